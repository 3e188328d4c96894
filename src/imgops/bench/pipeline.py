"""Batch timings: `imgops gray` (a subprocess) against the OpenCV peer script on the same files.

Each tool runs as its own process, from start-up to exit (so imgops pays its torch import, as users
do), into an empty output folder; runs alternate between tools, the inputs are read once first so
every tool sees a warm page cache, and the median wall time over the repetitions is reported.
Outputs are checked: every input gave an output, and the decoded gray images agree within 1.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".tif", ".tiff", ".bmp", ".webp"}
PEER_SCRIPT = Path(__file__).with_name("opencv_pool.py")
_CHECK_FILES = 5  # outputs compared between tools per run


def image_files(folder: Path) -> list[Path]:
    """The image files directly in `folder`, sorted by name."""
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


def _gray_supports(option: str) -> bool:
    help_text = subprocess.run(
        [sys.executable, "-m", "imgops.cli", "gray", "--help"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return option in help_text


def _commands(
    listing: Path, out: Path, device: str, png_level: int | None, stats: Path | None
) -> dict[str, list[str]]:
    jobs = str(os.cpu_count() or 1)
    peer = [sys.executable, str(PEER_SCRIPT), "--files-from", str(listing), "-d"]
    imgops = [sys.executable, "-m", "imgops.cli", "gray", "--files-from", str(listing)]
    imgops += ["-d", str(out / "imgops"), "--device", device, "-q"]
    if png_level is not None:
        imgops += ["--png-level", str(png_level)]
    if stats is not None:
        imgops += ["--stats-json", str(stats)]
    return {
        "imgops gray": imgops,
        f"opencv pool ({jobs} processes)": [*peer, str(out / "opencv-pool"), "--jobs", jobs],
        "opencv sequential": [*peer, str(out / "opencv-seq"), "--jobs", "1"],
    }


def _output_bytes(folder: Path) -> tuple[int, int]:
    files = [p for p in folder.rglob("*") if p.is_file()] if folder.exists() else []
    return len(files), sum(p.stat().st_size for p in files)


def _compare(ours: Path, theirs: Path, names: list[str]) -> str:
    """Decodes a few outputs of two tools; 'max diff N over K files' (N <= 1 expected)."""
    import cv2
    import numpy as np

    worst, compared = 0, 0
    for name in names[:_CHECK_FILES]:
        a = cv2.imread(str(ours / name), cv2.IMREAD_UNCHANGED)
        b = cv2.imread(str(theirs / name), cv2.IMREAD_UNCHANGED)
        if a is None or b is None or a.shape != b.shape:
            return f"MISMATCH in {name}"
        worst = max(worst, int(np.abs(a.astype(np.int64) - b.astype(np.int64)).max()))
        compared += 1
    return f"max diff {worst} over {compared} files"


def run_pipeline(
    folder: Path,
    *,
    reps: int = 3,
    device: str = "auto",
    png_level: int | None = None,
    work_dir: Path | None = None,
) -> dict[str, Any]:
    """Times imgops gray and the OpenCV peer (pool and sequential) on every image in `folder`."""
    files = image_files(folder)
    if not files:
        raise ValueError(f"{folder}: no image files ({', '.join(sorted(IMAGE_SUFFIXES))})")
    root = Path(tempfile.mkdtemp(prefix="imgops-bench-", dir=work_dir))
    try:
        listing = root / "inputs.txt"
        listing.write_text("".join(f"{p.resolve()}\n" for p in files), encoding="utf-8")
        input_bytes = sum(len(p.read_bytes()) for p in files)  # also warms the page cache
        stats_path = root / "stats.json" if _gray_supports("--stats-json") else None
        commands = _commands(listing, root / "out", device, png_level, stats_path)
        walls: dict[str, list[float]] = {tool: [] for tool in commands}
        runs: dict[str, dict[str, Any]] = {tool: {"tool": tool} for tool in commands}
        for _ in range(reps):
            for tool, command in commands.items():
                out = Path(command[command.index("-d") + 1])
                shutil.rmtree(out, ignore_errors=True)
                started = time.perf_counter()
                done = subprocess.run(command, capture_output=True, text=True, check=False)
                walls[tool].append(time.perf_counter() - started)
                count, size = _output_bytes(out)
                run = runs[tool]
                run.update(outputs=count, output_bytes=size, returncode=done.returncode)
                if done.returncode != 0 or count != len(files):
                    message = (done.stderr.strip().splitlines() or ["no message"])[-1]
                    run["error"] = (
                        f"exit {done.returncode}, {count}/{len(files)} outputs: {message}"
                    )
                if tool == "imgops gray" and stats_path is not None and stats_path.exists():
                    run["stages"] = _stage_shares(json.loads(stats_path.read_text()))
        names = [p.stem + ".png" for p in files]
        for tool, run in runs.items():
            run["wall_s"] = statistics.median(walls[tool])
            run["files_per_s"] = len(files) / run["wall_s"]
            if run.get("error"):
                run["wall_s"] = run["files_per_s"] = run["output_bytes"] = None
            elif tool != "imgops gray" and not runs["imgops gray"].get("error"):
                out = Path(commands[tool][commands[tool].index("-d") + 1])
                run["check"] = _compare(root / "out" / "imgops", out, names)
        base = runs["imgops gray"]["wall_s"]
        for run in runs.values():
            run["vs_imgops"] = run["wall_s"] / base if base and run["wall_s"] else None
        if "stages" not in runs["imgops gray"]:
            runs["imgops gray"]["stages_note"] = (
                "imgops gray does not expose stage timings (no --stats-json option)"
            )
        return {
            "input_dir": str(folder),
            "files": len(files),
            "input_bytes": input_bytes,
            "cpu_count": os.cpu_count(),
            "reps": reps,
            "png_level": png_level,
            "runs": list(runs.values()),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _stage_shares(stats: dict[str, Any]) -> dict[str, float]:
    """Share of each stage in the summed stage seconds, from imgops gray's --stats-json."""
    seconds = stats.get("stage_seconds", stats)
    total = sum(v for v in seconds.values() if isinstance(v, (int, float)))
    if not total:
        return {}
    return {k: v / total for k, v in seconds.items() if isinstance(v, (int, float))}
