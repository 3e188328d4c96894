"""The GPU's PNG row deflate (csrc/standalone/png_deflate_parallel.h), run piece by piece on the
CPU with its word-ownership check (png_encode_filtered_emulated): byte-identical to the CPU
encoder (png_encode_filtered) on random rows of every shape and content and on real photos, with
several stripes, stored blocks, stored blocks of several pieces and stored blocks after dynamic
ones all hit; its files decode (zlib, OpenCV, Pillow). Also the workspace the device needs
(png_deflate_layout) and the PNG file written around a zlib stream (png_finish_zlib)."""

from __future__ import annotations

import contextlib
import io
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from imgops.io import png

SAMPLES = Path(__file__).resolve().parents[1] / "samples"
KERNELS = png.cli_kernels()
pytestmark = pytest.mark.skipif(KERNELS is None, reason="imgops._cli_kernels was not built")

# The design constants of png_encode.h / png_deflate_parallel.h the tests aim at.
BLOCK_BYTES = 1 << 16  # filtered bytes a deflate block, rounded down to whole rows (>= 1 row)
CHUNK = 64  # bytes one GPU thread tokenizes
MAX_TABLES = 8  # stripes (Huffman tables) an image at most
STORED_PIECE = 65535  # a stored deflate block's most bytes
IDAT_MAX = 1 << 30  # bytes an IDAT chunk at most
SIGNATURE = b"\x89PNG\r\n\x1a\n"
COLOR_TYPES = {1: 0, 2: 4, 3: 2, 4: 6}
MATCH_EDGES = (257, 258, 259, 260, 261, 262, 516, 517)  # one match or two
KINDS = ("noise", "flat", "sparse", "runs", "gradient", "zero_runs", "chunk_edges")


# ------------------------------------------------------------------ helpers


