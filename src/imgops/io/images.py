"""Image decode and encode with OpenCV: 8/16-bit, gray/RGB/RGBA/palette, files and bytes.

Decoding follows OpenCV's default reading (EXIF orientation applied, palette expanded, alpha
dropped) but keeps the sample depth (16-bit stays 16-bit). Every failure raises
`ImageDecodeError` / `ImageEncodeError` with a one-line reason fit for the user.

cv2 is imported lazily, on first use, so importing this module stays cheap.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass, field

import numpy as np

from . import decoder_warnings
from .defaults import DEFAULT_PNG_LEVEL, LUMAS, MAX_PIXELS_ENV, default_max_pixels
from .image_headers import HeaderInfo, header_info, sniff_format
from .inputs import MAX_INPUT_BYTES, read_input_bytes

__all__ = [
    "DEFAULT_PNG_LEVEL",
    "FORMAT_EXTENSIONS",
    "LUMAS",
    "MAX_PIXELS_ENV",
    "PNG_ENCODERS",
    "DecodedImage",
    "HeaderInfo",
    "ImageDecodeError",
    "ImageEncodeError",
    "decode_image",
    "default_max_pixels",
    "encode_image",
    "image_dimensions",
    "quiet_opencv",
    "read_image",
    "sniff_format",
]

#: Output formats (the `--format` names) and the suffix each writes.
FORMAT_EXTENSIONS = {"png": ".png", "tif": ".tif", "jpg": ".jpg", "bmp": ".bmp", "webp": ".webp"}
#: PNG encoders: "imgops" (imgops.io.png, a fast deflate) or "opencv" (libpng through cv2).
PNG_ENCODERS = ("imgops", "opencv")
_SIXTEEN_BIT_FORMATS = ("png", "tif")


class ImageDecodeError(ValueError):
    """The data is not an image imgops can read; the message says why in one line."""


class ImageEncodeError(ValueError):
    """The array cannot be written in the requested format; the message says why."""


@dataclass(frozen=True)
class DecodedImage:
    """A decoded image: `pixels` is (H, W) gray or (H, W, 3) in `channel_order`, uint8 or uint16.

    `warnings`: one-line notes about this file for the report, e.g. "TIFF has 3 pages; page 0
    was converted", or a libpng/libjpeg warning captured while it was decoded (see
    imgops.io.decoder_warnings).
    """

    pixels: np.ndarray
    channel_order: str | None  # "bgr" for colour images (OpenCV's order), None for gray
    warnings: tuple[str, ...] = field(default=())
    #: The pixels are the luma plane a colour JPEG stores, decoded alone (luma "stored").
    stored_luma: bool = False

    @property
    def decoder(self) -> str:
        """The decoder's name for reports: "opencv", or "opencv-luma" for a stored luma plane."""
        return "opencv-luma" if self.stored_luma else "opencv"

    @property
    def note(self) -> str | None:
        """The warnings joined into one line ("; "), or None."""
        return "; ".join(self.warnings) if self.warnings else None

    @property
    def is_gray(self) -> bool:
        """True for single-channel images (they pass through gray unchanged)."""
        return self.pixels.ndim == 2


_cv2_module = None


def _cv2():
    """OpenCV, imported on first use."""
    global _cv2_module
    if _cv2_module is None:
        import cv2

        _cv2_module = cv2
    return _cv2_module


def quiet_opencv() -> None:
    """Silences OpenCV's own log lines on stderr (imgops reports each failure in one line)."""
    os.environ.setdefault("OPENCV_LOG_LEVEL", "SILENT")
    if _cv2_module is not None:
        _cv2_module.utils.logging.setLogLevel(_cv2_module.utils.logging.LOG_LEVEL_SILENT)


# --------------------------------------------------------------------------------------------
# Header sniffing: format and dimensions without decoding (decompression-bomb check).


def image_dimensions(data: bytes | memoryview) -> tuple[int, int] | None:
    """(width, height) of the image a decoder would produce, from the whole header of a PNG,
    JPEG, TIFF (IFDs anywhere in the file), BMP, WebP, GIF or PNM; None if it cannot tell."""
    info = header_info(data)
    return None if info is None else (info.width, info.height)


# --------------------------------------------------------------------------------------------
# Structure checks: name the problem precisely (truncation) instead of "cannot decode".


