"""imgops' own PNG encoder (level 2, imgops._cli_kernels): exact pixels in OpenCV and Pillow,
every chunk's CRC and the zlib stream's Adler-32 checked by an independent parser, pngcheck
where installed, and encode_png == encode_png_filtered(png_filter rows) byte for byte."""

from __future__ import annotations

import io
import os
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from imgops.io import png

SAMPLES = Path(__file__).resolve().parents[1] / "samples"
KERNELS = png.cli_kernels()
needs_kernels = pytest.mark.skipif(KERNELS is None, reason="imgops._cli_kernels was not built")


def parse_png(data: bytes) -> tuple[dict[str, int], bytes]:
    """Parses a PNG file independently of the encoder: checks the signature, every chunk's
    CRC-32 (with zlib), the chunk order, the zlib header and the Adler-32 of the decompressed
    stream. Returns the IHDR fields and the decompressed (filtered) rows."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    offset, kinds, idat = 8, [], []
    header: dict[str, int] = {}
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        kind = data[offset + 4 : offset + 8]
        body = data[offset + 8 : offset + 8 + length]
        assert len(body) == length, "truncated chunk"
        (crc,) = struct.unpack(">I", data[offset + 8 + length : offset + 12 + length])
        assert crc == zlib.crc32(kind + body), f"bad CRC in {kind!r}"
        kinds.append(kind)
        if kind == b"IHDR":
            fields = struct.unpack(">IIBBBBB", body)
            names = ("width", "height", "depth", "color", "compression", "filter", "interlace")
            header = dict(zip(names, fields, strict=True))
        elif kind == b"IDAT":
            idat.append(body)
        offset += 12 + length
    assert offset == len(data)
    assert kinds[0] == b"IHDR" and kinds[-1] == b"IEND" and set(kinds[1:-1]) == {b"IDAT"}
    stream = b"".join(idat)
    assert stream[0] == 0x78 and (stream[0] << 8 | stream[1]) % 31 == 0  # zlib header
    raw = zlib.decompress(stream)
    (adler,) = struct.unpack(">I", stream[-4:])
    assert adler == zlib.adler32(raw)
    return header, raw


def unfilter(raw: bytes, height: int, row_bytes: int, bpp: int) -> np.ndarray:
    """Reverses the PNG row filters (spec section 9), vectorised over rows where possible."""
    rows = np.frombuffer(raw, np.uint8).reshape(height, row_bytes + 1)
    out = np.zeros((height + 1, row_bytes + bpp), dtype=np.int32)  # padded: row -1, left bpp
    for y in range(height):
        kind, line = rows[y, 0], rows[y, 1:].astype(np.int32)
        up, cur = out[y], out[y + 1]
        if kind in (0, 2):
            cur[bpp:] = (line + (up[bpp:] if kind == 2 else 0)) & 255
            continue
        for x in range(row_bytes):
            a, b, c = cur[x], up[x + bpp], up[x]
            if kind == 1:
                pred = a
            elif kind == 3:
                pred = (a + b) >> 1
            else:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
            cur[x + bpp] = (line[x] + pred) & 255
    return out[1:, bpp:].astype(np.uint8)


def expected_bytes(image: np.ndarray) -> np.ndarray:
    """The image's samples as the PNG rows hold them (16-bit big-endian)."""
    flat = image.reshape(image.shape[0], -1)
    return flat.astype(">u2").view(np.uint8) if image.dtype == np.uint16 else flat


