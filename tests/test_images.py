"""imgops.io.images: decoding every sample, headers, clear errors, and encoding round trips."""

from __future__ import annotations

import io
import struct
import zlib

import cv2
import numpy as np
import pytest
import tifffile
from helpers_gray import (
    IMAGE_SAMPLES,
    SAMPLES,
    decode_bytes,
    jpeg_with_orientation,
    opencv_default,
)
from PIL import Image

from imgops.io.images import (
    DEFAULT_PNG_LEVEL,
    FORMAT_EXTENSIONS,
    MAX_PIXELS_ENV,
    PNG_ENCODERS,
    ImageDecodeError,
    ImageEncodeError,
    decode_image,
    encode_image,
    image_dimensions,
    read_image,
    sniff_format,
)

# Shapes and dtypes from samples/SOURCES.md (as decoded: palette expanded, alpha dropped).
EXPECTED = {
    "rocket_baseline_rgb.jpg": ((427, 640, 3), np.uint8),
    "flower_progressive_3mp.jpg": ((1512, 2268, 3), np.uint8),
    "flower_gray_3mp.jpg": ((1512, 2268), np.uint8),
    "flower_rgb_3mp.png": ((1512, 2268, 3), np.uint8),
    "camera_gray.png": ((512, 512), np.uint8),
    "coffee_rgb.png": ((400, 600, 3), np.uint8),
    "tulips_rgba.png": ((500, 500, 3), np.uint8),
    "room_rgb16.png": ((449, 676, 3), np.uint16),
    "light_palette_64px.png": ((64, 64, 3), np.uint8),
    "mri_dwi_b0_u16.tif": ((128, 128), np.uint16),
    "mri_fmri_imagej.tif": ((96, 128), np.uint16),
    "mri_anat_shift610_zlib.tif": ((41, 33), np.uint16),
}


