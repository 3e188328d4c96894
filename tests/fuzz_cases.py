"""Mutations of the real sample files and the oracle that judges each decode (fuzzing helpers).

Shared by tests/test_fuzz_decode.py (hypothesis draws the mutation parameters) and
scripts/fuzz_decode.py (a standalone runner for a time budget). A case passes when the decode
either succeeds with exactly the right pixels or raises the project's clean error type:

- images: `imgops.io.images.decode_image` returns what OpenCV itself decodes from the same bytes
  (depth kept, alpha dropped), and the gray op gives the integer BT.601 formula of those pixels,
  or it raises `ImageDecodeError` with a one-line message;
- volumes: `imgops.io.volumes.open_volume` + chunked `read_into` return what tifffile reads from
  the same bytes (series 0), or raise `FileError` with a one-line message.

Anything else (another exception type, a multi-line message, wrong pixels) is a failure.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
IMAGE_NAMES = (
    "coffee_rgb.png",
    "light_palette_64px.png",
    "tulips_rgba.png",
    "room_rgb16.png",
    "camera_gray.png",
    "rocket_baseline_rgb.jpg",
    "flower_progressive_3mp.jpg",
)
VOLUME_NAMES = ("mri_dwi_b0_u16.tif", "mri_fmri_imagej.tif", "mri_anat_shift610_zlib.tif")
MUTATIONS = ("bitflip", "truncate", "header_byte", "chunk_length", "splice_zero", "duplicate")
#: Smaller decompression-bomb limit while fuzzing: keeps every case fast and memory small.
FUZZ_MAX_PIXELS = 1 << 24

_cache: dict[str, bytes] = {}


def sample_bytes(name: str) -> bytes:
    """The bytes of one sample file (cached)."""
    if name not in _cache:
        _cache[name] = (SAMPLES / name).read_bytes()
    return _cache[name]


@dataclass(frozen=True)
class Mutation:
    """One edit of a sample: `kind`, a position in [0, 1) of the file and a 32-bit value."""

    kind: str
    where: float
    value: int

    def describe(self) -> str:
        """A short label for reports."""
        return f"{self.kind}@{self.where:.6f}:{self.value:#x}"


def _png_chunk_offsets(data: bytes) -> list[int]:
    offsets, pos = [], 8
    while pos + 8 <= len(data):
        offsets.append(pos)
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        pos += 12 + length
    return offsets


def _jpeg_segment_offsets(data: bytes) -> list[int]:
    offsets, pos = [], 2
    while pos + 4 <= len(data) and data[pos] == 0xFF:
        marker = data[pos + 1]
        if 0xD0 <= marker <= 0xD9 or marker == 0x01:
            pos += 2
            continue
        offsets.append(pos)
        if marker == 0xDA:
            break
        (length,) = struct.unpack(">H", data[pos + 2 : pos + 4])
        pos += 2 + length
    return offsets


def _tiff_entry_offsets(data: bytes) -> list[int]:
    """Byte offsets of the value fields of the first IFD's entries (classic TIFF only)."""
    if data[:4] not in (b"II*\x00", b"MM\x00*"):
        return []
    endian = "<" if data[:2] == b"II" else ">"
    (ifd,) = struct.unpack(endian + "I", data[4:8])
    if ifd + 2 > len(data):
        return []
    (count,) = struct.unpack(endian + "H", data[ifd : ifd + 2])
    return [ifd + 2 + 12 * i + 8 for i in range(count) if ifd + 2 + 12 * i + 12 <= len(data)]


def _length_fields(data: bytes) -> list[tuple[int, int]]:
    """(offset, size) of the length-like fields: PNG chunk lengths, JPEG segment lengths, TIFF
    IFD entry values (dimensions, strip offsets and counts)."""
    if data.startswith(b"\x89PNG"):
        return [(o, 4) for o in _png_chunk_offsets(data)]
    if data.startswith(b"\xff\xd8"):
        return [(o + 2, 2) for o in _jpeg_segment_offsets(data)]
    return [(o, 4) for o in _tiff_entry_offsets(data)]


def mutate(data: bytes, mutation: Mutation) -> bytes:
    """Applies one mutation to the bytes of a sample."""
    buffer = bytearray(data)
    size = len(buffer)
    pos = min(size - 1, int(mutation.where * size))
    value = mutation.value
    if mutation.kind == "bitflip":
        for i in range(1 + value % 4):  # 1 to 4 flips near each other
            at = (pos + i * (value >> 8) % 64) % size
            buffer[at] ^= 1 << ((value >> (2 * i)) & 7)
    elif mutation.kind == "truncate":
        return bytes(buffer[:pos])
    elif mutation.kind == "header_byte":  # the first 256 bytes: signatures, IHDR, SOF, IFD
        at = int(mutation.where * min(size, 256))
        buffer[at] = value & 0xFF
    elif mutation.kind == "chunk_length":
        fields = _length_fields(data)
        if fields:
            at, width = fields[int(mutation.where * len(fields))]
            old = int.from_bytes(buffer[at : at + width], "big")
            choices = (0, 1, old + 1, old - 1, old * 2, (1 << (8 * width)) - 1, value)
            new = choices[value % len(choices)] % (1 << (8 * width))
            little = data[:2] == b"II"
            buffer[at : at + width] = new.to_bytes(width, "little" if little else "big")
        else:
            buffer[pos] ^= 0xFF
    elif mutation.kind == "splice_zero":  # a run of zeros, as a torn write leaves
        run = 1 + value % 4096
        buffer[pos : pos + run] = bytes(min(run, size - pos))
    elif mutation.kind == "duplicate":  # a run of bytes repeated (a bad copy)
        run = 1 + value % 512
        buffer[pos:pos] = buffer[pos : pos + run]
    else:
        raise ValueError(f"unknown mutation {mutation.kind!r}")
    return bytes(buffer)


