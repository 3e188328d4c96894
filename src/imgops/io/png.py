"""A fast PNG encoder: one-pass row filters (C++, numpy where not built), a fast deflate.

Writes gray (color type 0), gray+alpha (4), RGB (2) and RGBA (6) images of 8 or 16 bits (16-bit
samples big-endian, as PNG requires), as IHDR, IDAT... and IEND chunks that every reader opens.
Channels are taken in R, G, B(, A) order: flip OpenCV's BGR before calling.

The rows are filtered and compressed in strips of about half a megabyte, so memory stays small
and the data stays in cache; the deflate libraries release the GIL while they work, so threads
scale.

Levels (measured on the gray outputs of samples/ and the shared photos; docs/PNG_ENCODER.md):

* 0: no filter, stored blocks (no compression): the fastest to write, the largest.
* 1: the Average filter and ISA-L's level 1 (package ``isal``). Without ``isal`` it is level 2.
* 2 (default): imgops' own encoder (imgops._cli_kernels, csrc/standalone/png_encode.h): the
  Paeth filter (AVX2) and a deflate made for filtered rows (runs as distance-1 matches,
  dynamic Huffman tables fitted to a sample of the rows), about 5x faster than the zlib
  level 2 it replaces and about 12 % smaller than OpenCV's default on photos. Without the
  compiled module: the same filter and the run-length strategy of zlib at level 1 (the same
  pixels, other bytes).
* 3..9: per-row adaptive filter (Sub, Up or Average, whichever has the smallest sum of
  absolute residuals) and deflate at that level with the default strategy (better for
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

__all__ = [
    "DEFAULT_LEVEL",
    "backend_info",
    "encode_png",
    "encode_png_filtered",
    "filter_code_for",
    "iter_png_chunks",
    "write_png",
    "write_png_atomic",
]

DEFAULT_LEVEL = 2
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_STRIP_BYTES = 1 << 19  # filter and compress about this many bytes at a time
_SCORE_STRIDE = 4  # the adaptive filter scores every 4th byte of wide rows
_IDAT_BYTES = 1 << 20  # emit an IDAT chunk once this much compressed data is pending
_COLOR_TYPES = {1: 0, 2: 4, 3: 2, 4: 6}  # channels -> PNG color type
_FILTER_NONE, _FILTER_SUB, _FILTER_UP, _FILTER_AVG, _FILTER_PAETH = 0, 1, 2, 3, 4
_FILTER_CODES = {
    "adaptive": -1,
    "none": _FILTER_NONE,
    "sub": _FILTER_SUB,
    "up": _FILTER_UP,
    "avg": _FILTER_AVG,
    "paeth": _FILTER_PAETH,
}


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
    own = "imgops row deflate (imgops._cli_kernels)"
    level2 = own if cli_kernels() is not None else f"{general} (imgops._cli_kernels not built)"
    return {
        "level 0": general,
        "level 1": f"{fast.name} {fast.version}" if fast else f"{level2} (isal not installed)",
        "level 2": level2,
        "levels 3-9": general,
    }


def _uses_row_deflate(level: int) -> bool:
    """Whether a level is imgops' own encoder (level 2, and level 1 without isal)."""
    return level == 2 or (level == 1 and "isal" not in _BACKENDS)


def gpu_deflate_wanted() -> bool:
    """Whether the CUDA engine deflates on the GPU: yes unless IMGOPS_GPU_DEFLATE=0. On the
    H100 host it took a 3200-photo batch from 355 to ~600 files/s (docs/BENCHMARKS.md,
    2026-12-05, second session); the bytes are the CPU encoder's either way."""
    return os.environ.get("IMGOPS_GPU_DEFLATE", "1") != "0"


def device_deflate(level: int) -> Any:
    """imgops._cli_kernels where the GPU's deflate (csrc/device/png_deflate_kernels.cuh) gives
    this level's exact bytes (the levels imgops' own row deflate serves) and the module can frame
    its stream (png_finish_zlib); else None."""
    kernels = cli_kernels()
    if kernels is None or not _uses_row_deflate(level) or not hasattr(kernels, "png_finish_zlib"):
        return None
    return kernels


def _plan(level: int) -> tuple[str, Callable[[], Any]]:
    """The filter mode and a compressor factory for a level (the Python-side deflates)."""
    if level == 0:
        return "none", lambda: _GENERAL.compressobj(0, zlib.DEFLATED, 15, 9)
    if level == 1 and "isal" in _BACKENDS:
        isal = _BACKENDS["isal"]
        return "avg", lambda: isal.compressobj(1, zlib.DEFLATED, 15, 9)
    if level <= 2:  # imgops' own encoder where built; this is its fallback
        return "paeth", lambda: _GENERAL.compressobj(1, zlib.DEFLATED, 15, 9, _GENERAL.rle)
    return "adaptive", lambda: _GENERAL.compressobj(level, zlib.DEFLATED, 15, 9)


