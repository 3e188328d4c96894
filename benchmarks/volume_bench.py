"""Benchmark `imgops normvol` on a large synthetic uint16 stack built from the real sample scans.

The stack is made of the three MRI sample volumes (samples/mri_*.tif), every slice resized
(bilinear) to --side x --side and repeated through Z until the stack reaches --size-gb; it is
written page by page, so building it needs little memory. Then, in the same run, each measured
in its own subprocess (peak RSS from os.wait4, so each process is measured alone):

- read floor:  reading the whole input with tifffile alone (chunks of pages, nothing else done);
- write floor: writing the same number of output bytes alone (plain writes, then fsync, as
               normvol's atomic output does);
- normvol:     `imgops normvol` with --max 4095 (one pass) and, with --modes, the default data max
               or --percentile (a first pass reads the input once more).

Goal of issue 5: normvol peak RSS < 1 GB and wall <= 1.2 x max(read floor, write floor).
The page cache is not dropped: the input is warm for every reader alike. The table's "-start"
column is (wall - startup) / floor: the stream alone, without the fixed cost of starting python,
torch and the extension (measured on a tiny stack).

Goals of issue 12 (`--goals zarr,channels`, measured in the same run):

- zarr:     `normvol stack.tif -o out.ome.zarr --max 4095` (zstd level 1, the default pyramid)
            against writing the same level-0 bytes (same chunks, same codec) with zarr alone
            from blocks already in memory: wall <= 1.3x, peak RSS < 1 GB;
- channels: `normvol --percentile 1 99.8` of a 2-channel ZCYX hyperstack against the
            single-channel stack of the same bytes: wall <= 1.2x.

    $ python benchmarks/volume_bench.py --size-gb 3 --workdir /tmp/imgops-bench
    $ python benchmarks/volume_bench.py --size-gb 16 --device cuda --json
    $ python benchmarks/volume_bench.py --size-gb 1 --goals zarr,channels --modes ''
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
GOAL_RSS_BYTES = 2**30
GOAL_WALL_RATIO = 1.2

_READ_FLOOR = """
import sys, tifffile
with tifffile.TiffFile(sys.argv[1]) as tif:
    n = len(tif.series[0].pages)
    for start in range(0, n, 32):
        tif.asarray(key=range(start, min(start + 32, n)))
