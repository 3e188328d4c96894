"""The `imgops serve` process: a Unix socket, and each command handed to it run in this process
one at a time, with the caller's folder, umask and IMGOPS_* settings, its output sent back as it
is printed (imgops.serve.protocol).

What stays warm between commands: the imports (numpy, OpenCV, the compiled kernels), and where a
GPU is kept warm, the torch-free CUDA engine's stage: the CUDA context, the kernels,
nvImageCodec's decoder and the pinned buffers (imgops.engine.driver_stage.keep_warm), which a
cold command line pays 1-2 s for on the H200 host before its first GPU decode.

The caller's Ctrl-C (a CANCEL frame, or the connection closing) reaches the command as Ctrl-C
does in a command line: a KeyboardInterrupt in this process's main thread, so the files in
progress finish and nothing partial is left. This module runs commands through a function it
is given (the CLI's run_command), so it does not import the command line itself.
"""

from __future__ import annotations

import _thread
import contextlib
import io
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .. import __version__
from . import protocol

__all__ = ["Server", "ServerBusy", "relayed_names"]

REQUEST_SECONDS = 10.0  # how long a caller has to send its request once connected
#: Seconds without a command after which the server tidies (Server's when_idle) once.
IDLE_TIDY_SECONDS = 2.0


class ServerBusy(Exception):
    """Another server answers at the socket's path."""


class _FrameStream(io.TextIOBase):
    """A text stream whose writes go to the caller as frames of one kind (stdout or stderr);
    writes after the caller has gone are dropped. Safe from several threads (rich's progress
    bar refreshes from its own)."""

    def __init__(self, conn: socket.socket, kind: bytes, tty: bool) -> None:
        self._conn, self._kind, self._tty = conn, kind, tty
        self._lock = threading.Lock()
        self.gone = False

    def write(self, text: str) -> int:
        data = text.encode("utf-8", "backslashreplace")
        with self._lock:
            if not self.gone and data:
                try:
                    protocol.send_frame(self._conn, self._kind, data)
                except OSError:
                    self.gone = True
        return len(text)

    def isatty(self) -> bool:
        return self._tty

    def fileno(self) -> int:
        raise io.UnsupportedOperation("a relayed stream has no descriptor")

    @property
    def encoding(self) -> str:
        return "utf-8"

    def writable(self) -> bool:
        return True


