"""Builds the photo batch of issue 10: JPEGs made from the real photos, deterministic.

Half the files are 3840x2160, half 2048x1536, JPEG quality 85..94. Each is a mosaic of 1 to 4
tiles; a tile is a random crop of one source photo (the colour photos in /work/shared/data
and samples/), resized to fill it, sometimes mirrored. The same arguments give the same files.

    python scripts/make_photo_batch.py OUT_DIR [--count 800] [--jobs N] [--source DIR ...]
"""

from __future__ import annotations

import argparse
import os
import sys
from multiprocessing import Pool
from pathlib import Path

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SOURCES = (Path("/work/shared/data"), ROOT / "samples")
SIZES = ((3840, 2160), (2048, 1536))
_photos: list[np.ndarray] = []


def load_photos(folders: list[Path]) -> list[np.ndarray]:
    """The 8-bit colour photos (JPEG/PNG, 3+ channels, >= 256 px a side) in the folders."""
    seen, photos = set(), []
    for folder in folders:
        for path in sorted(folder.glob("*")):
            if path.suffix.lower() not in (".jpg", ".jpeg", ".png") or path.name in seen:
                continue
            image = cv2.imread(str(path), cv2.IMREAD_COLOR)
            if image is None or min(image.shape[:2]) < 256:
                continue
            original = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
            if original is None or original.ndim != 3 or original.dtype != np.uint8:
                continue  # gray and 16-bit sources would make gray or clipped mosaics
            seen.add(path.name)
            photos.append(image)
    return photos


def make(index: int) -> np.ndarray:
    """Photo number `index`: a (H, W, 3) BGR mosaic, decided by `index` alone."""
    rng = np.random.default_rng(index)
    width, height = SIZES[index % 2]
    canvas = np.empty((height, width, 3), dtype=np.uint8)
    cols, rows = [(1, 1), (2, 1), (1, 2), (2, 2)][int(rng.integers(4))]
    xs = np.linspace(0, width, cols + 1).astype(int)
    ys = np.linspace(0, height, rows + 1).astype(int)
    for r in range(rows):
        for c in range(cols):
            photo = _photos[int(rng.integers(len(_photos)))]
            tile_w, tile_h = xs[c + 1] - xs[c], ys[r + 1] - ys[r]
            ph, pw = photo.shape[:2]
            scale = float(rng.uniform(0.5, 1.0))  # crop a part, at least half of the photo
            aspect = tile_w / tile_h
            crop_w = int(min(pw, ph * aspect) * scale)
            crop_h = max(1, int(crop_w / aspect))
            x0 = int(rng.integers(0, pw - crop_w + 1))
            y0 = int(rng.integers(0, ph - crop_h + 1))
            crop = photo[y0 : y0 + crop_h, x0 : x0 + crop_w]
            if rng.random() < 0.5:
                crop = crop[:, ::-1]
            tile = cv2.resize(crop, (int(tile_w), int(tile_h)), interpolation=cv2.INTER_CUBIC)
            canvas[ys[r] : ys[r + 1], xs[c] : xs[c + 1]] = tile
    return canvas


def _write(job: tuple[int, str]) -> int:
    index, folder = job
    quality = 85 + index % 10
    path = os.path.join(folder, f"photo_{index:04d}.jpg")
    ok = cv2.imwrite(path, make(index), [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise OSError(f"cannot write {path}")
    return os.path.getsize(path)


def _init(photos: list[np.ndarray]) -> None:
    global _photos
    _photos = photos
    cv2.setNumThreads(1)


def main(argv: list[str] | None = None) -> int:
    """Writes the batch; prints the file count and total bytes."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--count", type=int, default=800)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--source", type=Path, action="append")
    args = parser.parse_args(argv)
    photos = load_photos(args.source or [p for p in DEFAULT_SOURCES if p.is_dir()])
    if not photos:
        print("no colour photos found in the sources", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    jobs = [(i, str(args.out)) for i in range(args.count)]
    with Pool(args.jobs, initializer=_init, initargs=(photos,)) as pool:
        sizes = pool.map(_write, jobs, chunksize=4)
    print(f"{len(sizes)} files, {sum(sizes)} bytes, from {len(photos)} photos in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
