"""imgops on Dask vs one process: a uint16 zarr volume -> OME-Zarr float32 with exact
percentiles, a photo batch, and a scaling model (a model, not a measurement).

    PYTHONPATH=src python benchmarks/dask_bench.py --volume-mb 1024 --photos 200 \
        --json out.json

Volume: a random uint16 (Z, 1024, 2048) zarr (zstd, chunks of --chunk-slices slices) is made
once; then (a) one process, no dask: a loop over the chunks (value_histogram, percentiles,
normalize_volume, chunk writes into an OME-Zarr) and (b) `imgops.dask.volume.normalize_zarr` on
`local:N` (cluster start-up timed apart). Reported: medians, the ratio, each worker's peak RSS
(ru_maxrss of fresh worker processes), the scheduler overhead per task (no-op tasks), bytes
that crossed between processes (worker transfer counters).

Photos: --photos files (copies of the samples, JPEG and PNG) through `imgops.pipeline.run_gray`
with --workers threads vs `run_batch_distributed` on local:N.

The numbers depend on the machine; this one is shared (say so when reporting).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
PHOTO_SOURCES = ["flower_progressive_3mp.jpg", "rocket_baseline_rgb.jpg", "coffee_rgb.png"]


def make_volume(path: Path, megabytes: int, chunk_slices: int) -> tuple[int, int, int]:
    """A random uint16 zarr of about `megabytes` MiB, written chunk by chunk."""
    import zarr

    height, width = 1024, 2048
    depth = max(chunk_slices, megabytes * 2**20 // (height * width * 2))
    shape = (depth, height, width)
    array = zarr.create_array(
        str(path), shape=shape, chunks=(chunk_slices, height, width), dtype="uint16"
    )
    rng = np.random.default_rng(0)
    for start in range(0, depth, chunk_slices):
        stop = min(depth, start + chunk_slices)
        block = rng.normal(1200, 300, (stop - start, height, width)).clip(0, 4095)
        array[start:stop] = block.astype(np.uint16)
    return shape


def single_process_volume(src: Path, dst: Path, qs=(1.0, 99.8)) -> float:
    """One process, no dask: the chunk loop imgops normvol does, zarr in and OME-Zarr out."""
    import torch
    import zarr

    from imgops import ops
    from imgops.dask import ngff
    from imgops.volume import percentile_from_histogram

    started = time.perf_counter()
    source = zarr.open_array(str(src), mode="r")
    step = source.chunks[0]
    counts = None
    for start in range(0, source.shape[0], step):
        block = torch.from_numpy(source[start : start + step])
        part = ops.value_histogram(block)
        counts = part if counts is None else counts.add_(part)
    table = counts.numpy()
    low, high = (percentile_from_histogram(table, q) for q in qs)
    group = zarr.open_group(str(dst), mode="w", zarr_format=2)
    out = group.create_array(
        "0", shape=source.shape, chunks=source.chunks, dtype="float32", fill_value=0
    )
    for start in range(0, source.shape[0], step):
        block = torch.from_numpy(source[start : start + step])
        out[start : start + step] = ops.normalize_volume(block, max=high, min=low).numpy()
    group.attrs["multiscales"] = ngff.multiscales(3)
    return time.perf_counter() - started


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _transfer_bytes(dask_worker) -> int:
    for name in ("transfer_outgoing_bytes_total", "outgoing_transfer_bytes_total"):
        value = getattr(dask_worker, name, None)
        if value is not None:
            return int(value)
    return -1


def _noop(x):
    return x


def task_overhead_s(client, tasks: int = 1000) -> float:
    """Seconds per trivial task, submitted in bulk (scheduler + worker + round trip)."""
    client.gather(client.map(_noop, range(50), pure=False))  # warm
    started = time.perf_counter()
    client.gather(client.map(_noop, range(tasks), pure=False))
    return (time.perf_counter() - started) / tasks


def distributed_volume(src: Path, dst: Path, workers: int, repeats: int) -> dict:
    """normalize_zarr on local:N, each repeat on a fresh cluster (fresh peak RSS)."""
    from imgops.dask.cluster import connect
    from imgops.dask.volume import normalize_zarr

    runs = []
    for _ in range(repeats):
        shutil.rmtree(dst, ignore_errors=True)
        started = time.perf_counter()
        with connect(f"local:{workers}") as client:
            client.wait_for_workers(workers)
            client.run(_warm_imports)  # torch + the extension: not part of the run
            baseline = client.run(_peak_rss_mib)
            ready = time.perf_counter()
            run = normalize_zarr(src, dst, percentile=(1.0, 99.8), client=client)
            seconds = time.perf_counter() - ready
            rss = client.run(_peak_rss_mib)
            moved = client.run(_transfer_bytes)
            overhead = task_overhead_s(client)
        runs.append(
            {
                "seconds": seconds,
                "startup_seconds": ready - started,
                "bounds_seconds": run.seconds["bounds"],
                "write_seconds": run.seconds["write"],
                "blocks": run.blocks,
                "peak_rss_mib_per_worker": sorted(rss.values()),
                "rss_mib_after_imports": sorted(baseline.values()),
                "bytes_between_workers": sum(v for v in moved.values() if v >= 0),
                "task_overhead_ms": overhead * 1e3,
            }
        )
    return {"runs": runs, "median_seconds": statistics.median(r["seconds"] for r in runs)}


def _warm_imports() -> bool:
    import imgops.ops  # noqa: F401

    return True


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process, all its threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def photo_batch(folder: Path, count: int, workers: int, repeats: int = 1) -> dict:
    """run_gray with `workers` threads vs run_batch_distributed on local:N (cluster started and
    warm), alternated `repeats` times. Wall seconds, and CPU seconds of every process involved
    (this one, which holds the scheduler and the nannies, plus the workers): the CPU ratio is
    the overhead of distribution that a shared machine's load does not blur."""
    from imgops.dask.batch import run_batch_distributed
    from imgops.dask.cluster import connect
    from imgops.pipeline import GrayJob, PipelineSettings, run_gray

    paths = sorted(_photo_inputs(folder, count).iterdir())

    def jobs(out: Path) -> list:
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        return [GrayJob(p, out / f"{p.stem}.png", p.name) for p in paths]

    settings = PipelineSettings(device="cpu", jobs=workers, durable=False)
    remote = PipelineSettings(device="cpu", durable=False)
    wall: dict[str, list[float]] = {"single": [], "dask": []}
    cpu: dict[str, list[float]] = {"single": [], "dask": []}
    with connect(f"local:{workers}") as client:
        client.wait_for_workers(workers)
        client.run(_warm_imports)
        for _ in range(repeats):
            cpu0, started = _cpu_seconds(), time.perf_counter()
            single = run_gray(jobs(folder / "single"), settings)
            wall["single"].append(time.perf_counter() - started)
            cpu["single"].append(_cpu_seconds() - cpu0)
            before = client.run(_cpu_seconds)
            cpu0, started = _cpu_seconds(), time.perf_counter()
            spread = run_batch_distributed(jobs(folder / "dask"), None, remote, None, client)
            wall["dask"].append(time.perf_counter() - started)
            after = client.run(_cpu_seconds)
            workers_cpu = sum(after[k] - before[k] for k in after if k in before)
            cpu["dask"].append(_cpu_seconds() - cpu0 + workers_cpu)
    pairs = [d / s for s, d in zip(wall["single"], wall["dask"], strict=True)]
    return {
        "files": count,
        "single_seconds": wall["single"],
        "dask_seconds": wall["dask"],
        "ratio": statistics.median(wall["dask"]) / statistics.median(wall["single"]),
        "median_pair_ratio": statistics.median(pairs),
        "single_cpu_seconds": cpu["single"],
        "dask_cpu_seconds": cpu["dask"],
        "cpu_ratio": statistics.median(cpu["dask"]) / statistics.median(cpu["single"]),
        "single": single.line(),
        "dask": spread.line(),
    }


