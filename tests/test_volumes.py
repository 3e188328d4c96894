"""imgops.io.volumes: opening, describing, chunked reading and page-wise writing of TIFF stacks."""

from __future__ import annotations

import importlib.util
import json
import math
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import tifffile

from imgops.errors import FileError
from imgops.io.volumes import (
    CLASSIC_TIFF_LIMIT,
    needs_bigtiff,
    open_volume,
    output_flavour,
    write_volume,
)

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
SAMPLE_STACKS = sorted(SAMPLES.glob("mri_*.tif"))
EXPECTED = {
    "mri_dwi_b0_u16.tif": ((10, 128, 128), "direct", "NONE"),
    "mri_fmri_imagej.tif": ((24, 96, 128), "direct", "NONE"),
    "mri_anat_shift610_zlib.tif": ((25, 41, 33), "pages", "ADOBE_DEFLATE"),
}


def test_the_samples_are_all_there():
    assert {p.name for p in SAMPLE_STACKS} == set(EXPECTED)


@pytest.mark.parametrize("path", SAMPLE_STACKS, ids=lambda p: p.name)
def test_samples_describe_and_read_like_tifffile(path: Path):
    shape, mode, compression = EXPECTED[path.name]
    whole = tifffile.imread(path)
    with open_volume(path) as reader:
        info = reader.info
        assert (info.shape, info.read_mode, info.compression) == (shape, mode, compression)
        assert (info.dtype, info.axes) == ("uint16", "ZYX")
        np.testing.assert_array_equal(reader.read(0, info.depth), whole)
        out = np.zeros((3, *shape[1:]), np.uint16)
        for start in (0, 4, info.depth - 3):
            reader.read_into(start, out)
            np.testing.assert_array_equal(out, whole[start : start + 3])


def test_imagej_sample_metadata():
    with open_volume(SAMPLES / "mri_fmri_imagej.tif") as reader:
        info = reader.info
    assert info.imagej and not info.ome
    assert info.spacing == pytest.approx(2.2) and info.unit == "mm"
    assert info.resolution == (0.5, 0.5)


def test_read_into_rejects_out_of_range():
    with open_volume(SAMPLES / "mri_dwi_b0_u16.tif") as reader, pytest.raises(ValueError):
        reader.read_into(8, np.zeros((3, 128, 128), np.uint16))


@pytest.mark.parametrize("dtype", ["uint8", "int16", "uint16"])
@pytest.mark.parametrize("byteorder", ["<", ">"])
@pytest.mark.parametrize("layout", ["contiguous", "zlib", "tiled"])
def test_dtypes_byteorders_and_layouts(tmp_path: Path, dtype, byteorder, layout):
    info = np.iinfo(dtype)
    rng = np.random.default_rng(7)
    data = rng.integers(info.min, info.max, (7, 32, 48), endpoint=True).astype(dtype)
    path = tmp_path / "v.tif"
    options = {"zlib": {"compression": "zlib"}, "tiled": {"tile": (16, 16)}}.get(layout, {})
    tifffile.imwrite(path, data, byteorder=byteorder, photometric="minisblack", **options)
    with open_volume(path) as reader:
        assert reader.info.read_mode == ("direct" if layout == "contiguous" else "pages")
        assert reader.info.dtype == dtype
        np.testing.assert_array_equal(reader.read(2, 7), data[2:])


def test_two_dimensional_image_is_one_slice(tmp_path: Path):
    data = np.arange(12 * 10, dtype=np.uint16).reshape(12, 10)
    tifffile.imwrite(tmp_path / "flat.tif", data)
    with open_volume(tmp_path / "flat.tif") as reader:
        assert reader.info.shape == (1, 12, 10) and reader.info.axes == "YX"
        np.testing.assert_array_equal(reader.read(0, 1)[0], data)


