"""Warnings that libpng, libjpeg and libtiff print, captured and attributed to the file decoded.

The decoders inside OpenCV write their warnings ("libpng warning: iCCP: known incorrect sRGB
profile", "Corrupt JPEG data: 3 extraneous bytes before marker 0xd9") straight to file
descriptor 2, where they would land on the progress bar with no file name. `install()` (the
CLI calls it once) moves descriptor 2 onto a pipe that a small reader thread drains, and gives
Python's `sys.stderr` a descriptor of its own onto the real stderr, so imgops' own messages are
not delayed or captured.

Decodes stay parallel. Each decode runs inside `capture(replay)`; when it ends, the bytes that
reached the pipe while it ran are:
- attributed to it if no other decode overlapped it (the common case: one warning, one file);
- otherwise ambiguous: every decode that overlapped is flagged, and each flagged decode runs
  `replay()` again alone (an exclusive lock holds new decodes back for that moment), so its own
  warnings are captured exactly. Decoders are deterministic, so the replay prints the same
  lines. Ambiguous bytes no replay reproduces are written to the real stderr unchanged.
C-level output while no decode runs (a compiler, a CUDA warning) is forwarded at once.

Without `install()` (library use, tests), `capture` is a no-op that yields an empty list.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import os
import select
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

__all__ = ["MAX_LINES", "capture", "install", "installed", "uninstall"]

#: At most this many warning lines are kept per file (then "... and N more").
MAX_LINES = 4
_MAX_BYTES = 16 << 10  # per decode; the rest is counted, not kept


@dataclass(eq=False)
class _Group:
    """Ambiguous bytes and the decodes whose replays may claim them."""

    data: bytes
    pending: int = 0
    claimed: bool = False


@dataclass(eq=False)
class _Decode:
    overlapped: bool = False
    groups: list[_Group] = field(default_factory=list)


@dataclass(eq=False)
class _Capture:
    saved_fd: int
    read_fd: int
    old_stderr: object
    lock: threading.Lock = field(default_factory=threading.Lock)
    gate: threading.Condition = field(default_factory=threading.Condition)
    shared: int = 0
    exclusive: bool = False
    waiting_exclusive: int = 0
    active: set[_Decode] = field(default_factory=set)
    buffer: bytearray = field(default_factory=bytearray)
    stop: threading.Event = field(default_factory=threading.Event)
    reader: threading.Thread | None = None

    # --- the pipe -------------------------------------------------------------------------
    def drain_locked(self) -> None:
        """Moves everything in the pipe into the buffer, or to the real stderr if no decode runs."""
        while True:
            try:
                chunk = os.read(self.read_fd, 1 << 16)
            except BlockingIOError:
                return
            except OSError:
                return
            if not chunk:
                return
            if self.active:
                if len(self.buffer) < _MAX_BYTES:
                    self.buffer += chunk[: _MAX_BYTES - len(self.buffer)]
            else:
                self.forward(chunk)

    def forward(self, data: bytes) -> None:
        with contextlib.suppress(OSError):
            view = memoryview(data)
            while view:
                view = view[os.write(self.saved_fd, view) :]

    def read_loop(self) -> None:
        while not self.stop.is_set():
            try:
                ready, _, _ = select.select([self.read_fd], [], [], 0.2)
            except (OSError, ValueError):
                return
            if ready:
                with self.lock:
                    self.drain_locked()

    # --- shared / exclusive decoding ----------------------------------------------------------
    def enter_shared(self) -> None:
        with self.gate:
            while self.exclusive or self.waiting_exclusive:
                self.gate.wait()
            self.shared += 1

    def leave_shared(self) -> None:
        with self.gate:
            self.shared -= 1
            self.gate.notify_all()

    def enter_exclusive(self) -> None:
        with self.gate:
            self.waiting_exclusive += 1
            while self.exclusive or self.shared:
                self.gate.wait()
            self.waiting_exclusive -= 1
            self.exclusive = True

    def leave_exclusive(self) -> None:
        with self.gate:
            self.exclusive = False
            self.gate.notify_all()

    # --- one decode ---------------------------------------------------------------------------
    def begin(self) -> _Decode:
        decode = _Decode()
        with self.lock:
            self.drain_locked()  # earlier output belongs to no decode: forward it
            if self.active:
                decode.overlapped = True
                for other in self.active:
                    other.overlapped = True
            self.active.add(decode)
        return decode

    def end(self, decode: _Decode) -> tuple[bytes, list[_Group]]:
        """This decode's own bytes (if unambiguous), or the groups it must replay for."""
        with self.lock:
            self.drain_locked()
            data = bytes(self.buffer)
            self.buffer.clear()
            if data and not decode.overlapped and not decode.groups:
                self.active.discard(decode)
                return data, []
            if data:
                group = _Group(data)
                for member in (decode, *self.active):
                    member.groups.append(group)
                    group.pending += 1
            self.active.discard(decode)
            return b"", decode.groups

    def settle(self, groups: list[_Group], claimed: bool) -> None:
        """One member of each group is done; a group no replay reproduced is forwarded."""
        with self.lock:
            for group in groups:
                group.pending -= 1
                group.claimed = group.claimed or claimed
                if group.pending <= 0 and not group.claimed:
                    self.forward(group.data)

    def replay(self, replay: Callable[[], object], groups: list[_Group]) -> bytes:
        """Runs `replay` alone and returns what it printed."""
        self.enter_exclusive()
        try:
            decode = self.begin()
            try:
                with contextlib.suppress(Exception):
                    replay()
            finally:
                with self.lock:
                    self.drain_locked()
                    data = bytes(self.buffer)
                    self.buffer.clear()
                    self.active.discard(decode)
        finally:
            self.leave_exclusive()
        self.settle(groups, bool(data))
        return data


