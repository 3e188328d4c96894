"""`imgops serve` and the command line's relay to it (imgops.serve), on the CPU: the socket's
rules, the frames, which commands are relayed, and real servers in subprocesses: the same bytes
as a local run, the caller's folder, umask and IMGOPS_* settings, errors and exit statuses,
Ctrl-C from the caller, refusals, a busy or stale socket, and the fall-back when none answers.
The warm GPU stage itself is tested with the stand-in driver (tests/test_driver_engine.py)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from imgops.serve import client, protocol

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
PICTURES = sorted(p for p in SAMPLES.iterdir() if p.suffix in (".jpg", ".png"))
IMGOPS = [sys.executable, "-m", "imgops.cli"]

pytestmark = pytest.mark.skipif(not hasattr(socket, "AF_UNIX"), reason="Unix sockets only")


# ---------------------------------------------------------------------- units
def test_the_server_variable_names_a_socket_or_none(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    for off in (None, "", "0", "off", "no", "False"):
        assert protocol.server_socket_path(off) is None
    for on in ("1", "on", "auto", "yes", "TRUE"):
        assert protocol.server_socket_path(on) == tmp_path / "imgops" / "server.sock"
    assert protocol.server_socket_path(" /x/y.sock ") == Path("/x/y.sock")
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert protocol.default_socket_path() == Path(f"/tmp/imgops-{os.getuid()}/server.sock")


SOCKET_VALUES = ["1", "auto", "/x/y.sock", " /x/y.sock ", "rel/s.sock", "./s.sock", "a//b/./c/",
                 "s.sock/.", "./~/s.sock", "//net/s.sock", "///x//s.sock", ".", "..", "~",
                 "~/s.sock", "~/./a//s.sock", "~/", f"~{os.environ.get('USER', 'root')}/s.sock",
                 "~nobody-such-user/s.sock", "x/~/s.sock", "0", "", None]  # fmt: skip


def test_the_relay_names_the_socket_as_pathlib_does(monkeypatch):
    """forward() takes the socket's path as text, made without importing pathlib: it is
    str(server_socket_path(value)) (or the same RuntimeError) on every kind of path, with
    every kind of XDG_RUNTIME_DIR and HOME."""
    for runtime in (None, "", " ", "/run/user/7", "/run/user/7/", "//r", "///r", "rel/./r", "/"):
        for home in ("/home/u", "/home/u/", "//h", "/", "rel/h", None):
            for name, setting in (("XDG_RUNTIME_DIR", runtime), ("HOME", home)):
                if setting is None:
                    monkeypatch.delenv(name, raising=False)
                else:
                    monkeypatch.setenv(name, setting)
            for value in SOCKET_VALUES:
                case = (value, runtime, home)
                try:
                    expected = protocol.server_socket_path(value)
                except RuntimeError as error:
                    with pytest.raises(RuntimeError, match=str(error)):
                        protocol.server_socket_text(value)
                    continue
                text = protocol.server_socket_text(value)
                assert text == (None if expected is None else str(expected)), case


def test_the_relayed_width_is_shutils(monkeypatch):
    """The request's terminal width, made without importing shutil: shutil's own."""
    for columns in (None, "", "wide", "0", "-3", "132"):
        for lines in (None, "0", "40"):
            for name, setting in (("COLUMNS", columns), ("LINES", lines)):
                if setting is None:
                    monkeypatch.delenv(name, raising=False)
                else:
                    monkeypatch.setenv(name, setting)
            expected = shutil.get_terminal_size().columns
            assert client._terminal_columns() == expected, (columns, lines)


@pytest.mark.parametrize("width", [0, 57, 300])
def test_the_relayed_width_of_a_terminal_is_shutils(width):
    import fcntl
    import pty
    import struct
    import termios

    main, terminal = pty.openpty()
    try:
        fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, width, 0, 0))
        probe = ("import shutil, sys; from imgops.serve import client; "
                 "print(client._terminal_columns(), shutil.get_terminal_size().columns, "
                 "file=sys.stderr)")  # fmt: skip
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
        done = subprocess.run([sys.executable, "-c", probe], stdout=terminal, env=env,
                              stderr=subprocess.PIPE, text=True, timeout=60)  # fmt: skip
    finally:
        os.close(main)
        os.close(terminal)
    ours, shutils = done.stderr.split()
    assert ours == shutils and (width == 0 or int(ours) == width), done.stderr


def test_a_relayed_command_imports_no_typing_pathlib_or_shutil():
    """What the imgops executable imports to relay a command: socket, json, signal and
    imgops.serve's own modules; typing, pathlib (with urllib.parse) and shutil (with its
    compression modules) cost ~12 ms of each relayed command on the 2-core machine. Only what
    the imports add is counted (a site module may have imported more before)."""
    probe = ("import sys; before = set(sys.modules); import imgops.entry; from imgops import "
             "serve; from imgops.serve import client, protocol; print(' '.join(sorted("
             "set(sys.modules) - before)))")  # fmt: skip
    added = set(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                               check=True, timeout=60).stdout.split())  # fmt: skip
    assert "imgops.serve.client" in added
    assert not added & {"typing", "pathlib", "shutil", "urllib.parse", "bz2", "lzma", "click"}


def test_the_sockets_folder_must_be_private(tmp_path: Path):
    folder = tmp_path / "made"
    protocol.private_folder(folder / "s.sock", create=True)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    open_folder = tmp_path / "open"
    open_folder.mkdir(mode=0o755)
    open_folder.chmod(0o755)
    with pytest.raises(protocol.ServerSocketError, match="others may enter it"):
        protocol.private_folder(open_folder / "s.sock", create=False)
    with pytest.raises(protocol.ServerSocketError, match="too long"):
        protocol.private_folder(folder / ("x" * 120), create=False)
    with pytest.raises(protocol.ServerSocketError, match="No such file"):
        protocol.private_folder(tmp_path / "missing" / "s.sock", create=False)


def test_frames_come_through_whole_and_large_ones_in_pieces(monkeypatch):
    left, right = socket.socketpair()
    with left, right:
        protocol.send_json(left, protocol.REQUEST, {"argv": ["gray", "ä.jpg"]})
        kind, payload = protocol.recv_frame(right)
        assert kind == protocol.REQUEST and json.loads(payload) == {"argv": ["gray", "ä.jpg"]}
        monkeypatch.setattr(protocol, "MAX_FRAME", 10)
        protocol.send_frame(left, protocol.STDERR, bytes(range(25)))
        pieces = [protocol.recv_frame(right) for _ in range(3)]
        assert [k for k, _ in pieces] == [protocol.STDERR] * 3
        assert b"".join(p for _, p in pieces) == bytes(range(25))
        protocol.send_frame(left, protocol.CANCEL, b"")
        assert protocol.recv_frame(right) == (protocol.CANCEL, b"")
        left.sendall(b"O\x00\x00\x01\x00")  # 256 bytes announced, more than MAX_FRAME
        with pytest.raises(ValueError, match="256 bytes"):
            protocol.recv_frame(right)
        left.sendall(b"O\x00\x00\x00\x05ab")
        left.shutdown(socket.SHUT_WR)
        assert protocol.recv_frame(right) is None  # cut short: the end of the connection


def test_without_unix_sockets_the_command_runs_here(monkeypatch, capsys):
    monkeypatch.setenv("IMGOPS_SERVER", "1")
    monkeypatch.delattr(socket, "AF_UNIX")
    assert client.forward(["gray", "a.jpg", "-o", "b.png"]) is None
    assert "imgops serve needs Unix sockets" in capsys.readouterr().err
    assert client.server_status()[1] is False


def test_a_caller_sets_only_imgops_and_terminal_variables():
    from imgops.serve.server import relayed_names

    env = {"IMGOPS_MAX_IMAGE_PIXELS": "9", "IMGOPS_SERVER": "/x", "LD_PRELOAD": "evil.so",
           "TERM": "xterm", "PATH": "/bin", "NO_COLOR": "1"}  # fmt: skip
    assert relayed_names(env) == {"IMGOPS_MAX_IMAGE_PIXELS", "TERM", "NO_COLOR"}


@pytest.mark.parametrize(
    ("args", "relayed"),
    [
        (["gray", "a.jpg", "-o", "b.png"], True),
        (["-q", "gray", "photos/", "-d", "out"], True),
        (["bin", "a.png", "--factor", "2"], True),
        (["gray", "-", "-o", "b.png"], False),
        (["gray", "a.jpg", "-o", "-"], False),
        (["gray", "a.jpg", "-o-"], False),
        (["gray", "--files-from=-", "-d", "out"], False),
        (["gray", "--help"], False),
        (["normvol", "scan.tif", "--max", "4095"], True),
        (["normvol", "scan.tif", "-o", "-"], False),
        (["serve"], False),
        (["--version"], False),
        ([], False),
    ],
)
def test_which_command_lines_a_server_runs(args, relayed):
    assert client.relayable(args) is relayed


# ---------------------------------------------------------------------- real servers
def _short_folder() -> Path:
    """A private folder with a short path (Unix socket paths are limited to ~100 bytes)."""
    folder = Path(tempfile.mkdtemp(prefix="imgops-t-", dir="/tmp"))
    folder.chmod(0o700)
    return folder


class _Served:
    def __init__(self, folder: Path, process: subprocess.Popen, log: Path) -> None:
        self.folder, self.process, self.log = folder, process, log
        self.socket = folder / "s.sock"

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ, IMGOPS_SERVER=str(self.socket))
        env.pop("IMGOPS_MAX_IMAGE_PIXELS", None)
        env.update(extra)
        return env

    def run(self, args: list[str], cwd: Path, **kwargs) -> subprocess.CompletedProcess:
        extra = kwargs.pop("env", {})
        return subprocess.run(IMGOPS + args, cwd=cwd, env=self.env(**extra), capture_output=True,
                              text=True, timeout=120, **kwargs)  # fmt: skip

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=30)


def _start(folder: Path, *args: str) -> _Served:
    log = folder / "serve.log"
    sock = folder / "s.sock"
    env = {k: v for k, v in os.environ.items() if k != "IMGOPS_SERVER"}
    process = subprocess.Popen(
        [*IMGOPS, "serve", "--socket", str(sock), "--device", "cpu", "-v", *args],
        stderr=log.open("w"), stdout=subprocess.DEVNULL, env=env,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while "ready at" not in log.read_text():
        if process.poll() is not None:
            raise AssertionError(f"the server stopped: {log.read_text()}")
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"the server did not start: {log.read_text()}")
        time.sleep(0.05)
    return _Served(folder, process, log)


@pytest.fixture(scope="module")
def served():
    folder = _short_folder()
    server = _start(folder)
    yield server
    assert server.stop() in (0, 143)
    assert not server.socket.exists()  # removed on the way out
    shutil.rmtree(folder, ignore_errors=True)


def test_a_relayed_batch_writes_the_bytes_of_a_local_run(served, tmp_path: Path):
    (tmp_path / "in").mkdir()
    for picture in PICTURES:
        (tmp_path / "in" / picture.name).write_bytes(picture.read_bytes())
    done = served.run(["gray", "in", "-d", "relayed"], cwd=tmp_path)  # relative paths: the caller's
    assert done.returncode == 0, done.stderr
    assert f"{len(PICTURES)} written, 0 skipped, 0 failed" in done.stderr
    assert done.stdout == ""
    local = subprocess.run([*IMGOPS, "gray", "in", "-d", "local", "-q"], cwd=tmp_path,
                           env={k: v for k, v in os.environ.items() if k != "IMGOPS_SERVER"},
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert local.returncode == 0, local.stderr
    names = sorted(p.name for p in (tmp_path / "local").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "relayed").iterdir()) and names
    for name in names:
        relayed, local_bytes = (tmp_path / d / name for d in ("relayed", "local"))
        assert relayed.read_bytes() == local_bytes.read_bytes(), name
    assert "imgops gray in -d relayed: status 0" in served.log.read_text()


def test_a_relayed_normvol_writes_the_bytes_of_a_local_run(served, tmp_path: Path):
    scan = SAMPLES / "mri_dwi_b0_u16.tif"
    args = ["normvol", str(scan), "--max", "4095", "--device", "cpu", "-q"]
    relayed = served.run([*args, "-o", "relayed.tif"], cwd=tmp_path)
    assert relayed.returncode == 0 and relayed.stderr == "", relayed.stderr
    env = {k: v for k, v in os.environ.items() if k != "IMGOPS_SERVER"}
    local = subprocess.run([*IMGOPS, *args, "-o", "local.tif"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert local.returncode == 0, local.stderr
    assert (tmp_path / "relayed.tif").read_bytes() == (tmp_path / "local.tif").read_bytes()


def test_a_relayed_command_has_the_callers_settings_umask_and_errors(served, tmp_path: Path):
    source = tmp_path / "r.jpg"
    source.write_bytes((SAMPLES / "rocket_baseline_rgb.jpg").read_bytes())
    limited = served.run(["gray", "r.jpg", "-o", "r.png"], cwd=tmp_path,
                         env={"IMGOPS_MAX_IMAGE_PIXELS": "10"})  # fmt: skip
    assert limited.returncode == 1 and "over the limit of 10 pixels" in limited.stderr
    assert not (tmp_path / "r.png").exists()
    missing = served.run(["gray", "nothing.jpg", "-o", "n.png"], cwd=tmp_path)
    assert missing.returncode == 1
    assert "imgops: error: nothing.jpg: No such file or directory" in missing.stderr
    assert "Traceback" not in missing.stderr
    usage = served.run(["gray", "r.jpg", "--png-level", "12", "-o", "x.png"], cwd=tmp_path)
    assert usage.returncode == 2 and "--png-level" in usage.stderr
    private = served.run(["gray", "r.jpg", "-o", "p.png", "-q"], cwd=tmp_path,
                         preexec_fn=lambda: os.umask(0o077))  # fmt: skip
    assert private.returncode == 0 and private.stderr == ""
    assert stat.S_IMODE((tmp_path / "p.png").stat().st_mode) == 0o600
    # the server's own setting is back for the next caller
    again = served.run(["gray", "r.jpg", "-o", "again.png", "-q"], cwd=tmp_path)
    assert again.returncode == 0 and (tmp_path / "again.png").exists()


def test_stdin_and_stdout_run_in_the_calling_process(served, tmp_path: Path):
    before = served.log.read_text()
    data = (SAMPLES / "rocket_baseline_rgb.jpg").read_bytes()
    done = subprocess.run(IMGOPS + ["gray", "-", "-o", "-", "-q"], input=data, env=served.env(),
                          capture_output=True, timeout=120, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0 and done.stdout.startswith(b"\x89PNG")
    assert served.log.read_text() == before  # not relayed


def test_ctrl_c_in_the_caller_stops_the_relayed_batch_and_the_server_goes_on(
    served, tmp_path: Path
):
    source = tmp_path / "in"
    source.mkdir()
    flower = SAMPLES / "flower_gray_3mp.jpg"
    for i in range(400):
        os.link(flower, source / f"f{i:03d}.jpg")
    process = subprocess.Popen(IMGOPS + ["gray", "in", "-d", "out"], cwd=tmp_path,
                               env=served.env(), stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 60
    while not any((tmp_path / "out").glob("*.png")) and time.monotonic() < deadline:
        time.sleep(0.01)
    process.send_signal(signal.SIGINT)
    stderr = process.communicate(timeout=120)[1]
    assert process.returncode == 130, stderr
    assert "interrupted" in stderr
    written = sorted((tmp_path / "out").iterdir())
    assert 0 < len(written) < 400
    assert all(p.suffix == ".png" for p in written)  # no temporaries left
    done = served.run(["gray", "in/f000.jpg", "-o", "after.png", "-q"], cwd=tmp_path)
    assert done.returncode == 0 and served.process.poll() is None


def test_requests_the_server_will_not_run_are_refused_and_it_goes_on(served, tmp_path):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(str(served.socket))
        protocol.send_json(conn, protocol.REQUEST, {"protocol": 1, "version": "0.0.1",
                                                    "argv": ["gray"], "cwd": "/"})  # fmt: skip
        kind, payload = protocol.recv_frame(conn)
    assert kind == protocol.EXIT and "runs imgops" in json.loads(payload)["refused"]
    from imgops import __version__

    for argv, cwd, why in [
        (["serve"], "/", "does not run `imgops serve`"),
        (["gray", "-", "-o", "x.png"], "/", "does not run"),
        ("gray x.jpg", "/", "got no command line"),
        (["gray", "x.jpg"], "relative", "got no folder"),
    ]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(str(served.socket))
            protocol.send_json(conn, protocol.REQUEST, {"protocol": 1, "version": __version__,
                                                        "argv": argv, "cwd": cwd})  # fmt: skip
            kind, payload = protocol.recv_frame(conn)
        assert kind == protocol.EXIT and why in json.loads(payload)["refused"], argv
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:  # not even a frame
        conn.connect(str(served.socket))
        conn.sendall(b"R\x00\x00\x00\x03{x}")
    done = served.run(["gray", str(SAMPLES / "camera_gray.png"), "-o", "c.png", "-q"],
                      cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr  # the server went on


def test_a_second_server_on_a_busy_socket_is_one_line_and_status_1(served):
    done = subprocess.run([*IMGOPS, "serve", "--socket", str(served.socket), "--device", "cpu"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.endswith("an imgops server is already running there")


def test_with_no_server_the_command_runs_here_after_a_note(tmp_path: Path):
    folder = _short_folder()
    source = tmp_path / "r.jpg"
    source.write_bytes((SAMPLES / "rocket_baseline_rgb.jpg").read_bytes())
    env = dict(os.environ, IMGOPS_SERVER=str(folder / "none.sock"))
    done = subprocess.run(IMGOPS + ["gray", "r.jpg", "-o", "r.png"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0 and (tmp_path / "r.png").exists()
    assert f"imgops: note: no imgops server at {folder / 'none.sock'}" in done.stderr
    quiet = subprocess.run(IMGOPS + ["-q", "gray", "r.jpg", "-o", "q.png"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert quiet.returncode == 0 and quiet.stderr == ""


def test_a_stale_socket_is_replaced_and_sigterm_removes_it(tmp_path: Path):
    folder = _short_folder()
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(folder / "s.sock"))
    stale.close()  # a socket file nobody listens on: a server that died
    server = _start(folder, "--idle-timeout", "0")
    try:
        done = server.run(["gray", str(SAMPLES / "camera_gray.png"), "-o", "c.png", "-q"],
                          cwd=tmp_path)  # fmt: skip
        assert done.returncode == 0 and done.stderr == ""
    finally:
        assert server.stop() == 143
    assert not (folder / "s.sock").exists()


def test_an_idle_server_gives_freed_memory_back(served, tmp_path: Path):
    """Once no command has come for a moment, the server returns the memory its batches
    freed (glibc's malloc_trim; a command line keeps it until it exits)."""
    from imgops.volume.stream import release_free_heap

    if not release_free_heap():
        pytest.skip("not glibc")
    before = served.log.read_text().count("freed memory given back")
    done = served.run(["gray", str(PICTURES[0]), "-o", "idle.png", "-q"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    deadline = time.monotonic() + 15
    while served.log.read_text().count("freed memory given back") == before:
        assert time.monotonic() < deadline, served.log.read_text()
        time.sleep(0.1)
    assert "resident" in served.log.read_text()


def test_the_idle_timeout_stops_the_server(tmp_path: Path):
    folder = _short_folder()
    server = _start(folder, "--idle-timeout", "1")
    assert server.process.wait(timeout=30) == 0
    assert "idle for 1 s: stopping" in server.log.read_text()
    assert "stopped after 0 command(s)" in server.log.read_text()
    assert not (folder / "s.sock").exists()


def test_ctrl_c_of_a_caller_waiting_its_turn_leaves_at_once_and_nothing_runs(
    served, tmp_path: Path
):
    """While another command runs, a waiting caller's Ctrl-C ends it at once (status 130) and
    the server never runs its command; the running one goes on to its end."""
    (tmp_path / "a").mkdir()
    flower = SAMPLES / "flower_gray_3mp.jpg"
    for i in range(600):
        os.link(flower, tmp_path / "a" / f"f{i:03d}.jpg")
    first = subprocess.Popen(IMGOPS + ["gray", "a", "-d", "a-out", "-q"], cwd=tmp_path,
                             env=served.env(), stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 60
    while not any((tmp_path / "a-out").glob("*.png")) and time.monotonic() < deadline:
        time.sleep(0.01)
    waiting = subprocess.Popen(IMGOPS + ["gray", "a/f000.jpg", "-o", "b.png"], cwd=tmp_path,
                               env=served.env(), stderr=subprocess.PIPE, text=True)  # fmt: skip
    time.sleep(1.0)  # connected, its request queued behind the first command
    assert first.poll() is None, "the first batch ended too soon for this test"
    waiting.send_signal(signal.SIGINT)
    stderr = waiting.communicate(timeout=10)[1]
    assert waiting.returncode == 130, stderr
    assert "before the server began the command" in stderr
    assert first.poll() is None  # it left while the first command still ran
    assert first.wait(timeout=120) == 0, first.stderr.read()
    assert len(list((tmp_path / "a-out").iterdir())) == 600
    done = served.run(["gray", "a/f001.jpg", "-o", "c.png", "-q"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "b.png").exists()  # its turn came after the first; it did not run
    assert "left before its turn" in served.log.read_text()


def test_two_callers_at_once_both_get_their_batch(served, tmp_path: Path):
    """One command runs at a time; the second caller waits its turn, then runs."""
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        for picture in PICTURES:
            os.link(picture, tmp_path / name / picture.name)
    callers = [
        subprocess.Popen(
            IMGOPS + ["gray", name, "-d", f"{name}-out", "-q"],
            cwd=tmp_path,
            env=served.env(),
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for name in ("a", "b")
    ]
    for caller in callers:
        assert caller.wait(timeout=120) == 0, caller.stderr.read()
    for name in ("a", "b"):
        assert len(list((tmp_path / f"{name}-out").iterdir())) == len(PICTURES)


def test_doctor_says_whether_a_server_answers(served, tmp_path: Path):
    answering = served.run(["doctor", "--json", str(tmp_path)], cwd=tmp_path)
    assert answering.returncode == 0, answering.stderr
    info = json.loads(answering.stdout)
    assert (
        info["server"]
        == f"gray, bin and normvol are relayed to the imgops serve at {served.socket}"
    )
    assert not any("IMGOPS_SERVER" in problem for problem in info["problems"])
    env = {"IMGOPS_SERVER": str(served.folder / "nobody.sock")}
    silent = served.run(["doctor", "--json", str(tmp_path)], cwd=tmp_path, env=env)
    info = json.loads(silent.stdout)
    assert "where no server answers" in info["server"]
    assert any("no imgops server answers" in problem for problem in info["problems"])


ENTRY = [sys.executable, "-c", "from imgops.entry import main; main()"]


def test_the_imgops_executable_relays_before_it_imports_the_command_line(served, tmp_path):
    """The console script (imgops.entry) relays without importing imgops.cli (click, the
    commands); with no server it runs the command line here, after one note."""
    done = subprocess.run(ENTRY + ["gray", str(SAMPLES / "camera_gray.png"), "-o", "e.png"],
                          cwd=tmp_path, env=served.env(), capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0 and "1 written" in done.stderr, done.stderr
    assert f"gray {SAMPLES / 'camera_gray.png'} -o e.png: status 0" in served.log.read_text()
    probe = "import sys; from imgops.serve import client; print('imgops.cli' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"  # fmt: skip
    env = served.env(IMGOPS_SERVER=str(served.folder / "none.sock"))
    alone = subprocess.run(ENTRY + ["gray", str(SAMPLES / "camera_gray.png"), "-o", "f.png"],
                           cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=120)  # fmt: skip
    assert alone.returncode == 0 and (tmp_path / "f.png").exists()
    assert alone.stderr.count("imgops: note: no imgops server") == 1, alone.stderr


def test_status_and_stop(tmp_path: Path):
    folder = _short_folder()
    server = _start(folder, "--idle-timeout", "0")
    sock = str(server.socket)
    try:
        status = subprocess.run([*IMGOPS, "serve", "--socket", sock, "--status"],
                                capture_output=True, text=True, timeout=60)  # fmt: skip
        assert status.returncode == 0, status.stderr
        assert f"(pid {server.process.pid}, imgops " in status.stdout
        assert "0 command(s)" in status.stdout and "no GPU warm" in status.stdout
        stop = subprocess.run([*IMGOPS, "serve", "--socket", sock, "--stop"],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert stop.returncode == 0 and "asked to stop" in stop.stdout, stop.stderr
        assert server.process.wait(timeout=30) == 0
    finally:
        server.stop()
    assert not server.socket.exists()
    gone = subprocess.run([*IMGOPS, "serve", "--socket", sock, "--status"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert gone.returncode == 1
    assert gone.stderr.strip() == f"imgops: error: no imgops server answers at {sock}"
    shutil.rmtree(folder, ignore_errors=True)


def test_detach_returns_once_the_server_answers(tmp_path: Path):
    folder = _short_folder()
    sock = folder / "s.sock"
    env = {k: v for k, v in os.environ.items() if k != "IMGOPS_SERVER"}
    started = subprocess.run([*IMGOPS, "serve", "--socket", str(sock), "--device", "cpu",
                              "--detach"], capture_output=True, text=True, env=env,
                             timeout=120)  # fmt: skip
    try:
        assert started.returncode == 0, started.stderr
        assert f"ready at {sock} (pid " in started.stderr
        pid = int(started.stderr.split("(pid ")[1].split(",")[0])
        done = subprocess.run(IMGOPS + ["gray", str(SAMPLES / "camera_gray.png"), "-o", "c.png"],
                              cwd=tmp_path, env=dict(env, IMGOPS_SERVER=str(sock)),
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0 and "1 written" in done.stderr
        again = subprocess.run([*IMGOPS, "serve", "--socket", str(sock), "--detach"],
                               capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
        assert again.returncode == 1 and "already running there" in again.stderr
        assert "ready at" in (folder / "s.sock.log").read_text()  # its log left alone
    finally:
        stop = subprocess.run([*IMGOPS, "serve", "--socket", str(sock), "--stop"],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
    assert stop.returncode == 0 and f"(pid {pid}," in stop.stdout
    deadline = time.monotonic() + 30
    while sock.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not sock.exists()
    shutil.rmtree(folder, ignore_errors=True)


def test_detach_reports_a_server_that_cannot_start(tmp_path: Path):
    folder = _short_folder()
    env = {k: v for k, v in os.environ.items() if k != "IMGOPS_SERVER"}
    env["CUDA_VISIBLE_DEVICES"] = ""  # no GPU, wherever this runs
    failed = subprocess.run([*IMGOPS, "serve", "--socket", str(folder / "s.sock"), "--device",
                             "cuda", "--detach"], capture_output=True, text=True, env=env,
                            timeout=120)  # fmt: skip
    assert failed.returncode == 1
    assert failed.stderr.startswith("imgops: error: the server stopped before it answered: ")
    assert "--device cuda" in failed.stderr and not (folder / "s.sock").exists()
    shutil.rmtree(folder, ignore_errors=True)


def test_without_imgops_server_the_relay_costs_no_import():
    """IMGOPS_SERVER unset: the executable does not import the client (socket and the rest)."""
    probe = "\n".join([
        "import sys", "sys.argv = ['imgops', '--help']", "from imgops.entry import main",
        "try:", "    main()", "except SystemExit:", "    pass",
        "print('imgops.serve.client' in sys.modules, 'socket' in sys.modules, file=sys.stderr)",
    ])  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "IMGOPS_SERVER"}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.stderr.strip().splitlines()[-1] == "False False", done.stderr


def test_a_cuda_server_with_the_torch_engine_asked_for_says_why_it_cannot_start(monkeypatch):
    """IMGOPS_CUDA_ENGINE=torch on `imgops serve --device cuda`: the error names the variable,
    not missing kernels (the server keeps only the torch-free engine warm)."""
    from imgops.cli_common import ImgopsError
    from imgops.commands import serve
    from imgops.engine import cuda_driver, device, driver_stage

    monkeypatch.setattr(driver_stage, "_warm", driver_stage._warm)  # keep_warm() is undone
    monkeypatch.setattr(device, "cuda_device_count", lambda: 1)
    monkeypatch.setattr(cuda_driver, "kernels_path", lambda: Path("_device_kernels.fatbin"))
    monkeypatch.setenv("IMGOPS_CUDA_ENGINE", "torch")
    with pytest.raises(ImgopsError, match="IMGOPS_CUDA_ENGINE=torch is set") as raised:
        serve._warm_up("cuda")
    assert str(raised.value).startswith("--device cuda: ") and "fatbin" not in str(raised.value)
