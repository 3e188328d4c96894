"""imgops bench: the kernel bench's JSON is sane and checked; the pipeline bench runs the peer."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from click.testing import CliRunner

from imgops import ops
from imgops.bench import kernels, pipeline
from imgops.cli import cli

SAMPLES = Path(__file__).resolve().parents[1] / "samples"


@pytest.fixture(scope="module")
def quick_report() -> dict:
    result = CliRunner().invoke(
        cli, ["bench", "--quick", "--no-compile", "--device", "cpu", "--json", "-q"]
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_quick_bench_json_is_sane(quick_report: dict) -> None:
    env = quick_report["environment"]
    assert env["cpu_threads"] >= 1 and env["opencv_threads"] == env["cpu_threads"]
    copy = quick_report["copy"]["cpu"]
    assert copy["gbps"] > 0 and copy["median_ms"] > 0
    results = quick_report["results"]
    benched = {case.op for case in kernels.cases(torch.device("cpu"), True)}  # the registry's
    assert {r["op"] for r in results} == benched >= {"rgb_to_gray", "normalize_volume"}
    for r in results:
        assert r["error"] is None, r
        assert r["median_ms"] > 0 and r["gbps"] > 0 and r["pct_of_copy"] > 0 and r["reps"] >= 3
        assert r["bytes_moved"] > 0
    ours = [r for r in results if r["impl"] == "imgops"]
    cases = kernels.cases(torch.device("cpu"), True)
    assert len(ours) == len(cases) and all(r["verified"] == "exact" for r in ours)
    assert all(r["vs_imgops"] == pytest.approx(1.0) for r in ours)
    assert any(r["impl"] == "opencv" for r in results)
    assert not any(r["impl"] == "torch.compile" for r in results)  # --no-compile


def test_bytes_moved_counts_input_and_output(quick_report: dict) -> None:
    gray = next(r for r in quick_report["results"] if r["case"] == "256x256 RGB uint16")
    assert gray["bytes_moved"] == 256 * 256 * 3 * 2 + 256 * 256 * 2
    norm = next(r for r in quick_report["results"] if r["op"] == "normalize_volume")
    assert norm["bytes_moved"] == 4 * 128 * 128 * (2 + 4)


def test_a_wrong_kernel_is_reported_and_never_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    real = ops.rgb_to_gray

    def off_by_one(image: torch.Tensor, channel_order: str = "rgb") -> torch.Tensor:
        out = real(image, channel_order).clone()
        out.view(-1)[0] += 1
        return out

    monkeypatch.setattr(kernels.ops, "rgb_to_gray", off_by_one)
    case = kernels.Case("rgb_to_gray", "tiny", (8, 8, 3), torch.uint8)
    settings = kernels.Settings(quick=True, compile=False)
    results = kernels.run_case(case, torch.device("cpu"), settings, copy_gbps=1.0)
    ours = results[0]
    assert ours.impl == "imgops" and "differs from the reference" in ours.error
    assert ours.median_ms is None and ours.reps == 0
    assert all(r.error is None for r in results[1:])


def test_inputs_are_random_not_zeros() -> None:
    a = kernels._random((64, 64, 3), torch.uint8, torch.device("cpu"), seed=1)
    b = kernels._random((64, 64, 3), torch.uint8, torch.device("cpu"), seed=2)
    assert a.float().std() > 50 and not torch.equal(a, b)


def test_table_output_names_threads_and_copy() -> None:
    result = CliRunner().invoke(cli, ["bench", "--quick", "--no-compile", "--device", "cpu", "-q"])
    assert result.exit_code == 0, result.output
    assert "CPU threads" in result.stdout and "cpu copy" in result.stdout
    assert "imgops" in result.stdout and "opencv" in result.stdout


def test_opencv_peer_script_converts_real_files(tmp_path: Path) -> None:
    out = tmp_path / "out"
    inputs = [
        SAMPLES / "rocket_baseline_rgb.jpg",
        SAMPLES / "tulips_rgba.png",
        SAMPLES / "camera_gray.png",
    ]
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "opencv_pool.py"
    for jobs in ("2", "1"):
        done = subprocess.run(
            [sys.executable, str(script), "-d", str(out), "--jobs", jobs, *map(str, inputs)],
            capture_output=True,
            text=True,
            check=True,
        )
        summary = json.loads(done.stdout)
        assert summary["files"] == 3 and summary["failed"] == 0
        assert summary["output_bytes"] == sum(p.stat().st_size for p in out.iterdir())
    gray = cv2.imread(str(out / "rocket_baseline_rgb.png"), cv2.IMREAD_UNCHANGED)
    rgb = cv2.imread(str(inputs[0]))
    assert (
        gray.ndim == 2
        and np.abs(gray.astype(int) - cv2.cvtColor(rgb, cv2.COLOR_BGR2GRAY)).max() == 0
    )


def test_pipeline_bench_times_every_tool(tmp_path: Path) -> None:
    folder = tmp_path / "photos"
    folder.mkdir()
    for name in ("rocket_baseline_rgb.jpg", "coffee_rgb.png"):
        shutil.copy(SAMPLES / name, folder / name)
    (folder / "notes.txt").write_text("not an image")
    report = pipeline.run_pipeline(
        folder, reps=1, device="cpu", jpg=True, nvdecode=False, work_dir=tmp_path
    )
    assert report["files"] == 2
    runs = {run["tool"]: run for run in report["runs"]}
    jobs = os.cpu_count()
    assert set(runs) == {
        "imgops gray cpu",
        "imgops gray cpu --luma stored",
        "imgops gray cpu jpg",
        f"opencv pool ({jobs} processes)",
        f"opencv pool ({jobs} processes) jpg",
        f"floor: opencv decode ({jobs} processes)",
    }
    for tool, run in runs.items():
        assert run.get("error") is None, run
        assert run["wall_s"] > 0 and run["files_per_s"] > 0
        if not tool.startswith("floor"):
            assert run["output_bytes"] > 0
    assert runs[f"floor: opencv decode ({jobs} processes)"]["output_bytes"] is None
    png_check = runs[f"opencv pool ({jobs} processes)"]["check"]
    assert png_check.startswith("max diff") and int(png_check.split()[2].rstrip(",")) <= 1
    jpg_check = runs[f"opencv pool ({jobs} processes) jpg"]["check"]
    assert float(jpg_check.split()[4]) < 1.5  # JPEG at quality 95 both: close, not equal
    assert runs["imgops gray cpu"]["vs_pool"] > 0
    stored = runs["imgops gray cpu --luma stored"]  # the JPEGs' own luma planes
    assert stored.get("error") is None and stored["check"].startswith("max diff")
    assert stored["output_bytes"] > 0


def test_pipeline_bench_refuses_a_folder_without_images(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["bench", "--pipeline", str(tmp_path), "-q"])
    assert result.exit_code == 2 and "no image files" in result.output


def test_pipeline_bench_passes_no_fsync_to_imgops_only(tmp_path: Path) -> None:
    listing = tmp_path / "inputs.txt"
    listing.write_text("")
    args = dict(png_level=None, jpg=True, stats=None, nvdecode=False, batch=8)
    durable = pipeline._tools(listing, tmp_path, ["cpu"], **args)
    quick = pipeline._tools(listing, tmp_path, ["cpu"], durable=False, **args)
    for name, spec in quick.items():
        flagged = "--no-fsync" in spec["command"]
        assert flagged == name.startswith("imgops gray"), name
        assert "--no-fsync" not in durable[name]["command"]


def test_pipeline_bench_with_a_warm_server(tmp_path: Path) -> None:
    """--server: each imgops row again, relayed to an `imgops serve` started (--detach) and
    stopped (--stop) by the bench; the same outputs as the cold row."""
    folder = tmp_path / "photos"
    folder.mkdir()
    for name in ("rocket_baseline_rgb.jpg", "coffee_rgb.png"):
        shutil.copy(SAMPLES / name, folder / name)
    report = pipeline.run_pipeline(folder, reps=1, device="cpu", nvdecode=False, server=True)
    runs = {run["tool"]: run for run in report["runs"]}
    cold, warm = runs["imgops gray cpu"], runs["imgops gray cpu, warm server"]
    assert warm.get("error") is None and warm["files_per_s"] > 0, warm
    assert warm["output_bytes"] == cold["output_bytes"] > 0
    assert warm["check"].startswith("max diff 0")
