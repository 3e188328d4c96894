"""Issue 11, every bullet of classes 1-7, through the command line only.

Each test runs `imgops` in a real process (a hang fails the test after a timeout) and checks
the symptom the issue describes, so the same file runs against the code before the fixes
(commit c38caee, `PYTHONPATH=OLD/src`): this file imports nothing of imgops. Every test here
failed there and passes now, except those marked `xfail(strict=True)`: bullets still broken,
with the file and function to fix in the reason (they turn into failures once fixed, so the
mark is removed then). The result of each test on both codes is in docs/RELIABILITY.md.

Unreadable entries: root ignores permission bits, so as root the command runs under
`setpriv` with CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH dropped (then chmod 000 applies to
root as to any owner); without setpriv those tests skip.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import stat
import struct
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
import tifffile

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
ENV = {**os.environ, "PYTHONWARNINGS": "ignore"}
TEMP = "imgops-tmp"  # old and new temporaries both carry it
SETPRIV = shutil.which("setpriv")
NO_DAC = [
    "--inh-caps=-dac_override,-dac_read_search",
    "--bounding-set=-dac_override,-dac_read_search",
]


def imgops(
    *args: object, timeout: float = 90, no_dac: bool = False, env: dict | None = None, **kwargs
) -> subprocess.CompletedProcess:
    """`imgops ARGS` in a real process; a hang past `timeout` fails the test."""
    prefix = [SETPRIV, *NO_DAC] if no_dac and os.geteuid() == 0 else []
    kwargs.setdefault("stdout", subprocess.PIPE)
    try:
        return subprocess.run(
            [*prefix, sys.executable, "-m", "imgops.cli", *map(str, args)],
            stderr=subprocess.PIPE,
            env={**ENV, **(env or {})},
            timeout=timeout,
            **kwargs,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"imgops {' '.join(map(str, args))} hung for {timeout} s")


def stderr_of(result: subprocess.CompletedProcess) -> str:
    text = result.stderr.decode(errors="replace")
    assert "Traceback" not in text, text
    return text


def error_lines(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in stderr_of(result).splitlines() if "error:" in line.lower()]


def luma(bgr: np.ndarray) -> np.ndarray:
    wide = bgr.astype(np.int64)
    y = (299 * wide[..., 2] + 587 * wide[..., 1] + 114 * wide[..., 0] + 500) // 1000
    return y.astype(bgr.dtype)


def expected_gray(path: Path) -> np.ndarray:
    return luma(cv2.imread(str(path), cv2.IMREAD_COLOR))


def read_png(path: Path) -> np.ndarray:
    return cv2.imread(str(path), cv2.IMREAD_UNCHANGED)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def temporaries(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if TEMP in p.name]


def can_drop_dac() -> bool:
    return os.geteuid() != 0 or SETPRIV is not None


needs_permissions = pytest.mark.skipif(
    not can_drop_dac(), reason="root without setpriv: permission bits do not apply"
)


# ------------------------------------------------------------ class 1: inputs overwritten


@pytest.fixture
def pair(tmp_path: Path) -> Path:
    """in/ holding a.jpg and a.png (different pictures) and b.png."""
    folder = tmp_path / "in"
    folder.mkdir()
    shutil.copy(SAMPLES / "rocket_baseline_rgb.jpg", folder / "a.jpg")
    shutil.copy(SAMPLES / "light_palette_64px.png", folder / "a.png")
    shutil.copy(SAMPLES / "coffee_rgb.png", folder / "b.png")
    return folder


@pytest.mark.parametrize("overwrite", [True, False], ids=["overwrite", "no-overwrite"])
def test_c1_output_dir_equal_to_the_input_folder(pair: Path, overwrite: bool):
    """Landed: --overwrite replaced a.png with the gray of a.jpg (exit 0); without it a.png
    was silently left out of the batch (exit 0)."""
    before = snapshot(pair)
    result = imgops("gray", pair, "-d", pair, *(["--overwrite"] if overwrite else []))
    assert snapshot(pair) == before
    # the batch is refused as a whole (exit 2), naming the input it would replace; the landed
    # code without --overwrite failed a.jpg alone ("output in/a.png exists", exit 1) and never
    # said that the inputs a.png and b.png were left out
    assert result.returncode == 2, stderr_of(result)
    (line,) = [line for line in stderr_of(result).splitlines() if line.startswith("Error:")]
    assert "a.png" in line, line


def test_c1_named_input_that_is_another_inputs_default_output(tmp_path: Path):
    shutil.copy(SAMPLES / "coffee_rgb.png", tmp_path / "a.png")
    shutil.copy(SAMPLES / "camera_gray.png", tmp_path / "a_gray.png")  # not an imgops output
    before = (tmp_path / "a_gray.png").read_bytes()
    imgops("gray", tmp_path / "a_gray.png", tmp_path / "a.png", "--overwrite")
    assert (tmp_path / "a_gray.png").read_bytes() == before


def test_c1_normvol_output_equal_to_another_input(tmp_path: Path):
    shutil.copy(SAMPLES / "mri_dwi_b0_u16.tif", tmp_path / "a.tif")
    shutil.copy(SAMPLES / "mri_fmri_imagej.tif", tmp_path / "a_norm.tif")
    before = (tmp_path / "a_norm.tif").read_bytes()
    imgops("normvol", tmp_path / "a_norm.tif", tmp_path / "a.tif", "--max", 4095, "--overwrite")
    assert (tmp_path / "a_norm.tif").read_bytes() == before


def test_c1_stats_json_onto_an_input(pair: Path, tmp_path: Path):
    """Landed: the plain write replaced the input b.png with JSON, exit 0."""
    before = snapshot(pair)
    imgops("gray", pair / "b.png", "-d", tmp_path / "out", "--stats-json", pair / "b.png")
    assert snapshot(pair) == before


def test_c1_stats_json_through_a_hard_link_of_an_input(pair: Path, tmp_path: Path):
    """A second name of the input: an in-place (truncating) write changes the input itself."""
    link = tmp_path / "stats.json"
    os.link(pair / "b.png", link)
    before = snapshot(pair)
    imgops("gray", pair / "b.png", "-d", tmp_path / "out", "--stats-json", link)
    assert snapshot(pair) == before


def test_c1_stats_json_onto_the_output_just_written(pair: Path, tmp_path: Path):
    """Landed: out.png was written, then replaced by the JSON, exit 0."""
    target = tmp_path / "out.png"
    result = imgops("gray", pair / "b.png", "-o", target, "--stats-json", target)
    if target.exists():  # allowed only if it is the image, exact
        image = read_png(target)
        assert image is not None, f"{target} is not an image: {target.read_bytes()[:40]!r}"
        np.testing.assert_array_equal(image, expected_gray(pair / "b.png"))
    else:
        assert result.returncode == 2, stderr_of(result)


def _device_node(path: Path) -> bool:
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # the device of /dev/null
    except OSError:
        return False
    return True


@pytest.mark.parametrize("kind", ["fifo", "char_device"])
@pytest.mark.parametrize("command", ["gray", "normvol"])
def test_c1_non_regular_output_survives_overwrite(tmp_path: Path, kind: str, command: str):
    """Landed: `-o /dev/xyz --overwrite` renamed a regular file over the device node."""
    target = tmp_path / ("target.png" if command == "gray" else "target.tif")
    if kind == "fifo":
        os.mkfifo(target)
    elif not _device_node(target):
        pytest.skip("os.mknod is not permitted here")
    if command == "gray":
        args = ["gray", SAMPLES / "coffee_rgb.png"]
    else:
        args = ["normvol", SAMPLES / "mri_dwi_b0_u16.tif", "--max", 4095]
    result = imgops(*args, "-o", target, "--overwrite", timeout=120)
    mode = os.lstat(target).st_mode
    assert stat.S_ISFIFO(mode) if kind == "fifo" else stat.S_ISCHR(mode), oct(mode)
    assert result.returncode in (1, 2), stderr_of(result)
    assert temporaries(tmp_path) == []


# ----------------------------------------------------- class 2: truncated stdout as success


def _file_size_limit(limit: int):
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit: a short write, then EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


@pytest.mark.parametrize("unbuffered", ["1", ""], ids=["unbuffered", "buffered"])
def test_c2_stdout_short_write_on_a_filling_disk(tmp_path: Path, unbuffered: str):
    """Landed, with PYTHONUNBUFFERED=1: write() wrote 100000 of the 149271 bytes and returned
    that count; it was ignored: "1 written", exit 0, a truncated PNG."""
    target = tmp_path / "stdout.png"
    with open(target, "wb") as sink:
        result = imgops(
            "gray", SAMPLES / "coffee_rgb.png", "-o", "-", stdout=sink,
            env={"PYTHONUNBUFFERED": unbuffered}, preexec_fn=_file_size_limit(100_000),
        )  # fmt: skip
    assert target.stat().st_size == 100_000  # the case is a short write
    assert result.returncode == 1, stderr_of(result)
    assert "1 written" not in stderr_of(result)
    (line,) = error_lines(result)
    assert "stdout" in line, line
    assert "wrote 0 of" not in line, line  # 100 000 bytes did reach the file


@pytest.mark.parametrize("unbuffered", ["1", ""], ids=["unbuffered", "buffered"])
def test_c2_stdout_on_a_full_disk(unbuffered: str):
    """/dev/full fails the first write with ENOSPC: handled by the landed code too (a guard)."""
    with open("/dev/full", "wb") as full:
        result = imgops(
            "gray", SAMPLES / "coffee_rgb.png", "-o", "-", stdout=full,
            env={"PYTHONUNBUFFERED": unbuffered},
        )  # fmt: skip
    assert result.returncode == 1, stderr_of(result)
    assert "1 written" not in stderr_of(result)
    assert len(error_lines(result)) == 1, stderr_of(result)


def test_c2_reader_closes_the_pipe_early():
    process = subprocess.Popen(
        [sys.executable, "-m", "imgops.cli", "gray", SAMPLES / "flower_rgb_3mp.png", "-o", "-"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**ENV, "PYTHONUNBUFFERED": "1"},
    )
    assert process.stdout is not None
    process.stdout.read(10)
    process.stdout.close()
    try:
        _, stderr = process.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail("imgops hung writing to a closed pipe")
    text = stderr.decode(errors="replace")
    assert process.returncode == 1, text
    assert "1 written" not in text and "Traceback" not in text


# -------------------------------------------------------- class 3: hangs and exhaustion


def test_c3_fifo_as_gray_input(tmp_path: Path):
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    result = imgops("gray", fifo, "-o", tmp_path / "out.png", timeout=60)
    assert result.returncode == 1, stderr_of(result)
    (line,) = error_lines(result)
    assert "pipe.png" in line


def test_c3_fifo_inside_a_folder(tmp_path: Path):
    source = tmp_path / "in"
    source.mkdir()
    shutil.copy(SAMPLES / "coffee_rgb.png", source / "good.png")
    os.mkfifo(source / "stuck.png")
    result = imgops("gray", source, "-d", tmp_path / "out", timeout=60)
    assert result.returncode == 1, stderr_of(result)
    (line,) = error_lines(result)
    assert "stuck.png" in line
    good = read_png(tmp_path / "out" / "good.png")
    np.testing.assert_array_equal(good, expected_gray(SAMPLES / "coffee_rgb.png"))


def test_c3_fifo_as_normvol_input(tmp_path: Path):
    fifo = tmp_path / "pipe.tif"
    os.mkfifo(fifo)
    result = imgops("normvol", fifo, "--max", 4095, "-o", tmp_path / "o.tif", timeout=60)
    assert result.returncode == 1, stderr_of(result)
    assert any("pipe.tif" in line for line in error_lines(result)), stderr_of(result)


def _address_space(limit: int):
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


@pytest.mark.parametrize("command", ["gray", "normvol"])
def test_c3_dev_zero_as_input(tmp_path: Path, command: str):
    """Landed: gray read /dev/zero until a bare MemoryError."""
    link = tmp_path / ("zero.png" if command == "gray" else "zero.tif")
    link.symlink_to("/dev/zero")
    extra = ["--max", 4095] if command == "normvol" else []
    result = imgops(
        command, link, *extra, "-o", tmp_path / f"o{link.suffix}", timeout=60,
        preexec_fn=_address_space(8 << 30),
    )  # fmt: skip
    assert result.returncode == 1, stderr_of(result)
    lines = error_lines(result)
    assert len(lines) == 1 and "zero" in lines[0] and "MemoryError" not in lines[0], lines
    assert "device" in lines[0], lines  # refused as a non-regular file, not read


def _tiff_with_ifd_after_pixels(width: int, height: int) -> bytes:
    """An uncompressed 8-bit gray TIFF whose only IFD follows all of its pixels."""
    pixels = bytes(range(256)) * (width * height // 256) + bytes(width * height % 256)
    data = bytearray(b"II*\x00\x00\x00\x00\x00") + pixels
    if len(data) % 2:
        data += b"\x00"
    struct.pack_into("<I", data, 4, len(data))
    entries = [
        (256, 4, width), (257, 4, height), (258, 3, 8), (259, 3, 1), (262, 3, 1),
        (273, 4, 8), (277, 3, 1), (278, 4, height), (279, 4, width * height),
    ]  # fmt: skip
    data += struct.pack("<H", len(entries))
    for tag, kind, value in entries:
        data += struct.pack("<HHI", tag, kind, 1) + struct.pack(
            "<H2x" if kind == 3 else "<I", value
        )
    return bytes(data + b"\x00\x00\x00\x00")


def test_c3_pixel_limit_sees_a_tiff_ifd_after_the_pixels(tmp_path: Path):
    """Landed: the check parsed the first 64 KiB only; this 90 kP TIFF passed a 10 kP limit."""
    path = tmp_path / "late_ifd.tif"
    path.write_bytes(_tiff_with_ifd_after_pixels(300, 300))
    assert path.stat().st_size > 1 << 16
    limit = {"IMGOPS_MAX_IMAGE_PIXELS": "10000"}
    result = imgops("gray", path, "-o", tmp_path / "o.png", env=limit)
    assert result.returncode == 1, stderr_of(result)
    (line,) = error_lines(result)
    assert "late_ifd.tif" in line and "90000" in line, line
    assert not (tmp_path / "o.png").exists()
    allowed = imgops(
        "gray", path, "-o", tmp_path / "o.png", env={"IMGOPS_MAX_IMAGE_PIXELS": "90000"}
    )
    assert allowed.returncode == 0, stderr_of(allowed)  # the file itself is valid


# ---------------------------------------------- class 4: one bad entry stops the batch


def test_c4_symlink_loop_under_recursive(tmp_path: Path):
    source = tmp_path / "in"
    (source / "sub").mkdir(parents=True)
    shutil.copy(SAMPLES / "coffee_rgb.png", source / "b.png")
    shutil.copy(SAMPLES / "light_palette_64px.png", source / "sub" / "c.png")
    os.symlink("self.png", source / "self.png")
    os.symlink("..", source / "sub" / "up")
    result = imgops("gray", source, "-r", "-d", tmp_path / "out")
    assert result.returncode == 1, stderr_of(result)
    assert "RuntimeError" not in stderr_of(result)
    assert any("self.png" in line for line in error_lines(result)), stderr_of(result)
    assert (tmp_path / "out" / "b.png").is_file() and (tmp_path / "out" / "sub" / "c.png").is_file()


@pytest.mark.parametrize("stem_bytes", [225, 240, 251])
def test_c4_long_stems_get_their_outputs(tmp_path: Path, stem_bytes: int):
    """Landed: Errno 36 from the hidden temporary name (it passed 255 bytes)."""
    source = tmp_path / "in"
    source.mkdir()
    name = "s" * stem_bytes + ".png"
    shutil.copy(SAMPLES / "coffee_rgb.png", source / name)
    shutil.copy(SAMPLES / "light_palette_64px.png", source / "short.png")
    result = imgops("gray", source, "-d", tmp_path / "out")
    assert result.returncode == 0, stderr_of(result)
    np.testing.assert_array_equal(
        read_png(tmp_path / "out" / name), expected_gray(SAMPLES / "coffee_rgb.png")
    )
    assert (tmp_path / "out" / "short.png").is_file()


def test_c4_default_output_name_beside_the_input(tmp_path: Path):
    name = "d" * 245 + ".png"  # default output: 245 + len("_gray.png") = 254 bytes
    shutil.copy(SAMPLES / "coffee_rgb.png", tmp_path / name)
    result = imgops("gray", tmp_path / name)
    assert result.returncode == 0, stderr_of(result)
    assert (tmp_path / ("d" * 245 + "_gray.png")).is_file()
    assert temporaries(tmp_path) == []


def test_c4_output_sub_folder_that_is_a_file(tmp_path: Path):
    source = tmp_path / "in"
    (source / "sub").mkdir(parents=True)
    shutil.copy(SAMPLES / "coffee_rgb.png", source / "b.png")
    shutil.copy(SAMPLES / "light_palette_64px.png", source / "sub" / "c.png")
    out = tmp_path / "out"
    out.mkdir()
    (out / "sub").write_text("a file where a folder goes")
    result = imgops("gray", source, "-r", "-d", out)
    assert result.returncode == 1, stderr_of(result)
    assert "FileExistsError" not in stderr_of(result)
    assert any("sub" in line for line in error_lines(result))
    assert (out / "b.png").is_file()
    assert (out / "sub").read_text() == "a file where a folder goes"


@pytest.mark.parametrize(
    "bounds",
    [("--max", "1e-300"), ("--max", "1e39"), ("--min", "-3e38", "--max", "3e38")],
    ids=["tiny", "huge", "too-wide"],
)
def test_c4_normvol_bounds_float32_cannot_hold(tmp_path: Path, bounds: tuple):
    """Landed: `ValueError: normalize_volume: ...`, no file named, the next stacks never ran."""
    for name in ("a.tif", "b.tif"):
        shutil.copy(SAMPLES / "mri_dwi_b0_u16.tif", tmp_path / name)
    result = imgops(
        "normvol", tmp_path / "a.tif", tmp_path / "b.tif", *bounds, "-d", tmp_path / "o"
    )
    assert result.returncode == 1, stderr_of(result)
    lines = error_lines(result)
    assert "ValueError" not in stderr_of(result)
    assert any("a.tif" in line for line in lines) and any("b.tif" in line for line in lines), lines


@needs_permissions
def test_c4_unreadable_normvol_input_fails_alone(tmp_path: Path):
    os.chmod(tmp_path, 0o755)
    for name in ("a.tif", "b.tif"):
        shutil.copy(SAMPLES / "mri_dwi_b0_u16.tif", tmp_path / name)
    (tmp_path / "a.tif").chmod(0)
    result = imgops(
        "normvol", tmp_path / "a.tif", tmp_path / "b.tif", "--max", 4095, "-d", tmp_path / "o",
        no_dac=True,
    )  # fmt: skip
    assert result.returncode == 1, stderr_of(result)
    assert any("a.tif" in line for line in error_lines(result))
    assert (tmp_path / "o" / "b.tif").is_file()


@needs_permissions
def test_c4_unreadable_gray_input_fails_alone(tmp_path: Path):
    source = tmp_path / "in"
    source.mkdir()
    shutil.copy(SAMPLES / "coffee_rgb.png", source / "a.png")
    shutil.copy(SAMPLES / "coffee_rgb.png", source / "locked.png")
    (source / "locked.png").chmod(0)
    result = imgops(
        "gray", source / "locked.png", source / "a.png", "-d", tmp_path / "o", no_dac=True
    )
    assert result.returncode == 1, stderr_of(result)
    assert any("locked.png" in line for line in error_lines(result))
    assert (tmp_path / "o" / "a.png").is_file()


# ---------------------------------------------------------- class 5: silent missing work


@needs_permissions
def test_c5_unreadable_folder_is_an_error(tmp_path: Path):
    locked = tmp_path / "locked"
    locked.mkdir()
    shutil.copy(SAMPLES / "coffee_rgb.png", locked / "x.png")
    locked.chmod(0)
    try:
        result = imgops("gray", locked, "-d", tmp_path / "o", no_dac=True)
    finally:
        locked.chmod(0o755)
    assert result.returncode == 1, stderr_of(result)
    assert any("locked" in line for line in error_lines(result)), stderr_of(result)


@needs_permissions
def test_c5_unreadable_sub_folder_under_recursive_is_an_error(tmp_path: Path):
    source = tmp_path / "in"
    (source / "sub").mkdir(parents=True)
    shutil.copy(SAMPLES / "coffee_rgb.png", source / "b.png")
    shutil.copy(SAMPLES / "coffee_rgb.png", source / "sub" / "c.png")
    (source / "sub").chmod(0)
    try:
        result = imgops("gray", source, "-r", "-d", tmp_path / "o", no_dac=True)
    finally:
        (source / "sub").chmod(0o755)
    assert result.returncode == 1, stderr_of(result)
    assert any("sub" in line for line in error_lines(result)), stderr_of(result)
    assert (tmp_path / "o" / "b.png").is_file()


# --------------------------------------------------------------------- class 6: signals


def _batch(folder: Path, count: int) -> Path:
    source = folder / "in"
    source.mkdir()
    for i in range(count):
        os.link(SAMPLES / "flower_rgb_3mp.png", source / f"f{i:02d}.png")
    return source


def _start(*args: object) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "imgops.cli", *map(str, args)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**ENV, "PYTHONUNBUFFERED": "1"},
    )


def _wait_for_a_temporary(process: subprocess.Popen, out: Path, seconds: float = 90) -> bool:
    deadline = time.monotonic() + seconds
    while not (out.is_dir() and temporaries(out)):
        if process.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGQUIT], ids=["SIGHUP", "SIGQUIT"])
def test_c6_hup_and_quit_leave_no_temporary(tmp_path: Path, signum: int):
    out = tmp_path / "out"
    process = _start("gray", _batch(tmp_path, 24), "-d", out, "-j", "2")
    caught = _wait_for_a_temporary(process, out)
    process.send_signal(signum)
    process.communicate(timeout=90)
    if not caught:
        pytest.skip("the batch finished before a temporary file could be caught")
    assert temporaries(tmp_path) == []
    expected = expected_gray(SAMPLES / "flower_rgb_3mp.png")
    for path in out.glob("*.png"):
        np.testing.assert_array_equal(read_png(path), expected)


def test_c6_a_later_run_removes_the_temporaries_of_a_killed_run(tmp_path: Path):
    out = tmp_path / "out"
    process = _start("gray", _batch(tmp_path, 24), "-d", out, "-j", "2")
    caught = _wait_for_a_temporary(process, out)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    left = temporaries(out)
    if not caught or not left:
        pytest.skip("no temporary file was caught before the kill")
    hour_ago = time.time() - 3600
    for path in left:
        os.utime(path, (hour_ago, hour_ago))
    rerun = imgops("gray", SAMPLES / "coffee_rgb.png", "-o", out / "later.png")
    assert rerun.returncode == 0, stderr_of(rerun)
    assert temporaries(out) == []


# --------------------------------------------------------------------- class 7: messages


def test_c7_input_of_two_gib_is_one_clear_line(tmp_path: Path):
    big = tmp_path / "huge.png"
    with open(big, "wb") as handle:
        handle.write((SAMPLES / "coffee_rgb.png").read_bytes())
        handle.truncate((2 << 30) + 5)  # sparse
    result = imgops("gray", big, "-o", tmp_path / "o.png", preexec_fn=_address_space(12 << 30))
    assert result.returncode == 1, stderr_of(result)
    (line,) = error_lines(result)
    assert "huge.png" in line and "GiB" in line, line
    assert "error: (-" not in line and "Assertion" not in line, line


@pytest.mark.parametrize("value", ["abc", "0", "-5"])
def test_c7_invalid_pixel_limit_variable_is_named(tmp_path: Path, value: str):
    result = imgops(
        "gray", SAMPLES / "coffee_rgb.png", "-o", tmp_path / "o.png",
        env={"IMGOPS_MAX_IMAGE_PIXELS": value},
    )  # fmt: skip
    assert result.returncode in (1, 2), stderr_of(result)
    assert "IMGOPS_MAX_IMAGE_PIXELS" in stderr_of(result)
    assert not (tmp_path / "o.png").exists()


def test_c7_invalid_pixel_limit_variable_is_one_usage_error_for_a_batch(tmp_path: Path):
    folder = tmp_path / "in"
    folder.mkdir()
    for name in ("a.png", "b.png", "c.png"):
        shutil.copy(SAMPLES / "coffee_rgb.png", folder / name)
    result = imgops("gray", folder, "-d", tmp_path / "out", env={"IMGOPS_MAX_IMAGE_PIXELS": "lots"})
    assert result.returncode == 2, stderr_of(result)
    lines = error_lines(result)
    assert len(lines) == 1 and "IMGOPS_MAX_IMAGE_PIXELS" in lines[0], lines
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_c7_float16_overflow_is_said(tmp_path: Path):
    result = imgops(
        "normvol", SAMPLES / "mri_dwi_b0_u16.tif", "--max", "0.05", "--dtype", "float16",
        "-o", tmp_path / "o.tif",
    )  # fmt: skip
    assert result.returncode == 0, stderr_of(result)
    written = tifffile.imread(tmp_path / "o.tif")
    overflowed = int(np.isinf(written).sum())
    assert overflowed > 0  # the case does overflow
    lines = [line for line in stderr_of(result).splitlines() if "float16" in line]
    assert lines and str(overflowed) in lines[0], stderr_of(result)


def test_c7_multi_page_tiff_says_page_0(tmp_path: Path):
    pages = np.random.default_rng(11).integers(0, 256, (3, 40, 50, 3), dtype=np.uint8)
    tifffile.imwrite(tmp_path / "multi.tif", pages, photometric="rgb")
    result = imgops("gray", tmp_path / "multi.tif", "-o", tmp_path / "o.png")
    assert result.returncode == 0, stderr_of(result)
    assert "3 pages" in stderr_of(result) and "page 0" in stderr_of(result)
    rgb = pages[0].astype(np.int64)
    page0 = ((299 * rgb[..., 0] + 587 * rgb[..., 1] + 114 * rgb[..., 2] + 500) // 1000).astype(
        np.uint8
    )
    np.testing.assert_array_equal(read_png(tmp_path / "o.png"), page0)