def _png_problem(data: bytes | memoryview) -> str | None:
    """Why a PNG cannot be complete (data ends inside a chunk), or None if the chunks look whole."""
    pos, end, seen_idat = 8, len(data), False
    while pos + 8 <= end:
        (length,) = struct.unpack(">I", bytes(data[pos : pos + 4]))
        kind = bytes(data[pos + 4 : pos + 8])
        if not kind.isalpha() or (pos == 8 and kind != b"IHDR"):
            return f"corrupt PNG: invalid chunk at byte {pos}"
        if pos + 12 + length > end:
            name = kind.decode("latin-1")
            return f"truncated PNG: the file ends inside its {name} chunk ({end} bytes)"
        if kind == b"IEND":
            return None
        seen_idat = seen_idat or kind == b"IDAT"
        pos += 12 + length
    if pos == end:
        if not seen_idat:
            return f"truncated PNG: the file ends before any image data ({end} bytes)"
        return None  # ends on a chunk boundary after image data: let the decoder judge
    return f"truncated PNG: the file ends inside a chunk header ({end} bytes)"


# One 0xFF then a marker byte: a literal first byte lets re skip ahead at memchr speed (25x
# faster than a leading "\xff+" on photos), and the match starts at the last fill byte.
_JPEG_MARKER_IN_SCAN = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")


def jpeg_structure_problem(data: bytes | memoryview) -> str | None:
    """Why a JPEG is incomplete (no end-of-image marker), or None if its structure is whole."""
    pos, end = 2, len(data)
    view = bytes(data) if isinstance(data, memoryview) else data
    while pos + 2 <= end:
        if view[pos] != 0xFF:
            return f"corrupt JPEG: expected a marker at byte {pos}"
        marker = view[pos + 1]
        if marker == 0xFF:
            pos += 1
            continue
        if marker == 0xD9:
            return None
        if 0xD0 <= marker <= 0xD7 or marker == 0x01:
            pos += 2
            continue
        if pos + 4 > end:
            break
        (length,) = struct.unpack(">H", view[pos + 2 : pos + 4])
        pos += 2 + length
        if marker == 0xDA:  # entropy-coded data runs to the next real marker
            match = _JPEG_MARKER_IN_SCAN.search(view, pos)
            if match is None:
                break
            pos = match.start()
    return f"truncated JPEG: the file ends before its end-of-image marker ({end} bytes)"


# --------------------------------------------------------------------------------------------
# Decoding


def read_image(
    path: str | os.PathLike[str], *, max_pixels: int | None = None, luma: str = "exact"
) -> DecodedImage:
    """Reads and decodes an image file; see decode_image. OSError for unreadable files."""
    return decode_image(read_input_bytes(path), max_pixels=max_pixels, luma=luma)


def decode_image(
    data: bytes | memoryview, *, max_pixels: int | None = None, luma: str = "exact"
) -> DecodedImage:
    """Decodes encoded image bytes (any format OpenCV reads) to a gray or BGR uint8/uint16 array.

    EXIF orientation is applied, palettes are expanded and alpha is dropped, as OpenCV does by
    default; the bit depth is kept. Images over `max_pixels` (default: default_max_pixels())
    are refused from their header, before decoding. `luma` "stored" decodes an 8-bit YCbCr
    JPEG to the luma plane it stores (libjpeg skips the colour planes: about 1.5x faster), a
    gray image with `stored_luma` set; every other file decodes as with "exact".

    Raises:
        ImageDecodeError: empty, truncated, corrupt, not an image, too large, or an unsupported
            sample type; the message is one line.
        ValueError: `luma` is neither "exact" nor "stored".
    """
    if luma not in LUMAS:
        raise ValueError(f"luma must be exact or stored, got {luma!r}")
    if len(data) == 0:
        raise ImageDecodeError("empty file (0 bytes)")
    if len(data) > MAX_INPUT_BYTES:
        raise ImageDecodeError(
            f"data is {len(data) / (1 << 30):.1f} GiB; imgops decodes images of at most 2 GiB "
            "(OpenCV's limit for one encoded image)"
        )
    try:
        limit = default_max_pixels() if max_pixels is None else max_pixels
    except ValueError as error:
        raise ImageDecodeError(str(error)) from None
    kind = sniff_format(data)
    info = header_info(data)
    _check_size(kind, info, limit)
    if kind == "png":
        problem = _png_problem(data)
        if problem:
            raise ImageDecodeError(problem)
    notes = _page_notes(kind, info)
    stored = luma == "stored" and info is not None and info.stored_luma
    pixels, captured = _imdecode(data, kind, luma_plane=stored)
    image = _normalize(pixels)
    warnings = notes + captured
    if warnings or stored:
        image = DecodedImage(image.pixels, image.channel_order, warnings, stored_luma=stored)
    return image