class Server:
    """Serves commands on `path` until stopped (SIGINT/SIGTERM/SIGHUP) or idle for
    `idle_timeout` seconds (0: never). `run_command(argv) -> exit status` runs one command;
    `when_idle()` runs once after each command, when no other has come for IDLE_TIDY_SECONDS
    (tidying that back-to-back commands should not pay for); `log(line)` reports each command
    (or nothing)."""

    def __init__(
        self,
        path: Path,
        run_command: Callable[[list[str]], int],
        *,
        idle_timeout: float = 0.0,
        log: Callable[[str], None] | None = None,
        when_idle: Callable[[], str | None] | None = None,
    ) -> None:
        self.path = path
        self._run_command = run_command
        self._when_idle = when_idle or (lambda: None)  # returns a line for the log, or None
        self.idle_timeout = idle_timeout
        self._log = log or (lambda line: None)
        self.commands = 0
        self._started = time.monotonic()
        self._socket: socket.socket | None = None
        self._stopping = False
        self._cancel_lock = threading.Lock()
        self._cancel_pending = False  # a caller's cancel is on its way to the main thread
        self._cancel_delivered = False  # ... and arrived there, as a KeyboardInterrupt

    def status(self) -> dict[str, Any]:
        """What `imgops serve --status` prints: process, version, commands run, warm GPUs."""
        stages = sys.modules.get("imgops.engine.driver_stage")
        warm = sorted(stages.warm_stages()) if stages is not None else []
        return {
            "pid": os.getpid(),
            "version": __version__,
            "commands": self.commands,
            "seconds_up": round(time.monotonic() - self._started, 1),
            "warm_gpus": warm,
        }

    # ------------------------------------------------------------------ the socket
    def bind(self) -> None:
        """Makes the socket (its folder private; a stale socket from a server that died is
        replaced). ServerBusy where a server answers there; protocol.ServerSocketError where
        the path cannot be used."""
        protocol.private_folder(self.path, create=True)
        if self.path.exists() or self.path.is_symlink():
            if protocol.listening(self.path):
                raise ServerBusy(f"{self.path}: an imgops server is already running there")
            self.path.unlink()  # nobody listens: a dead server's socket
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o077)
        try:
            sock.bind(str(self.path))
        finally:
            os.umask(old)
        sock.listen(16)
        sock.settimeout(0.5)
        self._socket = sock

    def close(self) -> None:
        """Closes and removes the socket."""
        if self._socket is not None:
            self._socket.close()
            self._socket = None
            with contextlib.suppress(OSError):
                self.path.unlink()

    # ------------------------------------------------------------------ the loop
    def serve(self) -> None:
        """Runs commands until stopped; the socket is removed at the end."""
        assert self._socket is not None, "bind() first"
        previous = signal.signal(signal.SIGINT, self._on_sigint)
        last = time.monotonic()
        tidied = True
        try:
            while not self._stopping:  # (_on_sigint sets it)
                try:
                    conn, _ = self._socket.accept()
                except TimeoutError:
                    idle = time.monotonic() - last
                    if self.idle_timeout and idle > self.idle_timeout:
                        self._log(f"idle for {self.idle_timeout:g} s: stopping")
                        break
                    if not tidied and idle > IDLE_TIDY_SECONDS:
                        tidied = True
                        line = self._when_idle()
                        if line:
                            self._log(line)
                    continue
                except KeyboardInterrupt:  # this process's own Ctrl-C
                    break
                try:
                    with conn:
                        self._handle(conn)
                except OSError as error:  # the caller went away mid-answer
                    self._log(f"a caller's connection failed: {error}")
                last = time.monotonic()
                tidied = False
        finally:
            signal.signal(signal.SIGINT, previous)
            self.close()

    def _on_sigint(self, signum: int, frame: Any) -> None:
        """Ctrl-C: a caller's cancel (interrupts its command), or this process's own (stops
        the server once the command in progress, interrupted too, has finished)."""
        with self._cancel_lock:
            if self._cancel_pending:
                self._cancel_pending = False
                self._cancel_delivered = True
            else:
                self._stopping = True
        raise KeyboardInterrupt

    def _handle(self, conn: socket.socket) -> None:
        uid = protocol.peer_uid(conn)
        if uid is not None and hasattr(os, "getuid") and uid != os.getuid():
            self._log(f"refused a caller of another user (uid {uid})")
            return
        conn.settimeout(REQUEST_SECONDS)  # a caller that says nothing does not hold the server
        try:
            frame = protocol.recv_frame(conn)
            request = json.loads(frame[1]) if frame and frame[0] == protocol.REQUEST else None
        except (OSError, ValueError) as error:
            self._log(f"a caller's request could not be read: {error}")
            return
        conn.settimeout(None)
        if not isinstance(request, dict):
            return
        if request.get("control") in ("status", "stop"):
            if request["control"] == "stop":
                self._stopping = True
                self._log("asked to stop")
            protocol.send_json(conn, protocol.EXIT, {"status": self.status()})
            return
        if _left_before_its_turn(conn):
            self._log("a caller left before its turn: its command was not run")
            with contextlib.suppress(OSError):
                protocol.send_json(conn, protocol.EXIT, {"code": 130})
            return
        refused = _refusal(request)
        if refused is not None:
            protocol.send_json(conn, protocol.EXIT, {"refused": refused})
            return
        protocol.send_frame(conn, protocol.STARTED, b"")
        start = time.perf_counter()
        code = self._run(conn, request)
        self.commands += 1
        seconds = time.perf_counter() - start
        self._log(f"imgops {' '.join(request['argv'])}: status {code}, {seconds:.2f} s")
        protocol.send_json(conn, protocol.EXIT, {"code": code})

    def _run(self, conn: socket.socket, request: dict[str, Any]) -> int:
        """Runs one command in the caller's setting, cancellable from the caller's side."""
        finished = threading.Event()

        def watch() -> None:  # the caller's CANCEL, or its end: Ctrl-C for the command
            while True:
                try:
                    frame = protocol.recv_frame(conn)
                except (OSError, ValueError):
                    frame = None
                if frame is None or frame[0] == protocol.CANCEL:
                    break
            with self._cancel_lock:
                if not finished.is_set():
                    self._cancel_pending = True
                    _thread.interrupt_main(signal.SIGINT)

        watcher = threading.Thread(target=watch, name="imgops-serve-cancel", daemon=True)
        err = _FrameStream(conn, protocol.STDERR, bool(request.get("stderr_tty")))
        out = _FrameStream(conn, protocol.STDOUT, False)
        self._cancel_delivered = False
        code = 130
        try:
            with _callers_setting(request, out, err):
                watcher.start()
                try:
                    code = self._run_command(list(request["argv"]))
                finally:
                    with self._cancel_lock:
                        finished.set()
                while self._cancel_pending:  # a cancel asked at the very end lands here
                    time.sleep(0.001)
        except KeyboardInterrupt:  # outside the command's own handling of Ctrl-C
            with self._cancel_lock:
                delivered, self._cancel_delivered = self._cancel_delivered, False
            if not delivered:
                raise
        except OSError as error:  # the caller's folder is gone, or the like
            err.write(f"imgops: error: {error}\n")
            code = 1
        return code