def png_bytes(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def png_chunk(kind: bytes, payload: bytes) -> bytes:
    body = kind + payload
    return struct.pack(">I", len(payload)) + body + struct.pack(">I", zlib.crc32(body))


@pytest.mark.parametrize("path", IMAGE_SAMPLES, ids=lambda p: p.name)
def test_every_sample_decodes_to_its_documented_shape_and_dtype(path):
    image = read_image(path)
    shape, dtype = EXPECTED[path.name]
    assert image.pixels.shape == shape
    assert image.pixels.dtype == dtype
    assert image.pixels.flags["C_CONTIGUOUS"]
    assert image.channel_order == (None if len(shape) == 2 else "bgr")
    assert image.is_gray == (len(shape) == 2)
    assert image_dimensions(path.read_bytes()) == (shape[1], shape[0])


@pytest.mark.parametrize(
    "name", ["coffee_rgb.png", "flower_rgb_3mp.png", "light_palette_64px.png", "tulips_rgba.png"]
)
def test_colour_pngs_decode_to_the_same_pixels_as_pillow(name):
    """An independent decoder (Pillow/libpng via PIL) agrees pixel for pixel; alpha dropped."""
    image = read_image(SAMPLES / name)
    with Image.open(SAMPLES / name) as pil:
        rgb = np.asarray(pil.convert("RGB"))
    np.testing.assert_array_equal(image.pixels[..., ::-1], rgb)


def test_palette_png_is_expanded_to_its_light_colours_not_indices():
    pixels = read_image(SAMPLES / "light_palette_64px.png").pixels
    assert pixels.min() >= 200  # the indices are 0..45; the colours about 209..255
    assert pixels.max() == 255


def test_sixteen_bit_png_keeps_all_sixteen_bits():
    pixels = read_image(SAMPLES / "room_rgb16.png").pixels
    np.testing.assert_array_equal(
        pixels, cv2.imread(str(SAMPLES / "room_rgb16.png"), cv2.IMREAD_UNCHANGED)
    )
    assert (pixels & 0xFF).any()  # low bytes are real data, not a scaled 8-bit image
    assert pixels.max() > 255


def test_rgba_drops_alpha_without_compositing():
    pixels = read_image(SAMPLES / "tulips_rgba.png").pixels
    raw = cv2.imread(str(SAMPLES / "tulips_rgba.png"), cv2.IMREAD_UNCHANGED)
    assert raw.shape[2] == 4 and raw[..., 3].min() < 255
    np.testing.assert_array_equal(pixels, raw[..., :3])


def test_gray_with_alpha_gives_the_gray_plane():
    plane = np.arange(48, dtype=np.uint8).reshape(6, 8) * 5
    alpha = np.full_like(plane, 7)
    data = png_bytes(Image.fromarray(np.dstack([plane, alpha]), "LA"))
    image = decode_image(data)
    gray = image.pixels if image.is_gray else image.pixels[..., 0]
    np.testing.assert_array_equal(gray, plane)


@pytest.mark.parametrize("orientation,shape", [(1, (40, 60)), (3, (40, 60)), (6, (60, 40))])
def test_exif_orientation_is_applied_as_opencv_does(orientation, shape):
    data, stored = jpeg_with_orientation(orientation)
    image = decode_image(data)
    assert image.pixels.shape[:2] == shape
    default = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    np.testing.assert_array_equal(image.pixels, default)
    if orientation == 6:  # rotated 90 degrees clockwise: the red top-left block goes top-right
        assert image.pixels[10, -5, 2] > 200 and image.pixels[10, 5, 2] < 50
    if orientation == 3:  # rotated 180 degrees: red block bottom-right
        assert image.pixels[-5, -10, 2] > 200 and image.pixels[5, 10, 2] < 50


def test_decode_accepts_memoryview_and_matches_file_reading():
    path = SAMPLES / "rocket_baseline_rgb.jpg"
    from_view = decode_image(memoryview(path.read_bytes())).pixels
    np.testing.assert_array_equal(from_view, opencv_default(path))


# ------------------------------------------------------------------------------ errors


def test_empty_data_is_a_clear_error():
    with pytest.raises(ImageDecodeError, match=r"empty file \(0 bytes\)"):
        decode_image(b"")


def test_text_is_not_an_image():
    with pytest.raises(ImageDecodeError, match="not an image"):
        decode_image(b"name,value\n" * 40)


@pytest.mark.parametrize("name", ["coffee_rgb.png", "room_rgb16.png"])
def test_truncated_png_is_named_as_truncated(name):
    data = (SAMPLES / name).read_bytes()
    with pytest.raises(ImageDecodeError, match="truncated PNG.*IDAT"):
        decode_image(data[: len(data) // 2])


@pytest.mark.parametrize("name", ["rocket_baseline_rgb.jpg", "flower_progressive_3mp.jpg"])
def test_truncated_jpeg_is_named_as_truncated(name):
    data = (SAMPLES / name).read_bytes()
    with pytest.raises(ImageDecodeError, match="truncated JPEG"):
        decode_image(data[: len(data) * 2 // 3])


def test_corrupt_png_header_is_an_error():
    with pytest.raises(ImageDecodeError, match="corrupt PNG"):
        decode_image(b"\x89PNG\r\n\x1a\n" + b"\x00" * 200)


def test_corrupt_tiff_is_an_error():
    with pytest.raises(ImageDecodeError, match="TIFF"):
        decode_image(b"II*\x00" + b"\xff" * 300)


def test_decompression_bomb_is_refused_from_the_header():
    """A 100000 x 100000 PNG of a few hundred bytes: refused before any decoding."""
    header = struct.pack(">IIBBBBB", 100_000, 100_000, 8, 0, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 100_001 * 4)
    data = (
        b"\x89PNG\r\n\x1a\n"
        + png_chunk(b"IHDR", header)
        + png_chunk(b"IDAT", idat)
        + png_chunk(b"IEND", b"")
    )
    assert image_dimensions(data) == (100_000, 100_000)
    with pytest.raises(ImageDecodeError, match=r"100000x100000 .*over the limit"):
        decode_image(data)


def test_pixel_limit_comes_from_the_argument_or_the_environment(monkeypatch):
    data = (SAMPLES / "coffee_rgb.png").read_bytes()  # 600 x 400 = 240000 pixels
    with pytest.raises(ImageDecodeError, match="over the limit of 1000 pixels"):
        decode_image(data, max_pixels=1000)
    monkeypatch.setenv(MAX_PIXELS_ENV, "239999")
    with pytest.raises(ImageDecodeError, match=MAX_PIXELS_ENV):
        decode_image(data)
    monkeypatch.setenv(MAX_PIXELS_ENV, "240000")
    assert decode_image(data).pixels.shape == (400, 600, 3)


def test_float_images_are_refused_clearly():
    ok, data = cv2.imencode(".tif", np.zeros((4, 5), np.float32))
    assert ok
    with pytest.raises(ImageDecodeError, match="unsupported sample type float32"):
        decode_image(data.tobytes())


# ------------------------------------------------------------------------------ headers


@pytest.mark.parametrize("fmt", list(FORMAT_EXTENSIONS))
def test_dimensions_of_every_output_format(fmt):
    array = np.zeros((37, 53), np.uint8)
    data = encode_image(array, fmt)
    assert image_dimensions(data) == (53, 37)
    assert sniff_format(data) == {"jpg": "jpeg", "tif": "tiff"}.get(fmt, fmt)


@pytest.mark.parametrize(
    "options", [{"lossless": True}, {"quality": 80}, {"lossless": True, "exif": b"Exif\x00\x00"}]
)
def test_dimensions_of_webp_variants(options):
    buffer = io.BytesIO()
    Image.new("RGB", (71, 29), (10, 20, 30)).save(buffer, "WEBP", **options)
    assert image_dimensions(buffer.getvalue()) == (71, 29)


def test_dimensions_of_bigtiff_and_big_endian_tiff():
    for kwargs in ({"bigtiff": True}, {"byteorder": ">"}):
        buffer = io.BytesIO()
        tifffile.imwrite(buffer, np.zeros((23, 41), np.uint16), **kwargs)
        data = buffer.getvalue()
        assert image_dimensions(data) == (41, 23)
        assert decode_image(data).pixels.shape == (23, 41)


def test_dimensions_of_bmp_and_gif():
    for fmt in ("BMP", "GIF"):
        buffer = io.BytesIO()
        Image.new("RGB", (19, 11)).save(buffer, fmt)
        assert image_dimensions(buffer.getvalue()) == (19, 11)


def test_dimensions_unknown_for_unknown_data():
    assert image_dimensions(b"not an image at all") is None
    assert image_dimensions(b"P5\nthree two\n") is None
    assert sniff_format(b"") is None


@pytest.mark.parametrize(
    ("data", "size"),
    [
        (b"P5\n3 2\n255\n" + bytes(6), (3, 2)),
        (b"P6\n# a comment\n 70000\t5\n255\n", (70000, 5)),
        (b"Pf\n4 9\n-1.0\n", (4, 9)),
        (b"P7\nWIDTH 12\nHEIGHT 13\nDEPTH 1\nMAXVAL 255\nENDHDR\n", (12, 13)),
    ],
)
def test_dimensions_of_pnm_family(data, size):
    assert image_dimensions(data) == size


def tiff_with_ifd_after_pixels(width: int, height: int, *, pages: int = 1) -> bytes:
    """An uncompressed 8-bit gray TIFF whose IFDs follow all of its pixel data."""
    pixels = bytes(range(256)) * (width * height // 256) + bytes(width * height % 256)
    data = bytearray(b"II*\x00\x00\x00\x00\x00")
    strip_offsets = []
    for _ in range(pages):
        strip_offsets.append(len(data))
        data += pixels
    ifd_offsets = []
    for page in range(pages):
        if len(data) % 2:
            data += b"\x00"
        ifd_offsets.append(len(data))
        entries = [
            (256, 4, width), (257, 4, height), (258, 3, 8), (259, 3, 1), (262, 3, 1),
            (273, 4, strip_offsets[page]), (277, 3, 1), (278, 4, height),
            (279, 4, width * height),
        ]  # fmt: skip
        data += struct.pack("<H", len(entries))
        for tag, kind, value in entries:
            data += struct.pack("<HHI", tag, kind, 1)
            data += struct.pack("<H2x" if kind == 3 else "<I", value)
        data += b"\x00\x00\x00\x00"  # next IFD, patched below
    struct.pack_into("<I", data, 4, ifd_offsets[0])
    for page in range(pages - 1):
        next_at = ifd_offsets[page] + 2 + 9 * 12
        struct.pack_into("<I", data, next_at, ifd_offsets[page + 1])
    return bytes(data)


def test_pixel_limit_reads_a_tiff_ifd_that_follows_the_pixels():
    """Issue 11.3: the IFD 90 KB into the file (the landed check parsed only the first 64 KiB,
    so such a TIFF was decoded whatever its size)."""
    data = tiff_with_ifd_after_pixels(300, 300)
    assert len(data) > 1 << 16
    assert image_dimensions(data) == (300, 300)
    decoded = decode_image(data)  # a valid file: the pixels are exactly right
    expected = np.frombuffer(data[8 : 8 + 90_000], np.uint8).reshape(300, 300)
    np.testing.assert_array_equal(decoded.pixels, expected)
    with pytest.raises(ImageDecodeError, match=r"300x300 \(90000 pixels\), over the limit"):
        decode_image(data, max_pixels=89_999)


def test_multi_page_tiff_says_only_page_0_was_converted():
    """Issue 11.7: the gray of a 3-page TIFF is page 0, and the result says so."""
    data = tiff_with_ifd_after_pixels(40, 30, pages=3)
    decoded = decode_image(data)
    assert decoded.pixels.shape == (30, 40)
    assert decoded.warnings == ("TIFF has 3 pages; page 0 was converted, the others ignored",)
    assert decoded.note == decoded.warnings[0]
    single = decode_image(tiff_with_ifd_after_pixels(40, 30))
    assert single.warnings == () and single.note is None


def test_tiff_ifd_loop_is_counted_once_and_terminates():
    data = bytearray(tiff_with_ifd_after_pixels(16, 16, pages=2))
    first = struct.unpack_from("<I", data, 4)[0]
    second = struct.unpack_from("<I", data, first + 2 + 9 * 12)[0]
    struct.pack_into("<I", data, second + 2 + 9 * 12, first)  # page 1 points back to page 0
    info_pages = image_dimensions(bytes(data))
    assert info_pages == (16, 16)


def test_tiff_without_a_readable_size_is_refused():
    data = bytearray(tiff_with_ifd_after_pixels(16, 16))
    struct.pack_into("<I", data, 4, len(data) + 100)  # first IFD past the end of the file
    with pytest.raises(ImageDecodeError, match="corrupt TIFF: cannot read the image size"):
        decode_image(bytes(data))


def test_jpeg_frame_header_after_stray_bytes_is_still_found():
    """libjpeg skips bytes between segments; the size check must not stop there."""
    data = (SAMPLES / "rocket_baseline_rgb.jpg").read_bytes()
    app0_end = 4 + struct.unpack(">H", data[4:6])[0]  # after the APP0 segment
    spliced = data[:app0_end] + b"\x00garbage" + data[app0_end:]
    assert image_dimensions(spliced) == (640, 427)
    with pytest.raises(ImageDecodeError, match="over the limit"):
        decode_image(spliced, max_pixels=1000)


def test_gif_frame_larger_than_its_screen_sets_the_size():
    buffer = io.BytesIO()
    Image.new("P", (19, 11)).save(buffer, "GIF")
    data = bytearray(buffer.getvalue())
    struct.pack_into("<HH", data, 6, 2, 2)  # logical screen 2x2, the frame stays 19x11
    assert image_dimensions(bytes(data)) == (19, 11)


@pytest.mark.parametrize("value", ["abc", "-5", "0", "1e9", "12 px"])
def test_invalid_pixel_limit_variable_is_an_error_naming_it(monkeypatch, value):
    """Issue 11.7: the landed code ignored a bad IMGOPS_MAX_IMAGE_PIXELS silently."""
    from imgops.io.images import default_max_pixels

    monkeypatch.setenv(MAX_PIXELS_ENV, value)
    with pytest.raises(ValueError, match=f"{MAX_PIXELS_ENV} must be a positive whole number"):
        default_max_pixels()
    with pytest.raises(ImageDecodeError, match=MAX_PIXELS_ENV):
        decode_image((SAMPLES / "coffee_rgb.png").read_bytes())
    monkeypatch.setenv(MAX_PIXELS_ENV, " ")
    assert default_max_pixels() == 1 << 28


def test_data_over_two_gib_gets_a_clear_message(monkeypatch):
    """Issue 11.7: OpenCV's assertion text for buffers >= 2 GiB (the bound is shrunk here)."""
    import imgops.io.images as images

    data = (SAMPLES / "coffee_rgb.png").read_bytes()
    monkeypatch.setattr(images, "MAX_INPUT_BYTES", len(data) - 1)
    with pytest.raises(ImageDecodeError, match=r"GiB; imgops decodes images of at most 2 GiB"):
        decode_image(data)


# ------------------------------------------------------------------------------ encoding


def test_opencv_png_level_1_is_byte_identical_to_opencv_defaults():
    gray = cv2.imread(str(SAMPLES / "coffee_rgb.png"), cv2.IMREAD_GRAYSCALE)
    ours = encode_image(gray, "png", png_level=1, png_encoder="opencv")
    assert ours == cv2.imencode(".png", gray)[1].tobytes()


@pytest.mark.parametrize("encoder", PNG_ENCODERS)
@pytest.mark.parametrize("level", range(10))
def test_every_png_level_round_trips_exactly(level, encoder):
    gray = cv2.imread(str(SAMPLES / "rocket_baseline_rgb.jpg"), cv2.IMREAD_GRAYSCALE)
    data = encode_image(gray, "png", png_level=level, png_encoder=encoder)
    np.testing.assert_array_equal(decode_bytes(data), gray)
    with Image.open(io.BytesIO(data)) as pil:  # a standard PNG another reader opens
        np.testing.assert_array_equal(np.asarray(pil), gray)


@pytest.mark.parametrize("encoder", PNG_ENCODERS)
def test_png_level_0_is_largest_and_level_2_no_larger_than_level_1(encoder):
    """(imgops' level 1 is level 2 when the isal package is missing: equal sizes then.)"""
    gray = cv2.imread(str(SAMPLES / "rocket_baseline_rgb.jpg"), cv2.IMREAD_GRAYSCALE)
    sizes = [len(encode_image(gray, "png", png_level=n, png_encoder=encoder)) for n in (0, 1, 2)]
    assert sizes[0] > sizes[1] >= sizes[2]
    assert sizes[1] > sizes[2] or encoder == "imgops"


@pytest.mark.parametrize(
    "name", ["flower_rgb_3mp.png", "rocket_baseline_rgb.jpg", "coffee_rgb.png", "room_rgb16.png"]
)
def test_default_png_is_no_larger_than_opencvs_default(name):
    """The batch goal of issue 4: gray outputs no larger than OpenCV's default PNG."""
    bgr = cv2.imread(str(SAMPLES / name), cv2.IMREAD_UNCHANGED).astype(np.int64)
    gray = ((299 * bgr[..., 2] + 587 * bgr[..., 1] + 114 * bgr[..., 0] + 500) // 1000).astype(
        np.uint16 if name == "room_rgb16.png" else np.uint8
    )
    ours = encode_image(gray, "png")
    assert DEFAULT_PNG_LEVEL == 2
    assert len(ours) <= len(cv2.imencode(".png", gray)[1])
    np.testing.assert_array_equal(decode_bytes(ours), gray)


@pytest.mark.parametrize("encoder", PNG_ENCODERS)
def test_colour_png_keeps_the_channel_order(encoder):
    bgr = cv2.imread(str(SAMPLES / "coffee_rgb.png"))
    data = encode_image(bgr, "png", png_encoder=encoder)
    np.testing.assert_array_equal(decode_bytes(data), bgr)


@pytest.mark.parametrize("fmt", ["png", "tif", "bmp", "webp"])
def test_lossless_formats_round_trip_8_bit(fmt):
    gray = cv2.imread(str(SAMPLES / "camera_gray.png"), cv2.IMREAD_UNCHANGED)
    decoded = decode_bytes(encode_image(gray, fmt))
    if decoded.ndim == 3:  # WebP has no gray mode: three equal planes
        decoded = decoded[..., 0]
    np.testing.assert_array_equal(decoded, gray)


def test_jpeg_encoding_is_close():
    gray = cv2.imread(str(SAMPLES / "camera_gray.png"), cv2.IMREAD_UNCHANGED)
    decoded = decode_bytes(encode_image(gray, "jpg"))
    assert np.abs(decoded.astype(int) - gray).mean() < 2


@pytest.mark.parametrize("fmt", ["png", "tif"])
def test_sixteen_bit_round_trips_in_png_and_tiff(fmt):
    array = np.random.default_rng(3).integers(0, 65536, (31, 47), dtype=np.uint16)
    decoded = decode_bytes(encode_image(array, fmt))
    assert decoded.dtype == np.uint16
    np.testing.assert_array_equal(decoded, array)


@pytest.mark.parametrize("fmt", ["jpg", "bmp", "webp"])
def test_sixteen_bit_to_an_8_bit_format_is_a_clear_error(fmt):
    with pytest.raises(ImageEncodeError, match="16-bit images can be written as png or tif only"):
        encode_image(np.zeros((4, 4), np.uint16), fmt)


def test_encode_rejects_bad_arguments():
    with pytest.raises(ImageEncodeError, match="unknown format"):
        encode_image(np.zeros((4, 4), np.uint8), "gif")
    with pytest.raises(ImageEncodeError, match="0..9"):
        encode_image(np.zeros((4, 4), np.uint8), "png", png_level=10)
    with pytest.raises(ImageEncodeError, match="unknown PNG encoder"):
        encode_image(np.zeros((4, 4), np.uint8), "png", png_encoder="pillow")
    with pytest.raises(ImageEncodeError, match="float32"):
        encode_image(np.zeros((4, 4), np.float32), "png")
    with pytest.raises(ImageEncodeError, match="shape"):
        encode_image(np.zeros((4, 4, 2), np.uint8), "png")


def test_encode_accepts_non_contiguous_arrays():
    bgr = cv2.imread(str(SAMPLES / "coffee_rgb.png"))
    view = bgr[::2, ::3, 1]
    np.testing.assert_array_equal(decode_bytes(encode_image(view, "png")), view)
