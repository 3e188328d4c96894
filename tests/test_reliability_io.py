"""Issue 11, the I/O classes: inputs that hang or exhaust, truncated stdout, long names, stale
temporaries of killed runs. Real FIFOs, /dev/zero, /dev/full, pipes closed early and processes
killed with SIGKILL, in subprocesses with timeouts (a hang fails the test, never the CI job).
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

from imgops.io import atomic
from imgops.io.inputs import check_input, read_input_bytes, write_stream

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONWARNINGS": "ignore"}
TEMP = ".imgops-tmp-"


def imgops(*args: object, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
    """Runs the CLI in a real process; a hang past `timeout` fails the test."""
    kwargs.setdefault("stdout", subprocess.PIPE)
    try:
        return subprocess.run(
            [sys.executable, "-m", "imgops.cli", *map(str, args)],
            stderr=subprocess.PIPE,
            env={**ENV, **kwargs.pop("env", {})},
            timeout=timeout,
            **kwargs,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"imgops {' '.join(map(str, args))} hung for {timeout} s")


def errors(process: subprocess.CompletedProcess) -> list[str]:
    text = process.stderr.decode(errors="replace")
    assert "Traceback" not in text, text
    return [line for line in text.splitlines() if line.startswith("imgops: error:")]


def luma(bgr: np.ndarray) -> np.ndarray:
    wide = bgr.astype(np.int64)
    return ((299 * wide[..., 2] + 587 * wide[..., 1] + 114 * wide[..., 0] + 500) // 1000).astype(
        bgr.dtype
    )


# ------------------------------------------------------------------ inputs that hang or exhaust


def test_fifo_as_input_is_refused_at_once(tmp_path: Path):
    """Issue 11.3: the landed code opened the FIFO and waited for a writer forever."""
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    started = time.monotonic()
    result = imgops("gray", fifo, "-o", tmp_path / "out.png", timeout=30)
    assert result.returncode == 1, result.stderr
    (line,) = errors(result)
    assert "pipe.png" in line and "FIFO" in line, line
    assert time.monotonic() - started < 30
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe.png"]


def test_fifo_inside_a_folder_fails_alone_and_the_batch_goes_on(tmp_path: Path):
    source = tmp_path / "in"
    source.mkdir()
    shutil.copy(SAMPLES / "coffee_rgb.png", source / "good.png")
    os.mkfifo(source / "stuck.png")
    out = tmp_path / "out"
    result = imgops("gray", source, "-d", out, timeout=30)
    assert result.returncode == 1, result.stderr
    (line,) = errors(result)
    assert "stuck.png" in line and "FIFO" in line, line
    expected = luma(cv2.imread(str(SAMPLES / "coffee_rgb.png"), cv2.IMREAD_COLOR))
    np.testing.assert_array_equal(cv2.imread(str(out / "good.png"), cv2.IMREAD_UNCHANGED), expected)


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_character_device_as_input_is_refused_before_reading(tmp_path: Path, device: str):
    """Issue 11.3: /dev/zero was read until a bare MemoryError."""
    result = imgops(
        "gray", device, "-o", tmp_path / "z.png", timeout=30,
        preexec_fn=lambda: __import__("resource").setrlimit(
            __import__("resource").RLIMIT_AS, (3 << 30, 3 << 30)
        ),
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    (line,) = errors(result)
    assert device in line and "character device" in line and "MemoryError" not in line, line
    assert list(tmp_path.iterdir()) == []


def test_input_over_two_gib_is_refused_from_its_size(tmp_path: Path):
    """Issue 11.7: OpenCV's assertion text for >= 2 GiB inputs; now refused before reading."""
    big = tmp_path / "huge.png"
    with open(big, "wb") as handle:
        handle.write((SAMPLES / "coffee_rgb.png").read_bytes())
        handle.truncate((2 << 30) + 5)  # sparse: no disk used
    result = imgops("gray", big, "-o", tmp_path / "out.png", timeout=30)
    assert result.returncode == 1, result.stderr
    (line,) = errors(result)
    assert "huge.png" in line and "2.0 GiB" in line and "limit" in line, line
    assert "error: (-" not in line  # no OpenCV assertion text