# Shaped stacks (`metadata={"axes": ...}`, no imagej=True) that tifffile stores as RGB pages, since
# a length before Y and X (or X itself) is 3 or 4: each page holds several planes as its samples.
RGB_PAGED = {
    "zyx_3": ("ZYX", (3, 16, 12), {"photometric": "rgb", "planarconfig": "separate"}),
    "qyx_4": ("QYX", (4, 16, 12), {"photometric": "rgb", "planarconfig": "separate"}),
    "tzyx": ("TZYX", (2, 3, 16, 12), {"photometric": "rgb", "planarconfig": "separate"}),
    "czyx": ("CZYX", (3, 4, 16, 12), {"photometric": "rgb", "planarconfig": "separate"}),
    "x_is_3": ("ZYX", (5, 16, 3), {"photometric": "rgb"}),  # interleaved: a page of 5 planes
    "tzyx_x_is_3": ("TZYX", (2, 5, 6, 3), {"photometric": "rgb"}),
}
RGB_PAGED_LAYOUTS = {
    "contiguous": {},
    "zlib": {"compression": "zlib"},
    "separate_pages": {"contiguous": False},
    "zlib_separate_pages": {"compression": "zlib", "contiguous": False},
    "tiled": {"tile": (16, 16)},
    "big_endian": {"byteorder": ">"},
}


@pytest.mark.parametrize("layout", sorted(RGB_PAGED_LAYOUTS))
@pytest.mark.parametrize("kind", sorted(RGB_PAGED))
def test_shaped_stack_stored_as_rgb_pages_reads_its_planes(tmp_path: Path, kind: str, layout: str):
    axes, shape, options = RGB_PAGED[kind]
    data = np.random.default_rng(3).integers(0, 4096, shape, dtype=np.uint16)
    path = tmp_path / "v.tif"
    tifffile.imwrite(path, data, metadata={"axes": axes}, **options, **RGB_PAGED_LAYOUTS[layout])
    expected = tifffile.imread(path)
    depth = math.prod(shape[:-2])
    planes = expected.reshape(depth, *shape[-2:])
    with open_volume(path) as reader:
        info = reader.info
        assert info.shape == (depth, *shape[-2:]) and info.page_planes > 1
        assert info.axes == axes.replace("Q", "Z") and info.sizes == shape
        direct = layout in ("contiguous", "separate_pages", "big_endian")
        assert info.read_mode == ("direct" if direct else "pages")
        whole = reader.read(0, depth)
        assert whole.shape == info.shape
        np.testing.assert_array_equal(whole, planes)
        for count in (1, 2, depth - 1):  # chunks that start and end inside pages
            out = np.empty((count, *shape[-2:]), np.uint16)
            for start in range(depth - count + 1):
                reader.read_into(start, out)
                assert out.shape == (count, *shape[-2:])
                np.testing.assert_array_equal(out, planes[start : start + count])


def test_default_tifffile_write_of_a_zyx_stack_of_three_planes(tmp_path: Path):
    """What the bug report wrote: no photometric (tifffile picks RGB pages for Z = 3 today)."""
    data = np.arange(3 * 16 * 12, dtype=np.uint16).reshape(3, 16, 12) * 7
    path = tmp_path / "z3.tif"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # tifffile's default is changing
        tifffile.imwrite(path, data, metadata={"axes": "ZYX"}, compression="zlib")
    with open_volume(path) as reader:
        assert reader.info.shape == (3, 16, 12) and reader.info.axes == "ZYX"
        np.testing.assert_array_equal(reader.read(0, 3), tifffile.imread(path))
        np.testing.assert_array_equal(reader.read(1, 2), data[1:2])


@pytest.mark.parametrize("options", [{}, {"compression": "zlib"}, {"tile": (16, 16)}])
def test_shaped_two_dimensional_image_reads_as_one_plane(tmp_path: Path, options):
    data = np.arange(16 * 12, dtype=np.uint16).reshape(16, 12)
    tifffile.imwrite(tmp_path / "flat.tif", data, metadata={"axes": "YX"}, **options)
    with open_volume(tmp_path / "flat.tif") as reader:
        assert reader.info.shape == (1, 16, 12) and reader.info.axes == "YX"
        whole = reader.read(0, 1)  # tifffile reshapes the array it fills: not the caller's
        assert whole.shape == (1, 16, 12)
        np.testing.assert_array_equal(whole[0], data)


