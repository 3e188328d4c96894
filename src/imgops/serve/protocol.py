"""What `imgops serve` and the command line say to each other over a Unix socket.

Every message is a frame: one type byte, the payload's length (4 bytes, big-endian), the payload.
The client sends REQUEST (JSON: the command line, its folder, umask, IMGOPS_* settings and
whether its stderr is a terminal) and later, on Ctrl-C, CANCEL. The server answers with STARTED
when the command's turn comes (a server runs one at a time), STDOUT and STDERR bytes as the
command prints them, then EXIT (JSON: the exit status). A request whose caller cancelled or left
before its turn is not run.

The socket lives in a folder only its user may enter: $XDG_RUNTIME_DIR/imgops, else
/tmp/imgops-UID (made 0700, refused if anyone else owns it or may enter it); the server also
checks the peer's user id where the system tells it (SO_PEERCRED).
"""

from __future__ import annotations

import json
import os
import socket
import stat
import struct

from . import OFF_VALUES, SERVER_VARIABLE

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see imgops.serve.client)
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

__all__ = [
    "CANCEL",
    "EXIT",
    "REQUEST",
    "STARTED",
    "STDERR",
    "STDOUT",
    "SERVER_VARIABLE",
    "ServerSocketError",
    "default_socket_path",
    "recv_frame",
    "send_frame",
    "server_socket_path",
    "server_socket_text",
]

REQUEST, CANCEL, STARTED, STDOUT, STDERR, EXIT = b"R", b"C", b"S", b"O", b"E", b"X"
PROTOCOL = 1
_HEADER = struct.Struct(">cI")
MAX_FRAME = 64 << 20  # bytes a frame may carry (a request is a few KiB; output comes in pieces)
#: Variables relayed to the server's run of a command besides IMGOPS_* (how rich draws on the
#: caller's terminal); the server's own are not used.
TERMINAL_VARIABLES = ("NO_COLOR", "FORCE_COLOR", "TERM")


class ServerSocketError(Exception):
    """The socket's path or folder cannot be used (one line saying why)."""


def default_socket_path() -> Path:
    """The socket path imgops uses when none is given (see the module docstring)."""
    from pathlib import Path

    runtime = os.environ.get("XDG_RUNTIME_DIR", "").strip()
    uid = os.getuid() if hasattr(os, "getuid") else 0
    folder = Path(runtime) / "imgops" if runtime else Path("/tmp") / f"imgops-{uid}"
    return folder / "server.sock"


def server_socket_path(value: str | None) -> Path | None:
    """The socket IMGOPS_SERVER's `value` names (None: no server wanted)."""
    value = (value or "").strip()
    if value.lower() in OFF_VALUES:
        return None
    if value.lower() in ("1", "on", "yes", "true", "auto"):
        return default_socket_path()
    from pathlib import Path

    return Path(value).expanduser()


def server_socket_text(value: str | None) -> str | None:
    """str(server_socket_path(value)), made without pathlib where paths are POSIX: what a
    relayed command needs, without importing pathlib (~3 ms with urllib.parse).

    The same steps as pathlib's: a root of one slash (or exactly two), the names between the
    slashes but empty ones and '.', and `~` or `~user` first expanded with os.path.expanduser
    (RuntimeError where it cannot be); tests/test_serve.py compares the two."""
    if os.name != "posix":
        path = server_socket_path(value)
        return None if path is None else str(path)
    value = (value or "").strip()
    if value.lower() in OFF_VALUES:
        return None
    if value.lower() in ("1", "on", "yes", "true", "auto"):
        runtime = os.environ.get("XDG_RUNTIME_DIR", "").strip()
        uid = os.getuid() if hasattr(os, "getuid") else 0
        root, names = _posix_parts(runtime) if runtime else ("/", ["tmp"])
        return _posix_text(root, [*names, "imgops" if runtime else f"imgops-{uid}", "server.sock"])
    root, names = _posix_parts(value)
    if not root and names and names[0][:1] == "~":
        home = os.path.expanduser(names[0])
        if home[:1] == "~":
            raise RuntimeError("Could not determine home directory.")
        root, first = _posix_parts(home)
        names = first + names[1:]
    return _posix_text(root, names)


def _posix_parts(text: str) -> tuple[str, list[str]]:
    """PurePosixPath(text)'s root and names."""
    root = ""
    if text[:1] == "/":
        root = "//" if text[1:2] == "/" and text[2:3] != "/" else "/"
    return root, [name for name in text.split("/") if name and name != "."]


def _posix_text(root: str, names: list[str]) -> str:
    """str() of the PurePosixPath of `root` and `names`."""
    return root + "/".join(names) or "."


def private_folder(path: Path, *, create: bool) -> None:
    """Checks (and with `create`, makes) the socket's folder: owned by this user and closed to
    everyone else; ServerSocketError says what is wrong."""
    folder = path.parent
    if create:
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as error:
            raise ServerSocketError(f"{folder}: cannot make the folder: {error.strerror}") from None
    try:
        info = folder.stat()
    except OSError as error:
        raise ServerSocketError(f"{folder}: {error.strerror}") from None
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise ServerSocketError(f"{folder}: owned by another user (uid {info.st_uid})")
    if stat.S_IMODE(info.st_mode) & 0o077:
        raise ServerSocketError(
            f"{folder}: others may enter it (mode {stat.S_IMODE(info.st_mode):o}); "
            "the socket's folder must be private (chmod 700)"
        )
    if len(os.fsencode(path)) > 100:
        raise ServerSocketError(f"{path}: too long for a Unix socket path (at most 100 bytes)")


def listening(path: Path) -> bool:
    """Whether a process accepts connections on the socket at `path` (a connect, nothing
    sent: it does not wait for a server busy with a command)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def peer_uid(conn: socket.socket) -> int | None:
    """The user id of the process at the other end (Linux; None where unknown)."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    data = conn.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i"))
    return struct.unpack("3i", data)[1]


def send_frame(conn: socket.socket, kind: bytes, payload: bytes) -> None:
    """Sends one frame (large payloads in several frames of at most MAX_FRAME bytes)."""
    for start in range(0, max(1, len(payload)), MAX_FRAME):
        piece = payload[start : start + MAX_FRAME]
        conn.sendall(_HEADER.pack(kind, len(piece)) + piece)


def send_json(conn: socket.socket, kind: bytes, value: dict[str, Any]) -> None:
    """Sends a frame holding `value` as JSON."""
    send_frame(conn, kind, json.dumps(value).encode())


def _recv_exactly(conn: socket.socket, n: int) -> bytes | None:
    chunks, left = [], n
    while left:
        chunk = conn.recv(min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def recv_frame(conn: socket.socket) -> tuple[bytes, bytes] | None:
    """The next frame as (type, payload); None at the end of the connection."""
    header = _recv_exactly(conn, _HEADER.size)
    if header is None:
        return None
    kind, size = _HEADER.unpack(header)
    if size > MAX_FRAME:
        raise ValueError(f"a frame of {size} bytes (at most {MAX_FRAME})")
    payload = _recv_exactly(conn, size) if size else b""
    if payload is None:
        return None
    return kind, payload