def check_file(image: np.ndarray, data: bytes) -> None:
    """Every check of one encoded file: parser, unfiltering, OpenCV, Pillow, pngcheck."""
    height, width = image.shape[:2]
    channels = 1 if image.ndim == 2 else image.shape[2]
    header, raw = parse_png(data)
    assert (header["width"], header["height"]) == (width, height)
    assert header["depth"] == 8 * image.itemsize
    assert header["color"] == {1: 0, 2: 4, 3: 2, 4: 6}[channels]
    bpp = channels * image.itemsize
    if height * width <= 4096:  # the Python unfilter is slow; OpenCV checks the big ones
        got = unfilter(raw, height, width * bpp, bpp)
        np.testing.assert_array_equal(got, expected_bytes(image))
    decoded = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    assert decoded is not None
    if channels in (3, 4):
        decoded = decoded[..., [2, 1, 0, 3][:channels]]
    want = image[..., 0] if channels in (1, 2) and image.ndim == 3 else image
    if channels == 2:
        decoded = decoded if decoded.ndim == 2 else decoded[..., 0]
    assert decoded.dtype == image.dtype
    np.testing.assert_array_equal(decoded, want)
    if image.dtype == np.uint8 or channels == 1:  # Pillow reduces 16-bit colour to 8 bits
        with Image.open(io.BytesIO(data)) as pil:
            pil.load()
            pixels = np.asarray(pil)
        np.testing.assert_array_equal(
            pixels.astype(image.dtype),
            image[..., 0] if image.ndim == 3 and channels == 1 else image,
        )


def filtered_rows(image: np.ndarray, code: int) -> np.ndarray:
    """png_filter_rows' rows of the whole image (what the png_filter op returns)."""
    height = image.shape[0]
    flat = expected_bytes(image)
    rows = np.zeros((height + 1, flat.shape[1]), dtype=np.uint8)
    rows[1:] = flat
    out = np.empty((height, flat.shape[1] + 1), dtype=np.uint8)
    channels = 1 if image.ndim == 2 else image.shape[2]
    KERNELS.png_filter_rows(rows, out, height, flat.shape[1], channels * image.itemsize, code)
    return out


def assert_filtered_path_matches(image: np.ndarray, level: int = png.DEFAULT_LEVEL) -> bytes:
    """encode_png == encode_png_filtered(png_filter(image, filter_code_for(level)))."""
    data = png.encode_png(image, level=level)
    rows = filtered_rows(image, png.filter_code_for(level))
    again = png.encode_png_filtered(
        rows,
        width=image.shape[1],
        height=image.shape[0],
        channels=1 if image.ndim == 2 else image.shape[2],
        bit_depth=8 * image.itemsize,
        level=level,
    )
    assert again == data
    return data


def gray_of(name: str) -> np.ndarray:
    image = cv2.imread(str(SAMPLES / name), cv2.IMREAD_UNCHANGED)
    assert image is not None, name
    if image.ndim == 2:
        return image
    b, g, r = (image[..., i].astype(np.int64) for i in range(3))
    gray = (299 * r + 587 * g + 114 * b + 500) // 1000  # the exact BT.601 formula
    return gray.astype(image.dtype)


@needs_kernels
@pytest.mark.parametrize(
    "name", ["flower_rgb_3mp.png", "rocket_baseline_rgb.jpg", "coffee_rgb.png", "room_rgb16.png"]
)
def test_real_photos_decode_exactly_and_match_the_filtered_path(name: str) -> None:
    gray = gray_of(name)
    data = assert_filtered_path_matches(gray)
    check_file(gray, data)
    if gray.dtype == np.uint8:
        ok, opencv = cv2.imencode(".png", gray)
        assert ok and len(data) <= len(opencv), (name, len(data), len(opencv))


@needs_kernels
def test_colour_and_alpha_from_real_files() -> None:
    tulips = cv2.cvtColor(cv2.imread(str(SAMPLES / "tulips_rgba.png"), -1), cv2.COLOR_BGRA2RGBA)
    room = np.ascontiguousarray(cv2.imread(str(SAMPLES / "room_rgb16.png"), -1)[..., ::-1])
    for image in (tulips, tulips[..., :3], np.ascontiguousarray(tulips[..., [0, 3]]), room):
        check_file(image, assert_filtered_path_matches(np.ascontiguousarray(image)))