class OracleFailure(AssertionError):
    """A case that neither decoded correctly nor failed cleanly."""


def _one_line(message: str, what: str) -> None:
    if not message or "\n" in message or "Traceback" in message:
        raise OracleFailure(f"{what}: error message is not one clean line: {message!r}")


def expected_pixels(data: bytes) -> np.ndarray | None:
    """What OpenCV decodes from the bytes (depth kept, alpha dropped), or None if it cannot."""
    import cv2

    try:
        pixels = cv2.imdecode(
            np.frombuffer(data, np.uint8), cv2.IMREAD_ANYDEPTH | cv2.IMREAD_ANYCOLOR
        )
    except cv2.error:
        return None
    if pixels is None or pixels.size == 0:
        return None
    if pixels.ndim == 3 and pixels.shape[2] in (1, 2):
        return pixels[:, :, 0]
    if pixels.ndim == 3 and pixels.shape[2] == 4:
        return pixels[:, :, :3]
    return pixels


def luma(bgr: np.ndarray) -> np.ndarray:
    """The exact integer BT.601 luma of BGR pixels (gray input unchanged)."""
    if bgr.ndim == 2:
        return bgr
    wide = bgr.astype(np.int64)
    y = (299 * wide[..., 2] + 587 * wide[..., 1] + 114 * wide[..., 0] + 500) // 1000
    return y.astype(bgr.dtype)


def check_image(data: bytes, *, gray: bool = True) -> str:
    """Decodes with imgops and judges the outcome; returns "ok" or "error". Raises OracleFailure."""
    from imgops.io.images import ImageDecodeError, decode_image

    try:
        image = decode_image(data, max_pixels=FUZZ_MAX_PIXELS)
    except ImageDecodeError as error:
        _one_line(str(error), "decode_image")
        return "error"
    except Exception as error:
        raise OracleFailure(f"decode_image raised {type(error).__name__}: {error}") from error
    expected = expected_pixels(data)
    if expected is None:
        raise OracleFailure("decode_image succeeded where OpenCV cannot decode the bytes")
    if image.pixels.shape != expected.shape or image.pixels.dtype != expected.dtype:
        raise OracleFailure(
            f"decoded {image.pixels.shape} {image.pixels.dtype}, "
            f"OpenCV {expected.shape} {expected.dtype}"
        )
    if not np.array_equal(image.pixels, expected):
        raise OracleFailure("decoded pixels differ from OpenCV's")
    if gray:
        import torch

        from imgops import ops

        if image.is_gray:
            result = image.pixels
        else:
            tensor = torch.from_numpy(image.pixels)
            result = ops.rgb_to_gray(tensor, channel_order="bgr").numpy()
        if not np.array_equal(result, luma(expected)):
            raise OracleFailure("gray differs from the BT.601 formula on OpenCV's pixels")
    return "ok"


def check_volume(path: Path) -> str:
    """Opens and reads a (mutated) stack chunk by chunk; returns "ok" or "error"."""
    import tifffile

    from imgops.errors import FileError
    from imgops.io.volumes import open_volume

    try:
        with open_volume(path) as reader:
            info = reader.info
            slice_pixels = info.shape[1] * info.shape[2]
            step = max(1, (1 << 22) // max(1, slice_pixels))  # about 4 Mpixel per read
            parts = []
            for start in range(0, info.depth, step):
                out = np.empty((min(step, info.depth - start), *info.shape[1:]), info.dtype)
                reader.read_into(start, out)
                parts.append(out)
    except FileError as error:
        _one_line(error.format_message(), "open_volume/read_into")
        if str(path) not in error.format_message():
            raise OracleFailure(f"error does not name the file: {error.format_message()}") from None
        return "error"
    except Exception as error:
        raise OracleFailure(f"volume reader raised {type(error).__name__}: {error}") from error
    data = np.concatenate(parts) if parts else np.empty((0, *info.shape[1:]), info.dtype)
    try:  # the truth: tifffile's series read; if the (contiguous) series read fails, what
        # each page's own strip offsets say (a damaged file can be read either way)
        with tifffile.TiffFile(path) as tif:
            try:
                truth = tif.series[0].asarray()
            except Exception:
                truth = tif.asarray(key=range(info.depth), series=0)
    except Exception as error:
        raise OracleFailure(
            f"imgops read the stack but tifffile cannot ({type(error).__name__}: {error})"
        ) from error
    truth = truth.reshape(data.shape) if truth.size == data.size else truth
    if truth.shape != data.shape or not np.array_equal(truth, data):
        raise OracleFailure(f"stack read {data.shape} differs from tifffile's {truth.shape}")
    return "ok"


def quiet_libraries() -> None:
    """Silences OpenCV's and tifffile's own log output (the oracle reports every case)."""
    import logging

    from imgops.io.images import quiet_opencv

    quiet_opencv()
    import cv2  # noqa: F401  (so quiet_opencv's setting reaches the loaded module)

    quiet_opencv()
    logging.getLogger("tifffile").setLevel(logging.CRITICAL)
