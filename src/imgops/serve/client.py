"""The command line's side of `imgops serve`: with IMGOPS_SERVER set, `imgops gray ...` (and
`bin`, `normvol`) is handed to the server, which runs it warm and sends back what it prints and
its exit status; this process only relays. Plain Python (socket, json): nothing heavy is
imported, so a relayed command costs the interpreter's start and little more.

Commands that read stdin or write stdout (`-`), ask for help, or name another command run in
this process as always. Where no server answers, the command runs here too, after a one-line
note on stderr (not with -q).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys

from . import protocol

# No typing, pathlib or shutil here: with socket, json and signal, this module is all a relayed
# command imports (with typing, pathlib, urllib.parse and shutil's compression modules the
# imports took ~7 ms more, the process ~9 ms, on the 2-core machine); tests/test_serve.py checks.
TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

__all__ = ["RELAYED_COMMANDS", "control", "forward", "relayable", "server_status"]

#: The commands a server runs (the batch engine's); the rest always run in this process.
RELAYED_COMMANDS = frozenset({"gray", "bin", "normvol"})


def _uses_stdio(arg: str) -> bool:
    """`-`, `--option=-` or `-o-`: the command reads stdin or writes stdout."""
    attached = len(arg) == 3 and arg[0] == "-" and arg[1] != "-" and arg[2] == "-"
    return arg == "-" or arg.endswith("=-") or attached


def relayable(args: list[str]) -> bool:
    """Whether a server may run this command line (see the module docstring)."""
    command = next((a for a in args if not a.startswith("-")), None)
    if command not in RELAYED_COMMANDS:
        return False
    return not any(a in ("-h", "--help", "--version") or _uses_stdio(a) for a in args)


def _quiet(args: list[str]) -> bool:
    return any(a == "--quiet" or (a.startswith("-") and not a.startswith("--") and "q" in a)
               for a in args)  # fmt: skip


def _note(args: list[str], text: str) -> None:
    if not _quiet(args):
        print(f"imgops: note: {text}; running here", file=sys.stderr, flush=True)


def _request(args: list[str]) -> dict[str, Any]:
    from .. import __version__

    umask = os.umask(0o022)
    os.umask(umask)
    env = {k: v for k, v in os.environ.items() if k.startswith("IMGOPS_")}
    env.pop(protocol.SERVER_VARIABLE, None)
    env.update({k: os.environ[k] for k in protocol.TERMINAL_VARIABLES if k in os.environ})
    try:
        stderr_tty = sys.stderr.isatty()
    except (AttributeError, ValueError):
        stderr_tty = False
    return {
        "protocol": protocol.PROTOCOL,
        "version": __version__,
        "argv": args,
        "cwd": os.getcwd(),
        "umask": umask,
        "env": env,
        "stderr_tty": stderr_tty,
        "columns": _terminal_columns(),
    }


def _terminal_columns() -> int:
    """shutil.get_terminal_size().columns (the same steps), without importing shutil: COLUMNS
    where it is a positive number, else the width of the terminal on stdout, else 80 (where the
    terminal says 0: 80 from Python 3.11, 0 before)."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns > 0:
        return columns
    try:
        columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        return 80
    return columns or (80 if sys.version_info >= (3, 11) else 0)


def _write(stream: Any, data: bytes) -> None:
    target = getattr(stream, "buffer", None)
    if target is not None:
        stream.flush()
        target.write(data)
        target.flush()
    else:
        stream.write(data.decode("utf-8", "backslashreplace"))
        stream.flush()