def test_one_plane_chunk_of_a_compressed_stack_keeps_its_shape(tmp_path: Path):
    data = np.arange(5 * 8 * 8, dtype=np.uint16).reshape(5, 8, 8)
    tifffile.imwrite(tmp_path / "z.tif", data, compression="zlib", photometric="minisblack")
    with open_volume(tmp_path / "z.tif") as reader:
        out = np.zeros((1, 8, 8), np.uint16)
        reader.read_into(2, out)
        assert out.shape == (1, 8, 8)
        np.testing.assert_array_equal(out, data[2:3])


def _claim_more_pages(path: Path) -> None:
    """A shaped TZYX stack of RGB pages whose description names twice the pages it has."""
    data = np.zeros((2, 3, 16, 12), np.uint16)
    tifffile.imwrite(path, data, metadata={"axes": "TZYX"}, compression="zlib", photometric="rgb")
    with tifffile.TiffFile(path, mode="r+") as tif:
        description = json.dumps({"shape": [4, 3, 16, 12], "axes": "TZYX"})
        tif.pages[0].tags["ImageDescription"].overwrite(description)


def test_shaped_stack_naming_missing_pages_is_one_clear_error(tmp_path: Path):
    path = tmp_path / "more.tif"
    _claim_more_pages(path)
    with open_volume(path) as reader, pytest.raises(FileError) as caught:
        reader.read(0, reader.info.depth)
    message = caught.value.format_message()
    assert str(path) in message and "page 2 (planes 6..9) is missing" in message
    assert "IndexError" not in message and "\n" not in message


class _FakeSeries:
    """Two pages of 2x12 pixels each."""

    keyframe = SimpleNamespace(shape=(2, 12))

    def __len__(self) -> int:
        return 2


def test_pages_that_do_not_hold_whole_planes_are_refused(tmp_path: Path):
    """A layout tifffile itself would not build (its checks come first): the reader's own guard."""
    from imgops.io.volumes import _planes_per_page

    fake = _FakeSeries()
    with pytest.raises(FileError, match="do not hold whole 4x12 planes"):
        _planes_per_page(tmp_path / "x.tif", fake, "YX", (4, 12))
    assert _planes_per_page(tmp_path / "x.tif", fake, "ZYX", (3, 2, 12)) == 1


def test_ome_tiff_and_its_physical_sizes(tmp_path: Path):
    data = np.arange(5 * 8 * 8, dtype=np.uint16).reshape(5, 8, 8)
    meta = {"axes": "ZYX", "PhysicalSizeX": 0.25, "PhysicalSizeY": 0.25, "PhysicalSizeZ": 1.5}
    tifffile.imwrite(tmp_path / "s.ome.tif", data, ome=True, metadata=meta)
    with open_volume(tmp_path / "s.ome.tif") as reader:
        assert reader.info.ome
        assert reader.info.physical_sizes["PhysicalSizeZ"] == 1.5
        np.testing.assert_array_equal(reader.read(0, 5), data)


def test_imagej_time_series_keeps_its_axis(tmp_path: Path):
    data = np.zeros((4, 8, 8), np.uint16)
    tifffile.imwrite(tmp_path / "t.tif", data, imagej=True, metadata={"axes": "TYX"})
    with open_volume(tmp_path / "t.tif") as reader:
        assert reader.info.shape == (4, 8, 8) and reader.info.axes == "TYX"


def _write_inconsistent(path: Path) -> None:
    with tifffile.TiffWriter(path) as writer:
        writer.write(np.zeros((10, 10), np.uint16))
        writer.write(np.zeros((5, 10), np.uint16))