_LABELS = {"jpeg": "JPEG", "tiff": "TIFF", "webp": "WebP", "pnm": "PNM"}


def _check_size(kind: str | None, info: HeaderInfo | None, limit: int) -> None:
    """Refuses an image over `limit` pixels (or with an unreadable header) before decoding."""
    label = _LABELS.get(kind or "", (kind or "").upper())
    if info is None:
        if kind is not None and kind != "pnm":  # a decoder would fail, or decode a bomb
            raise ImageDecodeError(f"corrupt {label}: cannot read the image size from its header")
        return
    width, height = info.width, info.height
    if width == 0 or height == 0:
        raise ImageDecodeError(f"corrupt {label}: header says {width}x{height} pixels")
    if width * height > limit:
        raise ImageDecodeError(
            f"image is {width}x{height} ({width * height} pixels), over the limit of "
            f"{limit} pixels (set {MAX_PIXELS_ENV} to raise it)"
        )


def _page_notes(kind: str | None, info: HeaderInfo | None) -> tuple[str, ...]:
    """The note for a multi-page TIFF: only page 0 is decoded (as OpenCV's imdecode does)."""
    if kind != "tiff" or info is None or not info.pages or info.pages < 2:
        return ()
    count = f"at least {info.pages}" if info.pages_capped else str(info.pages)
    return (f"TIFF has {count} pages; page 0 was converted, the others ignored",)


def _imdecode(
    data: bytes | memoryview, kind: str | None, *, luma_plane: bool = False
) -> tuple[np.ndarray, tuple[str, ...]]:
    """OpenCV's decode of `data`, and the library warnings it printed (when captured).
    `luma_plane`: a YCbCr JPEG's Y plane alone (OpenCV asks libjpeg for JCS_GRAYSCALE, which
    for YCbCr data is the stored Y, and the colour planes are never inverse-transformed)."""
    cv2 = _cv2()
    buffer = np.frombuffer(data, dtype=np.uint8)
    flags = cv2.IMREAD_ANYDEPTH if luma_plane else cv2.IMREAD_ANYDEPTH | cv2.IMREAD_ANYCOLOR
    with decoder_warnings.capture(lambda: cv2.imdecode(buffer, flags)) as captured:
        try:
            pixels = cv2.imdecode(buffer, flags)
        except cv2.error as error:
            text = str(error)
            if "validateInputImageSize" in text or "pixels" in text.lower():
                raise ImageDecodeError("image too large for OpenCV's pixel limit") from None
            raise ImageDecodeError(f"cannot decode {kind or 'image'}: {_last_line(text)}") from None
    if pixels is None or pixels.size == 0:
        raise ImageDecodeError(_diagnose(data, kind))
    return pixels, tuple(captured)


def _diagnose(data: bytes | memoryview, kind: str | None) -> str:
    if kind is None:
        return "not an image (no format OpenCV reads recognises this data)"
    if kind == "jpeg":
        problem = jpeg_structure_problem(data)
        if problem:
            return problem
    label = {"jpeg": "JPEG", "tiff": "TIFF", "webp": "WebP"}.get(kind, kind.upper())
    return f"corrupt or unsupported {label}: OpenCV could not decode it"


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "unknown error"


def _normalize(pixels: np.ndarray) -> DecodedImage:
    if pixels.dtype not in (np.uint8, np.uint16):
        raise ImageDecodeError(
            f"unsupported sample type {pixels.dtype} (imgops reads 8- and 16-bit images)"
        )
    if pixels.ndim == 3:
        channels = pixels.shape[2]
        if channels in (1, 2):  # gray (+ alpha)
            pixels = np.ascontiguousarray(pixels[:, :, 0])
        elif channels == 4:  # BGRA: drop alpha
            pixels = np.ascontiguousarray(pixels[:, :, :3])
        elif channels != 3:
            raise ImageDecodeError(f"unsupported image with {channels} channels")
    elif pixels.ndim != 2:
        raise ImageDecodeError(f"unsupported image of shape {pixels.shape}")
    return DecodedImage(pixels, None if pixels.ndim == 2 else "bgr")


# --------------------------------------------------------------------------------------------
# Encoding


