"""Image headers without decoding: the container format, the decoded size, the page count.

The decompression-bomb check (imgops.io.images) refuses an image from these numbers before a
decoder allocates anything, so they come from the *whole* header wherever it is: a TIFF's IFD
chain may start after megabytes of pixel data, a JPEG's frame header may follow any number of
other segments (and libjpeg skips stray bytes between segments, so this parser does too).

Every parser returns `HeaderInfo` or None ("could not tell"); none raises.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

__all__ = ["MAX_TIFF_PAGES_COUNTED", "HeaderInfo", "header_info", "sniff_format"]

#: A TIFF's IFD chain is followed at most this far (the page count then says "at least").
MAX_TIFF_PAGES_COUNTED = 1 << 16


@dataclass(frozen=True)
class HeaderInfo:
    """`width` x `height` of the image a decoder would produce (page 0); `pages` for TIFF/GIF
    (None where the format has one image or the count was not read); `pages_capped` when the
    IFD chain was longer than MAX_TIFF_PAGES_COUNTED."""

    width: int
    height: int
    pages: int | None = None
    pages_capped: bool = False
    #: A JPEG's colour space as libjpeg infers it from the frame and the JFIF/Adobe markers:
    #: "gray", "ycbcr", "rgb", "cmyk", "ycck" or "other"; None for other formats.
    jpeg_colour: str | None = None
    #: A JPEG whose luma plane libjpeg can decode alone: 8-bit YCbCr, baseline, extended or
    #: progressive Huffman coding (the frames every camera and library writes).
    stored_luma: bool = False


def sniff_format(data: bytes | memoryview) -> str | None:
    """The container format from the magic bytes ("png", "jpeg", "tiff", ...), or None."""
    head = bytes(data[:16])
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if head.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if head[:4] in (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+"):
        return "tiff"
    if head.startswith(b"BM"):
        return "bmp"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if len(head) >= 3 and head[0:1] == b"P" and head[1:2] in b"1234567fF" and head[2:3].isspace():
        return "pnm"
    return None


def header_info(data: bytes | memoryview) -> HeaderInfo | None:
    """The header numbers of a PNG, JPEG, TIFF/BigTIFF, BMP, WebP, GIF or PNM/PAM/PFM, or None."""
    kind = sniff_format(data)
    parser = _PARSERS.get(kind or "")
    if parser is None:
        return None
    view = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    try:
        return parser(view)
    except (struct.error, IndexError, ValueError, OverflowError):
        return None


def _png(data) -> HeaderInfo | None:
    if bytes(data[12:16]) != b"IHDR":
        return None
    width, height = struct.unpack(">II", data[16:24])
    return HeaderInfo(width, height)


_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def _jpeg(data) -> HeaderInfo | None:
    """The first frame header (SOFn), skipping stray bytes as libjpeg; the JFIF and Adobe
    markers up to the first scan decide the colour space (libjpeg-turbo's jdapimin.c rules)."""
    pos, end = 2, len(data)
    jfif, adobe_transform = False, None
    frame: tuple[int, bytes] | None = None  # (SOF marker, the frame header's bytes)
    while pos + 4 <= end:
        if data[pos] != 0xFF:  # libjpeg: "extraneous bytes before marker", then goes on
            pos += 1
            continue
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if 0xD0 <= marker <= 0xD8 or marker in (0x00, 0x01):
            pos += 2
            continue
        if marker == 0xD9 or marker == 0xDA:  # end of image, or the first scan
            break
        (length,) = struct.unpack(">H", data[pos + 2 : pos + 4])
        if marker in (0xE0, 0xEE) or (marker in _SOF_MARKERS and frame is None):
            segment = bytes(data[pos + 4 : pos + 2 + length])
            if marker == 0xE0:
                jfif = jfif or (len(segment) >= 14 and segment.startswith(b"JFIF\0"))
            elif marker == 0xEE and len(segment) >= 12 and segment.startswith(b"Adobe"):
                adobe_transform = segment[11]
            elif marker in _SOF_MARKERS:
                frame = (marker, segment)
        if length < 2:
            break
        pos += 2 + length
    if frame is None:
        return None
    marker, segment = frame
    height, width = struct.unpack(">HH", segment[1:5])
    colour = _jpeg_colour(segment, jfif, adobe_transform)
    plain = marker in (0xC0, 0xC1, 0xC2) and segment[0] == 8  # Huffman coding, 8-bit samples
    return HeaderInfo(width, height, jpeg_colour=colour, stored_luma=plain and colour == "ycbcr")


def _jpeg_colour(frame: bytes, jfif: bool, adobe_transform: int | None) -> str:
    """libjpeg-turbo's default_decompress_parms: the colour space of a frame's components."""
    count = frame[5] if len(frame) > 5 else 0
    ids = tuple(frame[6 + 3 * i] for i in range(count) if 6 + 3 * i < len(frame))
    if count == 1:
        return "gray"
    if count == 3 and len(ids) == 3:
        if jfif:
            return "ycbcr"
        if adobe_transform is not None:
            return "rgb" if adobe_transform == 0 else "ycbcr"
        return "rgb" if ids == (82, 71, 66) else "ycbcr"  # component ids "R", "G", "B"
    if count == 4:
        return "cmyk" if adobe_transform in (None, 0) else "ycck"
    return "other"


def _tiff(data) -> HeaderInfo | None:
    """Page 0's ImageWidth/ImageLength, and the pages counted along the whole IFD chain."""
    endian = "<" if bytes(data[:2]) == b"II" else ">"
    (version,) = struct.unpack(endian + "H", data[2:4])
    if version == 42:
        (offset,) = struct.unpack(endian + "I", data[4:8])
        count_fmt, entry_fmt, entry_size, next_fmt = "H", "HHI", 12, "I"
    elif version == 43:
        (offset,) = struct.unpack(endian + "Q", data[8:16])
        count_fmt, entry_fmt, entry_size, next_fmt = "Q", "HHQ", 20, "Q"
    else:
        return None
    count_size = struct.calcsize("<" + count_fmt)
    next_size, end = struct.calcsize("<" + next_fmt), len(data)
    first: tuple[int, int] | None = None
    pages, seen = 0, set()
    while offset != 0 and offset not in seen and pages < MAX_TIFF_PAGES_COUNTED:
        if offset + count_size > end:
            break  # libtiff stops at a directory it cannot read
        seen.add(offset)
        (count,) = struct.unpack(endian + count_fmt, data[offset : offset + count_size])
        entries_end = offset + count_size + count * entry_size
        if entries_end + next_size > end:
            break
        if first is None:
            first = _tiff_size(data, endian, offset + count_size, count, entry_fmt, entry_size)
            if first is None:
                return None
        pages += 1
        (offset,) = struct.unpack(endian + next_fmt, data[entries_end : entries_end + next_size])
    if first is None:
        return None
    capped = pages >= MAX_TIFF_PAGES_COUNTED and offset != 0 and offset not in seen
    return HeaderInfo(first[0], first[1], pages=pages, pages_capped=capped)


_TIFF_VALUE_FORMATS = {3: "H", 4: "I", 16: "Q"}  # SHORT, LONG, LONG8


def _tiff_size(data, endian, start, count, entry_fmt, entry_size) -> tuple[int, int] | None:
    """ImageWidth (256) and ImageLength (257) of one IFD; the first of duplicated tags wins."""
    found: dict[int, int] = {}
    value_at = struct.calcsize("<" + entry_fmt)
    for i in range(count):
        at = start + i * entry_size
        tag, kind, _ = struct.unpack(endian + entry_fmt, data[at : at + value_at])
        if tag in (256, 257) and tag not in found:
            value_fmt = _TIFF_VALUE_FORMATS.get(kind)
            if value_fmt is None:
                return None
            size = struct.calcsize(value_fmt)
            value = data[at + value_at : at + value_at + size]
            (found[tag],) = struct.unpack(endian + value_fmt, value)
            if len(found) == 2:
                break
    if 256 in found and 257 in found:
        return found[256], found[257]
    return None


def _bmp(data) -> HeaderInfo | None:
    (header_size,) = struct.unpack("<I", data[14:18])
    if header_size == 12:  # BITMAPCOREHEADER
        width, height = struct.unpack("<HH", data[18:22])
    else:
        width, height = struct.unpack("<ii", data[18:26])
    return HeaderInfo(abs(width), abs(height))


def _webp(data) -> HeaderInfo | None:
    chunk = bytes(data[12:16])
    if chunk == b"VP8X":
        width = int.from_bytes(data[24:27], "little") + 1
        height = int.from_bytes(data[27:30], "little") + 1
        return HeaderInfo(width, height)
    if chunk == b"VP8L" and data[20] == 0x2F:
        bits = int.from_bytes(data[21:25], "little")
        return HeaderInfo((bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1)
    if chunk == b"VP8 " and bytes(data[23:26]) == b"\x9d\x01\x2a":
        width, height = struct.unpack("<HH", data[26:30])
        return HeaderInfo(width & 0x3FFF, height & 0x3FFF)
    return None


def _gif(data) -> HeaderInfo | None:
    """The logical screen, grown to the first image's extent if that frame reaches past it."""
    width, height = struct.unpack("<HH", data[6:10])
    flags = data[10]
    pos = 13 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0)
    end = len(data)
    while pos < end:
        block = data[pos]
        if block == 0x21:  # extension: label, then sub-blocks
            pos += 2
            while pos < end and data[pos] != 0:
                pos += data[pos] + 1
            pos += 1
        elif block == 0x2C:  # image descriptor
            left, top, frame_w, frame_h = struct.unpack("<HHHH", data[pos + 1 : pos + 9])
            return HeaderInfo(max(width, left + frame_w), max(height, top + frame_h))
        else:
            break
    return HeaderInfo(width, height)


def _pnm(data) -> HeaderInfo | None:
    """P1-P6 and PFM ("Pf"/"PF"): width and height are the first two numbers after the magic,
    comments skipped; PAM (P7): the WIDTH and HEIGHT lines."""
    head = bytes(data[:4096])
    if head[1:2] == b"7":
        fields = {}
        for line in head.split(b"\n")[1:]:
            parts = line.split()
            if parts and parts[0] == b"ENDHDR":
                break
            if len(parts) >= 2:
                fields[parts[0]] = parts[1]
        return HeaderInfo(int(fields[b"WIDTH"]), int(fields[b"HEIGHT"]))
    tokens: list[int] = []
    for line in head[2:].split(b"\n"):
        for word in line.split(b"#", 1)[0].split():
            tokens.append(int(word))
            if len(tokens) == 2:
                return HeaderInfo(tokens[0], tokens[1])
    return None


_PARSERS = {
    "png": _png,
    "jpeg": _jpeg,
    "tiff": _tiff,
    "bmp": _bmp,
    "webp": _webp,
    "gif": _gif,
    "pnm": _pnm,
}