def _left_before_its_turn(conn: socket.socket) -> bool:
    """Whether the caller sent CANCEL, or closed the connection, while its request waited."""
    conn.setblocking(False)
    try:
        waiting = conn.recv(1, socket.MSG_PEEK)
    except BlockingIOError:
        return False  # nothing since the request: the caller waits
    except OSError:
        return True
    finally:
        conn.setblocking(True)
    return waiting in (b"", protocol.CANCEL)


def _refusal(request: dict[str, Any]) -> str | None:
    """Why this server will not run the request (None: it will)."""
    from .client import relayable

    if request.get("protocol") != protocol.PROTOCOL:
        return f"speaks protocol {protocol.PROTOCOL}, not {request.get('protocol')}"
    if request.get("version") != __version__:
        return f"runs imgops {__version__}, not {request.get('version')} (restart it)"
    argv, cwd = request.get("argv"), request.get("cwd")
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        return "got no command line"
    if not isinstance(cwd, str) or not os.path.isabs(cwd):
        return "got no folder to run in"
    if not relayable(argv):
        return f"does not run `imgops {' '.join(argv)}`"
    return None


def relayed_names(env: dict[str, str]) -> set[str]:
    """The variables of a caller's `env` that its command runs with: IMGOPS_* (but the
    server's address) and protocol.TERMINAL_VARIABLES; nothing else is taken."""
    return {
        k
        for k in env
        if (k.startswith("IMGOPS_") and k != protocol.SERVER_VARIABLE)
        or k in protocol.TERMINAL_VARIABLES
    }


@contextlib.contextmanager
def _callers_setting(request: dict[str, Any], out: Any, err: Any) -> Iterator[None]:
    """The caller's folder, umask, IMGOPS_* and terminal variables, and stdout/stderr that
    go back to it, for the time of one command."""
    saved_env = dict(os.environ)
    saved_cwd = os.getcwd()
    saved_streams = sys.stdout, sys.stderr
    saved_umask = os.umask(int(request.get("umask", 0o022)))
    try:
        relayed = [k for k in os.environ if k.startswith("IMGOPS_")]
        for key in relayed + [k for k in protocol.TERMINAL_VARIABLES if k in os.environ]:
            if key != protocol.SERVER_VARIABLE:
                del os.environ[key]
        given = {str(k): str(v) for k, v in dict(request.get("env", {})).items()}
        os.environ.update({k: v for k, v in given.items() if k in relayed_names(given)})
        os.environ["COLUMNS"] = str(int(request.get("columns", 80)))
        os.chdir(request["cwd"])
        sys.stdout, sys.stderr = out, err
        yield
    finally:
        sys.stdout, sys.stderr = saved_streams
        os.umask(saved_umask)
        with contextlib.suppress(OSError):
            os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
