"""`imgops bin` end to end against numpy's block mean on the real stacks (8/16-bit, odd sizes,
streaming with more planes than one chunk), hyperstacks, metadata, errors.

Data: the MRI samples and hyperstacks built from them (tests/data/volume/SOURCES.md)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import tifffile
from click.testing import CliRunner
from test_hyperstack import hyperstack

from imgops.cli import cli
from imgops.commands.bin import bin_command
from imgops.volume_files import bin_file

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
FMRI, ANAT, DWI = (
    SAMPLES / n for n in ("mri_fmri_imagej.tif", "mri_anat_shift610_zlib.tif", "mri_dwi_b0_u16.tif")
)


def block_mean(a: np.ndarray, factors) -> np.ndarray:
    """numpy reference: mean of each block over the last len(factors) axes, partial blocks
    dropped; integers rounded half up (exact: integer sums), floats from the float64 mean."""
    lead = a.ndim - len(factors)
    cut = a[
        (Ellipsis, *[slice(0, n // f * f) for n, f in zip(a.shape[lead:], factors, strict=True)])
    ]
    shape = list(cut.shape[:lead])
    for n, f in zip(cut.shape[lead:], factors, strict=True):
        shape += [n // f, f]
    axes = tuple(lead + 2 * i + 1 for i in range(len(factors)))
    if np.issubdtype(a.dtype, np.integer):
        total = cut.reshape(shape).astype(np.int64).sum(axis=axes)
        size = int(np.prod(factors))
        return ((2 * total + size) // (2 * size)).astype(a.dtype)
    return cut.reshape(shape).astype(np.float64).mean(axis=axes).astype(a.dtype)


def invoke(*args):
    return CliRunner().invoke(bin_command, list(map(str, args)), catch_exceptions=False)


@pytest.mark.parametrize("factors", [(1, 2, 2), (2, 2, 2), (3, 4, 5), (2, 1, 1)])
@pytest.mark.parametrize("sample", [ANAT, FMRI], ids=["anat-odd-zlib", "fmri-imagej"])
def test_bin_equals_numpys_block_mean_streaming_past_one_chunk(
    tmp_path: Path, sample: Path, factors
):
    out = tmp_path / "o.tif"
    result = invoke(sample, "--factor", *factors, "-o", out, "--chunk-mb", 0.05)
    assert result.exit_code == 0, result.output
    assert result.stderr.strip().startswith(str(out)) and result.stderr.count("\n") == 1
    np.testing.assert_array_equal(
        tifffile.imread(out), block_mean(tifffile.imread(sample), factors)
    )


@pytest.mark.parametrize("dtype", ["uint8", "int16", "float32"])
def test_other_types(tmp_path: Path, dtype: str):
    data = tifffile.imread(ANAT).astype(np.float64)
    data = {"uint8": data / 122, "int16": data - 15000, "float32": data / 7 - 3}[dtype].astype(
        dtype
    )
    tifffile.imwrite(tmp_path / "s.tif", data, photometric="minisblack")
    result = invoke(tmp_path / "s.tif", "--factor", 2, 3, 3, "--chunk-mb", 0.02)
    assert result.exit_code == 0, result.output
    got = tifffile.imread(tmp_path / "s_bin233.tif")
    assert got.dtype == data.dtype
    np.testing.assert_array_equal(got, block_mean(data, (2, 3, 3)))


def test_hyperstack_bins_z_within_each_channel_and_keeps_metadata(tmp_path: Path):
    data = hyperstack(time_points=2)  # TZCYX
    path = tmp_path / "h.tif"
    tifffile.imwrite(
        path,
        data,
        imagej=True,
        resolution=(0.5, 0.5),
        metadata={"axes": "TZCYX", "spacing": 2.2, "unit": "mm", "Info": "kept"},
    )
    result = invoke(path, "--factor", 5, 2, 2, "--chunk-mb", 0.1)
    assert result.exit_code == 0, result.output
    out = tmp_path / "h_bin522.tif"
    expected = block_mean(data.transpose(0, 2, 1, 3, 4), (5, 2, 2)).transpose(0, 2, 1, 3, 4)
    with tifffile.TiffFile(out) as tif:
        assert tif.series[0].axes == "TZCYX" and tif.is_imagej
        np.testing.assert_array_equal(tif.asarray(), expected)
        assert tif.imagej_metadata["spacing"] == pytest.approx(11.0)
        assert tif.imagej_metadata["Info"] == "kept"
        assert tif.pages[0].resolution == pytest.approx((0.25, 0.25))


def test_python_api_and_ome(tmp_path: Path):
    ome = tmp_path / "c.ome.tif"
    tifffile.imwrite(
        ome,
        hyperstack().transpose(1, 0, 2, 3),
        ome=True,
        metadata={"axes": "CZYX", "PhysicalSizeX": 2.0, "PhysicalSizeZ": 2.2},
    )
    result = bin_file(ome, tmp_path / "b.ome.tif", (2, 2, 2))
    assert result.shape == (2, 12, 48, 64)
    with tifffile.TiffFile(tmp_path / "b.ome.tif") as tif:
        assert (
            tif.is_ome and tif.series[0].shape == (2, 12, 48, 64) and tif.series[0].axes == "CZYX"
        )
        assert (
            'PhysicalSizeX="4.0"' in tif.ome_metadata and 'PhysicalSizeZ="4.4' in tif.ome_metadata
        )
        np.testing.assert_array_equal(
            tif.asarray(), block_mean(hyperstack().transpose(1, 0, 2, 3), (2, 2, 2))
        )


def test_errors_are_one_line_and_leave_nothing(tmp_path: Path):
    shutil.copy(DWI, tmp_path / "a.tif")
    (tmp_path / "bad.tif").write_bytes(b"II*\x00 broken")
    result = invoke(tmp_path / "bad.tif", tmp_path / "a.tif", "--factor", 1, 2, 2)
    assert result.exit_code == 1 and "1 written" in result.stderr and "1 failed" in result.stderr
    assert (tmp_path / "a_bin122.tif").exists() and not (tmp_path / "bad_bin122.tif").exists()
    big = invoke(tmp_path / "a.tif", "--factor", 11, 1, 1, "-o", tmp_path / "x.tif")
    assert big.exit_code == 1 and "smaller than one 11x1x1 block" in big.stderr
    assert invoke(tmp_path / "a.tif", "--factor", 1, 1, 1).exit_code == 2
    assert invoke(tmp_path / "a.tif", "--factor", 0, 2, 2).exit_code == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.tif", "a_bin122.tif", "bad.tif"]


def test_name_template_fields_beside_the_input_and_with_d(tmp_path: Path):
    scans = tmp_path / "scans"
    (scans / "sub").mkdir(parents=True)
    shutil.copy(ANAT, scans / "a.tif")
    shutil.copy(ANAT, scans / "sub" / "b.ome.tif")
    expected = block_mean(tifffile.imread(ANAT), (1, 2, 2))
    out = tmp_path / "out"
    in_dir = invoke(scans, "-r", "--factor", 1, 2, 2, "-d", out, "--name", "{stem}-small.{ext}")
    assert in_dir.exit_code == 0, in_dir.output
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == [
        "a-small.tif",
        "sub",
        "sub/b-small.tif",
    ]  # -d keeps the sub-folders
    np.testing.assert_array_equal(tifffile.imread(out / "sub" / "b-small.tif"), expected)
    template = "{parent}_{stem}_{suffix}_x2.{ext}"
    beside = invoke(scans, "-r", "--factor", 1, 2, 2, "--name", template)
    assert beside.exit_code == 0, beside.output
    assert sorted(str(p.relative_to(scans)) for p in scans.rglob("*")) == [
        "a.tif",
        "scans_a_tif_x2.tif",
        "sub",
        "sub/b.ome.tif",
        "sub/sub_b_tif_x2.tif",  # {stem} leaves out the whole .ome.tif
    ]
    np.testing.assert_array_equal(tifffile.imread(scans / "scans_a_tif_x2.tif"), expected)
    again = invoke(scans, "-r", "--factor", 1, 2, 2, "--name", template, "--skip-existing")
    assert again.exit_code == 0 and "0 written, 2 skipped, 0 failed" in again.stderr
    bad = invoke(scans / "a.tif", "--factor", 1, 2, 2, "--name", "{size}.{ext}")
    assert bad.exit_code == 2 and "unknown field {size}" in bad.stderr


def test_name_collision_is_refused_before_anything_is_written(tmp_path: Path):
    shutil.copy(ANAT, tmp_path / "a.tif")
    shutil.copy(DWI, tmp_path / "b.tif")
    before = sorted(p.name for p in tmp_path.iterdir())
    result = invoke(tmp_path, "--factor", 1, 2, 2, "--name", "{parent}.{ext}")
    assert result.exit_code == 2
    assert f"would both write {tmp_path / (tmp_path.name + '.tif')}" in result.stderr
    assert "use --name" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_rerun_over_a_folder_leaves_earlier_outputs_out(tmp_path: Path):
    shutil.copy(ANAT, tmp_path / "a.tif")
    assert invoke(tmp_path, "--factor", 1, 2, 2).exit_code == 0
    again = invoke(tmp_path, "--factor", 1, 2, 2)  # a_bin122.tif is a.tif's output, not an input
    assert again.exit_code == 1 and "a_bin122.tif exists (use --overwrite)" in again.stderr
    assert "would overwrite an input" not in again.stderr
    skipped = invoke(tmp_path, "--factor", 1, 2, 2, "--skip-existing", "-v")
    assert skipped.exit_code == 0, skipped.output
    assert f"{tmp_path / 'a_bin122.tif'}: left out: the output of {tmp_path / 'a.tif'}" in (
        skipped.stderr
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.tif", "a_bin122.tif"]
    shutil.copy(DWI, tmp_path / "a_bin122.tif")  # a real stack of that name: never replaced
    real = invoke(tmp_path, "--factor", 1, 2, 2, "--overwrite")
    assert real.exit_code == 2 and "would overwrite an input" in real.stderr
    assert (tmp_path / "a_bin122.tif").read_bytes() == DWI.read_bytes()


def test_stats_json_counts_and_failed_list(tmp_path: Path):
    shutil.copy(ANAT, tmp_path / "a.tif")
    shutil.copy(DWI, tmp_path / "c.tif")
    (tmp_path / "bad.tif").write_bytes(b"II*\x00 broken")
    assert invoke(tmp_path / "a.tif", "--factor", 1, 2, 2).exit_code == 0
    stats = tmp_path / "run" / "stats.json"
    stats.parent.mkdir()
    inputs = [tmp_path / n for n in ("a.tif", "bad.tif", "c.tif")]
    result = invoke(
        *inputs, "--factor", 1, 2, 2, "--skip-existing", "--stats-json", stats, "--device", "cpu"
    )
    assert result.exit_code == 1
    assert "1 written, 1 skipped, 1 failed" in result.stderr
    data = json.loads(stats.read_text())
    assert (data["written"], data["skipped"], data["failed"]) == (1, 1, 1)
    assert data["interrupted"] is False
    assert [f["input"] for f in data["failures"]] == [str(tmp_path / "bad.tif")]
    assert data["failures"][0]["reason"] and "\n" not in data["failures"][0]["reason"]
    assert data["factors"] == [1, 2, 2] and data["device"] == "cpu"
    assert [f["output"] for f in data["files"]] == [str(tmp_path / "c_bin122.tif")]
    assert data["files"][0]["shape"] == [10, 64, 64]
    assert sorted(p.name for p in stats.parent.iterdir()) == ["stats.json"]  # no temporaries


def test_stats_json_is_never_an_input_or_output(tmp_path: Path):
    shutil.copy(ANAT, tmp_path / "a.tif")
    target = tmp_path / "a_bin122.tif"
    for stats in (target, tmp_path / "a.tif"):
        result = invoke(tmp_path / "a.tif", "--factor", 1, 2, 2, "--stats-json", stats)
        assert result.exit_code == 2, result.output
        assert "--stats-json" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.tif"]
    assert tifffile.imread(tmp_path / "a.tif").shape == (25, 41, 33)


def test_bin_help_lists_name_and_stats_json():
    result = CliRunner().invoke(cli, ["bin", "--help"], catch_exceptions=False)
    assert result.exit_code == 0
    text = " ".join(result.output.split())  # as one line, whatever the terminal's width
    assert "--name TEMPLATE Output file name: fields {stem} {ext} {suffix} {parent}" in text
    assert "[default: '{stem}_bin<FZ><FY><FX>.tif', with -d '{stem}.tif']" in text
    assert "--stats-json FILE Write counts, failed inputs with reasons" in text


@pytest.mark.cuda
@pytest.mark.parametrize("factors", [(1, 2, 2), (2, 3, 3)])
def test_cuda_bin_equals_the_cpu_and_numpy(tmp_path: Path, factors):
    for device in ("cpu", "cuda"):
        out = tmp_path / f"{device}.tif"
        result = invoke(
            ANAT, "--factor", *factors, "-o", out, "--device", device, "--chunk-mb", 0.05
        )
        assert result.exit_code == 0, result.output
    np.testing.assert_array_equal(
        tifffile.imread(tmp_path / "cuda.tif"), tifffile.imread(tmp_path / "cpu.tif")
    )
    np.testing.assert_array_equal(
        tifffile.imread(tmp_path / "cuda.tif"), block_mean(tifffile.imread(ANAT), factors)
    )
