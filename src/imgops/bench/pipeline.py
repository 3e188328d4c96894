"""Batch timings: `imgops gray` on each device against an OpenCV process pool and two floors.

Every tool runs as its own process, from start-up to exit (imgops pays its imports and, on
CUDA, torch and CUDA start-up, as users do), into an empty output folder. Runs alternate
between tools, the inputs are read once first so every tool sees a warm page cache, and the
median wall time over the repetitions is reported, with the output bytes.

The floors bound what any tool could reach: OpenCV's decode alone over the same process pool,
and nvImageCodec's batched GPU decode alone (steady state, its start-up excluded: the GPU
decode floor). Outputs are checked: every input gave an output, and a few decoded outputs
agree with imgops' CPU run within 1 (JPEG outputs: mean difference).

Run as a module for the GPU decode floor alone, or the decode differences (luma of the GPU
decode against the luma of OpenCV's decode, per file):
    python -m imgops.bench.pipeline nvdecode LIST [--batch 64]
    python -m imgops.bench.pipeline decodediff LIST
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..serve import SERVER_VARIABLE

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".tif", ".tiff", ".bmp", ".webp"}
PEER_SCRIPT = Path(__file__).with_name("opencv_pool.py")
_CHECK_FILES = 5  # outputs compared between tools per run
CPU_REFERENCE = "imgops gray cpu"


def image_files(folder: Path) -> list[Path]:
    """The image files directly in `folder`, sorted by name."""
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


def _gray_help() -> str:
    return subprocess.run(
        [sys.executable, "-m", "imgops.cli", "gray", "--help"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout


def cuda_present() -> bool:
    """A GPU the CUDA driver sees (no torch import)."""
    from ..engine.device import cuda_device_count

    return cuda_device_count() > 0


def _tools(
    listing: Path,
    out: Path,
    devices: list[str],
    *,
    png_level: int | None,
    jpg: bool,
    stats: Path | None,
    nvdecode: bool,
    batch: int,
    durable: bool = True,
    server: Path | None = None,
) -> dict[str, dict[str, Any]]:
    """name -> {"command", "out" (None: writes nothing), "fmt", "floor", "env" (set for the
    command)} for one run; `server`: also each imgops gray relayed to the server there."""
    jobs = str(os.cpu_count() or 1)
    help_text = _gray_help()
    peer = [sys.executable, str(PEER_SCRIPT), "--files-from", str(listing), "--jobs", jobs, "-d"]
    tools: dict[str, dict[str, Any]] = {}
    formats = ["png", "jpg"] if jpg else ["png"]

    def gray(device: str, fmt: str, folder: Path, *extra: str) -> list[str]:
        command = [sys.executable, "-m", "imgops.cli", "gray", "--files-from", str(listing)]
        command += ["-d", str(folder), "--device", device, "-q", *extra]
        if fmt == "jpg":
            command += ["-f", "jpg"]
        if png_level is not None and fmt == "png":
            command += ["--png-level", str(png_level)]
        if not durable:  # like the pool, which never flushes its files to disk
            command += ["--no-fsync"]
        if stats is not None and "--stats-json" in help_text:
            command += ["--stats-json", str(stats.with_name(folder.name + ".json"))]
        return command

    for fmt in formats:
        for device in devices:
            name = f"imgops gray {device}" + ("" if fmt == "png" else " jpg")
            folder = out / name.replace(" ", "-")
            tools[name] = {"command": gray(device, fmt, folder), "out": folder, "fmt": fmt}
            if server is not None:  # the same command, relayed to a warm `imgops serve`
                folder = out / (name.replace(" ", "-") + "-warm-server")
                tools[f"{name}, warm server"] = {
                    "command": gray(device, fmt, folder),
                    "out": folder,
                    "fmt": fmt,
                    "env": {SERVER_VARIABLE: str(server)},
                }
        if fmt == "png" and "cpu" in devices and "--luma" in help_text:
            name = f"{CPU_REFERENCE} --luma stored"  # JPEGs' own luma planes (compared below)
            folder = out / "imgops-gray-cpu-luma-stored"
            tools[name] = {
                "command": gray("cpu", fmt, folder, "--luma", "stored"),
                "out": folder,
                "fmt": fmt,
            }
        name = f"opencv pool ({jobs} processes)" + ("" if fmt == "png" else " jpg")
        folder = out / f"opencv-pool-{fmt}"
        tools[name] = {
            "command": [*peer, str(folder), "--format", fmt],
            "out": folder,
            "fmt": fmt,
        }
    tools[f"floor: opencv decode ({jobs} processes)"] = {
        "command": [*peer, str(out / "decode-only"), "--decode-only"],
        "out": None,
        "fmt": None,
        "floor": True,
    }
    if nvdecode:
        tools[f"floor: nvImageCodec GPU decode (batch {batch})"] = {
            "command": [sys.executable, "-m", "imgops.bench.pipeline", "nvdecode", str(listing)]
            + ["--batch", str(batch)],
            "out": None,
            "fmt": None,
            "floor": True,
            "inner": True,  # reports its own steady-state seconds
        }
    return tools


def _output_bytes(folder: Path | None) -> tuple[int, int]:
    if folder is None or not folder.exists():
        return 0, 0
    files = [p for p in folder.rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


def _compare(ours: Path, theirs: Path, names: list[str]) -> str:
    """Decodes a few outputs of two tools: 'max diff N, mean M over K files'."""
    import cv2
    import numpy as np

    worst, total, compared = 0, 0.0, 0
    for name in names[:_CHECK_FILES]:
        a = cv2.imread(str(ours / name), cv2.IMREAD_UNCHANGED)
        b = cv2.imread(str(theirs / name), cv2.IMREAD_UNCHANGED)
        if a is None or b is None or a.shape != b.shape:
            return f"MISMATCH in {name}"
        diff = np.abs(a.astype(np.int64) - b.astype(np.int64))
        worst, total, compared = (
            max(worst, int(diff.max())),
            total + float(diff.mean()),
            compared + 1,
        )
    return f"max diff {worst}, mean {total / max(1, compared):.4f} over {compared} files"


def run_pipeline(
    folder: Path,
    *,
    reps: int = 3,
    device: str = "all",
    png_level: int | None = None,
    jpg: bool = False,
    nvdecode: bool | None = None,
    batch: int = 64,
    work_dir: Path | None = None,
    durable: bool = True,
    server: bool = False,
) -> dict[str, Any]:
    """Times imgops gray (cpu, and cuda when present), the OpenCV pool and the decode floors.

    `durable` False passes --no-fsync to imgops gray (the pool never flushes to disk).
    `server`: also each imgops gray relayed to an `imgops serve` started for the run (keeping
    GPU 0 warm where present), after one untimed run each: the files/s of a process that
    stays up, the start-up paid before.

    `device`: "all" (cpu, and cuda where a GPU is visible), or one `--device` value.
    `jpg`: also time JPEG output (imgops `-f jpg` against the pool writing JPEGs).
    `nvdecode`: time the nvImageCodec decode floor (default: where a GPU is visible).
    """
    files = image_files(folder)
    if not files:
        raise ValueError(f"{folder}: no image files ({', '.join(sorted(IMAGE_SUFFIXES))})")
    gpu = cuda_present()
    devices = (["cpu", "cuda"] if gpu else ["cpu"]) if device == "all" else [device]
    nvdecode = gpu if nvdecode is None else nvdecode
    root = Path(tempfile.mkdtemp(prefix="imgops-bench-", dir=work_dir))
    try:
        listing = root / "inputs.txt"
        listing.write_text("".join(f"{p.resolve()}\n" for p in files), encoding="utf-8")
        input_bytes = sum(len(p.read_bytes()) for p in files)  # also warms the page cache
        socket_path = root / "s.sock" if server else None
        tools = _tools(
            listing, root / "out", devices, png_level=png_level, jpg=jpg,
            stats=root / "stats" / "x.json", nvdecode=nvdecode, batch=batch, durable=durable,
            server=socket_path,
        )  # fmt: skip
        (root / "stats").mkdir()
        walls: dict[str, list[float]] = {tool: [] for tool in tools}
        runs: dict[str, dict[str, Any]] = {tool: {"tool": tool} for tool in tools}
        with _served(socket_path, "cuda" if "cuda" in devices else "cpu") as warm_up:
            for spec in tools.values():
                if "env" in spec:  # one untimed run: the server's first batch pins its buffers
                    warm_up(spec)
            for _ in range(reps):
                for tool, spec in tools.items():
                    _run_once(tool, spec, runs[tool], walls[tool], len(files), root / "stats")
        _finish(runs, walls, tools, files)
        return {
            "input_dir": str(folder),
            "files": len(files),
            "input_bytes": input_bytes,
            "cpu_count": os.cpu_count(),
            "reps": reps,
            "png_level": png_level,
            "fsync": durable,
            "runs": list(runs.values()),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def _served(socket_path: Path | None, device: str) -> Iterator[Callable[[dict[str, Any]], None]]:
    """An `imgops serve` on `socket_path` (keeping `device` warm) for the block, stopped after
    it; yields warm_up(spec), which runs a tool once untimed. Nothing where socket_path is None.
    """
    if socket_path is None:
        yield lambda spec: None
        return
    env = {k: v for k, v in os.environ.items() if k != SERVER_VARIABLE}
    serve = [sys.executable, "-m", "imgops.cli", "serve", "--socket", str(socket_path)]
    started = subprocess.run([*serve, "--device", device, "--idle-timeout", "0", "--detach"],
                             capture_output=True, text=True, env=env, check=False)  # fmt: skip
    if started.returncode != 0:
        lines = started.stderr.strip().splitlines() or ["no message"]
        raise RuntimeError(f"imgops serve did not start: {lines[-1]}")
    try:

        def warm_up(spec: dict[str, Any]) -> None:
            if spec["out"] is not None:
                shutil.rmtree(spec["out"], ignore_errors=True)
            subprocess.run(spec["command"], capture_output=True, check=False,
                           env=dict(os.environ, **spec["env"]))  # fmt: skip

        yield warm_up
    finally:
        subprocess.run([*serve, "--stop"], capture_output=True, env=env, check=False)


def _run_once(
    tool: str, spec: dict[str, Any], run: dict[str, Any], walls: list[float], count: int,
    stats_dir: Path,
) -> None:  # fmt: skip
    out = spec["out"]
    if out is not None:
        shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ, **spec["env"]) if "env" in spec else None
    started = time.perf_counter()
    done = subprocess.run(spec["command"], capture_output=True, text=True, check=False, env=env)
    wall = time.perf_counter() - started
    written, size = _output_bytes(out)
    run.update(outputs=written, output_bytes=size if out is not None else None)
    run["returncode"] = done.returncode
    problem = done.returncode != 0 or (out is not None and written != count)
    if spec.get("inner") and not problem:
        try:
            inner = json.loads(done.stdout.strip().splitlines()[-1])
            wall = inner["seconds"]
            run["note"] = f"{inner['decoded']}/{count} decoded on the GPU; start-up excluded"
        except (ValueError, KeyError, IndexError):
            problem = True
    if problem:
        message = (done.stderr.strip().splitlines() or ["no message"])[-1]
        run["error"] = f"exit {done.returncode}, {written}/{count} outputs: {message}"
    walls.append(wall)
    if out is not None:
        stats = stats_dir / (out.name + ".json")
        if stats.exists():
            run["stages"] = _stage_shares(json.loads(stats.read_text()))
            run["decoders"] = json.loads(stats.read_text()).get("decoders")


def _finish(
    runs: dict[str, dict[str, Any]],
    walls: dict[str, list[float]],
    tools: dict[str, dict[str, Any]],
    files: list[Path],
) -> None:
    """Medians, files/s, ratios to the OpenCV pool, and the output checks."""
    for tool, run in runs.items():
        run["wall_s"] = statistics.median(walls[tool])
        run["files_per_s"] = len(files) / run["wall_s"] if run["wall_s"] else None
        if run.get("error"):
            run["wall_s"] = run["files_per_s"] = run["output_bytes"] = None
    reference = runs.get(CPU_REFERENCE)
    for tool, run in runs.items():
        spec = tools[tool]
        if spec["out"] is None or run.get("error") or tool == CPU_REFERENCE:
            continue
        if reference is None or reference.get("error"):
            continue
        names = [p.stem + "." + spec["fmt"] for p in files]
        if spec["fmt"] == "jpg":
            ref_dir = tools.get(f"{CPU_REFERENCE} jpg", {}).get("out")
            if ref_dir is None or tool == f"{CPU_REFERENCE} jpg":
                continue
        else:
            ref_dir = tools[CPU_REFERENCE]["out"]
        run["check"] = _compare(ref_dir, spec["out"], names)
    pools = [r for t, r in runs.items() if t.startswith("opencv pool") and "jpg" not in t]
    pool_rate = pools[0]["files_per_s"] if pools else None
    jpg_pools = [r for t, r in runs.items() if t.startswith("opencv pool") and "jpg" in t]
    jpg_rate = jpg_pools[0]["files_per_s"] if jpg_pools else None
    for tool, run in runs.items():
        base = jpg_rate if tool.endswith("jpg") else pool_rate
        rate = run["files_per_s"]
        run["vs_pool"] = rate / base if rate and base else None


def _stage_shares(stats: dict[str, Any]) -> dict[str, float]:
    """Share of each stage in the summed stage seconds, from imgops gray's --stats-json."""
    seconds = stats.get("stage_seconds", stats)
    numbers = {k: v for k, v in seconds.items() if isinstance(v, (int, float)) and v > 0}
    total = sum(numbers.values())
    return {k: v / total for k, v in numbers.items()} if total else {}