def _write_imagej_missing_pages(path: Path) -> None:
    """A compressed ImageJ stack of 4 planes whose description says 8."""
    data = np.zeros((4, 8, 8), np.uint16)
    tifffile.imwrite(path, data, imagej=True, metadata={"axes": "ZYX"}, compression="zlib")
    with tifffile.TiffFile(path, mode="r+") as tif:
        description = tif.pages[0].description.replace("images=4", "images=8")
        tif.pages[0].tags["ImageDescription"].overwrite(description.replace("slices=4", "slices=8"))


def _write_lzw_tagged(path: Path) -> None:
    """An LZW-tagged file without needing imagecodecs to write it (only the tag matters here)."""
    tifffile.imwrite(path, np.zeros((3, 8, 8), np.uint16), photometric="minisblack")
    with tifffile.TiffFile(path, mode="r+") as tif:
        for page in tif.pages:
            page.tags["Compression"].overwrite(5)


BAD_FILES = {
    "float64": (
        lambda p: tifffile.imwrite(p, np.zeros((3, 8, 8)), photometric="minisblack"),
        "float64",
    ),
    "complex": (
        lambda p: tifffile.imwrite(p, np.zeros((3, 8, 8), np.complex64), photometric="minisblack"),
        "complex",
    ),
    "rgb": (
        lambda p: tifffile.imwrite(p, np.zeros((3, 8, 8, 3), np.uint8), photometric="rgb"),
        "RGB",
    ),
    "unknown_axes": (
        lambda p: tifffile.imwrite(
            p,
            np.zeros((3, 2, 8, 8), np.uint16),
            photometric="minisblack",
            metadata={"axes": "TQYX"},
        ),
        "unknown: Q",
    ),
    "inconsistent": (_write_inconsistent, "page 1 is 5x10"),
    "imagej_missing_pages": (_write_imagej_missing_pages, "has 4 page(s) of 1 plane(s) each"),
    "not_a_tiff": (lambda p: p.write_text("hello, not a TIFF\n"), "not a readable TIFF"),
    "empty": (lambda p: p.write_bytes(b""), "not a readable TIFF"),
}


@pytest.mark.parametrize("kind", sorted(BAD_FILES))
def test_unsupported_files_are_one_clear_error(tmp_path: Path, kind: str):
    make, expected = BAD_FILES[kind]
    path = tmp_path / f"{kind}.tif"
    make(path)
    with pytest.raises(FileError) as caught:
        open_volume(path)
    message = caught.value.format_message()
    assert str(path) in message and expected in message and "\n" not in message


def test_lzw_without_imagecodecs_names_the_missing_codec(tmp_path: Path):
    if importlib.util.find_spec("imagecodecs") is not None:
        pytest.skip("imagecodecs is installed: LZW is readable")
    path = tmp_path / "lzw.tif"
    _write_lzw_tagged(path)
    with pytest.raises(FileError, match="LZW-compressed.*imagecodecs"):
        open_volume(path)


def test_missing_file_and_directory(tmp_path: Path):
    with pytest.raises(FileError, match="no such file"):
        open_volume(tmp_path / "absent.tif")
    with pytest.raises(FileError, match="is a directory"):
        open_volume(tmp_path)


def test_truncated_contiguous_file_is_a_file_error(tmp_path: Path):
    path = tmp_path / "cut.tif"
    tifffile.imwrite(path, np.ones((8, 64, 64), np.uint16))
    with open_volume(path) as reader:
        offset = reader.info.contiguous_offset
    path.write_bytes(path.read_bytes()[: offset + 3 * 64 * 64 * 2])
    with open_volume(path) as reader, pytest.raises(FileError, match="truncated|cannot read"):
        reader.read(0, 8)