def _image(kind: str, shape: tuple[int, ...], dtype: type, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    top = np.iinfo(dtype).max
    if kind == "flat":
        return np.full(shape, rng.integers(0, top, endpoint=True), dtype=dtype)
    if kind == "noise":
        return rng.integers(0, top, shape, endpoint=True, dtype=dtype)
    if kind == "gradient":
        y, x = np.indices(shape[:2])
        base = (y * rng.integers(1, 9) + x * rng.integers(1, 9)) % (top + 1)
        return np.broadcast_to(base.reshape(shape[:2] + (1,) * (len(shape) - 2)), shape).astype(
            dtype
        )
    # runs: random values repeated over random lengths (flat areas with edges)
    count = int(np.prod(shape))
    lengths = rng.integers(1, 600, count // 2 + 2)
    values = rng.integers(0, top, lengths.size, endpoint=True)
    return np.repeat(values, lengths)[:count].reshape(shape).astype(dtype)


@needs_kernels
@settings(max_examples=70, deadline=None)
@given(
    height=st.sampled_from([1, 2, 3, 7, 33, 64]) | st.integers(1, 80),
    width=st.sampled_from([1, 2, 15, 16, 17, 31, 32, 33, 63, 65]) | st.integers(1, 300),
    channels=st.integers(0, 4),
    dtype=st.sampled_from([np.uint8, np.uint16]),
    kind=st.sampled_from(["flat", "noise", "gradient", "runs"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_fuzz_round_trip_and_filtered_path(
    height: int, width: int, channels: int, dtype: type, kind: str, seed: int
) -> None:
    shape = (height, width) if channels == 0 else (height, width, channels)
    image = _image(kind, shape, dtype, seed)
    check_file(image, assert_filtered_path_matches(image))


@needs_kernels
@pytest.mark.parametrize("code", [-1, 0, 1, 2, 3, 4])
def test_every_filter_code_compresses_through_encode_png_filtered(code: int) -> None:
    """The GPU op may hand any filter code's rows to encode_png_filtered."""
    image = _image("runs", (40, 70, 3), np.uint8, code + 10)
    image[10:30] = _image("noise", (20, 70, 3), np.uint8, code + 1)
    data = png.encode_png_filtered(
        filtered_rows(image, code), width=70, height=40, channels=3, bit_depth=8, level=2
    )
    check_file(image, data)


@needs_kernels
def test_long_runs_large_flat_and_many_blocks() -> None:
    """Flat images: runs longer than 258, across rows and blocks, and tiny output."""
    flat = np.zeros((2000, 1500), dtype=np.uint8)
    flat[500:1500, 100:1400] = 200
    data = assert_filtered_path_matches(flat)
    check_file(flat, data)
    assert len(data) < flat.size // 200


@needs_kernels
def test_incompressible_noise_falls_back_to_stored_blocks() -> None:
    noise = _image("noise", (300, 700), np.uint8, 5)
    data = assert_filtered_path_matches(noise)
    check_file(noise, data)
    assert len(data) <= noise.size + noise.size // 50 + 200


@needs_kernels
@pytest.mark.skipif(shutil.which("pngcheck") is None, reason="pngcheck is not installed")
def test_pngcheck_accepts_every_kind(tmp_path: Path) -> None:
    images = [
        gray_of("coffee_rgb.png"),
        gray_of("room_rgb16.png"),
        _image("runs", (50, 61, 2), np.uint16, 1),
        _image("gradient", (1, 1, 4), np.uint8, 2),
        _image("noise", (20, 33, 3), np.uint16, 3),
    ]
    for i, image in enumerate(images):
        target = tmp_path / f"{i}.png"
        target.write_bytes(png.encode_png(image))
        result = subprocess.run(["pngcheck", str(target)], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr


@needs_kernels
def test_checksums_match_zlib() -> None:
    """CRC-32 (PCLMUL folding and the table loop) and Adler-32 (AVX2 and scalar) = zlib's."""
    rng = np.random.default_rng(0)
    for n in (0, 1, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 79, 80, 127, 128, 129, 5551, 5552,
              5553, 70000, 70001 + 15):  # fmt: skip
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        crc, adler = zlib.crc32(data), zlib.adler32(data)
        assert KERNELS.checksums(data) == (crc, adler, adler, crc), n
    ones = b"\xff" * 200_000  # the largest sums the Adler loops must not overflow on
    assert KERNELS.checksums(ones) == (
        zlib.crc32(ones),
        *(zlib.adler32(ones),) * 2,
        zlib.crc32(ones),
    )


def test_filter_code_for_every_level() -> None:
    assert png.filter_code_for(0) == 0
    assert png.filter_code_for(2) == 4
    assert png.filter_code_for(1) == (3 if "isal" in png._BACKENDS else 4)
    assert all(png.filter_code_for(level) == -1 for level in range(3, 10))
    with pytest.raises(ValueError, match="level"):
        png.filter_code_for(10)


@pytest.mark.parametrize("level", [0, 1, 2, 6])
def test_filtered_path_without_the_compiled_module(
    monkeypatch: pytest.MonkeyPatch, level: int
) -> None:
    """The numpy fallback (IMGOPS_NO_CLI_KERNELS): the same identity, other deflate bytes."""
    monkeypatch.setattr(png, "cli_kernels", lambda: None)
    gray = gray_of("camera_gray.png")
    data = png.encode_png(gray, level=level)
    rows = np.empty((gray.shape[0], gray.shape[1] + 1), dtype=np.uint8)
    work = np.empty((4, gray.shape[0], gray.shape[1]), dtype=np.uint8)
    mode = {0: "none", 3: "avg", 4: "paeth", -1: "adaptive"}[png.filter_code_for(level)]
    above = np.vstack([np.zeros((1, gray.shape[1]), np.uint8), gray[:-1]])
    png._filter_strip(mode, gray, above, 1, rows, work)
    again = png.encode_png_filtered(
        rows, width=gray.shape[1], height=gray.shape[0], channels=1, bit_depth=8, level=level
    )
    assert again == data
    check_file(gray, data)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"rows": np.zeros((3, 5), np.uint16)}, TypeError, "uint8"),
        ({"rows": np.zeros((3, 6), np.uint8)}, ValueError, "shape"),
        ({"rows": np.full((3, 5), 5, np.uint8)}, ValueError, "filter type"),
        ({"channels": 5}, ValueError, "channels"),
        ({"bit_depth": 4}, ValueError, "bit_depth"),
        ({"level": 11}, ValueError, "level"),
    ],
)
def test_encode_png_filtered_refuses_bad_input(kwargs: dict, error: type, match: str) -> None:
    arguments = {
        "rows": np.zeros((3, 5), np.uint8),
        "width": 4,
        "height": 3,
        "channels": 1,
        "bit_depth": 8,
        "level": 2,
    }
    arguments.update(kwargs)
    rows = arguments.pop("rows")
    with pytest.raises(error, match=match):
        png.encode_png_filtered(rows, **arguments)


@needs_kernels
def test_native_entry_points_refuse_bad_arguments() -> None:
    pixels = np.zeros((4, 4), np.uint8)
    with pytest.raises(ValueError, match="filter"):
        KERNELS.png_encode(pixels, 4, 4, 1, 1, 4, 5)
    with pytest.raises(ValueError, match="smaller"):
        KERNELS.png_encode(pixels, 4, 5, 1, 1, 4, 4)
    with pytest.raises(ValueError, match="channels"):
        KERNELS.png_encode(pixels, 4, 4, 0, 1, 4, 4)
    with pytest.raises(ValueError, match="exactly"):
        KERNELS.png_encode_filtered(np.zeros((4, 4), np.uint8), 4, 4, 1, 1)


@needs_kernels
def test_rows_wider_than_a_block() -> None:
    """Rows over 64 KiB (one row a block): noise (stored, after the rewind) and gradients."""
    noise = _image("noise", (3, 9000, 4), np.uint16, 8)
    check_file(noise, assert_filtered_path_matches(noise))
    ramp = _image("gradient", (4, 20000, 3), np.uint16, 9)
    check_file(ramp, assert_filtered_path_matches(ramp))


def _available_memory() -> int:
    """Bytes of physical memory free now (0 where unknown)."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


@needs_kernels
@pytest.mark.slow
@pytest.mark.skipif(_available_memory() < 8 << 30, reason="needs 8 GiB of free memory")
def test_stored_rows_wider_than_a_stored_piece_fit_the_output_buffer() -> None:
    """Noise rows of 70001 bytes: every block (one row) is stored as two pieces. The output
    buffer's bound once counted pieces over the whole input, not per block, and 30700 such rows
    (2.1 GB) overflowed it; here the file's length is the exact all-stored length."""
    height, row = 30700, 70001
    chunk = np.random.default_rng().integers(0, 256, (11, row), dtype=np.uint8)
    chunk[:, 0] = 0  # filter None
    data = np.tile(chunk, (height // 11 + 1, 1))[:height].tobytes()
    encoded = KERNELS.png_encode_filtered(data, row - 1, height, 1, 1)
    del data
    stream = 2 + height * (row + 2 * 5) + 4  # zlib header, two pieces a row, Adler-32
    idat_chunks = -(-stream // 2**30)
    assert len(encoded) == KERNELS.PNG_HEAD_BYTES + stream + 4 + 12 * (idat_chunks - 1) + 12
    assert encoded[-12:] == b"\0\0\0\0IEND\xaeB`\x82"


def numpy_paeth(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """PNG's Paeth predictor (PNG 9.4) in int16: a left, b above, c upper-left."""
    a, b, c = (x.astype(np.int16) for x in (a, b, c))
    p = a + b - c
    pa, pb, pc = np.abs(p - a), np.abs(p - b), np.abs(p - c)
    return np.where((pa <= pb) & (pa <= pc), a, np.where(pb <= pc, b, c)).astype(np.uint8)


def idat_stream(data: bytes) -> bytes:
    """The IDAT chunks of a PNG file, joined and inflated."""
    pos, joined = 8, b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        if data[pos + 4 : pos + 8] == b"IDAT":
            joined += data[pos + 8 : pos + 8 + length]
        pos += 12 + length
    return zlib.decompress(joined)


@needs_kernels
def test_paeth_rows_for_every_left_up_and_upper_left_value() -> None:
    """The encoder's (vectorised) Paeth filter against numpy's, for all 2^24 (a, b, c):
    position 2k+1 of the second row sees left a, above b and upper-left c, k = a b c."""
    k = np.arange(1 << 24, dtype=np.uint32)
    a, b, c = (k >> 16).astype(np.uint8), (k >> 8).astype(np.uint8), k.astype(np.uint8)
    image = np.empty((2, 1 << 25), dtype=np.uint8)
    image[0, 0::2], image[0, 1::2] = c, b  # the row above: c at 2k, b at 2k+1
    image[1, 0::2], image[1, 1::2] = a, (k * 2654435761 >> 24).astype(np.uint8)
    data = png.encode_png(image, level=2)
    assert png.filter_code_for(2) == 4  # level 2 filters every row with Paeth
    rows = np.frombuffer(idat_stream(data), np.uint8).reshape(2, (1 << 25) + 1)
    assert rows[1, 0] == 4
    residual = rows[1, 2::2]  # position 2k+1 of the row (after the filter byte)
    want = image[1, 1::2] - numpy_paeth(a, b, c)
    np.testing.assert_array_equal(residual, want)
