"""Median process walls from `label|rc=N|milliseconds|files written|last stderr line` lines
(what scripts/gpu-check.d/ab.sh and capi.sh write), one row per label; runs that failed or
wrote another number of files than expected are listed, not counted. With --stats DIR, each
label's `<prefix>-<label>-*.json` (imgops gray --stats-json) adds the engine walls and the
files the GPU decoded.

    python scripts/walls_table.py WALLS.txt [--files 800] [--stats DIR --prefix capi]
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
from pathlib import Path


def main() -> None:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("walls", type=Path)
    parser.add_argument("--files", type=int, default=800)
    parser.add_argument("--stats", type=Path)
    parser.add_argument("--prefix", default="")
    args = parser.parse_args()
    walls: dict[str, list[float]] = collections.defaultdict(list)
    for line in args.walls.read_text().splitlines():
        label, rc, ms, files, _ = (line.split("|", 4) + [""] * 5)[:5]
        if rc == "rc=0" and files.strip() == str(args.files):
            walls[label].append(int(ms) / 1000)
        else:
            print("FAILED RUN:", line.strip())
    for label, values in walls.items():
        row = f"{label:24s} median {statistics.median(values):6.2f} s  runs {values}"
        if args.stats is not None:
            stats = [
                json.loads(p.read_text())
                for p in sorted(args.stats.glob(f"{args.prefix}-{label}-*.json"))
            ]
            inner = [round(s.get("wall_seconds", 0), 2) for s in stats]
            gpu = [s.get("decoders", {}).get("nvimgcodec", 0) for s in stats]
            row += f"  engine walls {inner}  gpu-decoded {gpu}"
        print(row)


if __name__ == "__main__":
    main()