def run_crossover(
    folder: Path, *, counts: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 800), reps: int = 3,
    work_dir: Path | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Wall time of `imgops gray` on cpu and cuda for the first N files, for each N.

    The crossover (for imgops.engine.device.CUDA_MIN_FILES) is the smallest N from which
    CUDA finishes first at every larger N measured.
    """
    files = image_files(folder)
    if not files:
        raise ValueError(f"{folder}: no image files")
    root = Path(tempfile.mkdtemp(prefix="imgops-crossover-", dir=work_dir))
    rows = []
    try:
        for count in [n for n in counts if n <= len(files)]:
            listing = root / f"inputs-{count}.txt"
            listing.write_text("".join(f"{p.resolve()}\n" for p in files[:count]))
            row: dict[str, Any] = {"files": count}
            for device in ("cpu", "cuda"):
                out = root / device
                times = []
                for _ in range(reps):
                    shutil.rmtree(out, ignore_errors=True)
                    command = [sys.executable, "-m", "imgops.cli", "gray", "--files-from"]
                    command += [str(listing), "-d", str(out), "--device", device, "-q"]
                    started = time.perf_counter()
                    done = subprocess.run(command, capture_output=True, check=False)
                    times.append(time.perf_counter() - started)
                    if done.returncode != 0:
                        row[f"{device}_error"] = done.stderr.decode(errors="replace")[-300:]
                row[f"{device}_s"] = statistics.median(times)
            rows.append(row)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    crossover = None
    for index, row in enumerate(rows):
        if all(r["cuda_s"] < r["cpu_s"] for r in rows[index:]):
            crossover = row["files"]
            break
    return {"input_dir": str(folder), "reps": reps, "rows": rows, "crossover_files": crossover}


def nvdecode_floor(paths: list[str], batch: int) -> dict[str, Any]:
    """Seconds nvImageCodec takes to decode the files on the GPU, `batch` at a time.

    The encoded bytes are read first; decoder creation and one warm-up batch are excluded.
    """
    from ..io.gpu_decode import BatchDecoder

    data = [Path(p).read_bytes() for p in paths]
    decoder = BatchDecoder(0)
    limit = 1 << 30
    candidates = [decoder.accept(d, limit) for d in data]
    accepted = [c for c in candidates if c is not None]
    import torch

    stream = torch.cuda.Stream()
    decoder.decode(accepted[:batch], stream.cuda_stream)  # warm-up
    torch.cuda.synchronize()
    decoded = 0
    started = time.perf_counter()
    for start in range(0, len(accepted), batch):
        images = decoder.decode(accepted[start : start + batch], stream.cuda_stream)
        decoded += sum(image is not None for image in images)
        stream.synchronize()
        del images
    seconds = time.perf_counter() - started
    return {"files": len(paths), "decoded": decoded, "seconds": seconds}


def decode_differences(paths: list[str]) -> dict[str, Any]:
    """Luma of nvImageCodec's GPU decode against the luma of OpenCV's decode, per file.

    Both lumas are the exact BT.601 formula of the decoded pixels; returns the max and mean
    absolute difference per file and over all, and the RGB max difference.
    """
    import numpy as np

    from ..engine.ops import gray_numpy
    from ..io.gpu_decode import BatchDecoder, as_tensor
    from ..io.images import decode_image

    decoder = BatchDecoder(0)
    rows, worst_luma, worst_rgb, total, pixels = [], 0, 0, 0.0, 0
    for path in paths:
        data = Path(path).read_bytes()
        candidate = decoder.accept(data, 1 << 30)
        if candidate is None:
            rows.append({"file": path, "gpu": False})
            continue
        (image,) = decoder.decode([candidate])
        if image is None:
            rows.append({"file": path, "gpu": False})
            continue
        gpu = as_tensor(image).cpu().numpy()
        cpu = decode_image(data)
        if candidate.gray:
            gpu_luma, rgb_diff = gpu[..., 0], 0
        else:
            gpu_luma = gray_numpy(gpu, "rgb")
            rgb_diff = int(np.abs(gpu.astype(int) - cpu.pixels[..., ::-1].astype(int)).max())
        diff = np.abs(gpu_luma.astype(int) - gray_numpy(cpu.pixels, cpu.channel_order))
        rows.append(
            {"file": path, "gpu": True, "luma_max": int(diff.max()),
             "luma_mean": float(diff.mean()), "rgb_max": rgb_diff}
        )  # fmt: skip
        worst_luma, worst_rgb = max(worst_luma, int(diff.max())), max(worst_rgb, rgb_diff)
        total, pixels = total + float(diff.sum()), pixels + diff.size
    return {
        "files": len(paths),
        "compared": sum(1 for r in rows if r["gpu"]),
        "luma_max": worst_luma,
        "luma_mean": total / pixels if pixels else None,
        "rgb_max": worst_rgb,
        "per_file": rows,
    }


def _main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m imgops.bench.pipeline")
    sub = parser.add_subparsers(dest="what", required=True)
    floor = sub.add_parser("nvdecode", help="the nvImageCodec GPU decode floor")
    floor.add_argument("listing", type=Path)
    floor.add_argument("--batch", type=int, default=64)
    diff = sub.add_parser("decodediff", help="GPU decode vs OpenCV decode, luma differences")
    diff.add_argument("listing", type=Path)
    args = parser.parse_args(argv)
    paths = [line for line in args.listing.read_text().splitlines() if line.strip()]
    if args.what == "nvdecode":
        print(json.dumps(nvdecode_floor(paths, args.batch)))
    else:
        print(json.dumps(decode_differences(paths), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