_state: _Capture | None = None
_install_lock = threading.Lock()


def installed() -> bool:
    """True while descriptor 2 is captured (install() was called and not undone)."""
    return _state is not None


def install() -> bool:
    """Captures C-level writes to descriptor 2 (see the module docstring); idempotent.

    Python's sys.stderr is replaced by a stream on a duplicate of the real stderr. Returns
    False where this cannot be done or would be wrong (sys.stderr is not descriptor 2, e.g.
    click's CliRunner or pytest capturing it), leaving everything unchanged.
    """
    global _state
    with _install_lock:
        if _state is not None:
            return True
        try:
            if sys.stderr.fileno() != 2:  # a test runner's capture stream: leave it alone
                return False
            sys.stderr.flush()
            saved = os.dup(2)
        except (OSError, AttributeError, ValueError):  # io.UnsupportedOperation is an OSError
            return False
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        os.dup2(write_fd, 2)
        os.close(write_fd)
        old = sys.stderr
        sys.stderr = io.TextIOWrapper(
            io.FileIO(saved, "w", closefd=False),
            encoding=getattr(old, "encoding", None) or "utf-8",
            errors="backslashreplace",
            line_buffering=True,
            write_through=True,
        )
        state = _Capture(saved, read_fd, old)
        state.reader = threading.Thread(target=state.read_loop, name="imgops-stderr", daemon=True)
        state.reader.start()
        _state = state
    atexit.register(uninstall)
    return True


def uninstall() -> None:
    """Restores descriptor 2 and sys.stderr; output still in the pipe goes to the real stderr."""
    global _state
    with _install_lock:
        state, _state = _state, None
        if state is None:
            return
        state.stop.set()
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        # Restoring descriptor 2 first closes the pipe's last write end: the reader sees the end
        # of its input at once instead of at its next 0.2 s poll.
        os.dup2(state.saved_fd, 2)
        if state.reader is not None:
            state.reader.join(timeout=1)
        with state.lock:
            state.active.clear()
            state.forward(bytes(state.buffer))
            state.drain_locked()
        sys.stderr = state.old_stderr
        os.close(state.read_fd)
        os.close(state.saved_fd)


def _lines(data: bytes) -> list[str]:
    text = data.decode("utf-8", "backslashreplace")
    lines: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        if line and (not lines or lines[-1] != line):
            lines.append(line)
    if len(lines) > MAX_LINES:
        lines = lines[:MAX_LINES] + [f"... and {len(lines) - MAX_LINES} more warnings"]
    return lines


@contextlib.contextmanager
def capture(replay: Callable[[], object]) -> Iterator[list[str]]:
    """Runs the body as one decode; afterwards the yielded list holds its warning lines.

    `replay` decodes the same data again (used only when warnings of overlapping decodes
    cannot be told apart). If the body raises, no warnings are collected.
    """
    found: list[str] = []
    state = _state
    if state is None:
        yield found
        return
    state.enter_shared()
    decode = state.begin()
    failed = True
    try:
        yield found
        failed = False
    finally:
        own, groups = state.end(decode)
        state.leave_shared()
        if groups:
            if failed:
                state.settle(groups, False)
            else:
                own = state.replay(replay, groups)
        if own and not failed:
            found.extend(_lines(own))