def block_rows(row: int) -> int:
    """Filtered rows of `row` bytes (filter byte included) a deflate block holds."""
    return max(1, BLOCK_BYTES // row)


def png_chunks(data: bytes | bytearray | memoryview) -> list[tuple[bytes, memoryview]]:
    """A PNG file's (type, body) chunks; checks the signature, every length and CRC-32 (with
    zlib, independently of the encoder) and the order IHDR, IDAT..., IEND."""
    view = memoryview(data)
    assert bytes(view[:8]) == SIGNATURE
    offset, found = 8, []
    while offset < len(view):
        length, kind = struct.unpack(">I4s", view[offset : offset + 8])
        body = view[offset + 8 : offset + 8 + length]
        assert len(body) == length, f"truncated {kind!r}"
        (crc,) = struct.unpack(">I", view[offset + 8 + length : offset + 12 + length])
        assert crc == zlib.crc32(body, zlib.crc32(kind)), f"bad CRC in {kind!r}"
        found.append((kind, body))
        offset += 12 + length
    assert offset == len(view)
    kinds = [kind for kind, _ in found]
    assert kinds[0] == b"IHDR" and kinds[-1] == b"IEND" and set(kinds[1:-1]) == {b"IDAT"}
    return found


def zlib_stream(data: bytes, width: int, height: int, channels: int, itemsize: int) -> bytes:
    """The file's zlib stream (its IDAT payloads joined), after checking its IHDR."""
    parts = png_chunks(data)
    fields = struct.unpack(">IIBBBBB", parts[0][1])
    assert fields == (width, height, 8 * itemsize, COLOR_TYPES[channels], 0, 0, 0)
    return b"".join(bytes(body) for kind, body in parts if kind == b"IDAT")


def encode_both(rows: np.ndarray, width: int, height: int, channels: int, itemsize: int) -> bytes:
    """png_encode_filtered's file, after checking that the emulated GPU deflate gives the same
    bytes (a RuntimeError from the emulation is a broken word-ownership rule)."""
    rows = np.ascontiguousarray(rows, dtype=np.uint8)
    cpu = KERNELS.png_encode_filtered(rows, width, height, channels, itemsize)
    gpu = KERNELS.png_encode_filtered_emulated(rows, width, height, channels, itemsize)
    if gpu != cpu:
        common = min(len(cpu), len(gpu))
        differ = np.frombuffer(cpu, np.uint8, common) != np.frombuffer(gpu, np.uint8, common)
        first = int(np.argmax(differ)) if differ.any() else common
        pytest.fail(
            f"emulated != CPU for {height}x{width}x{channels} itemsize {itemsize}: "
            f"{len(gpu)} vs {len(cpu)} bytes, first difference at byte {first}"
        )
    return cpu


def assert_decodes(
    data: bytes, rows: np.ndarray, width: int, height: int, channels: int, itemsize: int
) -> bytes:
    """The file inflates (zlib checks the Adler-32) to exactly the filtered rows; returns the
    zlib stream."""
    stream = zlib_stream(data, width, height, channels, itemsize)
    assert stream[0] == 0x78 and (stream[0] << 8 | stream[1]) % 31 == 0
    assert zlib.decompress(stream) == np.ascontiguousarray(rows).tobytes()
    return stream


def samples_of(rows: np.ndarray, width: int, channels: int, itemsize: int) -> np.ndarray:
    """The (height, width, channels) samples of unfiltered rows (filter byte 0)."""
    body = np.ascontiguousarray(rows[:, 1:])
    if itemsize == 2:
        body = body.view(">u2").astype(np.uint16)
    return body.reshape(rows.shape[0], width, channels)


def assert_pixels(data: bytes, expected: np.ndarray) -> None:
    """OpenCV (IMREAD_UNCHANGED) and, for 8 bits, Pillow decode the file to `expected`
    ((height, width, channels), RGB(A) order)."""
    height, width, channels = expected.shape
    decoded = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    assert decoded is not None
    assert decoded.dtype == expected.dtype
    decoded = decoded.reshape(height, width, -1)
    if channels >= 3:  # OpenCV gives BGR(A)
        np.testing.assert_array_equal(decoded[..., [2, 1, 0, 3][:channels]], expected)
    else:  # gray (OpenCV drops or spreads gray+alpha's alpha)
        np.testing.assert_array_equal(decoded[..., 0], expected[..., 0])
    if expected.dtype == np.uint8:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            pillow = np.asarray(image)
        np.testing.assert_array_equal(pillow.reshape(height, width, channels), expected)


def stored_stream_bytes(row: int, height: int) -> int:
    """The length of a zlib stream whose every block is stored (each byte-aligned, since the one
    before it is stored too): the header, per 65535-byte piece one header byte and LEN/NLEN, the
    bytes, the Adler-32."""
    rows_a_block = block_rows(row)
    total = 2 + 4
    for first in range(0, height, rows_a_block):
        n = min(rows_a_block, height - first) * row
        total += n + 5 * -(-n // STORED_PIECE)
    return total


def stored_verbatim(stream: bytes, block: bytes) -> bool:
    """Whether a block of at most 65535 bytes is stored in the stream: LEN, NLEN and its bytes."""
    assert len(block) <= STORED_PIECE
    return struct.pack("<HH", len(block), len(block) ^ 0xFFFF) + block in stream


def filter_image(image: np.ndarray, code: int) -> np.ndarray:
    """png_filter_rows' filtered rows of a whole (H, W) or (H, W, C) image (16-bit samples
    big-endian, as PNG holds them): what the CPU encoder deflates for that filter code."""
    height = image.shape[0]
    channels = 1 if image.ndim == 2 else image.shape[2]
    flat = image.reshape(height, -1)
    if image.dtype == np.uint16:
        flat = flat.astype(">u2").view(np.uint8)
    rows = np.zeros((height + 1, flat.shape[1]), dtype=np.uint8)  # row 0: the row above row 1
    rows[1:] = flat
    out = np.empty((height, flat.shape[1] + 1), dtype=np.uint8)
    KERNELS.png_filter_rows(rows, out, height, flat.shape[1], channels * image.itemsize, code)
    return out


def read_sample(name: str, gray: bool) -> np.ndarray:
    """A sample image (RGB(A) order), or its gray (OpenCV's BT.601 luma)."""
    image = cv2.imread(str(SAMPLES / name), cv2.IMREAD_UNCHANGED)
    assert image is not None, name
    if image.ndim == 2:
        return image
    if gray:
        return cv2.cvtColor(image[..., :3], cv2.COLOR_BGR2GRAY)
    return cv2.cvtColor(image, cv2.COLOR_BGRA2RGBA if image.shape[2] == 4 else cv2.COLOR_BGR2RGB)


# ------------------------------------------------------------------ random filtered rows


def chunk_edges(row: int, height: int) -> np.ndarray:
    """Where the GPU's chunks start: every 64 bytes from each block's first byte, and from each
    row's first byte (the sampled rows are tokenized on their own)."""
    step = block_rows(row) * row
    total = row * height
    blocks = (np.arange(0, total, step)[:, None] + np.arange(0, step, CHUNK)[None, :]).ravel()
    rows = (np.arange(height)[:, None] * row + np.arange(0, row, CHUNK)[None, :]).ravel()
    edges = np.union1d(blocks, rows)
    return edges[edges < total]


def band(
    kind: str, start: int, stop: int, row: int, height: int, rng: np.random.Generator
) -> np.ndarray:
    """Bytes [start, stop) of the flat filtered rows, of one kind of content."""
    n = stop - start
    if n == 0:  # two cuts at one byte
        return np.empty(0, dtype=np.uint8)
    if kind == "noise":
        return rng.integers(0, 256, n, dtype=np.uint8)
    if kind == "flat":
        return np.full(n, rng.choice([0, 0, int(rng.integers(0, 256))]), dtype=np.uint8)
    if kind == "sparse":
        out = np.zeros(n, dtype=np.uint8)
        hits = rng.random(n) < rng.choice([0.001, 0.01, 0.1])
        out[hits] = rng.integers(1, 256, int(hits.sum()), dtype=np.uint8)
        return out
    if kind == "gradient":
        if rng.random() < 0.5:  # a slope: runs of 2^shift / step equal bytes
            steps = np.arange(start, stop, dtype=np.int64) * int(rng.integers(1, 8))
            return ((steps >> int(rng.integers(0, 10))) & 255).astype(np.uint8)
        return (np.cumsum(rng.integers(-2, 3, n)) & 255).astype(np.uint8)  # a random walk
    if kind == "runs":  # random values, lengths about the 4..5 and 258 edges, or any
        values, lengths, filled = [], [], 0
        while filled < n:
            pick = rng.random(1024)
            lengths.append(
                np.where(
                    pick < 0.55,
                    rng.integers(1, 10, 1024),
                    np.where(pick < 0.7, rng.choice(MATCH_EDGES, 1024), rng.integers(1, 700, 1024)),
                )
            )
            values.append(rng.integers(0, 256, 1024, dtype=np.uint8))
            filled += int(lengths[-1].sum())
        return np.repeat(np.concatenate(values), np.concatenate(lengths))[:n]
    if kind == "zero_runs":  # zero runs longer than one match (258 bytes) in noise
        out = rng.integers(0, 256, n, dtype=np.uint8)
        for first in rng.integers(0, n, n // 1500 + 1):
            out[first : first + int(rng.integers(259, 2000))] = 0
        return out
    assert kind == "chunk_edges"  # short and long runs just before, on and after chunk edges
    out = rng.integers(0, 256, n, dtype=np.uint8)
    edges = chunk_edges(row, height)
    edges = edges[(edges >= start) & (edges < stop)]
    if len(edges) > 400:
        edges = rng.choice(edges, 400, replace=False)
    for edge in edges:
        first = int(edge) - start + int(rng.integers(-6, 4))
        length = int(rng.choice([2, 3, 4, 5, 6, 7, 8, 9, 64, 65, 258, 259, 262]))
        out[max(0, first) : max(0, first + length)] = rng.integers(0, 256)
    return out


@dataclass(frozen=True)
class Case:
    """A random image of filtered rows: shape, the content of each band of it, the filter
    bytes (none: all 0, random: 0..4 a row, or one constant) and the seed of the bytes."""

    width: int
    height: int
    channels: int
    itemsize: int
    kinds: tuple[str, ...]
    filters: str
    seed: int

    @property
    def row(self) -> int:
        """A filtered row's bytes, filter byte included."""
        return self.width * self.channels * self.itemsize + 1

    def rows(self) -> np.ndarray:
        """The (height, row) filtered rows: the bands cut at random bytes, then filter bytes."""
        rng = np.random.default_rng(self.seed)
        total = self.height * self.row
        cuts = np.sort(rng.integers(0, total + 1, len(self.kinds) - 1))
        bounds = [0, *map(int, cuts), total]
        flat = np.empty(total, dtype=np.uint8)
        for kind, start, stop in zip(self.kinds, bounds[:-1], bounds[1:], strict=True):
            flat[start:stop] = band(kind, start, stop, self.row, self.height, rng)
        rows = flat.reshape(self.height, self.row)
        if self.filters == "none":
            rows[:, 0] = 0
        elif self.filters == "random":
            rows[:, 0] = rng.integers(0, 5, self.height)
        else:
            rows[:, 0] = rng.integers(0, 5)
        return rows


@st.composite
def cases(draw: st.DrawFn) -> Case:
    """Shapes of 1..300 rows up to ~20,000 bytes wide, and about one in eight with rows of
    60,000..70,000 bytes (a block of one row; a stored block then takes two pieces)."""
    channels = draw(st.integers(1, 4))
    itemsize = draw(st.integers(1, 2))
    bpp = channels * itemsize
    if draw(st.integers(0, 7)) == 0:
        width = draw(st.integers(60000 // bpp, 70000 // bpp))
        height = draw(st.integers(1, 4))
    else:
        width = draw(
            st.one_of(
                st.integers(1, 200 // bpp),
                st.integers(1, 20000 // bpp),
                st.integers(2000 // bpp, 20000 // bpp),  # often more than 8 blocks
            )
        )
        height = draw(st.one_of(st.integers(1, 300), st.integers(100, 300)))
    kinds = tuple(draw(st.lists(st.sampled_from(KINDS), min_size=1, max_size=4)))
    filters = draw(st.sampled_from(("none", "random", "constant")))
    seed = draw(st.integers(0, 2**32 - 1))
    return Case(width, height, channels, itemsize, kinds, filters, seed)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_emulated_deflate_is_the_cpu_deflate_on_random_rows(case: Case) -> None:
    """Emulated == CPU bytes for any shape and content; the file inflates to the rows, and with
    filter bytes 0 OpenCV and Pillow read the rows' samples."""
    rows = case.rows()
    shape = (case.width, case.height, case.channels, case.itemsize)
    data = encode_both(rows, *shape)
    assert_decodes(data, rows, *shape)
    if case.filters == "none":
        assert_pixels(data, samples_of(rows, case.width, case.channels, case.itemsize))


@pytest.mark.parametrize("row_bytes", [32767, 32768, 65534, 65535, 65536, 65537, 131071])
@pytest.mark.parametrize("kind", ["noise", "flat", "chunk_edges"])
def test_rows_about_a_block_wide(row_bytes: int, kind: str) -> None:
    """Rows around the block size (a block of one row; filtered rows past 65535 bytes make
    stored blocks of two pieces): emulated == CPU, and noise is stored, piece by piece."""
    height = 3
    case = Case(row_bytes, height, 1, 1, (kind,), "random", row_bytes)
    rows = case.rows()
    data = encode_both(rows, row_bytes, height, 1, 1)
    stream = assert_decodes(data, rows, row_bytes, height, 1, 1)
    assert KERNELS.png_deflate_layout(case.row, height)[4] == -(-height // block_rows(case.row))
    if kind == "noise":
        assert len(stream) == stored_stream_bytes(case.row, height)
    if kind == "flat":
        assert len(stream) < case.row * height // 50


@pytest.mark.parametrize("length", [2, 3, 4, 5, 6, 9, 64, 65, 257, 258, 259, 260, 261, 262, 600])
def test_runs_on_every_chunk_edge(length: int) -> None:
    """A run of `length` equal bytes starting at every offset -8..+8 of the chunk edges of the
    blocks and of the sampled rows, in noise (runs that start in one chunk and end in the
    next, cover a whole chunk, or are cut at a chunk edge): emulated == CPU."""
    width, height = 2000, 70  # block = 32 rows: 3 blocks, 64,032-byte blocks, chunk edges differ
    row = width + 1
    rng = np.random.default_rng(length)
    flat = rng.integers(0, 256, row * height, dtype=np.uint8)
    for index, edge in enumerate(chunk_edges(row, height)):
        first = max(0, int(edge) + index % 17 - 8)
        flat[first : first + length] = flat[first]
    rows = flat.reshape(height, row)
    rows[:, 0] = rng.integers(0, 5, height)
    data = encode_both(rows, width, height, 1, 1)
    assert_decodes(data, rows, width, height, 1, 1)


# ------------------------------------------------------------------ real images

PHOTOS = [
    ("flower_rgb_3mp.png", True),
    ("flower_rgb_3mp.png", False),
    ("coffee_rgb.png", True),
    ("coffee_rgb.png", False),
    ("rocket_baseline_rgb.jpg", True),
    ("camera_gray.png", True),
    ("tulips_rgba.png", False),
    ("room_rgb16.png", True),
    ("room_rgb16.png", False),
]


@pytest.mark.parametrize(("name", "gray"), PHOTOS)
@pytest.mark.parametrize("code", [png.filter_code_for(png.DEFAULT_LEVEL), -1, 0])
def test_emulated_deflate_is_the_cpu_deflate_on_photos(name: str, gray: bool, code: int) -> None:
    """Real photos (gray, as `imgops gray` writes them, and colour, 8 and 16 bits) filtered as
    the CPU path filters them: emulated == CPU bytes, and == encode_png's file for the default
    level's filter; the file decodes to the image."""
    image = read_sample(name, gray)
    height, width = image.shape[:2]
    channels = 1 if image.ndim == 2 else image.shape[2]
    rows = filter_image(image, code)
    data = encode_both(rows, width, height, channels, image.itemsize)
    if code == png.filter_code_for(png.DEFAULT_LEVEL):
        assert data == png.encode_png(image)
    stream = assert_decodes(data, rows, width, height, channels, image.itemsize)
    assert len(stream) < rows.size  # photos compress: dynamic blocks
    assert_pixels(data, image.reshape(height, width, channels))


def test_a_big_photo_has_several_stripes() -> None:
    """The 3.4 MP flower's gray: more blocks than stripes (tables), so stripes of several
    blocks and a short last stripe; emulated == CPU."""
    image = read_sample("flower_rgb_3mp.png", gray=True)
    height, width = image.shape
    rows = filter_image(image, png.filter_code_for(png.DEFAULT_LEVEL))
    blocks = KERNELS.png_deflate_layout(width + 1, height)[4]
    stripe_blocks = -(-blocks // MAX_TABLES)
    assert blocks > MAX_TABLES and stripe_blocks > 1 and blocks % stripe_blocks != 0
    data = encode_both(rows, width, height, 1, 1)
    assert_decodes(data, rows, width, height, 1, 1)


def test_a_mri_stack_of_16_bit_slices() -> None:
    """The 10 slices of a 12-bit diffusion MRI volume stacked into one tall 16-bit gray image
    (dark background: long zero runs): emulated == CPU, and the pixels come back."""
    ok, pages = cv2.imreadmulti(str(SAMPLES / "mri_dwi_b0_u16.tif"), flags=cv2.IMREAD_UNCHANGED)
    assert ok and len(pages) > 1
    image = np.concatenate(pages, axis=0)
    assert image.dtype == np.uint16 and image.ndim == 2
    height, width = image.shape
    rows = filter_image(image, png.filter_code_for(png.DEFAULT_LEVEL))
    assert KERNELS.png_deflate_layout(rows.shape[1], height)[4] > 1
    data = encode_both(rows, width, height, 1, 2)
    assert_decodes(data, rows, width, height, 1, 2)
    assert_pixels(data, image[..., None])


def test_noise_is_stored_block_by_block() -> None:
    """An incompressible image: every block stored (the stream is exactly the stored layout,
    each block's bytes verbatim), over more than 8 blocks; emulated == CPU."""
    width, height = 999, 700
    rng = np.random.default_rng(7)
    rows = rng.integers(0, 256, (height, width + 1), dtype=np.uint8)
    rows[:, 0] = 0
    row = width + 1
    assert KERNELS.png_deflate_layout(row, height)[4] > MAX_TABLES
    data = encode_both(rows, width, height, 1, 1)
    stream = assert_decodes(data, rows, width, height, 1, 1)
    assert len(stream) == stored_stream_bytes(row, height)
    assert len(stream) < rows.size * 1.001  # about the input
    step = block_rows(row) * row
    flat = rows.tobytes()
    for start in range(0, len(flat), step):
        assert stored_verbatim(stream, flat[start : start + step])
    assert_pixels(data, samples_of(rows, width, 1, 1))


def test_stored_blocks_between_dynamic_blocks_of_a_photo() -> None:
    """The camera photo with two blocks of rows replaced by noise: those blocks are stored,
    starting at any bit after a dynamic block, and the rest stays dynamic; emulated == CPU."""
    image = read_sample("camera_gray.png", gray=True).copy()
    height, width = image.shape
    row = width + 1
    step = block_rows(row)
    noisy = [1, 3]
    rng = np.random.default_rng(3)
    for block in noisy:
        image[block * step : (block + 1) * step] = rng.integers(0, 256, (step, width))
    rows = filter_image(image, png.filter_code_for(png.DEFAULT_LEVEL))
    data = encode_both(rows, width, height, 1, 1)
    stream = assert_decodes(data, rows, width, height, 1, 1)
    flat = rows.tobytes()
    for block in range(-(-height // step)):
        stored = stored_verbatim(stream, flat[block * step * row : (block + 1) * step * row])
        assert stored == (block in noisy), block
    assert_pixels(data, image[..., None])


def test_emulated_rejects_what_the_cpu_encoder_rejects() -> None:
    """Bad shapes and a wrong row buffer size are ValueErrors, as for png_encode_filtered."""
    rows = np.zeros((4, 5), np.uint8)
    for args in [(4, 4, 0, 1), (4, 4, 5, 1), (4, 4, 1, 3), (0, 4, 1, 1), (4, 0, 1, 1)]:
        for encode in (KERNELS.png_encode_filtered, KERNELS.png_encode_filtered_emulated):
            with pytest.raises(ValueError):
                encode(rows, *args)
    with pytest.raises(ValueError):
        KERNELS.png_encode_filtered_emulated(rows, 4, 5, 1, 1)  # 4 rows given, 5 said


# ------------------------------------------------------------------ png_finish_zlib


def finish(stream: bytes, size: int, shape: tuple[int, int, int, int]) -> bytearray:
    """png_finish_zlib on a `size`-byte buffer of 0xA5 filler with the stream at
    PNG_HEAD_BYTES; checks the file's length and that nothing past it was written."""
    head = KERNELS.PNG_HEAD_BYTES
    buffer = bytearray(b"\xa5") * size
    buffer[head : head + len(stream)] = stream
    length = KERNELS.png_finish_zlib(buffer, len(stream), *shape)
    assert buffer[length:] == b"\xa5" * (size - length)
    return buffer[:length]


def finish_cases() -> list[tuple[str, np.ndarray, tuple[int, int, int, int]]]:
    """Files of the CPU encoder: a photo (dynamic), noise (stored), one pixel, 16-bit RGBA."""
    rng = np.random.default_rng(11)
    photo = read_sample("camera_gray.png", gray=True)
    noise = rng.integers(0, 256, (300, 501), dtype=np.uint8)
    noise[:, 0] = 0
    rgba16 = rng.integers(0, 3, (40, 1 + 30 * 8), dtype=np.uint8)
    rgba16[:, 0] = rng.integers(0, 5, 40)
    return [
        ("photo", filter_image(photo, 4), (photo.shape[1], photo.shape[0], 1, 1)),
        ("noise", noise, (500, 300, 1, 1)),
        ("one pixel", np.array([[0, 200]], np.uint8), (1, 1, 1, 1)),
        ("rgba16", rgba16, (30, 40, 4, 2)),
    ]


@pytest.mark.parametrize("index", range(4))
def test_finish_zlib_rebuilds_the_cpu_file(index: int) -> None:
    """The zlib stream of a CPU-encoded file, placed at PNG_HEAD_BYTES: png_finish_zlib writes
    exactly the CPU's file around it, in a buffer of the device path's size or any buffer
    that holds the file; a buffer one byte short of the file is a ValueError."""
    _, rows, shape = finish_cases()[index]
    data = encode_both(rows, *shape)
    stream = zlib_stream(data, *shape)
    assert sum(kind == b"IDAT" for kind, _ in png_chunks(data)) == 1  # < IDAT_MAX bytes
    head = KERNELS.PNG_HEAD_BYTES
    device_size = head + len(stream) + 12 * (len(stream) // IDAT_MAX + 1) + 12
    assert KERNELS.png_file_room(len(stream)) == device_size  # what the device path takes
    assert finish(stream, device_size, shape) == data
    assert finish(stream, device_size + 1000, shape) == data
    for size in range(len(data), device_size):  # enough for the file: exact, or refused
        with contextlib.suppress(ValueError):
            assert finish(stream, size, shape) == data
    with pytest.raises(ValueError):
        finish(stream, len(data) - 1, shape)


def test_finish_zlib_rejects_bad_arguments() -> None:
    """Too small a buffer, a stream under 6 bytes (header + Adler-32), a bad shape: ValueError;
    a read-only buffer: TypeError."""
    head = KERNELS.PNG_HEAD_BYTES
    buffer = bytearray(head + 1000)
    for zlib_bytes in (-1, 0, 5):
        with pytest.raises(ValueError):
            KERNELS.png_finish_zlib(buffer, zlib_bytes, 4, 4, 1, 1)
    for zlib_bytes in (1000, 2 * IDAT_MAX):
        with pytest.raises(ValueError):
            KERNELS.png_finish_zlib(buffer, zlib_bytes, 4, 4, 1, 1)
    for shape in [(4, 4, 0, 1), (4, 4, 5, 1), (4, 4, 1, 3), (0, 4, 1, 1), (4, 0, 1, 1)]:
        with pytest.raises(ValueError):
            KERNELS.png_finish_zlib(buffer, 100, *shape)
    with pytest.raises(TypeError):
        KERNELS.png_finish_zlib(bytes(buffer), 100, 4, 4, 1, 1)
    assert KERNELS.png_finish_zlib(buffer, 100, 4, 4, 1, 1) > head + 100  # the buffer was fine
    with pytest.raises(ValueError):
        KERNELS.png_file_room(-1)
    for zlib_bytes in (0, 6, IDAT_MAX - 1, IDAT_MAX, 3 * IDAT_MAX + 5):  # 12 bytes per chunk
        chunks = zlib_bytes // IDAT_MAX + 1
        assert KERNELS.png_file_room(zlib_bytes) == head + zlib_bytes + 12 * chunks + 12


def device_buffer(stream: bytes, out_bytes: int) -> tuple[bytearray, int]:
    """A buffer as the GPU path leaves it: 0xA5 filler, the stream at PNG_HEAD_BYTES, its
    length in 8 little-endian bytes at room = png_file_room(out_bytes); and room."""
    room = KERNELS.png_file_room(out_bytes)
    buffer = bytearray(b"\xa5") * (room + 8)
    head = KERNELS.PNG_HEAD_BYTES
    buffer[head : head + len(stream)] = stream
    buffer[room : room + 8] = len(stream).to_bytes(8, "little")
    return buffer, room


@pytest.mark.parametrize("index", range(4))
@pytest.mark.parametrize("slack", [0, 1, 5000])
def test_finish_zlib_to_file_writes_the_cpu_file(tmp_path: Path, index: int, slack: int) -> None:
    """png_finish_zlib_to_file reads the stream's length from the buffer, frames it and writes
    exactly the CPU encoder's file to the target (the temporary file gone), whatever room the
    device path left past the stream; it returns the file's size and two durations."""
    _, rows, shape = finish_cases()[index]
    data = encode_both(rows, *shape)
    stream = zlib_stream(data, *shape)
    buffer, room = device_buffer(stream, len(stream) + slack)
    temp, target = tmp_path / "out.png.tmp", tmp_path / "out.png"
    size, framing, writing = KERNELS.png_finish_zlib_to_file(
        buffer, room, len(stream) + slack, *shape, str(temp), str(target), False, False
    )
    assert size == len(data) and target.read_bytes() == data
    assert framing >= 0 and writing >= 0
    assert not temp.exists()


def test_finish_zlib_to_file_refuses_bad_lengths_and_existing_targets(tmp_path: Path) -> None:
    """A length under 6 or over out_bytes: RuntimeError naming it, nothing written; an existing
    target without overwrite: FileExistsError, the target unchanged (with overwrite: replaced);
    too little room or a bad shape: ValueError; a read-only buffer: TypeError."""
    _, rows, shape = finish_cases()[0]
    data = encode_both(rows, *shape)
    stream = zlib_stream(data, *shape)
    temp, target = tmp_path / "out.png.tmp", tmp_path / "out.png"
    out_bytes = len(stream) + 10
    for length in (0, 5, out_bytes + 1, 1 << 62):
        buffer, room = device_buffer(stream, out_bytes)
        buffer[room : room + 8] = length.to_bytes(8, "little")
        with pytest.raises(RuntimeError, match=f"a stream of {length} bytes"):
            KERNELS.png_finish_zlib_to_file(
                buffer, room, out_bytes, *shape, str(temp), str(target), False, False
            )
        assert not target.exists() and not temp.exists()
    target.write_bytes(b"kept")
    buffer, room = device_buffer(stream, out_bytes)
    with pytest.raises(FileExistsError):
        KERNELS.png_finish_zlib_to_file(
            buffer, room, out_bytes, *shape, str(temp), str(target), False, False
        )
    assert target.read_bytes() == b"kept" and not temp.exists()
    buffer, room = device_buffer(stream, out_bytes)
    KERNELS.png_finish_zlib_to_file(
        buffer, room, out_bytes, *shape, str(temp), str(target), True, False
    )
    assert target.read_bytes() == data
    buffer, room = device_buffer(stream, out_bytes)
    for bad_room, bad_out in [(room - 1, out_bytes), (room, 5), (len(buffer) - 7, out_bytes)]:
        with pytest.raises(ValueError):
            KERNELS.png_finish_zlib_to_file(
                buffer, bad_room, bad_out, *shape, str(temp), str(target), True, False
            )
    with pytest.raises(ValueError):
        KERNELS.png_finish_zlib_to_file(
            buffer, room, out_bytes, 4, 4, 5, 1, str(temp), str(target), True, False
        )
    with pytest.raises(TypeError):
        KERNELS.png_finish_zlib_to_file(
            bytes(buffer), room, out_bytes, *shape, str(temp), str(target), True, False
        )


def available_memory() -> int:
    """Bytes of physical memory free now (0 where unknown)."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


@pytest.mark.slow
@pytest.mark.skipif(available_memory() < 4 << 30, reason="needs 4 GiB of free memory")
def test_finish_zlib_splits_a_stream_longer_than_one_idat() -> None:
    """A stream of 1 GiB + 4099 bytes (a position-dependent pattern: a misplaced byte shows):
    two IDAT chunks, the first of 2^30 bytes, each CRC right, the payloads the stream."""
    head = KERNELS.PNG_HEAD_BYTES
    zlib_bytes = IDAT_MAX + 4099
    period = 4099  # does not divide 2^30: each IDAT piece starts at another phase
    pattern = np.random.default_rng(5).integers(0, 256, period, dtype=np.uint8)
    tile = np.tile(pattern, (64 << 20) // period)
    size = head + zlib_bytes + 12 * (zlib_bytes // IDAT_MAX + 1) + 12
    buffer = bytearray(size)
    array = np.frombuffer(buffer, dtype=np.uint8)
    for start in range(0, zlib_bytes, len(tile)):
        piece = tile[: min(len(tile), zlib_bytes - start)]
        array[head + start : head + start + len(piece)] = piece
    del array
    length = KERNELS.png_finish_zlib(buffer, zlib_bytes, 640, 480, 1, 1)
    assert length == head + zlib_bytes + 12 + 12 + 4  # one more chunk header (8) and CRC (4)
    parts = png_chunks(memoryview(buffer)[:length])
    idats = [body for kind, body in parts if kind == b"IDAT"]
    assert [len(body) for body in idats] == [IDAT_MAX, zlib_bytes - IDAT_MAX]
    done = 0
    for body in idats:
        values = np.frombuffer(body, dtype=np.uint8)
        for start in range(0, len(values), len(tile)):
            got = values[start : start + len(tile)]
            phase = (done + start) % period
            want = np.roll(tile, -phase)[: len(got)] if phase else tile[: len(got)]
            assert np.array_equal(got, want), f"payload byte {done + start}.. misplaced"
        done += len(values)
        del values
    parts.clear()
    del idats


# ------------------------------------------------------------------ png_deflate_layout


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    row=st.one_of(st.integers(1, 300), st.integers(2, 20000), st.integers(32000, 140000)),
    height_draw=st.integers(1, 2000),
    seed=st.integers(0, 2**32 - 1),
)
def test_layout_holds_the_stream_of_incompressible_rows(
    row: int, height_draw: int, seed: int
) -> None:
    """The workspace: the stream first (a multiple of 8 bytes, with room for the stream of
    noise and for any all-stored stream, and not much more), then the other regions, the
    stream's length (uint64) last; one block per BLOCK_BYTES of rows (at least one row)."""
    height = max(1, min(height_draw, 3_000_000 // row))
    total, out, out_bytes, size, blocks = KERNELS.png_deflate_layout(row, height)
    assert out == 0
    assert out_bytes > 0 and out_bytes % 8 == 0
    assert out + out_bytes <= size and size % 8 == 0 and size + 8 <= total
    assert blocks == -(-height // max(1, BLOCK_BYTES // row))
    if row < 2:
        return  # no pixels in a filtered row of one byte: nothing to encode
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, 256, (height, row), dtype=np.uint8)
    rows[:, 0] = rng.integers(0, 5, height)
    data = encode_both(rows, row - 1, height, 1, 1)
    stream = zlib_stream(data, row - 1, height, 1, 1)
    stored = stored_stream_bytes(row, height)  # the stream of any rows, all blocks stored
    assert len(stream) <= out_bytes and stored <= out_bytes
    pieces = sum(
        -(-min(block_rows(row), height - first) * row // STORED_PIECE)
        for first in range(0, height, block_rows(row))
    )
    assert out_bytes - stored <= 8 * (blocks + pieces) + 512  # the stored bound: tight


@pytest.mark.parametrize(("row", "height"), [(0, 1), (1, 0), (-3, 5), (5, -3)])
def test_layout_rejects_empty_shapes(row: int, height: int) -> None:
    """Rows and heights under 1 are ValueErrors."""
    with pytest.raises(ValueError):
        KERNELS.png_deflate_layout(row, height)
