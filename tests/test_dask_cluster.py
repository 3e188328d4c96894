"""imgops.dask on a real distributed.LocalCluster: 2 worker processes, bounded in time.

Equality with the single-process results (arrays, zarr volumes, the photo batch), failures that
leave no half-written output (a bad chunk, Ctrl-C, a worker killed mid-run).
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("distributed")
zarr = pytest.importorskip("zarr")
import dask.array as da  # noqa: E402

from imgops import ops  # noqa: E402
from imgops.dask import arrays  # noqa: E402
from imgops.dask.batch import run_batch_distributed  # noqa: E402
from imgops.dask.cluster import connect  # noqa: E402
from imgops.dask.volume import normalize_zarr, open_zarr  # noqa: E402
from imgops.io.atomic import TEMP_MARKER  # noqa: E402
from imgops.pipeline import GrayJob, PipelineSettings, run_gray  # noqa: E402

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
PHOTOS = [
    "coffee_rgb.png",
    "rocket_baseline_rgb.jpg",
    "room_rgb16.png",
    "tulips_rgba.png",
    "camera_gray.png",
    "light_palette_64px.png",
]
TIME_LIMIT_S = 90


@pytest.fixture(autouse=True)
def _bounded_time():
    def expire(signum, frame):
        raise TimeoutError(f"test ran past {TIME_LIMIT_S} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(TIME_LIMIT_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.fixture(scope="module")
def client():
    with connect("local:2") as c:
        c.wait_for_workers(2, timeout=60)
        yield c


def _temporaries(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if TEMP_MARKER in p.name]


def _write_zarr(path: Path, data: np.ndarray, chunks) -> None:
    array = zarr.create_array(str(path), shape=data.shape, chunks=chunks, dtype=data.dtype)
    array[...] = data


def _scan(seed=0, shape=(24, 40, 44)) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 4096, shape, dtype=np.uint16)


def test_arrays_on_two_worker_processes_equal_the_single_process_op(client, tmp_path):
    assert len(client.scheduler_info()["workers"]) == 2
    data = _scan()
    _write_zarr(tmp_path / "in.zarr", data, (5, 16, 16))
    volume = da.from_zarr(str(tmp_path / "in.zarr"))  # each task reads its chunk on a worker
    qs = (0.5, 99.9)
    low, high = arrays.percentiles(volume, qs)
    assert [low, high] == list(np.percentile(data, qs))
    result = arrays.normalize(volume, percentile=qs, clip=True).compute()
    expected = ops.normalize_volume(torch.from_numpy(data), max=high, min=low, clip=True).numpy()
    assert np.array_equal(result, expected)
    rgb = np.random.default_rng(1).integers(0, 65536, (3, 21, 19, 3), dtype=np.uint16)
    gray = arrays.gray(da.from_array(rgb, chunks=(1, 8, 8, 1))).compute()
    assert np.array_equal(gray, ops.rgb_to_gray(torch.from_numpy(rgb)).numpy())


def _ome_input(path: Path, data: np.ndarray) -> None:
    group = zarr.open_group(str(path), mode="w", zarr_format=2)
    group.create_array("s0", shape=data.shape, chunks=(4, 20, 22), dtype=data.dtype)[...] = data
    group.attrs["multiscales"] = [
        {
            "version": "0.4",
            "axes": [
                {"name": "z", "type": "space", "unit": "micrometer"},
                {"name": "y", "type": "space", "unit": "micrometer"},
                {"name": "x", "type": "space", "unit": "micrometer"},
            ],
            "datasets": [
                {
                    "path": "s0",
                    "coordinateTransformations": [{"type": "scale", "scale": [2.0, 0.5, 0.5]}],
                }
            ],
        }
    ]


def test_ome_zarr_volume_is_written_by_the_workers_and_equals_numpy(client, tmp_path):
    data = _scan(2)
    _ome_input(tmp_path / "in.ome.zarr", data)
    target = tmp_path / "out.ome.zarr"
    done = []
    run = normalize_zarr(
        tmp_path / "in.ome.zarr", target, percentile=(1, 99), client=client, on_progress=done.append
    )
    low, high = np.percentile(data, (1, 99))
    assert (run.low, run.high) == (low, high)
    assert sum(done) == run.blocks == 6 * 2 * 2
    expected = ops.normalize_volume(torch.from_numpy(data), max=high, min=low).numpy()
    out = open_zarr(target)
    assert np.array_equal(out.array.compute(), expected)
    assert out.scale == [2.0, 0.5, 0.5] and [a["unit"] for a in out.axes] == ["micrometer"] * 3
    attrs = dict(zarr.open_group(str(target)).attrs)
    assert attrs["ome"]["version"] == "0.5"  # the layout imgops normvol writes by default
    assert attrs["imgops"]["min"] == low and attrs["imgops"]["percentile"] == [1, 99]
    assert not _temporaries(tmp_path)
    with pytest.raises(Exception, match="exists"):
        normalize_zarr(tmp_path / "in.ome.zarr", target, max=4095, client=client)


def test_plain_zarr_out_with_overwrite(client, tmp_path):
    data = _scan(3, (9, 30, 30))
    _write_zarr(tmp_path / "in.zarr", data, (4, 30, 16))
    target = tmp_path / "out.zarr"
    target.mkdir()
    (target / "old").write_text("replaced")
    normalize_zarr(tmp_path / "in.zarr", target, max="dtype", overwrite=True, client=client)
    expected = ops.normalize_volume(torch.from_numpy(data), max=65535.0, min=0.0).numpy()
    assert np.array_equal(zarr.open_array(str(target))[...], expected)
    assert not (target / "old").exists() and not _temporaries(tmp_path)


def test_a_bad_chunk_fails_the_run_and_leaves_no_output_store(client, tmp_path):
    data = _scan(4)
    _write_zarr(tmp_path / "in.zarr", data, (2, 40, 44))
    chunk = tmp_path / "in.zarr" / "c" / "7" / "0" / "0"  # zarr v3 key of block (7, 0, 0)
    assert chunk.is_file()
    chunk.write_bytes(b"this is not a zstd frame")
    target = tmp_path / "out.ome.zarr"
    with pytest.raises(Exception):  # noqa: B017 - whatever the codec raises, on a worker
        normalize_zarr(tmp_path / "in.zarr", target, max=4095, client=client)
    assert not target.exists() and not _temporaries(tmp_path)


def test_ctrl_c_during_the_volume_write_leaves_no_output_store(client, tmp_path):
    _write_zarr(tmp_path / "in.zarr", _scan(5), (1, 40, 44))

    def interrupt(n: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        normalize_zarr(
            tmp_path / "in.zarr",
            tmp_path / "o.ome.zarr",
            max=9,
            client=client,
            on_progress=interrupt,
        )
    assert not (tmp_path / "o.ome.zarr").exists() and not _temporaries(tmp_path)


def _photo_jobs(folder: Path, copies: int, extra: bool = True) -> list[GrayJob]:
    folder.mkdir(exist_ok=True)
    jobs = [
        GrayJob(SAMPLES / name, folder / f"{Path(name).stem}_{i}.png", name)
        for i in range(copies)
        for name in PHOTOS
    ]
    if extra:
        bad = folder.parent / "truncated.jpg"
        bad.write_bytes((SAMPLES / "rocket_baseline_rgb.jpg").read_bytes()[:300])
        jobs.append(GrayJob(bad, folder / "truncated.png", "truncated.jpg"))
        jobs.append(GrayJob(folder.parent / "missing.jpg", folder / "missing.png", "missing.jpg"))
    return jobs


def _reference(tmp_path: Path, jobs: list[GrayJob]) -> dict[str, bytes]:
    folder = tmp_path / "single"
    folder.mkdir(exist_ok=True)
    single = [GrayJob(j.source, folder / j.target.name, j.label) for j in jobs]
    run_gray(single, PipelineSettings(device="cpu", jobs=2))
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_photo_batch_equals_the_single_process_engine(client, tmp_path):
    jobs = _photo_jobs(tmp_path / "out", 2)
    results = []
    summary = run_batch_distributed(
        jobs, None, PipelineSettings(device="cpu"), results.append, client
    )
    assert (summary.written, summary.skipped, summary.failed) == (12, 0, 2)
    assert len(results) == len(jobs) and {r.job.label for r in results} >= set(PHOTOS)
    failed = {r.job.label: r.reason for r in summary.failures}
    assert set(failed) == {"truncated.jpg", "missing.jpg"} and all(failed.values())
    reference = _reference(tmp_path, jobs)
    written = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    assert written == reference  # byte for byte, the same files
    again = run_batch_distributed(jobs[:3], None, PipelineSettings(), None, client)
    assert again.failed == 3 and "exists" in again.failures[0].reason
    skip = run_batch_distributed(jobs[:3], None, PipelineSettings(skip_existing=True), None, client)
    assert skip.skipped == 3


def _assert_only_complete_outputs(folder: Path, reference: dict[str, bytes]) -> None:
    assert not _temporaries(folder)
    for path in folder.iterdir():
        assert path.read_bytes() == reference[path.name], path.name


def test_ctrl_c_cancels_the_batch_and_leaves_only_complete_files(client, tmp_path):
    jobs = _photo_jobs(tmp_path / "out", 6, extra=False)

    def interrupt(result) -> None:
        raise KeyboardInterrupt

    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_batch_distributed(
            jobs, None, PipelineSettings(device="cpu"), interrupt, client, partitions=18
        )
    assert time.monotonic() - started < 60
    time.sleep(0.5)  # nothing keeps writing after the call returned
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    time.sleep(1.0)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == names
    assert len(names) < len(jobs)  # the rest was cancelled
    _assert_only_complete_outputs(tmp_path / "out", _reference(tmp_path, jobs))


def test_a_worker_killed_mid_batch_still_completes_with_whole_files(client, tmp_path):
    """Runs last in this module: it kills one worker process (its nanny restarts it)."""
    jobs = _photo_jobs(tmp_path / "out", 6, extra=False)
    pids = client.run(os.getpid)
    killed = []

    def kill_once(result) -> None:
        if not killed:
            pid = next(iter(pids.values()))
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    summary = run_batch_distributed(
        jobs, None, PipelineSettings(device="cpu"), kill_once, client, partitions=12
    )
    assert killed
    assert summary.written + summary.failed == len(jobs)
    assert all(r.reason.startswith("worker lost") for r in summary.failures)
    _assert_only_complete_outputs(tmp_path / "out", _reference(tmp_path, jobs))
    written = {p.name for p in (tmp_path / "out").iterdir()}
    assert written == {j.target.name for j in jobs} - {r.job.target.name for r in summary.failures}
    shutil.rmtree(tmp_path / "single")