def test_read_input_bytes_reads_exactly_and_refuses_non_files(tmp_path: Path):
    data = (SAMPLES / "coffee_rgb.png").read_bytes()
    path = tmp_path / "a.png"
    path.write_bytes(data)
    assert read_input_bytes(path) == data
    with pytest.raises(OSError, match="over imgops' limit"):
        read_input_bytes(path, max_bytes=len(data) - 1)
    assert read_input_bytes(path, max_bytes=len(data)) == data
    os.mkfifo(tmp_path / "fifo")
    for name, reason in (
        (tmp_path / "fifo", "FIFO"),
        ("/dev/zero", "character device"),
        (tmp_path, "directory"),
    ):
        with pytest.raises(OSError, match=reason) as caught:
            read_input_bytes(name)
        assert caught.value.filename == str(name)


def test_read_input_bytes_notices_a_file_that_grows_or_shrinks(tmp_path: Path, monkeypatch):
    """The Python reader (os.fstat faked); the native one below."""
    from imgops.io import inputs

    monkeypatch.setattr(inputs, "cli_kernels", lambda: None)
    path = tmp_path / "a.bin"
    path.write_bytes(b"x" * 1000)
    real_fstat = os.fstat

    def fstat_saying(size: int):
        def fake(fd: int) -> os.stat_result:
            info = list(real_fstat(fd))
            info[stat.ST_SIZE] = size
            return os.stat_result(info)

        return fake

    monkeypatch.setattr(os, "fstat", fstat_saying(600))  # grew after fstat
    with pytest.raises(OSError, match="grew while being read"):
        read_input_bytes(path)
    monkeypatch.setattr(os, "fstat", fstat_saying(1400))  # shrank after fstat
    with pytest.raises(OSError, match="shrank while being read"):
        read_input_bytes(path)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_native_read_notices_a_file_longer_than_its_stat(tmp_path: Path):
    """/proc files say size 0 and hold more: the native reader's check after the last read
    catches it (a file that grew), as the Python reader's does."""
    from imgops.io import inputs

    if not hasattr(inputs.cli_kernels(), "read_file"):
        pytest.skip("imgops._cli_kernels was not built")
    with pytest.raises(OSError, match="grew while being read"):
        read_input_bytes("/proc/self/status")
    path = tmp_path / "b.bin"
    path.write_bytes(b"abc" * 5000)
    assert read_input_bytes(path) == b"abc" * 5000
    with pytest.raises(OSError, match="over imgops' limit") as caught:
        read_input_bytes(path, max_bytes=100)
    assert caught.value.filename == str(path)
    with pytest.raises(IsADirectoryError, match="is a directory"):
        read_input_bytes(tmp_path)
    with pytest.raises(FileNotFoundError) as caught:
        read_input_bytes(tmp_path / "missing")
    assert caught.value.filename == str(tmp_path / "missing")


def test_check_input_names_every_kind_of_non_file(tmp_path: Path):
    good = tmp_path / "good.png"
    good.write_bytes(b"x")
    assert check_input(good).st_size == 1
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "broken").symlink_to(tmp_path / "missing")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tmp_path / "sock"))
    try:
        cases = {
            tmp_path / "fifo": "FIFO",
            Path("/dev/null"): "character device",
            tmp_path: "is a directory",
            tmp_path / "sock": "socket",
            tmp_path / "broken": "broken symbolic link",
            tmp_path / "missing": "No such file",
            tmp_path / "loop": "symbolic links",
        }
        for path, reason in cases.items():
            with pytest.raises(OSError) as caught:
                check_input(path)
            assert reason in caught.value.strerror, (path, caught.value)
            assert "\n" not in str(caught.value)
    finally:
        server.close()


# ------------------------------------------------------------------ stdout truncation


def test_stdout_on_a_full_disk_is_a_failure(tmp_path: Path):
    """Issue 11.2: `-o - > full-disk` must not end in "1 written"."""
    with open("/dev/full", "wb") as full:
        result = imgops("gray", SAMPLES / "coffee_rgb.png", "-o", "-", stdout=full)
    assert result.returncode == 1, result.stderr
    (line,) = errors(result)
    assert "No space left on device" in line, line
    assert "1 written" not in result.stderr.decode()


