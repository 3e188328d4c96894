"""A fast PNG encoder: one-pass row filters (C++, numpy where not built), a fast deflate.

Writes gray (color type 0), gray+alpha (4), RGB (2) and RGBA (6) images of 8 or 16 bits (16-bit
samples big-endian, as PNG requires), as IHDR, IDAT... and IEND chunks that every reader opens.
Channels are taken in R, G, B(, A) order: flip OpenCV's BGR before calling.

The rows are filtered and compressed in strips of about half a megabyte, so memory stays small
and the data stays in cache; the deflate libraries release the GIL while they work, so threads
scale.

Levels (measured on the gray outputs of samples/; docs/BENCHMARKS.md has the tables):

* 0: no filter, stored blocks (no compression): the fastest, the largest.
* 1: the Average filter and ISA-L's level 1 (package ``isal``): about 3x faster than OpenCV's
  default encoder, within about ±2 % of its size on photos (sometimes larger). Without ``isal``
  it falls back to level 2.
* 2 (default): per-row adaptive filter (Sub, Up or Average, whichever has the smallest sum of
  absolute residuals) and deflate with the run-length strategy at level 1 (package ``zlib-ng``,
  else the standard library's zlib, which gives the same bytes). Smaller than OpenCV's default
  on every sample photo and faster.
* 3..9: the adaptive filter and deflate at that level with the default strategy (better for
  drawings and masks with repeated patterns; slow on photos).

The fast packages are optional: without them every level works through the standard library.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from ..native import cli_kernels

__all__ = ["DEFAULT_LEVEL", "backend_info", "encode_png", "iter_png_chunks", "write_png"]

DEFAULT_LEVEL = 2
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_STRIP_BYTES = 1 << 19  # filter and compress about this many bytes at a time
_SCORE_STRIDE = 4  # the adaptive filter scores every 4th byte of wide rows
_IDAT_BYTES = 1 << 20  # emit an IDAT chunk once this much compressed data is pending
_COLOR_TYPES = {1: 0, 2: 4, 3: 2, 4: 6}  # channels -> PNG color type
_FILTER_NONE, _FILTER_SUB, _FILTER_UP, _FILTER_AVG, _FILTER_PAETH = 0, 1, 2, 3, 4


@dataclass(frozen=True)
class _Deflate:
    """One deflate implementation: a compressor factory and its CRC-32."""

    name: str
    version: str
    compressobj: Callable[..., Any]
    crc32: Callable[..., int]
    rle: int
    default_strategy: int


def _load_backends() -> dict[str, _Deflate]:
    backends = {
        "zlib": _Deflate(
            "zlib", zlib.ZLIB_RUNTIME_VERSION, zlib.compressobj, zlib.crc32, zlib.Z_RLE, 0
        )
    }
    try:
        from zlib_ng import zlib_ng

        backends["zlib-ng"] = _Deflate(
            "zlib-ng", zlib_ng.ZLIBNG_VERSION, zlib_ng.compressobj, zlib_ng.crc32, zlib_ng.Z_RLE, 0
        )
    except ImportError:
        pass
    try:
        import isal
        from isal import isal_zlib

        backends["isal"] = _Deflate(
            "isal", isal.__version__, isal_zlib.compressobj, isal_zlib.crc32, 0, 0
        )
    except ImportError:
        pass
    return backends


_BACKENDS = _load_backends()
_GENERAL = _BACKENDS.get("zlib-ng", _BACKENDS["zlib"])  # levels 0, 2..9
_CRC32 = _BACKENDS.get("isal", _GENERAL).crc32  # all give the same CRC; use the fastest


def backend_info() -> dict[str, str]:
    """Which deflate implementation serves each level, with versions (for reports and `doctor`)."""
    fast = _BACKENDS.get("isal")
    general = f"{_GENERAL.name} {_GENERAL.version}"
    return {
        "level 0": general,
        "level 1": f"{fast.name} {fast.version}" if fast else f"{general} (isal not installed)",
        "levels 2-9": general,
    }


def _plan(level: int) -> tuple[str, Callable[[], Any]]:
    """The filter mode and a compressor factory for a level."""
    if level == 0:
        return "none", lambda: _GENERAL.compressobj(0, zlib.DEFLATED, 15, 9)
    if level == 1 and "isal" in _BACKENDS:
        isal = _BACKENDS["isal"]
        return "avg", lambda: isal.compressobj(1, zlib.DEFLATED, 15, 9)
    if level <= 2:
        return "adaptive", lambda: _GENERAL.compressobj(1, zlib.DEFLATED, 15, 9, _GENERAL.rle)
    return "adaptive", lambda: _GENERAL.compressobj(level, zlib.DEFLATED, 15, 9)


def _check_image(image: np.ndarray) -> tuple[int, int, int, int]:
    """Validates the array; returns (height, width, channels, bit depth)."""
    if not isinstance(image, np.ndarray):
        raise TypeError(f"encode_png: expected a numpy array, got {type(image).__name__}")
    if image.dtype not in (np.uint8, np.uint16):
        raise TypeError(f"encode_png: expected uint8 or uint16 samples, got {image.dtype}")
    if image.ndim not in (2, 3):
        raise ValueError(f"encode_png: expected (H, W) or (H, W, C), got shape {image.shape}")
    channels = 1 if image.ndim == 2 else image.shape[2]
    if channels not in _COLOR_TYPES:
        raise ValueError(f"encode_png: expected 1 to 4 channels, got {channels}")
    height, width = image.shape[:2]
    if not (0 < height < 2**31 and 0 < width < 2**31):
        raise ValueError(f"encode_png: height and width must be 1..2^31-1, got {height}x{width}")
    return height, width, channels, 8 * image.dtype.itemsize


def _residuals(mode: int, cur: np.ndarray, up: np.ndarray, bpp: int, out: np.ndarray) -> None:
    """Writes the PNG filter residuals of rows `cur` (previous rows `up`) into `out` (uint8)."""
    if mode == _FILTER_NONE:
        np.copyto(out, cur)
    elif mode == _FILTER_SUB:
        out[:, :bpp] = cur[:, :bpp]
        np.subtract(cur[:, bpp:], cur[:, :-bpp], out=out[:, bpp:])
    elif mode == _FILTER_UP:
        np.subtract(cur, up, out=out)
    elif mode == _FILTER_PAETH:
        _paeth_residuals(cur, up, bpp, out)
    else:  # Average: cur - floor((left + up) / 2), computed without widening
        left, above = cur[:, :-bpp], up[:, bpp:]
        tail = out[:, bpp:]
        np.bitwise_xor(left, above, out=tail)
        np.right_shift(tail, 1, out=tail)
        tail += left & above
        np.right_shift(up[:, :bpp], 1, out=out[:, :bpp])
        np.subtract(cur, out, out=out)


def _paeth_residuals(cur: np.ndarray, up: np.ndarray, bpp: int, out: np.ndarray) -> None:
    """Paeth residuals (PNG 9.4): cur minus whichever of left, above, upper-left is nearest
    to left + above - upper-left (ties to left, then above); left = upper-left = 0 in pixel 0."""
    a = np.zeros(cur.shape, dtype=np.int16)
    c = np.zeros(cur.shape, dtype=np.int16)
    a[:, bpp:] = cur[:, :-bpp]
    c[:, bpp:] = up[:, :-bpp]
    b = up.astype(np.int16)
    pa = np.abs(b - c)
    pb = np.abs(a - c)
    pc = np.abs(a + b - 2 * c)
    predictor = np.where((pa <= pb) & (pa <= pc), a, np.where(pb <= pc, b, c))
    np.subtract(cur, predictor.astype(np.uint8), out=out)


def _filter_strip(
    mode: str, cur: np.ndarray, up: np.ndarray, bpp: int, out: np.ndarray, work: np.ndarray
) -> None:
    """Fills `out` (rows, 1 + row bytes): the filter type byte then the residuals of each row."""
    body = out[:, 1:]
    if mode != "adaptive":
        out[:, 0] = _FILTER_CODES[mode]
        _residuals(_FILTER_CODES[mode], cur, up, bpp, body)
        return
    # Adaptive: the filter with the smallest sum of |residual| (as signed bytes) per row,
    # the heuristic the PNG specification recommends.
    # The score looks at every _SCORE_STRIDE-th byte of wide rows: a quarter of the cost, the
    # same choice on nearly every row.
    rows = cur.shape[0]
    candidates = (_FILTER_SUB, _FILTER_UP, _FILTER_AVG)
    stride = _SCORE_STRIDE if cur.shape[1] >= 16 * _SCORE_STRIDE else 1
    scores = np.empty((len(candidates), rows), dtype=np.uint64)
    magnitude = work[len(candidates), :rows, ::stride]
    for i, kind in enumerate(candidates):
        residual = work[i, :rows]
        _residuals(kind, cur, up, bpp, residual)
        sample = residual[:, ::stride]
        np.negative(sample, out=magnitude)
        np.minimum(sample, magnitude, out=magnitude)
        magnitude.sum(axis=1, dtype=np.uint64, out=scores[i])
    best = scores.argmin(axis=0)
    out[:, 0] = np.asarray(candidates, dtype=np.uint8)[best]
    for i in range(len(candidates)):
        chosen = best == i
        if chosen.all():
            np.copyto(body, work[i, :rows])
        elif chosen.any():
            body[chosen] = work[i, :rows][chosen]


_FILTER_CODES = {
    "adaptive": -1,
    "none": _FILTER_NONE,
    "sub": _FILTER_SUB,
    "up": _FILTER_UP,
    "avg": _FILTER_AVG,
    "paeth": _FILTER_PAETH,
}


def _idat_stream(image: np.ndarray, level: int) -> Iterator[bytes]:
    """Yields the compressed, filtered image data (the concatenated IDAT payload) in pieces."""
    height, width = image.shape[:2]
    channels = 1 if image.ndim == 2 else image.shape[2]
    itemsize = image.dtype.itemsize
    bpp = channels * itemsize
    row_bytes = width * bpp
    strip = max(1, min(height, _STRIP_BYTES // row_bytes))
    mode, make_compressor = _plan(level)
    compressor = make_compressor()

    # Row 0 of `rows` holds the row above the strip (zeros above the first row, as PNG defines).
    rows = np.zeros((strip + 1, row_bytes), dtype=np.uint8)
    samples = rows.view(">u2" if itemsize == 2 else np.uint8).reshape(strip + 1, width * channels)
    out = np.empty((strip, row_bytes + 1), dtype=np.uint8)
    kernels = cli_kernels()
    numpy_adaptive = mode == "adaptive" and kernels is None
    work = np.empty((4, strip, row_bytes), dtype=np.uint8) if numpy_adaptive else out
    flat = image.reshape(height, width * channels)
    for top in range(0, height, strip):
        count = min(strip, height - top)
        np.copyto(samples[1 : count + 1], flat[top : top + count])  # byte-swaps 16-bit samples
        if kernels is not None:  # one pass per row in C++; the same bytes as _filter_strip
            kernels.png_filter_rows(rows, out, count, row_bytes, bpp, _FILTER_CODES[mode])
        else:
            _filter_strip(mode, rows[1 : count + 1], rows[:count], bpp, out[:count], work)
        piece = compressor.compress(out[:count])
        if piece:
            yield piece
        rows[0] = rows[count]
    yield compressor.flush()


def _chunk(kind: bytes, data: bytes) -> bytes:
    crc = _CRC32(data, _CRC32(kind))
    return b"".join((struct.pack(">I", len(data)), kind, data, struct.pack(">I", crc)))


def iter_png_chunks(image: np.ndarray, *, level: int = DEFAULT_LEVEL) -> Iterator[bytes]:
    """Yields the PNG file in pieces (signature, IHDR, IDAT..., IEND), for streaming writes."""
    height, width, channels, depth = _check_image(image)
    if not 0 <= level <= 9:
        raise ValueError(f"encode_png: level must be 0..9, got {level}")
    yield PNG_SIGNATURE
    ihdr = struct.pack(">IIBBBBB", width, height, depth, _COLOR_TYPES[channels], 0, 0, 0)
    yield _chunk(b"IHDR", ihdr)
    pending: list[bytes] = []
    size = 0
    for piece in _idat_stream(image, level):
        pending.append(piece)
        size += len(piece)
        if size >= _IDAT_BYTES:
            yield _chunk(b"IDAT", b"".join(pending))
            pending, size = [], 0
    if pending:
        yield _chunk(b"IDAT", b"".join(pending))
    yield _chunk(b"IEND", b"")


def encode_png(image: np.ndarray, *, level: int = DEFAULT_LEVEL) -> bytes:
    """Encodes an (H, W) or (H, W, C) uint8/uint16 array (C = 1..4, RGB order) as PNG bytes.

    Example:
        >>> data = encode_png(np.zeros((2, 3), dtype=np.uint8))
        >>> data[:8] == PNG_SIGNATURE
        True
    """
    return b"".join(iter_png_chunks(image, level=level))


def write_png(
    target: str | os.PathLike[str] | BinaryIO, image: np.ndarray, *, level: int = DEFAULT_LEVEL
) -> int:
    """Writes `image` as PNG to a path or a binary file object; returns the bytes written.

    Writing to a path is not atomic: use imgops.io.atomic.atomic_output for that.
    """
    if hasattr(target, "write"):
        return sum(target.write(piece) for piece in iter_png_chunks(image, level=level))
    with open(target, "wb") as file:
        return sum(file.write(piece) for piece in iter_png_chunks(image, level=level))
