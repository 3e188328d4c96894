"""Every PNG in OUT decodes to within 1 of the exact BT.601 luma of OpenCV's decode of its input
in SRC (OUT's `NAME.png` comes from SRC's `NAME.jpg`); prints the histogram of the largest
differences. Used by serve.sh: the GPU decodes differ from OpenCV's by at most 1 in luma.

    python scripts/gpu-check.d/serve_verify.py SRC OUT
"""

from __future__ import annotations

import sys
from collections import Counter
from multiprocessing import Pool
from pathlib import Path

import cv2
import numpy as np


def largest_difference(pair: tuple[Path, Path]) -> tuple[str, int | str]:
    """(output name, the largest |output - exact luma of OpenCV's decode|, or what is wrong)."""
    output, source = pair
    got = cv2.imread(str(output), cv2.IMREAD_UNCHANGED)
    bgr = cv2.imread(str(source), cv2.IMREAD_COLOR)
    if got is None or bgr is None:
        return output.name, "unreadable"
    bgr = bgr.astype(np.int64)
    luma = (299 * bgr[..., 2] + 587 * bgr[..., 1] + 114 * bgr[..., 0] + 500) // 1000
    if got.shape != luma.shape:
        return output.name, f"shape {got.shape} against {luma.shape}"
    return output.name, int(np.abs(got.astype(np.int64) - luma).max())


def main(source: Path, out: Path) -> int:
    pairs = [(p, source / (p.stem + ".jpg")) for p in sorted(out.glob("*.png"))]
    with Pool() as pool:
        results = pool.map(largest_difference, pairs, chunksize=8)
    bad = [r for r in results if not isinstance(r[1], int) or r[1] > 1]
    histogram = Counter(d for _, d in results if isinstance(d, int))
    print(f"checked {len(results)} outputs: largest difference {dict(sorted(histogram.items()))}; "
          f"bad {bad[:5]}")  # fmt: skip
    return 1 if bad or not results else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
