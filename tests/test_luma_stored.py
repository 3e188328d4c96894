"""`imgops gray --luma stored`: a colour JPEG's own luma plane, decoded without its colour planes.

The independent reference is Pillow's JPEG decoder asked for mode "L" (`Image.draft`), which
has libjpeg hand out the stored Y plane as OpenCV's grayscale decode does; the header parse is
checked on JPEGs whose markers are rewritten to each of libjpeg-turbo's colour-space rules.
"""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from helpers_gray import (
    SAMPLES,
    decode_bytes,
    expected_gray,
    jpeg_with_orientation,
    luma_formula,
    run_imgops,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from imgops.cli import cli
from imgops.engine.device import choose, cuda_device_count
from imgops.engine.types import PipelineSettings
from imgops.gray_files import gray_file
from imgops.io.image_headers import header_info
from imgops.io.images import decode_image

ROCKET = SAMPLES / "rocket_baseline_rgb.jpg"
PROGRESSIVE = SAMPLES / "flower_progressive_3mp.jpg"
GRAY_JPEG = SAMPLES / "flower_gray_3mp.jpg"
COFFEE = SAMPLES / "coffee_rgb.png"


def pillow_luma_plane(data: bytes) -> np.ndarray:
    """Pillow's decode of a JPEG straight to mode L: libjpeg's stored Y plane."""
    with Image.open(io.BytesIO(data)) as image:
        image.draft("L", image.size)
        assert image.mode == "L"
        return np.asarray(image)


def jpeg_bytes(pixels: np.ndarray, **options) -> bytes:
    """RGB pixels as a JPEG written by Pillow (JFIF, YCbCr)."""
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", **options)
    return buffer.getvalue()


def segments(data: bytes) -> list[tuple[int, int, int]]:
    """(marker, start, end) of each marker segment before the first scan."""
    found, pos = [], 2
    while data[pos + 1] != 0xDA:
        (length,) = struct.unpack(">H", data[pos + 2 : pos + 4])
        found.append((data[pos + 1], pos, pos + 2 + length))
        pos += 2 + length
    return found


def without(data: bytes, marker: int) -> bytes:
    """The JPEG with its first segment of this marker removed (e.g. 0xE0, JFIF's APP0)."""
    for found, start, end in segments(data):
        if found == marker:
            return data[:start] + data[end:]
    raise AssertionError(f"no segment {marker:#x}")


def without_jfif(data: bytes) -> bytes:
    """The JPEG with its JFIF APP0 segment removed."""
    return without(data, 0xE0)


def with_segment(data: bytes, marker: int, payload: bytes, *, after_frame: bool = False) -> bytes:
    """The JPEG with one more segment, right after SOI or right after the frame header."""
    segment = bytes([0xFF, marker]) + struct.pack(">H", len(payload) + 2) + payload
    pos = 2
    if after_frame:
        pos = next(end for m, _, end in segments(data) if m in (0xC0, 0xC1, 0xC2))
    return data[:pos] + segment + data[pos:]


def adobe(transform: int) -> bytes:
    """An Adobe APP14 payload with the given colour transform."""
    return b"Adobe" + struct.pack(">HHHB", 100, 0, 0, transform)


def with_component_ids(data: bytes, ids: tuple[int, ...]) -> bytes:
    """The JPEG with its frame's component ids replaced (the scan headers keep the old ones,
    so only the header parse is meaningful on the result)."""
    marker, start, _ = next(s for s in segments(data) if s[0] in (0xC0, 0xC1, 0xC2))
    patched = bytearray(data)
    for i, component in enumerate(ids):
        patched[start + 10 + 3 * i] = component
    return bytes(patched)


def frame_patched(data: bytes, *, marker: int | None = None, precision: int | None = None):
    """The JPEG with its frame header's marker or sample precision rewritten."""
    _, start, _ = next(s for s in segments(data) if s[0] in (0xC0, 0xC1, 0xC2))
    patched = bytearray(data)
    if marker is not None:
        patched[start + 1] = marker
    if precision is not None:
        patched[start + 4] = precision
    return bytes(patched)


# --------------------------------------------------------------------------------------------
# The header: which JPEGs store a luma plane libjpeg can hand out alone


def test_header_names_the_colour_space_of_the_samples() -> None:
    rocket = header_info(ROCKET.read_bytes())
    assert (rocket.width, rocket.height, rocket.jpeg_colour, rocket.stored_luma) == (
        640, 427, "ycbcr", True,
    )  # fmt: skip
    assert header_info(PROGRESSIVE.read_bytes()).stored_luma  # SOF2
    gray = header_info(GRAY_JPEG.read_bytes())
    assert (gray.jpeg_colour, gray.stored_luma) == ("gray", False)
    png = header_info(COFFEE.read_bytes())
    assert (png.jpeg_colour, png.stored_luma) == (None, False)


def test_header_follows_libjpeg_colour_rules() -> None:
    data = ROCKET.read_bytes()
    bare = without_jfif(data)
    cases = {
        "JFIF": (data, "ycbcr"),
        "no JFIF, ids 1 2 3": (with_component_ids(bare, (1, 2, 3)), "ycbcr"),
        "no JFIF, ids R G B": (with_component_ids(bare, (82, 71, 66)), "rgb"),
        "no JFIF, other ids": (with_component_ids(bare, (7, 8, 9)), "ycbcr"),
        "JFIF wins over ids R G B": (with_component_ids(data, (82, 71, 66)), "ycbcr"),
        "Adobe transform 0": (with_segment(bare, 0xEE, adobe(0)), "rgb"),
        "Adobe transform 1": (with_segment(bare, 0xEE, adobe(1)), "ycbcr"),
        "Adobe transform 0 after the frame": (
            with_segment(bare, 0xEE, adobe(0), after_frame=True),
            "rgb",
        ),
        "Adobe wins over ids 1 2 3": (
            with_segment(with_component_ids(bare, (1, 2, 3)), 0xEE, adobe(0)),
            "rgb",
        ),
    }
    for name, (variant, colour) in cases.items():
        info = header_info(variant)
        assert info.jpeg_colour == colour, name
        assert info.stored_luma == (colour == "ycbcr"), name
        assert (info.width, info.height) == (640, 427), name


def test_header_refuses_frames_libjpeg_would_not_hand_out_as_an_8_bit_luma_plane() -> None:
    data = ROCKET.read_bytes()
    assert header_info(frame_patched(data, marker=0xC1)).stored_luma  # extended Huffman
    for marker in (0xC3, 0xC9, 0xCA, 0xCB):  # lossless, arithmetic coding
        info = header_info(frame_patched(data, marker=marker))
        assert info.jpeg_colour == "ycbcr" and not info.stored_luma, hex(marker)
    assert not header_info(frame_patched(data, precision=12)).stored_luma


def test_header_names_cmyk_and_ycck() -> None:
    buffer = io.BytesIO()
    Image.new("CMYK", (16, 8), (10, 20, 30, 40)).save(buffer, "JPEG")
    cmyk = buffer.getvalue()
    assert header_info(cmyk).jpeg_colour == "cmyk"  # Pillow writes Adobe transform 0
    ycck = header_info(with_segment(without(cmyk, 0xEE), 0xEE, adobe(2)))
    assert (ycck.jpeg_colour, ycck.stored_luma) == ("ycck", False)


# --------------------------------------------------------------------------------------------
# Decoding


@pytest.mark.parametrize("path", [ROCKET, PROGRESSIVE], ids=lambda p: p.name)
def test_stored_luma_is_the_jpeg_luma_plane(path: Path) -> None:
    data = path.read_bytes()
    image = decode_image(data, luma="stored")
    assert image.stored_luma and image.channel_order is None
    assert image.pixels.dtype == np.uint8
    np.testing.assert_array_equal(image.pixels, pillow_luma_plane(data))
    exact = expected_gray(path)
    assert image.pixels.shape == exact.shape
    differs = image.pixels.astype(np.int16) != exact
    assert differs.mean() < 0.03  # measured: 0.4 % over 100 photos, 1.4 % on this flower


def test_stored_luma_differs_from_exact_where_colours_clip() -> None:
    """A saturated red and blue checkerboard, chroma subsampled: the stored luma is the
    encoder's, the exact luma is that of the clipped RGB, and they are not the same image."""
    pixels = np.zeros((64, 64, 3), np.uint8)
    pixels[::2, ::2] = (255, 0, 0)
    pixels[1::2, 1::2] = (0, 0, 255)
    data = jpeg_bytes(pixels, quality=90, subsampling=2)
    stored = decode_image(data, luma="stored").pixels
    exact = decode_image(data).pixels
    np.testing.assert_array_equal(stored, pillow_luma_plane(data))
    assert np.abs(stored.astype(np.int16) - luma_formula(exact)).max() > 1


@pytest.mark.parametrize("orientation,turns", [(3, 2), (6, -1), (8, 1)])
def test_stored_luma_applies_exif_orientation(orientation: int, turns: int) -> None:
    upright, _ = jpeg_with_orientation(1)
    rotated, _ = jpeg_with_orientation(orientation)
    base = decode_image(upright, luma="stored")
    turned = decode_image(rotated, luma="stored")
    assert base.stored_luma and turned.stored_luma
    np.testing.assert_array_equal(turned.pixels, np.rot90(base.pixels, turns))
    assert turned.pixels.shape == decode_image(rotated).pixels.shape[:2]


@pytest.mark.parametrize("path", [GRAY_JPEG, COFFEE, SAMPLES / "room_rgb16.png"], ids=str)
def test_files_without_a_stored_luma_plane_decode_exactly(path: Path) -> None:
    data = path.read_bytes()
    stored, exact = decode_image(data, luma="stored"), decode_image(data)
    assert not stored.stored_luma
    assert stored.channel_order == exact.channel_order
    np.testing.assert_array_equal(stored.pixels, exact.pixels)


def test_rgb_and_cmyk_jpegs_decode_exactly_with_stored() -> None:
    pixels = np.random.default_rng(5).integers(0, 256, (24, 40, 3), np.uint8)
    rgb = jpeg_bytes(pixels, quality=90, subsampling=0)
    rgb = with_segment(without_jfif(rgb), 0xEE, adobe(0))  # ids 1 2 3, but Adobe says RGB
    assert header_info(rgb).jpeg_colour == "rgb"
    stored = decode_image(rgb, luma="stored")
    assert not stored.stored_luma and stored.channel_order == "bgr"
    np.testing.assert_array_equal(stored.pixels, decode_image(rgb).pixels)
    buffer = io.BytesIO()
    Image.fromarray(pixels).convert("CMYK").save(buffer, "JPEG")
    cmyk = decode_image(buffer.getvalue(), luma="stored")
    assert not cmyk.stored_luma
    np.testing.assert_array_equal(cmyk.pixels, decode_image(buffer.getvalue()).pixels)


def test_unknown_luma_is_refused() -> None:
    with pytest.raises(ValueError, match="exact or stored"):
        decode_image(ROCKET.read_bytes(), luma="fast")


@settings(max_examples=40, deadline=None)
@given(
    height=st.integers(1, 70),
    width=st.integers(1, 70),
    quality=st.integers(30, 100),
    subsampling=st.sampled_from([0, 1, 2]),
    progressive=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
    kind=st.sampled_from(["noise", "gradient", "flat"]),
)
def test_stored_luma_matches_pillow_on_random_jpegs(
    height, width, quality, subsampling, progressive, seed, kind
) -> None:
    rng = np.random.default_rng(seed)
    if kind == "noise":
        pixels = rng.integers(0, 256, (height, width, 3), np.uint8)
    elif kind == "gradient":
        ramp = np.linspace(0, 255, width, dtype=np.float64)[None, :, None]
        pixels = np.broadcast_to(ramp * rng.random(3), (height, width, 3)).astype(np.uint8)
    else:
        pixels = np.broadcast_to(rng.integers(0, 256, 3, np.uint8), (height, width, 3)).copy()
    data = jpeg_bytes(pixels, quality=quality, subsampling=subsampling, progressive=progressive)
    image = decode_image(data, luma="stored")
    assert image.stored_luma
    np.testing.assert_array_equal(image.pixels, pillow_luma_plane(data))
    assert image.pixels.shape == decode_image(data).pixels.shape[:2]


# --------------------------------------------------------------------------------------------
# The command and the API


def test_gray_luma_stored_writes_the_luma_plane(tmp_path: Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    for path in (ROCKET, GRAY_JPEG, COFFEE):
        (folder / path.name).write_bytes(path.read_bytes())
    stats = tmp_path / "stats.json"
    result = CliRunner().invoke(
        cli,
        ["gray", str(folder), "-d", str(tmp_path / "out"), "--luma", "stored", "-q"]
        + ["--stats-json", str(stats)],
    )
    assert result.exit_code == 0, result.output
    out = tmp_path / "out"
    rocket = decode_bytes((out / "rocket_baseline_rgb.png").read_bytes())
    np.testing.assert_array_equal(rocket, pillow_luma_plane(ROCKET.read_bytes()))
    for path in (GRAY_JPEG, COFFEE):  # no stored luma plane: the exact luma
        written = decode_bytes((out / (path.stem + ".png")).read_bytes())
        np.testing.assert_array_equal(written, expected_gray(path))
    report = json.loads(stats.read_text())
    assert report["luma"] == "stored"
    assert report["decoders"] == {"opencv-luma": 1, "opencv": 2}
    assert report["device"] == "cpu"


def test_gray_verbose_says_which_files_gave_their_luma_plane(tmp_path: Path) -> None:
    done = run_imgops(
        "gray", str(ROCKET), str(COFFEE), "-d", str(tmp_path), "--luma", "stored", "-v"
    )
    assert done.returncode == 0, done.stderr
    assert b"decoded: opencv 1, opencv-luma 1" in done.stderr, done.stderr


def test_gray_luma_exact_is_the_default(tmp_path: Path) -> None:
    stats = tmp_path / "stats.json"
    target = tmp_path / "rocket.png"
    result = CliRunner().invoke(
        cli, ["gray", str(ROCKET), "-o", str(target), "-q", "--stats-json", str(stats)]
    )
    assert result.exit_code == 0, result.output
    np.testing.assert_array_equal(decode_bytes(target.read_bytes()), expected_gray(ROCKET))
    report = json.loads(stats.read_text())
    assert report["luma"] == "exact" and report["decoders"] == {"opencv": 1}


def test_gray_luma_stored_through_stdin_and_stdout() -> None:
    done = run_imgops("gray", "-", "-o", "-", "--luma", "stored", input=ROCKET.read_bytes())
    assert done.returncode == 0, done.stderr
    np.testing.assert_array_equal(decode_bytes(done.stdout), pillow_luma_plane(ROCKET.read_bytes()))


@pytest.mark.parametrize(
    "args,message",
    [
        (["--luma", "stored", "--decoder", "gpu"], "--luma stored decodes on the CPU"),
        (["--luma", "fast"], "'fast' is not one of 'exact', 'stored'"),
    ],
)
def test_gray_luma_usage_errors(tmp_path: Path, args: list[str], message: str) -> None:
    target = tmp_path / "out.png"
    result = CliRunner().invoke(cli, ["gray", str(ROCKET), "-o", str(target), *args])
    assert result.exit_code == 2 and message in result.output
    assert not target.exists()


def test_gray_luma_stored_on_a_missing_gpu_is_one_line(tmp_path: Path) -> None:
    if cuda_device_count() > 7:
        pytest.skip("this host has a GPU 7")
    target = tmp_path / "out.png"
    done = run_imgops("gray", str(ROCKET), "-o", str(target), "--luma", "stored", "--device",
                      "cuda:7")  # fmt: skip
    assert done.returncode == 1 and b"no CUDA GPU" in done.stderr, done.stderr
    assert b"Traceback" not in done.stderr and not target.exists()


def test_auto_device_stays_on_the_cpu_with_stored_luma() -> None:
    plan = choose(PipelineSettings(luma="stored", expected_files=100_000))
    assert (plan.device, plan.decoder) == ("cpu", "cpu")
    assert "--luma stored" in plan.why
    with pytest.raises(ValueError, match="--decoder gpu"):
        choose(PipelineSettings(luma="stored", decoder="gpu"))


def test_gray_file_takes_luma(tmp_path: Path) -> None:
    target = tmp_path / "rocket.png"
    report = gray_file(ROCKET, target, luma="stored", device="cpu")
    assert report.outputs == [str(target)]
    np.testing.assert_array_equal(
        decode_bytes(target.read_bytes()), pillow_luma_plane(ROCKET.read_bytes())
    )
