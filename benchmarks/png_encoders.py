"""PNG encoders on gray photos: imgops.io.png levels against cv2.imencode and the old level 2.

    $ PYTHONPATH=src python benchmarks/png_encoders.py [--reps 9]   # Markdown on stdout

Inputs: the gray (exact BT.601, (299R + 587G + 114B + 500) // 1000) of every photo in
samples/ and ../shared/data (deduplicated by content), plus a 3840x2160 mosaic of them.
CPU time per call (time.process_time, one thread, the median of --reps) so other load on the
machine disturbs it less; bytes are exact. Every imgops output is decoded with OpenCV and
compared with its input. "old level 2" is the level 2 before imgops' own deflate (adaptive
filter, zlib-ng's run-length strategy at level 1), rebuilt here from the module's parts.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np

from imgops.io import png

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = [ROOT / "samples", ROOT.parent / "shared" / "data", Path("/work/shared/data")]
PHOTOS = ["flower_rgb_3mp.png", "flower_gray_3mp.jpg", "flower_progressive_3mp.jpg",
          "rocket_baseline_rgb.jpg", "coffee_rgb.png", "camera_gray.png", "tulips_rgba.png",
          "room_rgb16.png"]  # fmt: skip


def bt601_gray(image: np.ndarray) -> np.ndarray:
    """Exact integer BT.601 luma of an OpenCV (BGR[A]) image; gray images pass through."""
    if image.ndim == 2:
        return image
    b, g, r = (image[..., i].astype(np.int64) for i in range(3))
    return ((299 * r + 587 * g + 114 * b + 500) // 1000).astype(image.dtype)


def load_grays() -> dict[str, np.ndarray]:
    """The gray photos, one per distinct content, by file name."""
    grays: dict[str, np.ndarray] = {}
    seen: set[str] = set()
    for folder in FOLDERS:
        for name in PHOTOS:
            path = folder / name
            if not path.is_file():
                continue
            image = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
            if image is None:
                continue
            gray = np.ascontiguousarray(bt601_gray(image))
            digest = hashlib.sha256(gray.tobytes()).hexdigest()
            if digest not in seen:
                seen.add(digest)
                grays[name] = gray
    return grays


def mosaic_4k(grays: dict[str, np.ndarray]) -> np.ndarray:
    """A 3840x2160 8-bit mosaic of the photos, tiled row by row in 960x720 crops."""
    tiles = [g for g in grays.values() if g.dtype == np.uint8]
    canvas = np.zeros((2160, 3840), dtype=np.uint8)
    index = 0
    for top in range(0, 2160, 720):
        for left in range(0, 3840, 960):
            tile = tiles[index % len(tiles)]
            index += 1
            crop = cv2.resize(tile, (960, 720), interpolation=cv2.INTER_AREA)
            canvas[top : top + 720, left : left + 960] = crop
    return canvas


def old_level2(image: np.ndarray) -> bytes:
    """The level 2 of imgops before its own deflate: adaptive filter + zlib(-ng) RLE level 1."""
    height, width = image.shape[:2]
    compressor = png._GENERAL.compressobj(1, zlib.DEFLATED, 15, 9, png._GENERAL.rle)
    pieces = [compressor.compress(s) for s in png._filtered_strips(image, "adaptive")]
    pieces.append(compressor.flush())
    parts = [png._header(width, height, 1, 8 * image.itemsize)]
    parts.extend(png._idat_chunks(iter(pieces)))
    parts.append(png._chunk(b"IEND", b""))
    return b"".join(parts)


def cpu_ms(fn: Callable[[], bytes], reps: int) -> tuple[float, bytes]:
    times, result = [], b""
    for _ in range(reps):
        start = time.process_time()
        result = fn()
        times.append(time.process_time() - start)
    return statistics.median(times) * 1e3, result


def encoders() -> dict[str, Callable[[np.ndarray], bytes]]:
    table: dict[str, Callable[[np.ndarray], bytes]] = {
        "cv2 default": lambda im: cv2.imencode(".png", im)[1].tobytes(),
        "cv2 level 1": lambda im: cv2.imencode(".png", im, [cv2.IMWRITE_PNG_COMPRESSION, 1])[
            1
        ].tobytes(),
        "old imgops level 2": old_level2,
    }
    for level in (0, 1, 2, 3, 6):
        table[f"imgops level {level}"] = lambda im, lv=level: png.encode_png(im, level=lv)
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=9)
    args = parser.parse_args()
    images = load_grays()
    images["mosaic 4K"] = mosaic_4k(images)
    results: dict[str, list[tuple[float, int]]] = {}
    for label, encode in encoders().items():
        for name, image in images.items():
            reps = 3 if label.endswith(("6", "3")) else args.reps
            ms, data = cpu_ms(lambda e=encode, im=image: e(im), reps)
            if label.startswith(("imgops", "old")):
                decoded = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
                assert np.array_equal(decoded, image), (label, name)
            results.setdefault(label, []).append((ms, len(data)))
    base_bytes = [size for _, size in results["cv2 default"]]
    base_ms = [ms for ms, _ in results["old imgops level 2"]]
    print(f"backends: {png.backend_info()}\n")
    heads = [
        f"{n} ({im.shape[1]}x{im.shape[0]}{', 16-bit' if im.dtype == np.uint16 else ''})"
        for n, im in images.items()
    ]
    print("| encoder | " + " | ".join(heads) + " | total ms | speed vs old level 2 | "
          "total bytes vs cv2 default |")  # fmt: skip
    print("|---|" + "---:|" * (len(images) + 3))
    for label, cells in results.items():
        ms_total = sum(ms for ms, _ in cells)
        bytes_total = sum(size for _, size in cells)
        text = " | ".join(
            f"{ms:.1f} ms, {size / b:.3f}" for (ms, size), b in zip(cells, base_bytes, strict=True)
        )
        print(
            f"| {label} | {text} | {ms_total:.1f} | {sum(base_ms) / ms_total:.2f}x | "
            f"{bytes_total / sum(base_bytes):.3f} |"
        )
    print(
        "\ncells: CPU ms (median of the repetitions, one thread), size / cv2 default size; "
        "speed = total CPU time of the old level 2 / this encoder's"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