def _opencv_png_params(level: int) -> list[int]:
    """OpenCV parameters for a PNG level with png_encoder="opencv" (see encode_image)."""
    cv2 = _cv2()
    if level == 0:
        return [cv2.IMWRITE_PNG_COMPRESSION, 0, cv2.IMWRITE_PNG_FILTER, cv2.IMWRITE_PNG_FILTER_NONE]
    if level in (1, 2):
        png_filter = cv2.IMWRITE_PNG_FILTER_SUB if level == 1 else cv2.IMWRITE_PNG_FILTER_PAETH
        return [
            cv2.IMWRITE_PNG_COMPRESSION, 1,
            cv2.IMWRITE_PNG_STRATEGY, cv2.IMWRITE_PNG_STRATEGY_RLE,
            cv2.IMWRITE_PNG_FILTER, png_filter,
        ]  # fmt: skip
    return [
        cv2.IMWRITE_PNG_COMPRESSION, level,
        cv2.IMWRITE_PNG_STRATEGY, cv2.IMWRITE_PNG_STRATEGY_DEFAULT,
        cv2.IMWRITE_PNG_FILTER, cv2.IMWRITE_PNG_ALL_FILTERS,
    ]  # fmt: skip


def _encode_params(fmt: str, png_level: int) -> list[int]:
    cv2 = _cv2()
    if fmt == "png":
        return _opencv_png_params(png_level)
    if fmt == "tif":
        return [cv2.IMWRITE_TIFF_COMPRESSION, cv2.IMWRITE_TIFF_COMPRESSION_NONE]
    if fmt == "jpg":
        return [cv2.IMWRITE_JPEG_QUALITY, 95]
    if fmt == "webp":
        return [cv2.IMWRITE_WEBP_QUALITY, 101]  # lossless
    return []


def encode_image(
    array: np.ndarray,
    fmt: str = "png",
    *,
    png_level: int = DEFAULT_PNG_LEVEL,
    png_encoder: str = "imgops",
) -> bytes:
    """Encodes a (H, W) or (H, W, 3) BGR uint8/uint16 array as png, tif, jpg, bmp or webp bytes.

    PNG goes through imgops.io.png (levels: 0 stored, 1 fastest compressed, 2 default: smaller
    than OpenCV's default and faster, 3-9 zlib matching for drawings); `png_encoder="opencv"`
    uses libpng instead (0 stored, 1 = OpenCV's default bytes, 2 Paeth filter, 3-9 zlib level
    with adaptive filters). TIFF is written uncompressed (fast), JPEG at quality 95, WebP
    lossless. 16-bit arrays: PNG or TIFF only.

    Raises:
        ImageEncodeError: unsupported format, level, dtype or shape for the format.
    """
    if fmt not in FORMAT_EXTENSIONS:
        known = ", ".join(FORMAT_EXTENSIONS)
        raise ImageEncodeError(f"unknown format {fmt!r} (expected one of {known})")
    if not 0 <= png_level <= 9:
        raise ImageEncodeError(f"PNG level must be 0..9, got {png_level}")
    if png_encoder not in PNG_ENCODERS:
        raise ImageEncodeError(f"unknown PNG encoder {png_encoder!r}")
    if array.dtype not in (np.uint8, np.uint16):
        raise ImageEncodeError(f"cannot encode {array.dtype} samples (uint8 or uint16 expected)")
    if not (array.ndim == 2 or (array.ndim == 3 and array.shape[2] == 3)):
        raise ImageEncodeError(f"cannot encode an array of shape {array.shape}")
    if array.dtype == np.uint16 and fmt not in _SIXTEEN_BIT_FORMATS:
        raise ImageEncodeError(f"16-bit images can be written as png or tif only, not {fmt}")
    if fmt == "png" and png_encoder == "imgops":
        from .png import encode_png

        rgb = array if array.ndim == 2 else array[..., ::-1]
        return encode_png(np.ascontiguousarray(rgb), level=png_level)
    cv2 = _cv2()
    try:
        ok, encoded = cv2.imencode(
            FORMAT_EXTENSIONS[fmt], np.ascontiguousarray(array), _encode_params(fmt, png_level)
        )
    except cv2.error as error:
        raise ImageEncodeError(f"{fmt} encoding failed: {_last_line(str(error))}") from None
    if not ok:
        raise ImageEncodeError(f"{fmt} encoding failed")
    return encoded.tobytes()
