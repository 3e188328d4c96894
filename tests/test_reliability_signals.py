"""Interruptions and resource limits in real processes (issue 6): nothing partial is left.

SIGINT/SIGTERM/SIGHUP (a closed terminal)/SIGQUIT during a gray batch and during a normvol
batch exit 128+N (130/143/129/131) and leave only complete outputs and no temporary file; a
full disk (RLIMIT_FSIZE with SIGXFSZ ignored, so writes fail with EFBIG) is one clear error
with no partial file; two processes writing into one folder never clobber.
(A signal in the middle of one large stack is tests/test_cli_normvol.py's slow test.)
The signal and full-disk cases run on the CPU and, where there is a GPU, on CUDA.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
import tifffile

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
TEMP = ".imgops-tmp-"
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONWARNINGS": "ignore"}


def imgops(*args: object, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "imgops.cli", *map(str, args)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        **kwargs,
    )


def temporaries(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if TEMP in p.name]


def finished(folder: Path, suffix: str) -> list[Path]:
    return [p for p in folder.glob(f"*{suffix}") if TEMP not in p.name]


def wait_for(condition, process: subprocess.Popen, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            _, stderr = process.communicate()
            pytest.fail(f"the work finished or stalled before it could be interrupted: {stderr}")
        time.sleep(0.01)


def luma(bgr: np.ndarray) -> np.ndarray:
    wide = bgr.astype(np.int64)
    return ((299 * wide[..., 2] + 587 * wide[..., 1] + 114 * wide[..., 0] + 500) // 1000).astype(
        bgr.dtype
    )


@pytest.fixture(scope="module")
def expected_flower() -> np.ndarray:
    return luma(cv2.imread(str(SAMPLES / "flower_rgb_3mp.png"), cv2.IMREAD_COLOR))


@pytest.fixture(scope="module")
def expected_coffee() -> np.ndarray:
    return luma(cv2.imread(str(SAMPLES / "coffee_rgb.png"), cv2.IMREAD_COLOR))


def _batch(folder: Path, count: int, name: str = "flower_rgb_3mp.png") -> Path:
    source = folder / "in"
    source.mkdir()
    for i in range(count):
        os.link(SAMPLES / name, source / f"f{i:02d}.png")
    return source


BATCH_SIGNALS = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT]
BATCH_SIGNAL_IDS = ["SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT"]


@pytest.mark.parametrize("signum", BATCH_SIGNALS, ids=BATCH_SIGNAL_IDS)
def test_signal_during_a_gray_batch_leaves_only_complete_outputs(
    tmp_path, signum, expected_flower, device
):
    source = _batch(tmp_path, 24)
    out = tmp_path / "out"
    process = imgops("gray", source, "-d", out, "-j", "2", "--device", device)
    wait_for(lambda: out.is_dir() and len(finished(out, ".png")) >= 1, process)
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signum, stderr
    assert "Traceback" not in stderr
    written = finished(out, ".png")
    assert 1 <= len(written) < 24, "the batch was not interrupted"
    assert temporaries(tmp_path) == []
    for path in written:  # every file left behind is whole and right
        np.testing.assert_array_equal(cv2.imread(str(path), cv2.IMREAD_UNCHANGED), expected_flower)


def _stack(path: Path, depth: int, side: int = 512) -> None:
    slices = tifffile.imread(SAMPLES / "mri_dwi_b0_u16.tif")
    with tifffile.TiffWriter(path) as writer:
        writer.write(
            (np.resize(slices[z % len(slices)], (side, side)) for z in range(depth)),
            shape=(depth, side, side),
            dtype="uint16",
            photometric="minisblack",
        )


@pytest.mark.slow
@pytest.mark.parametrize("signum", BATCH_SIGNALS, ids=BATCH_SIGNAL_IDS)
def test_signal_during_a_normvol_batch_keeps_the_finished_stack(tmp_path, signum, device):
    for name in ("a.tif", "b.tif"):
        _stack(tmp_path / name, 200)
    out = tmp_path / "out"
    process = imgops(
        "normvol", tmp_path / "a.tif", tmp_path / "b.tif", "-d", out, "--max", 4095,
        "--chunk-mb", 1, "--device", device,
    )  # fmt: skip
    wait_for(lambda: (out / "a.tif").exists() and temporaries(out), process)
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signum, stderr
    assert sorted(p.name for p in out.iterdir()) == ["a.tif"]
    result = tifffile.imread(out / "a.tif")
    assert result.shape == (200, 512, 512)
    np.testing.assert_array_equal(
        result[::37], tifffile.imread(tmp_path / "a.tif")[::37].astype(np.float32) / 4095
    )


def _file_size_limit(limit: int):
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_full_disk_during_gray_is_one_error_and_nothing_partial(tmp_path, device):
    shutil.copy(SAMPLES / "coffee_rgb.png", tmp_path / "small.png")
    shutil.copy(SAMPLES / "flower_rgb_3mp.png", tmp_path / "big.png")
    out = tmp_path / "out"
    out.mkdir()
    process = imgops(
        "gray", tmp_path / "small.png", tmp_path / "big.png", "-d", out, "--device", device,
        preexec_fn=_file_size_limit(400_000),
    )  # fmt: skip
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 1, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("imgops: error:")]
    assert len(errors) == 1 and "big.png" in errors[0] and "File too large" in errors[0], stderr
    assert "Traceback" not in stderr
    assert sorted(p.name for p in out.iterdir()) == ["small.png"]  # no partial big.png


def test_full_disk_during_normvol_is_one_error_and_nothing_partial(tmp_path, device):
    shutil.copy(SAMPLES / "mri_fmri_imagej.tif", tmp_path / "scan.tif")
    process = imgops(
        "normvol", tmp_path / "scan.tif", "--max", 1162, "--device", device,
        preexec_fn=_file_size_limit(300_000),
    )  # fmt: skip
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 1, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("imgops: error:")]
    assert len(errors) == 1 and "scan_norm.tif" in errors[0], stderr
    assert "cannot write" in errors[0] and "Traceback" not in stderr
    assert "File too large" in errors[0] or "disk full" in errors[0], errors[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scan.tif"]


@pytest.mark.parametrize("mode", ["refuse", "overwrite"])
def test_two_processes_writing_one_folder_never_clobber(tmp_path, mode, expected_coffee):
    source = _batch(tmp_path, 16, "coffee_rgb.png")
    out = tmp_path / "out"
    extra = ["--overwrite"] if mode == "overwrite" else []
    first, second = (
        imgops("gray", source, "-d", out, "-j", "1", "--device", "cpu", *extra) for _ in range(2)
    )
    results = [p.communicate(timeout=120) + (p.returncode,) for p in (first, second)]
    for _, stderr, code in results:
        assert code in (0, 1) and "Traceback" not in stderr, stderr
        for line in stderr.splitlines():
            if line.startswith("imgops: error:"):
                assert "exists (use --overwrite)" in line, line
    if mode == "refuse":  # each output written by exactly one of them
        written = sum(int(stderr.splitlines()[-1].split()[0]) for _, stderr, _ in results)
        assert written == 16, results
    assert sorted(p.name for p in out.iterdir()) == [f"f{i:02d}.png" for i in range(16)]
    for path in out.iterdir():
        np.testing.assert_array_equal(cv2.imread(str(path), cv2.IMREAD_UNCHANGED), expected_coffee)
