"""Shared helpers for the gray tests: sample paths, independent references, subprocess runs."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "samples"
#: Every sample image `imgops gray` reads (the MRI stacks decode as their first page).
IMAGE_SAMPLES = sorted(p for p in SAMPLES.iterdir() if p.suffix in (".png", ".jpg", ".tif"))
COLOUR_SAMPLES = [
    "coffee_rgb.png",
    "flower_progressive_3mp.jpg",
    "flower_rgb_3mp.png",
    "light_palette_64px.png",
    "rocket_baseline_rgb.jpg",
    "tulips_rgba.png",
]
GRAY_SAMPLES = ["camera_gray.png", "flower_gray_3mp.jpg", "mri_dwi_b0_u16.tif"]
#: Small samples for tests that only need a few quick files.
SMALL = ["coffee_rgb.png", "rocket_baseline_rgb.jpg", "light_palette_64px.png"]


def opencv_default(path: Path) -> np.ndarray:
    """The file as OpenCV reads it by default but keeping depth (orientation applied, no alpha)."""
    image = cv2.imread(str(path), cv2.IMREAD_ANYDEPTH | cv2.IMREAD_ANYCOLOR)
    assert image is not None, path
    return image


def luma_formula(bgr: np.ndarray) -> np.ndarray:
    """The exact integer BT.601 luma, (299 R + 587 G + 114 B + 500) // 1000, from BGR pixels."""
    wide = bgr.astype(np.int64)
    y = (299 * wide[..., 2] + 587 * wide[..., 1] + 114 * wide[..., 0] + 500) // 1000
    return y.astype(bgr.dtype)


def expected_gray(path: Path) -> np.ndarray:
    """What `imgops gray` must produce for a file: the formula, or the pixels if already gray."""
    image = opencv_default(path)
    return image if image.ndim == 2 else luma_formula(image)


def pillow_gray(path: Path) -> np.ndarray:
    """Pillow's own decoding and convert("L") (8-bit images only): an independent check."""
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB").convert("L"))


def decode_bytes(data: bytes) -> np.ndarray:
    """Decodes encoded bytes with OpenCV, unchanged (depth and channels kept)."""
    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    assert image is not None
    return image


def read_output(path: Path) -> np.ndarray:
    """An output file as stored: (H, W), dtype kept (WebP gray comes back as 3 equal planes)."""
    image = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    assert image is not None, path
    if image.ndim == 3:
        assert np.array_equal(image[..., 0], image[..., 1]), "output is not gray"
        image = image[..., 0]
    return image


def assert_gray_matches(output: np.ndarray, source: Path) -> None:
    """Exact formula; within 1 of OpenCV cvtColor and Pillow for 8-bit colour sources."""
    expected = expected_gray(source)
    assert output.dtype == expected.dtype, (source, output.dtype)
    assert output.shape == expected.shape, (source, output.shape)
    np.testing.assert_array_equal(output, expected, err_msg=str(source))
    original = opencv_default(source)
    if original.ndim == 3 and original.dtype == np.uint8:
        opencv = cv2.cvtColor(original, cv2.COLOR_BGR2GRAY).astype(np.int16)
        assert np.abs(output.astype(np.int16) - opencv).max() <= 1, source
        pillow = pillow_gray(source).astype(np.int16)
        assert np.abs(output.astype(np.int16) - pillow).max() <= 1, source


def jpeg_with_orientation(orientation: int) -> tuple[bytes, np.ndarray]:
    """A 40x60 JPEG carrying an EXIF orientation tag, and its stored (unrotated) RGB pixels."""
    pixels = np.zeros((40, 60, 3), np.uint8)
    pixels[:10, :20] = (250, 10, 10)
    pixels[30:, 50:] = (10, 250, 10)
    exif = Image.Exif()
    exif[0x0112] = orientation
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", exif=exif.tobytes(), quality=100, subsampling=0)
    return buffer.getvalue(), pixels


def run_imgops(
    *args: str, input: bytes | None = None, cwd: Path | None = None, **kwargs
) -> subprocess.CompletedProcess:
    """Runs `python -m imgops.cli ARGS` in a fresh interpreter; stdout/stderr as bytes."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run(
        [sys.executable, "-m", "imgops.cli", *args],
        input=input,
        capture_output="stdout" not in kwargs,
        cwd=cwd,
        env=env,
        timeout=120,
        **kwargs,
    )


def error_lines(stderr: str) -> list[str]:
    """The `imgops: error: ...` lines of a run's stderr."""
    return [line for line in stderr.splitlines() if line.startswith("imgops: error:")]
