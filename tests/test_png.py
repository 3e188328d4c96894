"""imgops.io.png: standard PNGs that OpenCV and Pillow decode to the exact pixels, every level."""

from __future__ import annotations

import io
import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from PIL import Image

from imgops.io import png

SAMPLES = Path(__file__).resolve().parents[1] / "samples"
PHOTOS = ["flower_rgb_3mp.png", "rocket_baseline_rgb.jpg", "coffee_rgb.png", "camera_gray.png"]


def _gray_sample(name: str) -> np.ndarray:
    image = cv2.imread(str(SAMPLES / name), cv2.IMREAD_UNCHANGED)
    assert image is not None, name
    return image if image.ndim == 2 else cv2.cvtColor(image[..., :3], cv2.COLOR_BGR2GRAY)


def _cv2_decode(data: bytes) -> np.ndarray:
    decoded = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    assert decoded is not None
    if decoded.ndim == 3:  # OpenCV gives BGR(A); the encoder takes RGB(A)
        order = [2, 1, 0, 3][: decoded.shape[2]]
        decoded = decoded[..., order]
    return decoded


def _pillow_decode(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as image:
        image.load()
        return np.asarray(image)


def _assert_round_trip(image: np.ndarray, level: int = png.DEFAULT_LEVEL) -> bytes:
    data = png.encode_png(image, level=level)
    expected = image[..., 0] if image.ndim == 3 and image.shape[2] == 1 else image
    decoded = _cv2_decode(data)
    if expected.ndim == 3 and expected.shape[2] == 2:  # OpenCV drops gray+alpha's alpha
        expected = expected[..., 0]
        decoded = decoded if decoded.ndim == 2 else decoded[..., 0]
    assert decoded.dtype == image.dtype and decoded.shape == expected.shape
    assert np.array_equal(decoded, expected)
    if image.dtype == np.uint8 or image.ndim == 2:  # Pillow reduces 16-bit colour to 8 bits
        pillow = _pillow_decode(data)
        original = image[..., 0] if image.ndim == 3 and image.shape[2] == 1 else image
        assert np.array_equal(pillow.astype(image.dtype), original)
    return data


@pytest.mark.parametrize("level", range(10))
def test_every_level_round_trips_a_real_photo(level: int) -> None:
    gray = _gray_sample("coffee_rgb.png")
    _assert_round_trip(gray, level)


@pytest.mark.parametrize("name", PHOTOS)
def test_default_level_is_exact_and_no_larger_than_opencv_default(name: str) -> None:
    gray = _gray_sample(name)
    data = _assert_round_trip(gray)
    ok, opencv = cv2.imencode(".png", gray)
    assert ok
    assert len(data) <= len(opencv), f"{name}: {len(data)} bytes > OpenCV's {len(opencv)}"


@pytest.mark.parametrize("level", [0, 1, 2, 6])
def test_16_bit_gray_is_big_endian_and_exact(level: int) -> None:
    room = cv2.imread(str(SAMPLES / "room_rgb16.png"), cv2.IMREAD_UNCHANGED)
    gray16 = cv2.cvtColor(room, cv2.COLOR_BGR2GRAY)
    assert gray16.dtype == np.uint16 and gray16.max() > 255
    data = _assert_round_trip(gray16, level)
    with Image.open(io.BytesIO(data)) as image:
        assert image.mode.startswith("I;16")


def test_16_bit_rgb_from_a_real_file() -> None:
    room = cv2.imread(str(SAMPLES / "room_rgb16.png"), cv2.IMREAD_UNCHANGED)
    _assert_round_trip(np.ascontiguousarray(room[..., ::-1]))


def test_rgba_and_gray_alpha_from_a_real_file() -> None:
    tulips = cv2.imread(str(SAMPLES / "tulips_rgba.png"), cv2.IMREAD_UNCHANGED)
    rgba = cv2.cvtColor(tulips, cv2.COLOR_BGRA2RGBA)
    _assert_round_trip(rgba)
    _assert_round_trip(rgba[..., :3])
    with Image.open(io.BytesIO(png.encode_png(rgba[..., [0, 3]]))) as image:
        assert image.mode == "LA"
        assert np.array_equal(np.asarray(image), rgba[..., [0, 3]])


@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (9, 1), (3, 5), (17, 33), (2, 1001)])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
def test_tiny_and_odd_shapes(shape: tuple[int, int], dtype: type) -> None:
    rng = np.random.default_rng(sum(shape))
    image = rng.integers(0, np.iinfo(dtype).max, shape, endpoint=True, dtype=dtype)
    for level in (0, 1, 2, 9):
        _assert_round_trip(image, level)