def filter_code_for(level: int) -> int:
    """The PNG filter code (as png_filter_rows and the png_filter op take it) of a level:
    0 none, 3 Average (level 1 with isal), 4 Paeth (level 2), -1 adaptive (levels 3..9)."""
    _check_level(level)
    return _FILTER_CODES[_plan(level)[0]]


def _check_level(level: int) -> None:
    if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level <= 9:
        raise ValueError(f"encode_png: level must be an integer 0..9, got {level!r}")


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


def _strip_rows(row_bytes: int, height: int) -> int:
    """Rows filtered and compressed at a time by the Python-side deflates."""
    return max(1, min(height, _STRIP_BYTES // row_bytes))


def _filtered_strips(image: np.ndarray, mode: str) -> Iterator[np.ndarray]:
    """Yields the filtered rows of the image, _strip_rows at a time (a reused buffer)."""
    height, width = image.shape[:2]
    channels = 1 if image.ndim == 2 else image.shape[2]
    itemsize = image.dtype.itemsize
    bpp = channels * itemsize
    row_bytes = width * bpp
    strip = _strip_rows(row_bytes, height)
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
        yield out[:count]
        rows[0] = rows[count]


def _compressed(strips: Iterator[np.ndarray], level: int) -> Iterator[bytes]:
    """Yields the zlib stream (the concatenated IDAT payload) of filtered strips, in pieces."""
    compressor = _plan(level)[1]()
    for strip in strips:
        piece = compressor.compress(strip)
        if piece:
            yield piece
    yield compressor.flush()


def _idat_chunks(pieces: Iterator[bytes]) -> Iterator[bytes]:
    """Groups pieces of the zlib stream into IDAT chunks of about _IDAT_BYTES."""
    pending: list[bytes] = []
    size = 0
    for piece in pieces:
        pending.append(piece)
        size += len(piece)
        if size >= _IDAT_BYTES:
            yield _chunk(b"IDAT", b"".join(pending))
            pending, size = [], 0
    if pending:
        yield _chunk(b"IDAT", b"".join(pending))


def _chunk(kind: bytes, data: bytes) -> bytes:
    crc = _CRC32(data, _CRC32(kind))
    return b"".join((struct.pack(">I", len(data)), kind, data, struct.pack(">I", crc)))


def _header(width: int, height: int, channels: int, depth: int) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, depth, _COLOR_TYPES[channels], 0, 0, 0)
    return PNG_SIGNATURE + _chunk(b"IHDR", ihdr)


def iter_png_chunks(image: np.ndarray, *, level: int = DEFAULT_LEVEL) -> Iterator[bytes]:
    """Yields the PNG file in pieces (signature, IHDR, IDAT..., IEND), for streaming writes."""
    height, width, channels, depth = _check_image(image)
    _check_level(level)
    kernels = cli_kernels()
    if kernels is not None and _uses_row_deflate(level):  # the whole file in one call
        pixels = np.ascontiguousarray(image)
        row_bytes = width * channels * pixels.itemsize
        yield kernels.png_encode(
            pixels, width, height, channels, pixels.itemsize, row_bytes, _FILTER_PAETH
        )
        return
    yield _header(width, height, channels, depth)
    mode = _plan(level)[0]
    yield from _idat_chunks(_compressed(_filtered_strips(image, mode), level))
    yield _chunk(b"IEND", b"")


def write_png_atomic(
    target: str | os.PathLike[str],
    image: np.ndarray,
    *,
    level: int = DEFAULT_LEVEL,
    overwrite: bool,
    durable: bool = True,
) -> tuple[int, float, float] | None:
    """Encodes `image` (as encode_png) straight into `target`, atomically as
    imgops.io.atomic.write_bytes_atomic writes: one native call encodes into a buffer the
    calling thread reuses and writes, syncs and commits the file, the GIL released throughout.
    Returns (bytes, encode seconds, write seconds), or None where that call does not serve
    `level` (or imgops._cli_kernels is missing): then encode and write as usual.

    Raises:
        OutputExistsError: `target` exists and `overwrite` is false.
        OSError: the write failed (the temporary file is removed).
    """
    kernels = cli_kernels()
    if kernels is None or not hasattr(kernels, "png_encode_to_file"):
        return None
    height, width, channels, _ = _check_image(image)
    _check_level(level)
    if not _uses_row_deflate(level):
        return None
    pixels = np.ascontiguousarray(image)
    row_bytes = width * channels * pixels.itemsize
    return _write_natively(
        kernels.png_encode_to_file,
        target,
        (pixels, width, height, channels, pixels.itemsize, row_bytes, _FILTER_PAETH),
        overwrite=overwrite,
        durable=durable,
    )


def write_zlib_png_atomic(
    target: str | os.PathLike[str],
    buffer: np.ndarray,
    *,
    room: int,
    out_bytes: int,
    width: int,
    height: int,
    channels: int,
    overwrite: bool,
    durable: bool = True,
) -> tuple[int, float, float] | None:
    """Frames a zlib stream the GPU deflated (8-bit rows) into its PNG file in place and
    writes it to `target` atomically, in one native call with the GIL released
    (png_finish_zlib_to_file: the encode threads of the CUDA engine hand the GIL over once per
    file for both). `buffer`: the pinned buffer laid out as the file, the stream at
    PNG_HEAD_BYTES, its length in 8 little-endian bytes at `room` (png_file_room(out_bytes)).
    Returns (bytes, framing seconds, write seconds), or None where the compiled module lacks
    that call (then png_finish_zlib and write_bytes_atomic).

    Raises:
        OutputExistsError: `target` exists and `overwrite` is false.
        OSError: the write failed (the temporary file is removed).
        RuntimeError: the stream's length is not one the device deflate can give.
    """
    kernels = cli_kernels()
    if kernels is None or not hasattr(kernels, "png_finish_zlib_to_file"):
        return None
    return _write_natively(
        kernels.png_finish_zlib_to_file,
        target,
        (buffer, room, out_bytes, width, height, channels, 1),
        overwrite=overwrite,
        durable=durable,
    )


def _write_natively(
    call: Callable[..., Any],
    target: str | os.PathLike[str],
    args: tuple[Any, ...],
    *,
    overwrite: bool,
    durable: bool,
) -> Any:
    """call(*args, temp, target, overwrite, durable): a native writer that writes a tracked
    temporary file beside `target` and commits it (its refusal to replace `target` becomes
    OutputExistsError)."""
    from .atomic import native_write, tracked_temporary

    path = os.fspath(target)
    with tracked_temporary(path, overwrite=overwrite, check=False) as temp:
        return native_write(call, path, *args, str(temp), path, overwrite, durable)


def encode_png_filtered(
    rows: np.ndarray, *, width: int, height: int, channels: int, bit_depth: int, level: int
) -> bytes:
    """The PNG file of rows already filtered: uint8 (height, 1 + width * channels * bit_depth/8),
    each row its filter-type byte then the residuals (16-bit samples big-endian), e.g. from the
    png_filter op, with the deflate of `level`. For filter_code_for(level)'s rows this gives
    exactly encode_png's bytes. Releases the GIL while it works.

    Example:
        >>> image = np.arange(12, dtype=np.uint8).reshape(3, 4)
        >>> rows = np.hstack([np.zeros((3, 1), np.uint8), image])  # filter 0 (None)
        >>> data = encode_png_filtered(rows, width=4, height=3, channels=1, bit_depth=8, level=2)
        >>> data[:8] == PNG_SIGNATURE
        True
    """
    _check_level(level)
    if channels not in _COLOR_TYPES or bit_depth not in (8, 16):
        raise ValueError(
            f"encode_png_filtered: channels must be 1..4 and bit_depth 8 or 16, got "
            f"{channels} and {bit_depth}"
        )
    if not (0 < height < 2**31 and 0 < width < 2**31):
        raise ValueError(
            f"encode_png_filtered: height and width must be 1..2^31-1, got {height}x{width}"
        )
    row_bytes = width * channels * bit_depth // 8
    if not isinstance(rows, np.ndarray) or rows.dtype != np.uint8:
        raise TypeError("encode_png_filtered: rows must be a uint8 numpy array")
    if rows.shape != (height, row_bytes + 1):
        raise ValueError(
            f"encode_png_filtered: rows must have shape {(height, row_bytes + 1)}, got {rows.shape}"
        )
    if int(rows[:, 0].max()) > _FILTER_PAETH:
        raise ValueError("encode_png_filtered: a row's filter type byte is not 0..4")
    rows = np.ascontiguousarray(rows)
    kernels = cli_kernels()
    if kernels is not None and _uses_row_deflate(level):
        return kernels.png_encode_filtered(rows, width, height, channels, bit_depth // 8)
    strip = _strip_rows(row_bytes, height)
    strips = (rows[top : top + strip] for top in range(0, height, strip))
    parts = [_header(width, height, channels, bit_depth)]
    parts.extend(_idat_chunks(_compressed(strips, level)))
    parts.append(_chunk(b"IEND", b""))
    return b"".join(parts)


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
