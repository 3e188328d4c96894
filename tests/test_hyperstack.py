"""normvol on hyperstacks, every input dtype and every codec, against numpy references.

Data: hyperstacks and codec variants built from the MRI samples (tests/data/volume/SOURCES.md).
The CSBDeep reference is a numpy port of csbdeep.utils.normalize / normalize_mi_ma (BSD-3):
mi, ma = percentiles over `axis` (keepdims), x, mi, ma, eps cast to float32, then
(x - mi) / (ma - mi + eps), clipped to [0, 1] if asked."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import tifffile
from click.testing import CliRunner

from imgops.cli import cli
from imgops.io.volumes import codec_status, open_volume

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
FMRI, ANAT, DWI = (
    SAMPLES / n for n in ("mri_fmri_imagej.tif", "mri_anat_shift610_zlib.tif", "mri_dwi_b0_u16.tif")
)


def csbdeep_normalize(x, pmin=3, pmax=99.8, axis=None, clip=False, eps=1e-20, dtype=np.float32):
    """numpy port of csbdeep.utils.normalize (the formula CSBDeep and StarDist use)."""
    mi = np.percentile(x, pmin, axis=axis, keepdims=True)
    ma = np.percentile(x, pmax, axis=axis, keepdims=True)
    x = x.astype(dtype, copy=False)
    mi, ma, eps = mi.astype(dtype, copy=False), ma.astype(dtype, copy=False), dtype(eps)
    out = (x - mi) / (ma - mi + eps)
    return np.clip(out, 0, 1) if clip else out


def _xml_without_type(xml: str) -> str:
    return xml.replace('Type="float"', "").replace('Type="uint16"', "").replace(" />", "/>")


def hyperstack(time_points: int = 0) -> np.ndarray:
    """ZCYX (or TZCYX) uint16 from the fMRI scan; channel 1: the scan reversed in Z, // 2 + 100."""
    scan = tifffile.imread(FMRI)
    zc = np.stack([scan, (scan[::-1] // 2 + 100).astype(np.uint16)], axis=1)
    if not time_points:
        return zc
    return np.stack([np.roll(zc, t * 3, axis=0) for t in range(time_points)])


def invoke(*args):
    return CliRunner().invoke(cli, ["normvol", *map(str, args)], catch_exceptions=False)


@pytest.fixture
def zcyx(tmp_path: Path) -> Path:
    path = tmp_path / "cells.tif"
    tifffile.imwrite(
        path,
        hyperstack(),
        imagej=True,
        resolution=(0.5, 0.5),
        metadata={
            "axes": "ZCYX",
            "spacing": 2.2,
            "unit": "mm",
            "Info": "acquired by nibabel's test suite",
            "Labels": [f"z{i // 2} c{i % 2}" for i in range(48)],
            "Ranges": (0.0, 1000.0, 100.0, 600.0),
        },
    )
    return path


# ------------------------------------------------------------------- per-group normalisation


@pytest.mark.parametrize("clip", [False, True])
def test_per_channel_percentiles_equal_csbdeep(zcyx: Path, clip: bool):
    out = zcyx.with_name("out.tif")
    args = ["--percentile", 1, 99.8, "-o", out, "--chunk-mb", 0.2] + (["--clip"] if clip else [])
    result = invoke(zcyx, *args)
    assert result.exit_code == 0, result.output
    data = hyperstack()
    expected = csbdeep_normalize(data, 1, 99.8, axis=(0, 2, 3), clip=clip)
    np.testing.assert_array_equal(tifffile.imread(out), expected)
    assert result.stderr.count("written") == 1 and str(out) in result.stderr


def test_per_none_and_per_time_and_channel_time(tmp_path: Path):
    data = hyperstack(time_points=3)
    path = tmp_path / "tz.tif"
    tifffile.imwrite(path, data, imagej=True, metadata={"axes": "TZCYX"})
    for per, axis in (
        ("none", None),
        ("time", (1, 2, 3, 4)),
        ("channel,time", (1, 3, 4)),
        ("channel", (0, 1, 3, 4)),
    ):
        out = tmp_path / f"{per}.tif"
        result = invoke(path, "--percentile", 3, 99.8, "--per", per, "-o", out, "--chunk-mb", 0.3)
        assert result.exit_code == 0, result.output
        np.testing.assert_array_equal(
            tifffile.imread(out), csbdeep_normalize(data, 3, 99.8, axis=axis), err_msg=per
        )


def test_per_channel_data_bounds_and_bound_lists(zcyx: Path):
    data = hyperstack().astype(np.float32)
    out = zcyx.with_name("o.tif")
    assert invoke(zcyx, "-o", out).exit_code == 0
    high = data.max(axis=(0, 2, 3), keepdims=True)
    np.testing.assert_array_equal(tifffile.imread(out), (data - 0) / high)
    result = invoke(zcyx, "--max", "900,500", "--min", "10,100", "-o", out, "--overwrite")
    assert result.exit_code == 0, result.output
    low = np.array([10, 100], np.float32).reshape(1, 2, 1, 1)
    span = np.array([890, 400], np.float32).reshape(1, 2, 1, 1)
    np.testing.assert_array_equal(tifffile.imread(out), (data - low) / span)


def test_metadata_survives_and_ranges_follow_the_channel_bounds(zcyx: Path):
    out = zcyx.with_name("o.tif")
    assert invoke(zcyx, "--max", "1000,600", "--min", "0,100", "-o", out).exit_code == 0
    with tifffile.TiffFile(zcyx) as before, tifffile.TiffFile(out) as after:
        a, b = before.imagej_metadata, after.imagej_metadata
        changed = {k for k in set(a) | set(b) if str(a.get(k)) != str(b.get(k))}
        assert changed == {"Ranges", "min", "max"} - (set() if "min" in b else {"min", "max"})
        assert b["Ranges"] == pytest.approx((0.0, 1.0, 0.0, 1.0))
        assert after.series[0].axes == "ZCYX" and after.series[0].shape == before.series[0].shape
        assert after.pages[0].resolution == pytest.approx(before.pages[0].resolution)


def test_mismatched_channel_count_is_one_error_and_no_output(zcyx: Path):
    result = invoke(zcyx, "--max", "1,2,3", "-o", zcyx.with_name("o.tif"))
    assert result.exit_code == 1 and "lists 3 values, the stack has 2 channels" in result.stderr
    assert str(zcyx) in result.stderr and not zcyx.with_name("o.tif").exists()


def test_unknown_axes_are_one_error(tmp_path: Path):
    path = tmp_path / "odd.tif"
    tifffile.imwrite(
        path, np.zeros((2, 3, 8, 8), np.uint16), photometric="minisblack", metadata={"axes": "TQYX"}
    )
    result = invoke(path, "--max", 9)
    assert result.exit_code == 1 and "unknown: Q" in result.stderr and str(path) in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["odd.tif"]


# ------------------------------------------------------------------- dtypes, defaults, warnings


def _scaled(dtype: str) -> np.ndarray:
    base = tifffile.imread(ANAT).astype(np.float64)
    return {
        "uint8": base / 122,
        "uint16": base,
        "int16": base - 15000,
        "uint32": base * 1e5,
        "int32": base * 6e4 - 9e8,
        "float16": base / 500 - 20,
        "float32": base / 3 - 777.25,
    }[dtype].astype(dtype)


@pytest.mark.parametrize(
    "dtype", ["uint8", "uint16", "int16", "uint32", "int32", "float16", "float32"]
)
def test_every_input_dtype_with_the_printed_default_min(tmp_path: Path, dtype: str):
    data = _scaled(dtype)
    path, out = tmp_path / "s.tif", tmp_path / "o.tif"
    tifffile.imwrite(path, data, photometric="minisblack")
    result = invoke(path, "-o", out)
    assert result.exit_code == 0, result.output
    low = 0.0 if dtype.startswith("uint") else float(data.min())
    high = float(data.max())
    assert f"min {low:.10g}, max {high:.10g}" in result.stderr
    if dtype in ("uint32", "int32"):
        expected = ((data.astype(np.float64) - low) / (high - low)).astype(np.float32)
    else:
        x = data.astype(np.float32)
        expected = (x - np.float32(low)) / np.float32(high - low)
    np.testing.assert_array_equal(tifffile.imread(out), expected)


def test_nan_and_inf_are_left_out_and_pass_through(tmp_path: Path):
    data = _scaled("float32")
    data[0, 0, :4] = [np.nan, np.inf, -np.inf, np.nan]
    path = tmp_path / "nan.tif"
    tifffile.imwrite(path, data, photometric="minisblack")
    result = invoke(path, "--percentile", 1, 99, "-o", tmp_path / "o.tif")
    assert result.exit_code == 0, result.output
    assert "4 NaN/inf values left out" in result.stderr
    finite = data[np.isfinite(data)]
    lo, hi = np.percentile(finite, 1), np.percentile(finite, 99)
    out = tifffile.imread(tmp_path / "o.tif")
    expected = (data - np.float32(lo)) / (np.float32(hi) - np.float32(lo) + np.float32(1e-20))
    np.testing.assert_array_equal(out, expected)  # NaN == NaN positions, +-inf kept
    assert invoke(path, "--percentile", 1, 99, "--clip", "-o", tmp_path / "c.tif").exit_code == 0
    clipped = tifffile.imread(tmp_path / "c.tif")[0, 0, :4]
    np.testing.assert_array_equal(clipped, [np.nan, 1, 0, np.nan])


def test_values_outside_the_range_are_counted_and_float16_overflow_warned(tmp_path: Path):
    shutil.copy(ANAT, tmp_path / "a.tif")
    data = tifffile.imread(ANAT)
    result = invoke(tmp_path / "a.tif", "--max", 4095, "-o", tmp_path / "o.tif")
    assert result.exit_code == 0
    assert f"{int((data > 4095).sum())} values" in result.stderr and "--clip" in result.stderr
    result = invoke(
        tmp_path / "a.tif", "--max", 0.25, "--dtype", "float16", "-o", tmp_path / "h.tif"
    )
    overflow = int(((data.astype(np.float32) / np.float32(0.25)) > 65504).sum())
    assert overflow and f"{overflow} values overflowed float16" in result.stderr
    clean = invoke(tmp_path / "a.tif", "--max", 31003, "-o", tmp_path / "c.tif")
    assert (
        "warning" not in clean.stderr
        and clean.stderr.strip() == f"{tmp_path / 'c.tif'}: written (min 0, max 31003)"
    )


@pytest.mark.parametrize(
    "bad", [("--max", "1e-300"), ("--max", "1e39"), ("--min", "-3e38", "--max", "3e38")]
)
def test_bounds_float32_cannot_use_name_the_file_and_the_batch_goes_on(tmp_path: Path, bad):
    shutil.copy(DWI, tmp_path / "a.tif")
    shutil.copy(FMRI, tmp_path / "b.tif")
    result = invoke(tmp_path / "a.tif", tmp_path / "b.tif", *bad, "-d", tmp_path / "out")
    assert result.exit_code == 1
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert (
        len(errors) == 2
        and all("float32" in e for e in errors)
        and str(tmp_path / "a.tif") in errors[0]
    )
    assert "Traceback" not in result.output


def test_a_broken_input_fails_alone(tmp_path: Path):
    shutil.copy(DWI, tmp_path / "a.tif")
    (tmp_path / "b.tif").write_bytes(b"II*\x00 not a tiff at all")
    shutil.copy(FMRI, tmp_path / "c.tif")
    result = invoke(tmp_path / "a.tif", tmp_path / "b.tif", tmp_path / "c.tif", "--max", 9000)
    assert result.exit_code == 1 and "1 failed" in result.stderr and "2 written" in result.stderr
    assert (tmp_path / "a_norm.tif").exists() and (tmp_path / "c_norm.tif").exists()


def test_a_rerun_over_a_glob_leaves_its_own_outputs_alone(tmp_path: Path):
    shutil.copy(DWI, tmp_path / "a.tif")
    assert invoke(tmp_path / "a.tif", "--max", 4095).exit_code == 0
    before = (tmp_path / "a_norm.tif").read_bytes()
    result = invoke(*sorted(tmp_path.glob("*.tif")), "--max", 4095, "--skip-existing")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "a_norm.tif").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.tif", "a_norm.tif"]


def test_folders_and_recursion(tmp_path: Path):
    (tmp_path / "in" / "sub").mkdir(parents=True)
    shutil.copy(DWI, tmp_path / "in" / "a.tif")
    shutil.copy(ANAT, tmp_path / "in" / "sub" / "b.tif")
    result = invoke(tmp_path / "in", "-r", "--max", 40000, "-d", tmp_path / "out")
    assert result.exit_code == 0, result.output
    written = sorted(
        str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("*.tif")
    )
    assert written == ["a.tif", "sub/b.tif"]  # the shared planner keeps sub-folders under -d


# ------------------------------------------------------------------- codecs and layouts


def _dwi8() -> np.ndarray:
    return (tifffile.imread(DWI) // 16).astype(np.uint8)


CODEC_FILES = {
    "lzw": lambda p: tifffile.imwrite(p, tifffile.imread(DWI), compression="lzw"),
    "zstd": lambda p: tifffile.imwrite(p, tifffile.imread(DWI), compression="zstd"),
    "deflate_predictor": lambda p: tifffile.imwrite(
        p, tifffile.imread(DWI), compression="zlib", predictor=True
    ),
    "jpeg": lambda p: tifffile.imwrite(p, _dwi8(), compression="jpeg", photometric="minisblack"),
    "tiled": lambda p: tifffile.imwrite(p, tifffile.imread(DWI), tile=(32, 64), compression="zlib"),
    "bigtiff": lambda p: tifffile.imwrite(p, tifffile.imread(DWI), bigtiff=True),
    "planar": lambda p: tifffile.imwrite(
        p, tifffile.imread(DWI)[:3], planarconfig="separate", photometric="minisblack"
    ),
}


@pytest.mark.parametrize("kind", sorted(CODEC_FILES))
def test_codecs_and_layouts_read_like_tifffile(tmp_path: Path, kind: str):
    path = tmp_path / f"{kind}.tif"
    CODEC_FILES[kind](path)
    expected = tifffile.imread(path)
    with open_volume(path) as reader:
        assert reader.info.shape == (int(np.prod(expected.shape[:-2])), *expected.shape[-2:])
        np.testing.assert_array_equal(
            reader.read(0, reader.info.depth), expected.reshape(reader.info.shape)
        )
        if kind == "planar":
            assert reader.info.axes == "CYX" and reader.info.read_mode == "zarr"
    out = tmp_path / "o.tif"
    result = invoke(path, "--max", 5000, "-o", out)
    assert result.exit_code == 0, result.output
    np.testing.assert_array_equal(
        tifffile.imread(out), expected.astype(np.float32) / np.float32(5000)
    )


def test_codec_status_for_doctor():
    status = codec_status()
    assert all(isinstance(v, bool) for v in status.values())
    assert status["LZW"] and status["ZSTD"] and status["JPEG"] and status["ADOBE_DEFLATE"]


@pytest.mark.parametrize("compress", ["none", "zlib", "zstd", "lzw"])
def test_output_compression_round_trips(tmp_path: Path, compress: str):
    out = tmp_path / "o.tif"
    assert invoke(FMRI, "--max", 1162, "--compress", compress, "-o", out).exit_code == 0
    with tifffile.TiffFile(out) as tif:
        page = tif.pages[0]
        assert (
            page.compression.name
            == {"none": "NONE", "zlib": "ADOBE_DEFLATE", "zstd": "ZSTD", "lzw": "LZW"}[compress]
        )
        assert (int(page.predictor) == 3) == (compress == "zstd")  # 3: floating-point predictor
        assert tif.is_imagej == (compress != "zstd")
        np.testing.assert_array_equal(
            tif.asarray(), tifffile.imread(FMRI).astype(np.float32) / np.float32(1162)
        )


def test_auto_compression_follows_the_input(tmp_path: Path):
    shutil.copy(ANAT, tmp_path / "z.tif")
    assert invoke(tmp_path / "z.tif", "--max", 31003).exit_code == 0
    with tifffile.TiffFile(tmp_path / "z_norm.tif") as tif:
        assert tif.pages[0].compression.name == "ADOBE_DEFLATE"


def test_two_d_stays_two_d_and_ome_stays_ome(tmp_path: Path):
    flat = tmp_path / "flat.tif"
    tifffile.imwrite(flat, tifffile.imread(DWI)[4])
    assert invoke(flat, "--max", 4095).exit_code == 0
    assert tifffile.imread(tmp_path / "flat_norm.tif").shape == (128, 128)
    ome = tmp_path / "cells.ome.tif"
    tifffile.imwrite(
        ome,
        hyperstack().transpose(1, 0, 2, 3),
        ome=True,
        metadata={
            "axes": "CZYX",
            "PhysicalSizeX": 2.0,
            "PhysicalSizeY": 2.0,
            "PhysicalSizeZ": 2.2,
            "Channel": {"Name": ["fmri", "reversed"]},
        },
    )
    result = invoke(ome)
    assert result.exit_code == 0, result.output
    out = tmp_path / "cells_norm.ome.tif"
    with tifffile.TiffFile(ome) as before, tifffile.TiffFile(out) as after:
        assert (
            after.is_ome and after.series[0].axes == "CZYX" and after.series[0].dtype == np.float32
        )
        assert 'Type="float"' in after.ome_metadata and 'Name="reversed"' in after.ome_metadata
        assert 'PhysicalSizeZ="2.2"' in after.ome_metadata
        assert _xml_without_type(before.ome_metadata.split("<Image")[1]) == _xml_without_type(
            after.ome_metadata.split("<Image")[1]
        )


@pytest.mark.cuda
@pytest.mark.parametrize("args", [("--percentile", 1, 99.8), ("--max", "900,500"), ()])
def test_cuda_per_channel_equals_the_cpu(zcyx: Path, args):
    for device in ("cpu", "cuda"):
        result = invoke(
            zcyx,
            *args,
            "-o",
            zcyx.with_name(f"{device}.tif"),
            "--device",
            device,
            "--chunk-mb",
            0.2,
        )
        assert result.exit_code == 0, result.output
    np.testing.assert_array_equal(
        tifffile.imread(zcyx.with_name("cuda.tif")), tifffile.imread(zcyx.with_name("cpu.tif"))
    )


def test_files_from_with_null_separators(tmp_path: Path):
    shutil.copy(DWI, tmp_path / "a b.tif")
    shutil.copy(ANAT, tmp_path / "c.tif")
    listing = f"{tmp_path / 'a b.tif'}\0{tmp_path / 'c.tif'}\0".encode()
    result = CliRunner().invoke(
        cli, ["normvol", "--files-from", "-", "-0", "--max", "40000"], input=listing
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "a b_norm.tif").exists() and (tmp_path / "c_norm.tif").exists()
    assert "2 written" in result.stderr