def test_needs_bigtiff_decision():
    assert not needs_bigtiff(0, 1)
    assert not needs_bigtiff(2**31, 1000)
    assert needs_bigtiff(2**32, 1)
    assert needs_bigtiff(CLASSIC_TIFF_LIMIT, 1)
    assert not needs_bigtiff(CLASSIC_TIFF_LIMIT - 4096, 1)
    # A 3 GB uint16 input becomes 6 GB of float32 but 3 GB of float16.
    slices, page = 3 * 1024, 1024 * 512
    assert needs_bigtiff(slices * page * 4, slices)
    assert not needs_bigtiff(slices * page * 2, slices)
    # Many small pages: the per-page IFD overhead counts.
    assert needs_bigtiff(CLASSIC_TIFF_LIMIT - 2**20, 2**20)


def _pages(data: np.ndarray):
    yield from data


def test_write_keeps_imagej_spacing_and_resolution(tmp_path: Path):
    with open_volume(SAMPLES / "mri_fmri_imagej.tif") as reader:
        info = reader.info
        data = reader.read(0, info.depth).astype(np.float32) / 1162
    target = tmp_path / "out.tif"
    assert write_volume(target, _pages(data), info, "float32") == "imagej"
    with tifffile.TiffFile(target) as tif:
        assert tif.imagej_metadata["spacing"] == pytest.approx(2.2)
        assert tif.imagej_metadata["unit"] == "mm"
        assert tif.pages[0].resolution == pytest.approx((0.5, 0.5))
        assert tif.series[0].axes == "ZYX" and not tif.is_bigtiff
        np.testing.assert_array_equal(tif.asarray(), data)


def test_float16_output_is_shaped_and_keeps_spacing(tmp_path: Path):
    with open_volume(SAMPLES / "mri_fmri_imagej.tif") as reader:
        info = reader.info
        data = (reader.read(0, info.depth) / 1162).astype(np.float16)
    target = tmp_path / "half.tif"
    assert write_volume(target, _pages(data), info, "float16") == "shaped"
    with tifffile.TiffFile(target) as tif:
        assert tif.series[0].dtype == np.float16 and tif.series[0].axes == "ZYX"
        meta = tif.shaped_metadata[0]
        assert meta["spacing"] == pytest.approx(2.2) and meta["unit"] == "mm"
        assert tif.pages[0].resolution == pytest.approx((0.5, 0.5))
        np.testing.assert_array_equal(tif.asarray(), data)


def test_ome_output_keeps_physical_sizes(tmp_path: Path):
    meta = {"axes": "ZYX", "PhysicalSizeX": 0.25, "PhysicalSizeZ": 1.5}
    tifffile.imwrite(
        tmp_path / "s.ome.tif", np.zeros((3, 8, 8), np.uint16), ome=True, metadata=meta
    )
    with open_volume(tmp_path / "s.ome.tif") as reader:
        info = reader.info
    target = tmp_path / "o.ome.tif"
    assert write_volume(target, _pages(np.zeros((3, 8, 8), np.float32)), info) == "ome"
    with tifffile.TiffFile(target) as tif:
        assert tif.is_ome and 'PhysicalSizeZ="1.5"' in tif.ome_metadata


def test_output_flavour_rules():
    with open_volume(SAMPLES / "mri_fmri_imagej.tif") as reader:
        imagej = reader.info
    with open_volume(SAMPLES / "mri_dwi_b0_u16.tif") as reader:
        plain = reader.info
    assert output_flavour(imagej, "float32", bigtiff=False) == "imagej"
    assert output_flavour(imagej, "float32", bigtiff=True) == "shaped"
    assert output_flavour(imagej, "float16", bigtiff=False) == "shaped"
    assert output_flavour(plain, "float32", bigtiff=False) == "shaped"


def test_write_refuses_wrong_page_count(tmp_path: Path):
    with open_volume(SAMPLES / "mri_dwi_b0_u16.tif") as reader:
        info = reader.info
    with pytest.raises(ValueError):
        write_volume(tmp_path / "x.tif", _pages(np.zeros((3, 128, 128), np.float32)), info)
