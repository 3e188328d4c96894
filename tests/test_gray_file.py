"""The Python file API: imgops.gray_file and imgops.normalize_file.

Each writes the same bytes as the command it mirrors (it is the same code), and fails with
plain Python exceptions that name the file, never click's, leaving nothing behind.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import click
import numpy as np
import pytest
import tifffile
from click.testing import CliRunner

import imgops
from imgops.cli import cli
from imgops.errors import FileFailedError, OutputIsInput, PlanError, UsageProblem

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
IMAGES = [
    "coffee_rgb.png",
    "rocket_baseline_rgb.jpg",
    "flower_progressive_3mp.jpg",
    "room_rgb16.png",
    "tulips_rgba.png",
    "light_palette_64px.png",
    "camera_gray.png",
]
STACK = SAMPLES / "mri_anat_shift610_zlib.tif"


def run_cli(*args: object):
    result = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


def bt601(path: Path) -> np.ndarray:
    """The exact integer luma of an RGB(A) sample, computed here with numpy (int64)."""
    import cv2

    pixels = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    if pixels.ndim == 2:
        return pixels
    b, g, r = (pixels[..., i].astype(np.int64) for i in range(3))
    return ((299 * r + 587 * g + 114 * b + 500) // 1000).astype(pixels.dtype)


# ----------------------------------------------------------------------------- gray_file


@pytest.mark.parametrize("name", IMAGES)
def test_gray_file_writes_the_clis_bytes(tmp_path: Path, name: str):
    src = SAMPLES / name
    report = imgops.gray_file(src, tmp_path / "api.png", device="cpu")
    run_cli("gray", src, "-o", tmp_path / "cli.png", "--device", "cpu")
    assert (tmp_path / "api.png").read_bytes() == (tmp_path / "cli.png").read_bytes()
    assert report.outputs == [str(tmp_path / "api.png")] and report.written == 1


def test_gray_file_gives_the_exact_luma(tmp_path: Path):
    import cv2

    src = SAMPLES / "coffee_rgb.png"
    imgops.gray_file(src, tmp_path / "g.png", device="cpu")
    got = cv2.imread(str(tmp_path / "g.png"), cv2.IMREAD_UNCHANGED)
    np.testing.assert_array_equal(got, bt601(src))


@pytest.mark.parametrize(("fmt", "suffix"), [("tif", ".tif"), ("jpg", ".jpg"), ("png", ".png")])
def test_gray_file_formats_and_default_names(tmp_path: Path, fmt: str, suffix: str):
    src = shutil.copy(SAMPLES / "coffee_rgb.png", tmp_path / "c.png")
    report = imgops.gray_file(src, fmt=fmt, device="cpu")
    assert report.outputs == [str(tmp_path / f"c_gray{suffix}")]
    run_cli("gray", src, "-f", fmt, "-o", tmp_path / f"cli{suffix}", "--device", "cpu")
    assert (tmp_path / f"c_gray{suffix}").read_bytes() == (tmp_path / f"cli{suffix}").read_bytes()


def test_gray_file_name_template(tmp_path: Path):
    src = shutil.copy(SAMPLES / "rocket_baseline_rgb.jpg", tmp_path / "r.jpg")
    report = imgops.gray_file(src, name="{parent}_{stem}_{suffix}.{ext}", device="cpu")
    assert report.outputs == [str(tmp_path / f"{tmp_path.name}_r_jpg.png")]


def test_gray_file_errors_are_plain_and_leave_nothing(tmp_path: Path):
    src = shutil.copy(SAMPLES / "coffee_rgb.png", tmp_path / "c.png")
    (tmp_path / "bad.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    cases = [
        (lambda: imgops.gray_file(tmp_path / "nope.png", tmp_path / "o.png"), FileFailedError),
        (lambda: imgops.gray_file(tmp_path / "bad.jpg", tmp_path / "o.png"), FileFailedError),
        (lambda: imgops.gray_file(src, src, overwrite=True), OutputIsInput),
        (lambda: imgops.gray_file(src, tmp_path / "o.xyz"), UsageProblem),
        (lambda: imgops.gray_file(src, tmp_path / "o.png", fmt="jpg"), UsageProblem),
    ]
    for call, kind in cases:
        with pytest.raises(kind) as caught:
            call()
        assert not isinstance(caught.value, click.ClickException)
    bad = pytest.raises(FileFailedError, imgops.gray_file, tmp_path / "bad.jpg", tmp_path / "o.png")
    assert bad.value.path == str(tmp_path / "bad.jpg") and bad.value.reason
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jpg", "c.png"]


def test_gray_file_refuses_an_existing_output_until_overwrite(tmp_path: Path):
    src = SAMPLES / "coffee_rgb.png"
    (tmp_path / "o.png").write_bytes(b"precious")
    with pytest.raises(FileFailedError, match=r"exists \(use --overwrite\)"):
        imgops.gray_file(src, tmp_path / "o.png")
    assert (tmp_path / "o.png").read_bytes() == b"precious"
    imgops.gray_file(src, tmp_path / "o.png", overwrite=True, device="cpu")
    assert (tmp_path / "o.png").read_bytes()[:4] == b"\x89PNG"


def test_gray_file_needs_neither_click_nor_torch(tmp_path: Path):
    code = (
        "import sys, imgops\n"
        f"imgops.gray_file({str(SAMPLES / 'coffee_rgb.png')!r}, {str(tmp_path / 'g.png')!r},"
        " device='cpu')\n"
        "print('click' in sys.modules, 'torch' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    # torch only where imgops._cli_kernels is missing (a just-in-time install)
    from imgops.native import cli_kernels

    assert result.stdout.split() == ["False", str(cli_kernels() is None)]


def test_planner_errors_from_gray_file_carry_the_clis_exit_code(tmp_path: Path):
    src = shutil.copy(SAMPLES / "coffee_rgb.png", tmp_path / "c.png")
    with pytest.raises(PlanError) as caught:
        imgops.gray_file(src, src)
    assert caught.value.exit_code == 2


# ----------------------------------------------------------------------------- normalize_file


def test_normalize_file_writes_the_clis_file(tmp_path: Path):
    result = imgops.normalize_file(STACK, tmp_path / "api.tif", max=4095, chunk_mb=0.05)
    run_cli("normvol", STACK, "--max", 4095, "-o", tmp_path / "cli.tif", "--device", "cpu")
    api, ref = tifffile.imread(tmp_path / "api.tif"), tifffile.imread(tmp_path / "cli.tif")
    assert api.dtype == np.float32
    np.testing.assert_array_equal(api, ref)
    expected = tifffile.imread(STACK).astype(np.float32) / np.float32(4095)
    np.testing.assert_array_equal(api, expected)
    assert result.highs == [4095.0] and result.lows == [0.0]


def test_normalize_file_percentiles_are_numpys(tmp_path: Path):
    result = imgops.normalize_file(STACK, tmp_path / "p.tif", percentiles=(1, 99.8), clip=True)
    data = tifffile.imread(STACK)
    low, high = np.percentile(data, (1, 99.8))
    assert (result.lows[0], result.highs[0]) == (low, high)


def test_normalize_file_errors_name_the_file_and_leave_nothing(tmp_path: Path):
    shutil.copy(SAMPLES / "coffee_rgb.png", tmp_path / "photo.tif")
    for src, match in ((tmp_path / "nope.tif", "no such file"), (tmp_path / "photo.tif", "TIFF")):
        with pytest.raises(Exception, match=match) as caught:
            imgops.normalize_file(src, tmp_path / "o.tif")
        assert str(src) in str(caught.value)
    with pytest.raises(ValueError, match="percentiles"):
        imgops.normalize_file(STACK, tmp_path / "o.tif", percentiles=(50, 10))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["photo.tif"]


def test_normalize_file_errors_are_not_click_exceptions(tmp_path: Path):
    with pytest.raises(Exception) as caught:
        imgops.normalize_file(tmp_path / "nope.tif", tmp_path / "o.tif")
    assert not isinstance(caught.value, click.ClickException)


def test_normalize_file_never_replaces_its_input(tmp_path: Path):
    src = shutil.copy(STACK, tmp_path / "s.tif")
    before = Path(src).read_bytes()
    with pytest.raises(Exception, match="input"):
        imgops.normalize_file(src, src, max=4095, overwrite=True)
    assert Path(src).read_bytes() == before