def test_stdout_pipe_closed_early_is_a_failure():
    """Issue 11.2: a reader that closes the pipe early; the rest of the image is lost."""
    process = subprocess.Popen(
        [sys.executable, "-m", "imgops.cli", "gray", SAMPLES / "flower_rgb_3mp.png", "-o", "-"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=ENV,
    )
    assert process.stdout is not None
    process.stdout.read(10)
    process.stdout.close()
    try:
        _, stderr = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail("imgops hung writing to a closed pipe")
    text = stderr.decode()
    assert process.returncode == 1, text
    lines = [line for line in text.splitlines() if line.startswith("imgops: error:")]
    assert len(lines) == 1 and "pipe" in lines[0], text
    assert "1 written" not in text and "Traceback" not in text


class _Trickle(io.RawIOBase):
    """A raw stream that takes at most `step` bytes per write, sometimes none (None)."""

    def __init__(self, step: int) -> None:
        self.step, self.data, self.calls = step, bytearray(), 0
        self.devnull = os.open(os.devnull, os.O_WRONLY)

    def close(self) -> None:
        if self.devnull >= 0:
            os.close(self.devnull)
            self.devnull = -1
        super().close()

    def writable(self) -> bool:
        return True

    def write(self, chunk) -> int | None:
        self.calls += 1
        if self.calls % 3 == 0:
            return 0 if self.step == 0 else None
        taken = bytes(chunk[: self.step])
        self.data += taken
        return len(taken)

    def fileno(self) -> int:
        return self.devnull  # always writable: what write_stream's select() waits on


def test_write_stream_continues_short_writes_to_the_end():
    """The landed code raised "short write" for a partial count, and took None for done."""
    data = bytes(range(256)) * 40
    stream = _Trickle(1000)
    write_stream(stream, data)
    stream.close()
    assert bytes(stream.data) == data


def test_write_stream_through_a_non_blocking_pipe_delivers_every_byte():
    """A raw unbuffered stdout whose descriptor is non-blocking returns None when the pipe is
    full: the landed code counted that as written (a silently truncated image)."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    data = os.urandom(1 << 20)
    received = bytearray()

    def drain() -> None:
        while chunk := os.read(read_fd, 4096):
            received.extend(chunk)
            time.sleep(0.0005)

    reader = threading.Thread(target=drain)
    reader.start()
    with open(write_fd, "wb", buffering=0) as raw:
        write_stream(raw, data)
    reader.join(timeout=30)
    os.close(read_fd)
    assert bytes(received) == data


def test_write_stream_errors_name_the_stream_and_the_count():
    with pytest.raises(OSError, match=r"write returned 0 after 0 of 5 bytes") as caught:
        write_stream(_Zero(), b"abcde")
    assert caught.value.filename == "<stdout>"
    read_fd, write_fd = os.pipe()
    os.close(read_fd)
    with open(write_fd, "wb", buffering=0) as raw, pytest.raises(OSError) as caught:
        write_stream(raw, b"x" * 10, "<stdout>")
    assert caught.value.errno == errno.EPIPE and "closed the pipe" in str(caught.value)


class _Zero(io.RawIOBase):
    def writable(self) -> bool:
        return True

    def write(self, chunk) -> int:
        return 0


# ------------------------------------------------------------------ long names


def test_longest_legal_names_get_outputs_not_errno_36(tmp_path: Path):
    """Issue 11.4: stems of 225-251 bytes failed because the hidden temp name passed 255."""
    source = tmp_path / "in"
    source.mkdir()
    names = ["a" * 251 + ".png", "é" * 120 + "x.png", "b" * 240 + ".jpeg"]
    for name in names:
        shutil.copy(SAMPLES / "coffee_rgb.png", source / name)
    out = tmp_path / "out"
    result = imgops("gray", source, "-d", out)
    assert result.returncode == 0, result.stderr
    assert errors(result) == []
    written = sorted(p.name for p in out.iterdir())
    assert written == sorted(Path(n).stem + ".png" for n in names)
    alongside = imgops("gray", source / names[1])  # default name: <stem>_gray.png, 254 bytes
    assert alongside.returncode == 0, alongside.stderr
    assert (source / (Path(names[1]).stem + "_gray.png")).is_file()


def test_temporary_names_stay_short_for_any_legal_name(tmp_path: Path):
    for name in ("x" * 255, "y" * 200 + "." + "z" * 54, "火" * 85, "a.png", ".png", "noext"):
        temp = atomic.temporary_path_for(tmp_path / name)
        assert len(os.fsencode(temp.name)) <= 110, temp.name
        assert temp.name.startswith(".") and TEMP in temp.name
        assert atomic.temporary_owner(temp) == os.getpid()
        temp.write_bytes(b"ok")  # the file system takes it
    assert atomic.temporary_path_for(tmp_path / "a.tif").suffix == ".tif"


# ------------------------------------------------------------------ stale temporaries


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_stale_temporaries_are_dead_and_old_only(tmp_path: Path):
    dead = _dead_pid()
    old_dead = tmp_path / f".a.imgops-tmp-{dead}-0123abcd.png"
    new_dead = tmp_path / f".b.imgops-tmp-{dead}-0123abce.png"
    old_alive = tmp_path / f".c.imgops-tmp-{os.getppid()}-0123abcf.png"
    lookalike = tmp_path / f"d.imgops-tmp-{dead}-nothex00.png"
    for path in (old_dead, new_dead, old_alive, lookalike):
        path.write_bytes(b"partial")
    for path in (old_dead, old_alive, lookalike):
        _age(path, 3600)
    assert atomic.stale_temporaries(tmp_path) == [old_dead]
    assert atomic.stale_temporaries(tmp_path, min_age_seconds=0) == sorted([old_dead, new_dead])
    assert atomic.remove_stale_temporaries(tmp_path) == [old_dead]
    assert not old_dead.exists() and new_dead.exists() and old_alive.exists()


def test_a_later_run_removes_the_temporaries_of_a_sigkilled_run(tmp_path: Path):
    """Issue 11.6: temp files of killed runs (SIGKILL) were never cleaned by later runs."""
    source = tmp_path / "in"
    source.mkdir()
    for i in range(24):
        os.link(SAMPLES / "flower_rgb_3mp.png", source / f"f{i:02d}.png")
    out = tmp_path / "out"
    process = subprocess.Popen(
        [sys.executable, "-m", "imgops.cli", "gray", source, "-d", out, "-j", "2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=ENV,
    )
    deadline = time.monotonic() + 60
    while not (out.is_dir() and any(TEMP in p.name for p in out.iterdir())):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.skip("the batch finished before a temporary file could be caught")
        time.sleep(0.002)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    left = [p for p in out.iterdir() if TEMP in p.name]
    if not left:
        pytest.skip("the temporary file was committed before the kill arrived")
    assert all(atomic.temporary_owner(p) == process.pid for p in left)
    for path in left:
        _age(path, atomic.STALE_AFTER_SECONDS + 60)
    finished = sorted(p.name for p in out.iterdir() if TEMP not in p.name)
    rerun = imgops("gray", SAMPLES / "coffee_rgb.png", "-o", out / "later.png")
    assert rerun.returncode == 0, rerun.stderr
    assert [p for p in out.iterdir() if TEMP in p.name] == []  # the killed run's are gone
    assert sorted(p.name for p in out.iterdir()) == sorted([*finished, "later.png"])


# ------------------------------------------------------------------ the signal handlers' clean-up


@pytest.fixture
def fresh_atomic_state(monkeypatch):
    """The atomic writer's process-wide state, restored after the test."""
    monkeypatch.setattr(atomic, "_pending", set())
    monkeypatch.setattr(atomic, "_folders", set())
    monkeypatch.setattr(atomic, "_terminating", False)


def test_final_clean_up_sweeps_a_temporary_recreated_after_its_unlink(
    tmp_path: Path, monkeypatch, fresh_atomic_state
):
    """A worker thread still running while the SIGHUP/SIGTERM handler runs can create its
    temporary after the handler unlinked it (the suspected cause of one SIGHUP test failure
    under load, test_reliability_classes.py); the handler's sweep of this process's
    temporaries in the folders it wrote in removes it."""
    late = []
    real_sleep = time.sleep

    def worker_writes_late(seconds: float) -> None:
        for temp in held:  # what the worker's open(temp, "wb") does after the first unlink
            temp.write_bytes(b"partial")
            late.append(temp)
        held.clear()
        real_sleep(seconds)

    monkeypatch.setattr(atomic.time, "sleep", worker_writes_late)
    with atomic.atomic_output(tmp_path / "a.png", overwrite=False) as temp:
        held = [temp]
        atomic.remove_pending_temporaries(final=True)
        assert late == [temp]
        assert [p for p in tmp_path.iterdir() if TEMP in p.name] == []
        exiting = pytest.raises(atomic.ExitingError, match="exiting")  # nothing new starts
        with exiting, atomic.atomic_output(tmp_path / "b.png", overwrite=False):
            pass
        temp.write_bytes(b"x")  # (so the commit below has a file; the process would be gone)
    assert not any(TEMP in p.name for p in tmp_path.iterdir())


def test_final_clean_up_leaves_other_processes_temporaries(tmp_path: Path, fresh_atomic_state):
    other = tmp_path / f".a.imgops-tmp-{os.getppid()}-0123abcd.png"
    other.write_bytes(b"another run's")
    with atomic.atomic_output(tmp_path / "mine.png", overwrite=True) as temp:
        temp.write_bytes(b"mine")
        atomic.remove_pending_temporaries(final=True)
        assert not temp.exists() and other.exists()
        temp.write_bytes(b"x")


@pytest.mark.parametrize("writer", ["python", "native"])
def test_final_clean_up_waits_for_a_write_in_progress(
    tmp_path: Path, monkeypatch, fresh_atomic_state, writer: str
):
    """A worker that (re)creates its temporary 50 ms after the handler started: the handler
    waits for the write to end (committed here) instead of racing it; nothing is left. Both
    writers: the os-level one, and the native call that writes and commits in one go."""
    import threading
    import types

    entered = threading.Event()

    def worker() -> None:
        with contextlib.suppress(OSError):
            atomic.write_bytes_atomic(tmp_path / "slow.png", b"late", overwrite=False)

    if writer == "python":
        monkeypatch.setattr(atomic, "cli_kernels", lambda: None)
        original = atomic.commit

        def slow_commit(temp, target, **options):
            entered.set()
            time.sleep(0.05)
            temp.write_bytes(b"late")  # what a writer still inside its block may do
            original(temp, target, **options)

        monkeypatch.setattr(atomic, "commit", slow_commit)
    else:
        kernels = atomic.cli_kernels()
        if kernels is None:
            pytest.skip("imgops._cli_kernels was not built")

        def slow_native(*args):
            entered.set()
            time.sleep(0.05)
            return kernels.write_file_atomic(*args)

        fake = types.SimpleNamespace(write_file_atomic=slow_native)
        monkeypatch.setattr(atomic, "cli_kernels", lambda: fake)
    thread = threading.Thread(target=worker)
    thread.start()
    assert entered.wait(5)
    atomic.remove_pending_temporaries(final=True)
    # The process exits right here: the write must be over by now, or its file outlives it.
    assert not thread.is_alive()
    thread.join(5)
    assert not any(TEMP in p.name for p in tmp_path.iterdir())
    assert (tmp_path / "slow.png").read_bytes() == b"late"


@pytest.mark.parametrize("kind", ["bytes", "empty", "uint16 array", "2-D view"])
def test_write_bytes_atomic_writes_every_byte_of_any_buffer(tmp_path, kind):
    """os.write underneath: multi-byte items and 2-D buffers are written as their bytes."""
    import numpy as np

    from imgops.io.atomic import write_bytes_atomic

    array = np.arange(3 * 70001, dtype=np.uint16).reshape(3, 70001)
    data = {
        "bytes": array.tobytes(),
        "empty": b"",
        "uint16 array": memoryview(array.reshape(-1)),
        "2-D view": memoryview(array),
    }[kind]
    target = tmp_path / "out.bin"
    expected = bytes(memoryview(data).cast("B")) if kind != "bytes" else data
    assert write_bytes_atomic(target, data, overwrite=False) == len(expected)
    assert target.read_bytes() == expected
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]  # no temporary left