"""

_WRITE_FLOOR = """
import os, sys
import numpy as np
path, total = sys.argv[1], int(sys.argv[2])
block = np.random.default_rng(0).random((64 << 20) // 8).tobytes()
with open(path, "wb") as f:
    done = 0
    while done < total:
        done += f.write(block[: min(len(block), total - done)])
    f.flush()
    os.fsync(f.fileno())
"""


_ZARR_FLOOR = """
import sys
import numpy as np, tifffile, zarr
from zarr.codecs import ZstdCodec
src, dst, cz, period = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
with tifffile.TiffFile(src) as tif:
    n = len(tif.pages)
    y, x = tif.pages[0].shape
    distinct = tif.asarray(key=range(min(period, n))).astype(np.float32) / np.float32(4095)
array = zarr.create_array(
    dst, shape=(n, y, x), chunks=(cz, min(y, 512), min(x, 512)), dtype="float32",
    compressors=[ZstdCodec(level=1)], fill_value=0, zarr_format=3,
)
for z0 in range(0, n, cz):
    array[z0 : min(z0 + cz, n)] = distinct[[z % period for z in range(z0, min(z0 + cz, n))]]
"""

_HYPERSTACK = """
import sys
import tifffile
src, dst = sys.argv[1], sys.argv[2]
with tifffile.TiffFile(src) as tif:
    n = len(tif.pages) // 2 * 2
    shape = (n // 2, 2, *tif.pages[0].shape)
    pages = (tif.pages[i].asarray() for i in range(n))
    with tifffile.TiffWriter(dst, bigtiff=True) as writer:
        writer.write(pages, shape=shape, dtype="uint16", photometric="minisblack",
                     metadata={"axes": "ZCYX"})
"""


def slice_period() -> int:
    """How many distinct slices the synthetic stack repeats (the samples' slice count)."""
    import tifffile

    return sum(len(tifffile.TiffFile(p).pages) for p in sorted(SAMPLES.glob("mri_*.tif")))


def imgops_command(*args: object) -> list[str]:
    """`python -m imgops.cli ARGS` (quiet, overwriting)."""
    return [sys.executable, "-m", "imgops.cli", *map(str, args), "--overwrite", "-q"]


def run_goals(args: argparse.Namespace, source: Path, results: dict) -> None:
    """The issue-12 goals on the built stack (see the module docstring)."""
    workdir = Path(args.workdir)
    if "zarr" in args.goals:
        store, floor = workdir / "out.ome.zarr", workdir / "floor.zarr"
        results["zarr_floor"] = measure(
            [sys.executable, "-c", _ZARR_FLOOR, str(source), str(floor), "4", str(slice_period())]
        )
        shutil.rmtree(floor, ignore_errors=True)
        entry = results["normvol_ome_zarr"] = measure(
            imgops_command("normvol", source, "-o", store, "--max", 4095, "--device", args.device)
        )
        shutil.rmtree(store, ignore_errors=True)
        entry["wall_over_floor"] = entry["wall_s"] / results["zarr_floor"]["wall_s"]
        entry["goal_met"] = entry["wall_over_floor"] <= 1.3 and entry["peak_rss_bytes"] < 2**30
    if "channels" in args.goals:
        hyper = workdir / "hyper.tif"
        subprocess.run([sys.executable, "-c", _HYPERSTACK, str(source), str(hyper)], check=True)
        out = workdir / "pc.tif"
        common = ("--percentile", 1, 99.8, "--device", args.device, "-o", out)
        one = results["percentile_1ch"] = measure(imgops_command("normvol", source, *common))
        two = results["percentile_2ch"] = measure(imgops_command("normvol", hyper, *common))
        two["wall_over_1ch"] = two["wall_s"] / one["wall_s"]
        two["goal_met"] = two["wall_over_1ch"] <= 1.2
        for path in (hyper, out):
            path.unlink(missing_ok=True)


def print_goals(results: dict) -> None:
    """The issue-12 goal lines."""
    mb = 2**20
    if "normvol_ome_zarr" in results:
        floor, entry = results["zarr_floor"], results["normvol_ome_zarr"]
        print(
            f"OME-Zarr + pyramid {entry['wall_s']:.2f} s vs zarr level-0 alone "
            f"{floor['wall_s']:.2f} s: {entry['wall_over_floor']:.2f}x (goal <= 1.3), peak RSS "
            f"{entry['peak_rss_bytes'] / mb:.0f} MB: {'met' if entry['goal_met'] else 'NOT met'}"
        )
    if "percentile_2ch" in results:
        one, two = results["percentile_1ch"], results["percentile_2ch"]
        print(
            f"--percentile 2 channels {two['wall_s']:.2f} s vs 1 channel {one['wall_s']:.2f} s: "
            f"{two['wall_over_1ch']:.2f}x (goal <= 1.2): {'met' if two['goal_met'] else 'NOT met'}"
        )


def build_stack(path: Path, size_gb: float, side: int) -> tuple[int, int]:
    """Writes the synthetic stack page by page; returns (depth, bytes)."""
    import numpy as np
    import tifffile
    import torch

    slices = []
    for sample in sorted(SAMPLES.glob("mri_*.tif")):
        volume = torch.from_numpy(tifffile.imread(sample).astype(np.float32))
        resized = torch.nn.functional.interpolate(
            volume[:, None], size=(side, side), mode="bilinear", align_corners=False
        )[:, 0]
        slices.extend(resized.round().clamp(0, 65535).to(torch.int32).numpy().astype(np.uint16))
    depth = max(1, int(size_gb * 1e9) // (side * side * 2))

    def pages():
        for z in range(depth):
            yield slices[z % len(slices)]

    nbytes = depth * side * side * 2
    with tifffile.TiffWriter(path, bigtiff=nbytes > 2**32 - 2**25) as writer:
        writer.write(
            pages(),
            shape=(depth, side, side),
            dtype="uint16",
            photometric="minisblack",
            metadata={"axes": "ZYX"},
        )
    return depth, nbytes


def measure(command: list[str]) -> dict[str, float]:
    """Runs `command`; returns wall seconds and that process's peak RSS (bytes)."""
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    stderr = process.stderr.read().decode(errors="replace") if process.stderr else ""
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({process.returncode}): {stderr[-2000:]}")
    return {"wall_s": wall, "peak_rss_bytes": usage.ru_maxrss * 1024}


def normvol_command(
    source: Path, target: Path, mode: str, device: str, chunk_mb: float
) -> list[str]:
    """The normvol command line for one mode: fixed (--max 4095), data (default) or percentile."""
    extra = {"fixed": ["--max", "4095"], "data": [], "percentile": ["--percentile", "1", "99.8"]}
    return [
        sys.executable,
        "-m",
        "imgops.cli",
        "normvol",
        str(source),
        "-o",
        str(target),
        "--device",
        device,
        "--chunk-mb",
        str(chunk_mb),
        "--dtype",
        "float32",
        "--overwrite",
        "-q",
        *extra[mode],
    ]


def run(args: argparse.Namespace) -> dict:
    """Builds the stack, measures the floors and normvol; returns the results."""
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(workdir).free
    # the input, and then either the write floor's file or the float32 output (never both)
    need = args.size_gb * 1e9 * 3.2
    if free < need:
        raise SystemExit(
            f"{workdir}: {free / 1e9:.1f} GB free, this run needs about {need / 1e9:.0f} GB"
        )
    source, target, scratch = (
        workdir / "stack.tif",
        workdir / "stack_norm.tif",
        workdir / "floor.bin",
    )
    results: dict = {"size_gb": args.size_gb, "device": args.device, "chunk_mb": args.chunk_mb}
    try:
        started = time.perf_counter()
        # Built in a child process: the parent stays small, because Linux carries a parent's
        # peak RSS into the rusage of every child it forks afterwards.
        built = subprocess.run(
            [sys.executable, __file__, "--build", str(source), str(args.size_gb), str(args.side)],
            check=True,
            capture_output=True,
            text=True,
        )
        depth, nbytes = (int(v) for v in built.stdout.split())
        results.update(
            depth=depth,
            side=args.side,
            input_bytes=nbytes,
            output_bytes=nbytes * 2,
            build_s=time.perf_counter() - started,
        )
        results["read_floor"] = measure([sys.executable, "-c", _READ_FLOOR, str(source)])
        results["write_floor"] = measure(
            [sys.executable, "-c", _WRITE_FLOOR, str(scratch), str(nbytes * 2)]
        )
        scratch.unlink()
        tiny = workdir / "tiny.tif"
        shutil.copy(SAMPLES / "mri_dwi_b0_u16.tif", tiny)
        results["startup"] = measure(
            normvol_command(tiny, workdir / "tiny_norm.tif", "fixed", args.device, args.chunk_mb)
        )
        for mode in args.modes:
            results[f"normvol_{mode}"] = measure(
                normvol_command(source, target, mode, args.device, args.chunk_mb)
            )
            target.unlink()
        run_goals(args, source, results)
    finally:
        if not args.keep:
            for path in (source, target, scratch, workdir / "tiny.tif", workdir / "tiny_norm.tif"):
                path.unlink(missing_ok=True)
    floor = max(results["read_floor"]["wall_s"], results["write_floor"]["wall_s"])
    results["floor_s"] = floor
    for mode in args.modes:
        entry = results[f"normvol_{mode}"]
        entry["wall_over_floor"] = entry["wall_s"] / floor
        # What the stream itself costs: the wall less the fixed start (python, torch, extension).
        entry["stream_over_floor"] = (entry["wall_s"] - results["startup"]["wall_s"]) / floor
        entry["goal_met"] = (
            entry["peak_rss_bytes"] < GOAL_RSS_BYTES and entry["wall_over_floor"] <= GOAL_WALL_RATIO
        )
    return results


def print_table(results: dict, modes: list[str]) -> None:
    """A human-readable table of the results."""
    gb = 1e9
    side, depth = results["side"], results["depth"]
    print(
        f"stack {depth} x {side} x {side} uint16 = {results['input_bytes'] / gb:.2f} GB in, "
        f"{results['output_bytes'] / gb:.2f} GB float32 out, device {results['device']}, "
        f"--chunk-mb {results['chunk_mb']:g}"
    )
    print(
        f"{'run':<22}{'wall s':>9}{'GB/s in':>9}{'peak RSS MB':>13}{'x floor':>9}"
        f"{'-start':>8}  goal"
    )
    rows = [
        ("read floor (tifffile)", results["read_floor"]),
        ("write floor (+fsync)", results["write_floor"]),
    ]
    rows.append(("startup (tiny stack)", results["startup"]))
    rows += [(f"normvol {mode}", results[f"normvol_{mode}"]) for mode in modes]
    for name, entry in rows:
        ratio = entry.get("wall_over_floor")
        goal = "" if "goal_met" not in entry else ("met" if entry["goal_met"] else "NOT met")
        rate = results["input_bytes"] / gb / entry["wall_s"]
        ratio_text = "" if ratio is None else f"{ratio:.2f}"
        stream = entry.get("stream_over_floor")
        stream_text = "" if stream is None else f"{stream:.2f}"
        print(
            f"{name:<22}{entry['wall_s']:>9.2f}{rate:>9.2f}"
            f"{entry['peak_rss_bytes'] / 2**20:>13.0f}{ratio_text:>9}{stream_text:>8}  {goal}"
        )


def main() -> None:
    """Command line: see the module docstring."""
    if len(sys.argv) == 5 and sys.argv[1] == "--build":
        depth, nbytes = build_stack(Path(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]))
        print(depth, nbytes)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--size-gb", type=float, default=3.0, help="input stack size (GB, 1e9 bytes)"
    )
    parser.add_argument("--side", type=int, default=1024, help="slice width and height")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--chunk-mb", type=float, default=256)
    parser.add_argument(
        "--modes", default="fixed", help="comma list of fixed, data, percentile (default fixed)"
    )
    parser.add_argument(
        "--goals", default="", help="comma list of zarr, channels (issue 12's goals)"
    )
    parser.add_argument("--workdir", default="/tmp/imgops-volume-bench")
    parser.add_argument("--keep", action="store_true", help="keep the files (default: delete)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    args.goals = [g.strip() for g in args.goals.split(",") if g.strip()]
    results = run(args)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print_table(results, args.modes)
        print_goals(results)


if __name__ == "__main__":
    main()