def _photo_inputs(folder: Path, count: int) -> Path:
    inputs = folder / "in"
    inputs.mkdir(parents=True, exist_ok=True)
    sources = [SAMPLES / name for name in PHOTO_SOURCES]
    for i in range(count):
        source = sources[i % len(sources)]
        shutil.copyfile(source, inputs / f"{i:04d}{source.suffix}")
    return inputs


def photo_cli(folder: Path, count: int, workers: int, repeats: int) -> dict:
    """`imgops gray IN -d OUT` as a user runs it (a fresh process each time, start-up and cluster
    start included) vs the same with `--scheduler local:N`; medians of `repeats` runs each,
    alternated. Outputs are checked byte-identical."""
    import subprocess

    inputs = _photo_inputs(folder, count)
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parent.parent / "src")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
    times: dict[str, list[float]] = {"single": [], "dask": []}
    for _ in range(repeats):
        for kind in ("single", "dask"):
            out = folder / kind
            shutil.rmtree(out, ignore_errors=True)
            command = [sys.executable, "-m", "imgops.cli", "gray", str(inputs), "-d", str(out)]
            command += ["--device", "cpu", "-q", "--stats-json", str(folder / f"{kind}.json")]
            if kind == "dask":
                command += ["--scheduler", f"local:{workers}"]
            started = time.perf_counter()
            subprocess.run(command, check=True, env=env)
            times[kind].append(time.perf_counter() - started)
    same = (
        all(
            (folder / "single" / p.name).read_bytes() == p.read_bytes()
            for p in (folder / "dask").iterdir()
        )
        and len(list((folder / "dask").iterdir())) == count
    )
    stats = json.loads((folder / "dask.json").read_text())
    single_s, dask_s = statistics.median(times["single"]), statistics.median(times["dask"])
    return {
        "files": count,
        "single_seconds": times["single"],
        "dask_seconds": times["dask"],
        "ratio": dask_s / single_s,
        # each dask run against the single run just before it: steadier on a shared machine
        "pair_ratios": [d / s for s, d in zip(times["single"], times["dask"], strict=True)],
        "median_pair_ratio": statistics.median(
            d / s for s, d in zip(times["single"], times["dask"], strict=True)
        ),
        "dask_engine_wall_seconds": stats.get("wall_seconds"),
        "identical_outputs": same,
    }


