"""What the CPU side of `imgops gray` can do on this host, piece by piece (issue 10).

For a folder of JPEGs (e.g. the issue-10 photo batch), each measured alone, with 1..N threads:
  decode   OpenCV imread (colour) per file          (cv2 releases the GIL)
  deflate  imgops' PNG encoder on the gray images   (releases the GIL)
  write    ~200 KB files into a fresh folder: plain, + fsync of the file, + fsync of the folder,
           and the group variants (the folder fsynced once per group of files)
Per-thread milliseconds per file and files/s for each thread count: how the work scales with
threads shows whether the cores are real, shared (SMT) or contended.

    python scripts/host_profile.py DIR [--files 64] [--threads 1,2,4,8,16] [--json OUT]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))


def scaling(work: list, step, threads: list[int], rounds: int) -> list[dict]:
    """Runs step(x) over `work` rounds x per thread count; per-call ms and files/s."""
    rows = []
    for count in threads:
        calls: list[float] = []

        def timed(x, calls: list[float] = calls) -> None:
            t = time.perf_counter()
            step(x)
            calls.append(time.perf_counter() - t)

        items = work * rounds
        with ThreadPoolExecutor(count) as pool:
            list(pool.map(timed, work[: 2 * count]))  # warm the threads and caches
            calls.clear()
            start = time.perf_counter()
            list(pool.map(timed, items))
            wall = time.perf_counter() - start
        rows.append(
            {
                "threads": count,
                "files": len(items),
                "ms_per_file_thread": round(1000 * statistics.median(calls), 2),
                "files_per_s": round(len(items) / wall, 1),
            }
        )
    return rows


def write_variants(payload: bytes, count: int, threads: int, root: Path) -> dict:
    """files/s writing `count` files of `payload` with `threads` threads, four ways."""
    out = {}

    def plain(folder: Path, i: int, sync_file: bool, sync_dir: bool) -> None:
        temp, target = folder / f".t{i}", folder / f"{i}.png"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, payload)
            if sync_file:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.link(temp, target)
        os.unlink(temp)
        if sync_dir:
            dfd = os.open(folder, os.O_RDONLY)
            os.fsync(dfd)
            os.close(dfd)

    for name, sync_file, sync_dir in (
        ("no fsync", False, False),
        ("fsync file", True, False),
        ("fsync file + folder (today)", True, True),
    ):
        folder = Path(tempfile.mkdtemp(dir=root))
        start = time.perf_counter()
        write = functools.partial(plain, folder, sync_file=sync_file, sync_dir=sync_dir)
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(write, range(count)))
        out[name] = round(count / (time.perf_counter() - start), 1)
        shutil.rmtree(folder)
    # the folder fsynced once per 64 files (group commit)
    folder = Path(tempfile.mkdtemp(dir=root))
    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        for base in range(0, count, 64):
            group = range(base, min(count, base + 64))
            list(pool.map(functools.partial(plain, folder, sync_file=True, sync_dir=False), group))
            dfd = os.open(folder, os.O_RDONLY)
            os.fsync(dfd)
            os.close(dfd)
    out["fsync file, folder once per 64"] = round(count / (time.perf_counter() - start), 1)
    shutil.rmtree(folder)
    return out


def main() -> None:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--files", type=int, default=64)
    parser.add_argument("--threads", default="1,2,4,8,12,16")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    from imgops.io import png

    paths = sorted(args.folder.glob("*.jpg"))[: args.files]
    data = [p.read_bytes() for p in paths]
    grays = [
        cv2.cvtColor(cv2.imdecode(np.frombuffer(d, np.uint8), cv2.IMREAD_COLOR), cv2.COLOR_BGR2GRAY)
        for d in data
    ]
    cv2.setNumThreads(1)
    report: dict = {"cpus": os.cpu_count(), "affinity": len(os.sched_getaffinity(0))}
    report["png_backends"] = png.backend_info()
    print(f"{len(paths)} files; cpus {report['cpus']}, affinity {report['affinity']}", flush=True)

    def decode(d: bytes) -> None:
        cv2.imdecode(np.frombuffer(d, np.uint8), cv2.IMREAD_COLOR)

    def deflate(g: np.ndarray) -> None:
        png.encode_png(g, level=png.DEFAULT_LEVEL)

    encoded = [png.encode_png(g) for g in grays]
    report["mean_png_bytes"] = int(statistics.mean(len(e) for e in encoded))
    for name, step, work in (("decode", decode, data), ("deflate", deflate, grays)):
        report[name] = scaling(work, step, threads, args.rounds)
        for row in report[name]:
            print(f"{name:8s} {row}", flush=True)
    root = Path(tempfile.mkdtemp(prefix="imgops-write-", dir=os.environ.get("WRITE_DIR", "/tmp")))
    payload = encoded[0]
    for count in sorted({1, max(threads)}):
        report[f"write_{count}_threads"] = write_variants(payload, 400, count, root)
        print(f"write, {count} threads, {len(payload)} B files:", report[f"write_{count}_threads"])
    shutil.rmtree(root, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
