"""Compares each OUT folder with a reference folder, file by file and byte for byte (a stress
run's commands write the same bytes every time: a difference is a wrong output, to be checked
against the source with serve_verify.py). Prints one line per OUT: "OUT: N identical" or
"OUT: K of N differ: NAME ..." (a missing or extra file counts as a difference); exit status 1
if any OUT differs.

    python scripts/gpu-check.d/same_outputs.py REF OUT [OUT...]
"""

from __future__ import annotations

import sys
from multiprocessing import Pool
from pathlib import Path


def same_file(pair: tuple[Path, Path]) -> bool:
    """Whether the two files hold the same bytes (a missing one: no)."""
    first, second = pair
    try:
        return first.read_bytes() == second.read_bytes()
    except OSError:
        return False


def compare(reference: Path, out: Path, pool: Pool) -> list[str]:
    """The names (of either folder) whose files differ, are missing or are extra."""
    ours = {p.name for p in out.iterdir()}
    theirs = {p.name for p in reference.iterdir()}
    common = sorted(ours & theirs)
    same = pool.map(same_file, [(reference / n, out / n) for n in common], chunksize=16)
    return sorted(ours ^ theirs) + [n for n, ok in zip(common, same, strict=True) if not ok]


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    reference, outs = Path(argv[1]), [Path(a) for a in argv[2:]]
    total = sum(1 for _ in reference.iterdir())
    status = 0
    with Pool() as pool:
        for out in outs:
            differ = compare(reference, out, pool)
            if differ:
                status = 1
                names = " ".join(differ[:12]) + (" ..." if len(differ) > 12 else "")
                print(f"{out}: {len(differ)} of {total} differ: {names}")
            else:
                print(f"{out}: {total} identical")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