def test_strided_views_and_many_strips(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(png, "_STRIP_BYTES", 64)  # one row a strip
    monkeypatch.setattr(png, "_IDAT_BYTES", 256)
    gray = _gray_sample("camera_gray.png")
    view = gray[::3, 1::2]
    assert not view.flags.c_contiguous
    for level in (0, 1, 2):
        _assert_round_trip(view, level)


def test_chunks_are_standard() -> None:
    data = png.encode_png(np.arange(12, dtype=np.uint8).reshape(3, 4))
    assert data[:8] == png.PNG_SIGNATURE
    offset, kinds = 8, []
    while offset < len(data):
        length = int.from_bytes(data[offset : offset + 4], "big")
        kind = data[offset + 4 : offset + 8]
        body = data[offset + 8 : offset + 8 + length]
        crc = int.from_bytes(data[offset + 8 + length : offset + 12 + length], "big")
        assert crc == zlib.crc32(kind + body)
        kinds.append(kind)
        offset += 12 + length
    assert kinds == [b"IHDR", b"IDAT", b"IEND"]


def test_flat_images_compress_well() -> None:
    """The default level must not blow up on flat areas (Huffman-only would: 8:1 at best)."""
    mask = np.zeros((600, 800), dtype=np.uint8)
    mask[100:400, 200:500] = 255
    data = _assert_round_trip(mask)
    ok, opencv = cv2.imencode(".png", mask)
    assert len(data) <= 2 * len(opencv) and len(data) < mask.size // 100


def test_write_png_to_path_and_file(tmp_path: Path) -> None:
    gray = _gray_sample("rocket_baseline_rgb.jpg")
    target = tmp_path / "out.png"
    written = png.write_png(target, gray)
    assert written == target.stat().st_size
    assert np.array_equal(cv2.imread(str(target), cv2.IMREAD_UNCHANGED), gray)
    buffer = io.BytesIO()
    assert png.write_png(buffer, gray) == written


@pytest.mark.parametrize(
    ("image", "error"),
    [
        (np.zeros((4, 4), dtype=np.float32), TypeError),
        (np.zeros((4, 4), dtype=np.int16), TypeError),
        (np.zeros((0, 4), dtype=np.uint8), ValueError),
        (np.zeros((4, 4, 5), dtype=np.uint8), ValueError),
        (np.zeros((2, 4, 4, 3), dtype=np.uint8), ValueError),
        ([[1, 2], [3, 4]], TypeError),
    ],
)
def test_bad_input_is_a_clear_error(image: object, error: type) -> None:
    with pytest.raises(error, match="encode_png"):
        png.encode_png(image)  # type: ignore[arg-type]


def test_bad_level() -> None:
    with pytest.raises(ValueError, match="level"):
        png.encode_png(np.zeros((2, 2), dtype=np.uint8), level=10)


def test_backend_info_names_every_level() -> None:
    info = png.backend_info()
    assert set(info) == {"level 0", "level 1", "level 2", "levels 3-9"}


def test_stdlib_fallback_gives_identical_pixels(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the fast packages every level still works, through the standard library's zlib."""
    stdlib = png._BACKENDS["zlib"]
    monkeypatch.setattr(png, "_BACKENDS", {"zlib": stdlib})
    monkeypatch.setattr(png, "_GENERAL", stdlib)
    monkeypatch.setattr(png, "_CRC32", zlib.crc32)
    gray = _gray_sample("coffee_rgb.png")
    for level in (0, 1, 2, 5):
        _assert_round_trip(gray, level)


@settings(max_examples=60, deadline=None)
@given(
    image=hnp.arrays(
        dtype=st.sampled_from([np.uint8, np.uint16]),
        shape=st.tuples(
            st.integers(1, 40), st.integers(1, 40), st.sampled_from([0, 1, 2, 3, 4])
        ).map(lambda s: s[:2] if s[2] == 0 else s),
    ),
    level=st.integers(0, 9),
)
def test_random_images_round_trip(image: np.ndarray, level: int) -> None:
    _assert_round_trip(image, level)


@settings(max_examples=80, deadline=None)
@given(
    rows=st.integers(1, 12),
    row_pixels=st.integers(1, 90),
    bpp=st.sampled_from([1, 2, 3, 4, 6, 8]),
    mode=st.sampled_from(["adaptive", "none", "sub", "up", "avg", "paeth"]),
    smooth=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_cpp_row_filters_equal_the_numpy_ones_byte_for_byte(
    rows: int, row_pixels: int, bpp: int, mode: str, smooth: bool, seed: int
) -> None:
    kernels = png.cli_kernels()
    if kernels is None:
        pytest.skip("imgops._cli_kernels was not built (just-in-time install)")
    rng = np.random.default_rng(seed)
    row_bytes = row_pixels * bpp
    data = rng.integers(0, 256, (rows + 1, row_bytes), dtype=np.uint8)
    if smooth:  # photo-like rows, where the adaptive choice varies from row to row
        data = np.cumsum(rng.integers(-3, 4, (rows + 1, row_bytes)), axis=1).astype(np.uint8)
    if seed % 3 == 0:
        data[0] = 0  # the first strip of an image has zeros above it
    codes = {"adaptive": -1, "none": 0, "sub": 1, "up": 2, "avg": 3, "paeth": 4}
    expected = np.empty((rows, row_bytes + 1), dtype=np.uint8)
    work = np.empty((4, rows, row_bytes), dtype=np.uint8)
    png._filter_strip(mode, data[1:], data[:-1], bpp, expected, work)
    got = np.full((rows, row_bytes + 1), 7, dtype=np.uint8)
    kernels.png_filter_rows(data, got, rows, row_bytes, bpp, codes[mode])
    np.testing.assert_array_equal(got, expected)


def test_cpp_and_numpy_encoders_write_the_same_file(monkeypatch: pytest.MonkeyPatch) -> None:
    if png.cli_kernels() is None:
        pytest.skip("imgops._cli_kernels was not built (just-in-time install)")
    gray = _gray_sample("flower_rgb_3mp.png")
    levels = (0, 1, 6) if "isal" in png._BACKENDS else (0, 6)  # level 2 is the C++ deflate
    fast = {level: png.encode_png(gray, level=level) for level in levels}
    monkeypatch.setattr(png, "cli_kernels", lambda: None)
    for level, data in fast.items():
        assert png.encode_png(gray, level=level) == data, level
    _assert_round_trip(gray, 2)  # the fallback of level 2: numpy Paeth and zlib's RLE


def test_cpp_row_filters_refuse_bad_arguments() -> None:
    kernels = png.cli_kernels()
    if kernels is None:
        pytest.skip("imgops._cli_kernels was not built (just-in-time install)")
    rows, out = np.zeros((3, 8), np.uint8), np.zeros((2, 9), np.uint8)
    for args, problem in [
        ((rows, out, 3, 8, 1, 0), "needs"),  # 3 rows need 4 input rows
        ((rows, out, 2, 8, 9, 0), "bpp"),
        ((rows, out, 2, 8, 1, 5), "filter"),
        ((rows, out, 2, 8, 1, -2), "filter"),
    ]:
        with pytest.raises(ValueError, match=problem):
            kernels.png_filter_rows(*args)


def _paeth_reference(data: np.ndarray, bpp: int) -> np.ndarray:
    """Paeth residuals of data[1:] (data[0] the row above), written from PNG spec 9.4 in Python."""
    out = np.empty((data.shape[0] - 1, data.shape[1] + 1), dtype=np.uint8)
    for y in range(1, data.shape[0]):
        out[y - 1, 0] = 4
        for x in range(data.shape[1]):
            a = int(data[y, x - bpp]) if x >= bpp else 0
            b = int(data[y - 1, x])
            c = int(data[y - 1, x - bpp]) if x >= bpp else 0
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            predictor = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
            out[y - 1, x + 1] = (int(data[y, x]) - predictor) % 256
    return out


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 6),
    row_pixels=st.integers(1, 40),
    bpp=st.sampled_from([1, 2, 3, 4, 6, 8]),
    seed=st.integers(0, 2**32 - 1),
)
def test_paeth_filter_matches_the_specification(
    rows: int, row_pixels: int, bpp: int, seed: int
) -> None:
    """Filter code 4 (Paeth), numpy and C++, against a literal transcription of the spec."""
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, (rows + 1, row_pixels * bpp), dtype=np.uint8)
    if seed % 2:  # ties between the three predictors are common in smooth rows
        data = (np.cumsum(rng.integers(-2, 3, data.shape), axis=1) & 255).astype(np.uint8)
    expected = _paeth_reference(data, bpp)
    numpy_out = np.empty_like(expected)
    work = np.empty((4, rows, data.shape[1]), dtype=np.uint8)
    png._filter_strip("paeth", data[1:], data[:-1], bpp, numpy_out, work)
    np.testing.assert_array_equal(numpy_out, expected)
    kernels = png.cli_kernels()
    if kernels is not None:
        got = np.full_like(expected, 7)
        kernels.png_filter_rows(data, got, rows, data.shape[1], bpp, 4)
        np.testing.assert_array_equal(got, expected)