def scaling_model(volume: dict, shape, chunk_slices: int, single_s: float) -> dict:
    """A MODEL, not a measurement: predicted volume throughput on 8 and 64 workers.

    Inputs measured here: the per-task overhead (no-op tasks on local:N), the compute seconds
    per block (single-process time / blocks, i.e. one core's work per block including zarr
    decode/encode), the bytes each block moves between processes (its 512 KiB histogram and a
    tiny write ack: the voxels go worker <-> storage, never through the scheduler). Assumed:
    one core per worker, storage that keeps up (a parallel filesystem), 10 Gb/s links. The
    scheduler handles about 1 / overhead tasks per second in total.
    """
    run = volume["runs"][0]
    blocks = run["blocks"] * 3  # histogram + normalize/write + combine, per block
    overhead_s = run["task_overhead_ms"] / 1e3
    per_block_s = single_s / run["blocks"]
    block_bytes = chunk_slices * shape[1] * shape[2] * 2
    moved_per_block = 65536 * 8 + 64
    link_bytes_s = 10e9 / 8
    out = {}
    for workers in (8, 64):
        compute_bound = workers * block_bytes / (per_block_s + overhead_s)
        scheduler_bound = block_bytes / (overhead_s * 3)  # 3 tasks per block through one scheduler
        network_bound = block_bytes / moved_per_block * link_bytes_s
        throughput = min(compute_bound, scheduler_bound, network_bound)
        out[f"{workers}_workers"] = {
            "predicted_input_GBps": throughput / 1e9,
            "bound_by": min(
                ("compute", compute_bound),
                ("scheduler", scheduler_bound),
                ("network", network_bound),
                key=lambda item: item[1],
            )[0],
        }
    return {
        "MODEL_NOT_MEASUREMENT": True,
        "per_block_compute_s": per_block_s,
        "task_overhead_s": overhead_s,
        "tasks": blocks,
        "block_input_bytes": block_bytes,
        "bytes_moved_per_block": moved_per_block,
        "predictions": out,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--volume-mb", type=int, default=1024)
    parser.add_argument("--chunk-slices", type=int, default=16)
    parser.add_argument("--photos", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: tmp)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--skip-volume", action="store_true")
    parser.add_argument("--skip-photos", action="store_true")
    parser.add_argument(
        "--cli", action="store_true", help="photos through `imgops gray` processes as well"
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="imgops-dask-bench-", dir=args.work))
    report: dict = {"cpus": os.cpu_count(), "load_avg_start": os.getloadavg()}
    try:
        if not args.skip_volume:
            src = work / "scan.zarr"
            shape = make_volume(src, args.volume_mb, args.chunk_slices)
            _log(f"volume {shape} made")
            singles = []
            for _ in range(args.repeats):
                shutil.rmtree(work / "single.ome.zarr", ignore_errors=True)
                singles.append(single_process_volume(src, work / "single.ome.zarr"))
            shutil.rmtree(work / "single.ome.zarr", ignore_errors=True)
            single_s = statistics.median(singles)
            _log(f"single process: {singles}")
            spread = distributed_volume(src, work / "out.ome.zarr", args.workers, args.repeats)
            report["volume"] = {
                "shape": shape,
                "input_MiB": int(np.prod(shape)) * 2 / 2**20,
                "chunk_slices": args.chunk_slices,
                "single_process_seconds": singles,
                "dask": spread,
                "ratio": spread["median_seconds"] / single_s,
            }
            _log(f"dask: {spread['median_seconds']:.2f} s")
            report["scaling_model"] = scaling_model(spread, shape, args.chunk_slices, single_s)
            shutil.rmtree(work / "out.ome.zarr", ignore_errors=True)
        if not args.skip_photos:
            report["photos"] = photo_batch(work / "photos", args.photos, args.workers, args.repeats)
            _log(f"photos (engine): {report['photos']['ratio']:.2f}x")
        if args.cli and not args.skip_photos:
            report["photos_cli"] = photo_cli(
                work / "photos_cli", args.photos, args.workers, args.repeats
            )
    finally:
        report["load_avg_end"] = os.getloadavg()
        shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text)


if __name__ == "__main__":
    main()
