"""`imgops normvol` end to end: options, outputs against the reference, errors and exit codes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tifffile
import torch
from click.testing import CliRunner

from imgops.cli import cli
from imgops.reference import normalize_volume_reference

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
DWI, FMRI, ANAT = "mri_dwi_b0_u16.tif", "mri_fmri_imagej.tif", "mri_anat_shift610_zlib.tif"


@pytest.fixture
def stacks(tmp_path: Path) -> Path:
    """A scratch folder holding copies of the sample stacks (outputs land beside them)."""
    for name in (DWI, FMRI, ANAT):
        shutil.copy(SAMPLES / name, tmp_path / name)
    return tmp_path


def invoke(*args: object):
    return CliRunner().invoke(cli, ["normvol", *map(str, args)], catch_exceptions=False)


def reference(path: Path, high: float, low: float = 0.0, **kwargs) -> np.ndarray:
    data = torch.from_numpy(tifffile.imread(path))
    return normalize_volume_reference(data, high, low, **kwargs).numpy()


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".imgops-tmp-" in p.name)


def test_default_max_is_the_data_max_and_output_sits_beside_the_input(stacks: Path):
    result = invoke(stacks / DWI)
    assert result.exit_code == 0, result.output
    assert "max 4095" in result.stderr and result.stdout == ""
    out = tifffile.imread(stacks / "mri_dwi_b0_u16_norm.tif")
    np.testing.assert_array_equal(out, reference(stacks / DWI, 4095))


@pytest.mark.parametrize("name", [DWI, FMRI, ANAT])
def test_explicit_max_min_match_the_reference(stacks: Path, name: str):
    target = stacks / "out.tif"
    result = invoke(stacks / name, "--max", 5000, "--min", 12.5, "-o", target, "--chunk-mb", 0.05)
    assert result.exit_code == 0, result.output
    np.testing.assert_array_equal(tifffile.imread(target), reference(stacks / name, 5000, 12.5))


def test_max_dtype_float16_and_clip(stacks: Path):
    target = stacks / "half.tif"
    result = invoke(
        stacks / ANAT, "--max", "dtype", "--min", 1000, "--dtype", "float16", "--clip", "-o", target
    )
    assert result.exit_code == 0, result.output
    out = tifffile.imread(target)
    assert out.dtype == np.float16
    expected = reference(stacks / ANAT, 65535, 1000, dtype=torch.float16, clip=True)
    np.testing.assert_array_equal(out, expected)


def test_min_data(stacks: Path):
    result = invoke(stacks / ANAT, "--min", "data", "--max", 40000, "-o", stacks / "o.tif")
    assert result.exit_code == 0, result.output
    data = tifffile.imread(stacks / ANAT)
    np.testing.assert_array_equal(
        tifffile.imread(stacks / "o.tif"), reference(stacks / ANAT, 40000, float(data.min()))
    )


def test_percentiles_equal_numpys(stacks: Path):
    target = stacks / "p.tif"
    result = invoke(stacks / FMRI, "--percentile", 1, 99.8, "-o", target)
    assert result.exit_code == 0, result.output
    data = tifffile.imread(stacks / FMRI)
    low, high = np.percentile(data, 1), np.percentile(data, 99.8)
    assert f"{high:.10g}" in result.stderr
    np.testing.assert_array_equal(tifffile.imread(target), reference(stacks / FMRI, high, low))


def test_imagej_metadata_survives(stacks: Path):
    assert invoke(stacks / FMRI, "--max", 1162).exit_code == 0
    with tifffile.TiffFile(stacks / "mri_fmri_imagej_norm.tif") as tif:
        assert tif.is_imagej and tif.imagej_metadata["spacing"] == pytest.approx(2.2)
        assert tif.imagej_metadata["unit"] == "mm"
        assert tif.pages[0].resolution == pytest.approx((0.5, 0.5))
        assert tif.series[0].shape == (24, 96, 128) and tif.series[0].axes == "ZYX"


def test_dir_output_for_several_inputs(stacks: Path):
    out = stacks / "normalised"
    result = invoke(stacks / DWI, stacks / ANAT, "--max", 4095, "-d", out, "-q")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["mri_anat_shift610_zlib.tif", DWI]
    assert result.stderr == ""  # -q: no summary, no warnings


def test_existing_output_is_refused_then_overwritten_or_skipped(stacks: Path):
    target = stacks / "o.tif"
    target.write_bytes(b"precious")
    result = invoke(stacks / DWI, "--max", 4095, "-o", target)
    assert result.exit_code == 1 and "exists" in result.stderr and str(target) in result.stderr
    assert target.read_bytes() == b"precious"
    assert invoke(stacks / DWI, "--max", 4095, "-o", target, "--skip-existing").exit_code == 0
    assert target.read_bytes() == b"precious"
    assert invoke(stacks / DWI, "--max", 4095, "-o", target, "--overwrite").exit_code == 0
    np.testing.assert_array_equal(tifffile.imread(target), reference(stacks / DWI, 4095))
    assert leftovers(stacks) == []


@pytest.mark.parametrize(
    "args",
    [
        ["--max", 0],
        ["--max", "nan"],
        ["--max", "inf"],
        ["--max", "lots"],
        ["--max", 5, "--min", 9],
        ["--max", 5, "--min", 5],
        ["--percentile", 99, 1],
        ["--percentile", 1, 101],
        ["--percentile", 1, 99, "--max", 9],
        ["--chunk-mb", 0],
        ["--dtype", "float64"],
        ["-o", "a.tif", "-d", "out"],
    ],
    ids=str,
)
def test_usage_errors_exit_2_and_write_nothing(stacks: Path, args):
    before = sorted(p.name for p in stacks.iterdir())
    result = invoke(stacks / DWI, *args)
    assert result.exit_code == 2, result.output
    assert sorted(p.name for p in stacks.iterdir()) == before


def test_two_inputs_with_one_output_is_a_usage_error(stacks: Path):
    assert invoke(stacks / DWI, stacks / ANAT, "-o", stacks / "x.tif").exit_code == 2


def _make_bad(folder: Path) -> dict[str, Path]:
    bad = {
        "float64": folder / "f64.tif",
        "rgb": folder / "rgb.tif",
        "inconsistent": folder / "mixed.tif",
        "missing": folder / "absent.tif",
    }
    tifffile.imwrite(bad["float64"], np.zeros((4, 8, 8)), photometric="minisblack")
    tifffile.imwrite(bad["rgb"], np.zeros((4, 8, 8, 3), np.uint8), photometric="rgb")
    with tifffile.TiffWriter(bad["inconsistent"]) as writer:
        writer.write(np.zeros((10, 10), np.uint16))
        writer.write(np.zeros((5, 10), np.uint16))
    return bad


@pytest.mark.parametrize("kind", ["float64", "rgb", "inconsistent", "missing"])
def test_bad_inputs_exit_1_with_one_line_and_no_output(stacks: Path, kind: str):
    path = _make_bad(stacks)[kind]
    result = invoke(path, "--max", 100)
    assert result.exit_code == 1
    lines = [line for line in result.stderr.splitlines() if line.startswith("imgops: error:")]
    assert len(lines) == 1 and str(path) in lines[0]
    assert "Traceback" not in result.stderr
    assert not any(p.name.endswith("_norm.tif") for p in stacks.iterdir())
    assert leftovers(stacks) == []


def test_a_bad_file_in_a_batch_does_not_stop_the_others(stacks: Path):
    bad = _make_bad(stacks)
    result = invoke(bad["float64"], stacks / DWI, bad["missing"], "--max", 4095)
    assert result.exit_code == 1
    assert "1 written, 0 skipped, 2 failed" in result.stderr
    assert (stacks / "mri_dwi_b0_u16_norm.tif").exists()


def test_constant_volume_is_a_data_error(stacks: Path):
    tifffile.imwrite(stacks / "zeros.tif", np.zeros((3, 8, 8), np.uint16), photometric="minisblack")
    result = invoke(stacks / "zeros.tif")
    assert result.exit_code == 1 and "not above min" in result.stderr
    assert not (stacks / "zeros_norm.tif").exists()


def test_output_never_overwrites_the_input(stacks: Path):
    result = invoke(stacks / DWI, "--max", 4095, "-o", stacks / DWI, "--overwrite")
    assert result.exit_code == 2 and "would overwrite its input" in result.output
    assert (stacks / DWI).read_bytes() == (SAMPLES / DWI).read_bytes()


def test_failure_mid_stack_leaves_no_file(stacks: Path, monkeypatch):
    import imgops.io.volumes as volumes

    real = volumes.VolumeReader.read_into
    calls = {"n": 0}

    def failing(self, start, out):
        calls["n"] += 1
        if calls["n"] == 3:
            raise volumes.FileError(self.path, "cannot read slices (simulated I/O error)")
        real(self, start, out)

    monkeypatch.setattr(volumes.VolumeReader, "read_into", failing)
    result = invoke(stacks / FMRI, "--max", 1162, "--chunk-mb", 0.2)
    assert result.exit_code == 1 and "simulated" in result.stderr
    assert calls["n"] >= 3
    assert not (stacks / "mri_fmri_imagej_norm.tif").exists() and leftovers(stacks) == []


def test_help_has_examples():
    result = CliRunner().invoke(cli, ["normvol", "--help"])
    assert result.exit_code == 0 and "$ imgops normvol" in result.output


def test_real_process_exit_codes_and_streams(stacks: Path):
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    command = [sys.executable, "-m", "imgops.cli", "normvol"]
    ok = subprocess.run(
        [*command, str(stacks / ANAT), "--max", "31003"], capture_output=True, text=True, env=env
    )
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout == ""
    np.testing.assert_array_equal(
        tifffile.imread(stacks / "mri_anat_shift610_zlib_norm.tif"), reference(stacks / ANAT, 31003)
    )
    missing = subprocess.run(
        [*command, str(stacks / "nope.tif")], capture_output=True, text=True, env=env
    )
    assert missing.returncode == 1 and "nope.tif: no such file" in missing.stderr.lower()
    assert "Traceback" not in missing.stderr


@pytest.mark.slow
@pytest.mark.parametrize("signum", [2, 15], ids=["SIGINT", "SIGTERM"])
def test_a_signal_mid_stack_leaves_no_file(tmp_path: Path, signum: int):
    import signal
    import time

    depth, side = 400, 512
    slices = tifffile.imread(SAMPLES / DWI)
    with tifffile.TiffWriter(tmp_path / "big.tif") as writer:
        writer.write(
            (np.resize(slices[z % len(slices)], (side, side)) for z in range(depth)),
            shape=(depth, side, side),
            dtype="uint16",
            photometric="minisblack",
        )
    command = [sys.executable, "-m", "imgops.cli", "normvol", str(tmp_path / "big.tif")]
    process = subprocess.Popen(
        [*command, "--max", "4095", "--chunk-mb", "1"], stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 60
    while not leftovers(tmp_path) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert leftovers(tmp_path), "normvol finished before it could be interrupted"
    time.sleep(0.2)
    process.send_signal(signal.Signals(signum))
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signum, stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.tif"]


def test_stats_json_has_counts_bounds_and_failed_list(stacks: Path):
    import json

    (stacks / "bad.tif").write_bytes(b"II*\x00 broken")
    stats = stacks / "run" / "stats.json"
    stats.parent.mkdir()
    result = invoke(
        stacks / DWI, stacks / "bad.tif", "--max", 4095, "-d", stacks / "out",
        "--stats-json", stats, "--device", "cpu",
    )  # fmt: skip
    assert result.exit_code == 1
    data = json.loads(stats.read_text())
    assert (data["written"], data["skipped"], data["failed"]) == (1, 0, 1)
    assert [f["input"] for f in data["failures"]] == [str(stacks / "bad.tif")]
    assert data["command"] == "normvol" and data["device"] == "cpu"
    (entry,) = data["files"]
    assert entry["output"] == str(stacks / "out" / DWI)
    assert entry["bounds"] == {"all": [0.0, 4095.0]} and entry["seconds"] > 0
    assert entry["outside_0_1"] == int((tifffile.imread(stacks / DWI) > 4095).sum())