def forward(args: list[str]) -> int | None:
    """Runs `args` on the server IMGOPS_SERVER names and returns its exit status; None where
    the command is to run in this process (no server wanted, none answering, or one this
    command cannot be relayed to)."""
    path = protocol.server_socket_text(os.environ.get(protocol.SERVER_VARIABLE))
    if path is None or not relayable(args):
        return None
    if not hasattr(socket, "AF_UNIX"):
        _note(args, "imgops serve needs Unix sockets, which this system lacks")
        return None
    try:
        request = _request(args)
    except OSError:  # e.g. this folder was removed: the command line says so its own way
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError as error:
        conn.close()
        _note(args, f"no imgops server at {path} ({error.strerror or error}; start one with "
                    "`imgops serve`)")  # fmt: skip
        return None
    with conn:
        try:
            protocol.send_json(conn, protocol.REQUEST, request)
            return _relay(conn, args, path)
        except OSError as error:
            print(f"imgops: error: the server at {path}: {error.strerror or error}",
                  file=sys.stderr)  # fmt: skip
            return 1


class _LeftWaiting(KeyboardInterrupt):
    """Ctrl-C while the request waited for its turn (another command was running)."""


#: How long a caller cancelled before its turn waits to learn whether the command had begun.
TURN_ANSWER_SECONDS = 1.0


def _relay(conn: socket.socket, args: list[str], path: str) -> int | None:
    """Copies the server's output here until its exit status comes. A Ctrl-C while the request
    waits for its turn leaves at once (the server will not run it); once the command runs,
    the first Ctrl-C asks the server to stop it (it finishes the files in progress, as here)
    and a second one leaves at once."""
    started = cancelled = False

    def on_interrupt(signum: int, frame: Any) -> None:
        nonlocal cancelled
        if cancelled:
            raise KeyboardInterrupt
        cancelled = True
        try:
            protocol.send_frame(conn, protocol.CANCEL, b"")
        except OSError:
            raise KeyboardInterrupt from None
        if not started:
            raise _LeftWaiting

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        while True:
            try:
                frame = protocol.recv_frame(conn)
            except _LeftWaiting:
                frame = _answer_to_a_cancel_before_the_turn(conn)
                if frame is None:
                    print("imgops: interrupted before the server began the command (not run)",
                          file=sys.stderr)  # fmt: skip
                    return 130
                started = True  # any answer: the turn had come (its frames go on as usual)
            if frame is None:
                print(f"imgops: error: the server at {path} closed the connection before the "
                      "command finished", file=sys.stderr)  # fmt: skip
                return 1
            kind, payload = frame
            if kind == protocol.STARTED:
                started = True
            elif kind == protocol.STDOUT:
                _write(sys.stdout, payload)
            elif kind == protocol.STDERR:
                _write(sys.stderr, payload)
            elif kind == protocol.EXIT:
                answer = json.loads(payload)
                if answer.get("refused"):
                    if cancelled:
                        return 130
                    _note(args, f"the server at {path} {answer['refused']}")
                    return None
                return int(answer["code"])
    except KeyboardInterrupt:
        print("imgops: interrupted (the server may still be finishing the files in progress)",
              file=sys.stderr)  # fmt: skip
        return 130
    finally:
        signal.signal(signal.SIGINT, previous)


def _answer_to_a_cancel_before_the_turn(conn: socket.socket) -> tuple[bytes, bytes] | None:
    """The next frame where one comes within TURN_ANSWER_SECONDS (the turn had just come: the
    command is then stopped as any running command is); else None."""
    conn.settimeout(TURN_ANSWER_SECONDS)
    try:
        return protocol.recv_frame(conn)
    except (OSError, ValueError):
        return None
    finally:
        conn.settimeout(None)


def server_status() -> tuple[Path | None, bool]:
    """The socket IMGOPS_SERVER names (None: unset) and whether a server answers there."""
    path = protocol.server_socket_path(os.environ.get(protocol.SERVER_VARIABLE))
    if path is None or not hasattr(socket, "AF_UNIX"):
        return path, False
    return path, protocol.listening(path)


def control(path: Path, action: str) -> dict[str, Any] | None:
    """Asks the server at `path` for its status, or to stop ("status", "stop"); its status,
    or None where no server answers."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        try:
            conn.connect(str(path))
            protocol.send_json(conn, protocol.REQUEST, {"control": action})
            frame = protocol.recv_frame(conn)
        except OSError:
            return None
    if frame is None or frame[0] != protocol.EXIT:
        return None
    return json.loads(frame[1]).get("status")
