"""Every PNG in each OUT decodes to within 1 of the exact BT.601 luma of OpenCV's decode of its
input in SRC (OUT's `NAME.png` comes from SRC's `NAME.jpg`); prints, per OUT, the histogram of
the largest differences and the bad outputs (with the share of their pixels off by more than 1
and the rows those lie in). Each source is decoded once, however many OUT folders there are (one
per command of a stress run). Used by serve.sh and finish_stress.sh: the GPU decodes differ from
OpenCV's by at most 1 in luma.

    python scripts/gpu-check.d/serve_verify.py SRC OUT [OUT...]
"""

from __future__ import annotations

import sys
from collections import Counter
from multiprocessing import Pool
from pathlib import Path

import cv2
import numpy as np

#: (OUT, output name, the largest difference or what is wrong, detail of a bad one)
Finding = tuple[str, str, "int | str", str]


def exact_luma(source: Path) -> np.ndarray | None:
    """The exact BT.601 luma of OpenCV's decode of `source`, as int16 (None: unreadable)."""
    bgr = cv2.imread(str(source), cv2.IMREAD_COLOR)
    if bgr is None:
        return None
    bgr = bgr.astype(np.int32)
    luma = (299 * bgr[..., 2] + 587 * bgr[..., 1] + 114 * bgr[..., 0] + 500) // 1000
    return luma.astype(np.int16)


def check_source(job: tuple[Path, list[Path], str]) -> list[Finding]:
    """The outputs of one source in every OUT folder, against its exact luma."""
    source, outs, name = job
    luma = exact_luma(source)
    findings: list[Finding] = []
    for out in outs:
        path = out / name
        if not path.exists():
            continue
        got = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
        if got is None or luma is None:
            findings.append((str(out), name, "unreadable", ""))
            continue
        if got.shape != luma.shape:
            findings.append((str(out), name, f"shape {got.shape} against {luma.shape}", ""))
            continue
        off = np.abs(got.astype(np.int16) - luma)
        largest = int(off.max())
        detail = ""
        if largest > 1:
            rows = np.nonzero((off > 1).any(axis=1))[0]
            detail = f"{(off > 1).mean():.1%} of pixels, rows {rows[0]}-{rows[-1]}"
        findings.append((str(out), name, largest, detail))
    return findings


def main(source: Path, outs: list[Path]) -> int:
    names = sorted({p.name for out in outs for p in out.glob("*.png")})
    jobs = [(source / (Path(name).stem + ".jpg"), outs, name) for name in names]
    with Pool() as pool:
        findings = [f for found in pool.map(check_source, jobs, chunksize=4) for f in found]
    by_out: dict[str, list[Finding]] = {str(out): [] for out in outs}
    for finding in findings:
        by_out[finding[0]].append(finding)
    failed = not findings
    for out in outs:
        mine = by_out[str(out)]
        bad = [f for f in mine if not isinstance(f[2], int) or f[2] > 1]
        histogram = Counter(f[2] for f in mine if isinstance(f[2], int))
        label = f"{out}: " if len(outs) > 1 else ""
        listed = [(name, largest) for _, name, largest, _ in bad[:5]]
        print(f"{label}checked {len(mine)} outputs: largest difference "
              f"{dict(sorted(histogram.items()))}; bad {listed}")  # fmt: skip
        for _, name, largest, detail in bad[:5]:
            if detail:
                print(f"  {name}: largest difference {largest}, {detail}")
        failed = failed or bool(bad) or not mine
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    sys.exit(main(Path(sys.argv[1]), [Path(a) for a in sys.argv[2:]]))
