"""The peer: JPEG/PNG/... -> gray PNG with OpenCV alone, over a process pool (or sequentially).

A standalone script (standard library and cv2 only, no torch, no imgops import), run as a file:

    $ python opencv_pool.py -d out/ photos/*.jpg            # Pool(os.cpu_count())
    $ python opencv_pool.py -d out/ --jobs 1 photos/*.jpg   # the same work, one process, no pool
    $ python opencv_pool.py -d out/ --files-from list.txt

Each file: cv2.imread (any depth, any colour, EXIF orientation applied; gray passes through),
cv2.cvtColor BGR->GRAY, cv2.imwrite of DIR/<stem>.png with OpenCV's default PNG parameters
(`--format jpg`: DIR/<stem>.jpg at `--quality`, default 95). `--decode-only`: imread alone,
nothing written (the CPU decode floor).
Prints one JSON line: {"files": N, "failed": K, "output_bytes": B}; exit 1 if any file failed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def convert(job: tuple[str, str, int]) -> int:
    """Converts one file; returns the bytes written, or -1 on failure.

    An empty target means decode only (returns 0); `quality` applies to .jpg targets.
    """
    import cv2

    source, target, quality = job
    image = cv2.imread(source, cv2.IMREAD_ANYDEPTH | cv2.IMREAD_ANYCOLOR)  # EXIF applied
    if image is None:
        return -1
    if not target:
        return 0
    if image.ndim == 3:
        code = cv2.COLOR_BGRA2GRAY if image.shape[2] == 4 else cv2.COLOR_BGR2GRAY
        image = cv2.cvtColor(image, code)
    params = [cv2.IMWRITE_JPEG_QUALITY, quality] if target.endswith(".jpg") else []
    if not cv2.imwrite(target, image, params):
        return -1
    return os.path.getsize(target)


def _init_worker() -> None:
    import cv2

    cv2.setNumThreads(1)  # one process per core: no nested threading


def main(argv: list[str] | None = None) -> int:
    """Parses arguments, converts every file, prints the JSON summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("inputs", nargs="*")
    parser.add_argument("-d", "--output-dir", required=True)
    parser.add_argument("--files-from", help="a file with one input path a line")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--format", choices=("png", "jpg"), default="png")
    parser.add_argument("--quality", type=int, default=95)
    parser.add_argument("--decode-only", action="store_true")
    args = parser.parse_args(argv)
    inputs = list(args.inputs)
    if args.files_from:
        with open(args.files_from, encoding="utf-8") as listing:
            inputs += [line.rstrip("\n") for line in listing if line.strip()]
    os.makedirs(args.output_dir, exist_ok=True)

    def target_for(path: str) -> str:
        if args.decode_only:
            return ""
        stem = os.path.splitext(os.path.basename(path))[0]
        return os.path.join(args.output_dir, f"{stem}.{args.format}")

    jobs = [(path, target_for(path), args.quality) for path in inputs]
    if args.jobs > 1:
        from multiprocessing import Pool

        with Pool(args.jobs, initializer=_init_worker) as pool:
            sizes = pool.map(convert, jobs, chunksize=1)
    else:
        _init_worker()
        sizes = [convert(job) for job in jobs]
    failed = sum(1 for size in sizes if size < 0)
    written = sum(size for size in sizes if size > 0)
    print(json.dumps({"files": len(jobs), "failed": failed, "output_bytes": written}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
