"""PNG encoders on the gray outputs of samples/: imgops.io.png levels against cv2.imencode.

    $ python benchmarks/png_encoders.py            # a Markdown table on stdout

CPU time (time.process_time, median of 7) so other load on the machine disturbs it less;
bytes are exact. Every imgops output is decoded with OpenCV and compared with the input.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import cv2
import numpy as np

from imgops.io import png

SAMPLES = Path(__file__).resolve().parents[1] / "samples"
NAMES = [
    "flower_rgb_3mp.png",
    "flower_gray_3mp.jpg",
    "rocket_baseline_rgb.jpg",
    "coffee_rgb.png",
    "camera_gray.png",
    "tulips_rgba.png",
    "room_rgb16.png",
]
OPENCV = {
    "cv2 default": [],
    "cv2 level 1": [cv2.IMWRITE_PNG_COMPRESSION, 1],
    "cv2 level 1 huffman": [
        cv2.IMWRITE_PNG_COMPRESSION,
        1,
        cv2.IMWRITE_PNG_STRATEGY,
        cv2.IMWRITE_PNG_STRATEGY_HUFFMAN_ONLY,
    ],
    "cv2 level 1 rle": [
        cv2.IMWRITE_PNG_COMPRESSION,
        1,
        cv2.IMWRITE_PNG_STRATEGY,
        cv2.IMWRITE_PNG_STRATEGY_RLE,
    ],
    "cv2 level 3": [cv2.IMWRITE_PNG_COMPRESSION, 3],
    "cv2 level 6": [cv2.IMWRITE_PNG_COMPRESSION, 6],
    "cv2 level 9": [cv2.IMWRITE_PNG_COMPRESSION, 9],
}


def gray(name: str) -> np.ndarray:
    image = cv2.imread(str(SAMPLES / name), cv2.IMREAD_UNCHANGED)
    return image if image.ndim == 2 else cv2.cvtColor(image[..., :3], cv2.COLOR_BGR2GRAY)


def cpu_ms(fn, reps: int = 7) -> tuple[float, object]:
    times, result = [], None
    for _ in range(reps):
        start = time.process_time()
        result = fn()
        times.append(time.process_time() - start)
    return statistics.median(times) * 1e3, result


def main() -> int:
    images = {name: gray(name) for name in NAMES}
    rows: dict[str, list[tuple[float, int]]] = {}
    for name, image in images.items():
        for label, params in OPENCV.items():
            ms, (ok, data) = cpu_ms(lambda im=image, p=params: cv2.imencode(".png", im, p))
            rows.setdefault(label, []).append((ms, len(data)))
        for level in range(10):
            ms, data = cpu_ms(
                lambda im=image, lv=level: png.encode_png(im, level=lv), 3 if level > 5 else 7
            )
            decoded = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
            assert np.array_equal(decoded, image), (name, level)
            rows.setdefault(f"imgops level {level}", []).append((ms, len(data)))
    base = rows["cv2 default"]
    print(f"backends: {png.backend_info()}\n")
    print(
        "| encoder | "
        + " | ".join(
            f"{n} ({images[n].shape[1]}x{images[n].shape[0]}"
            f"{', 16-bit' if images[n].dtype == np.uint16 else ''})"
            for n in NAMES
        )
        + " | total ms | total bytes vs cv2 default |"
    )
    print("|---|" + "---:|" * (len(NAMES) + 2))
    for label, cells in rows.items():
        ms_total = sum(ms for ms, _ in cells)
        bytes_total = sum(size for _, size in cells)
        text = " | ".join(
            f"{ms:.1f} ms, {size / b[1]:.3f}" for (ms, size), b in zip(cells, base, strict=True)
        )
        print(
            f"| {label} | {text} | {ms_total:.1f} | {bytes_total / sum(b[1] for b in base):.3f} |"
        )
    print("\ncells: CPU ms (median), size / cv2 default size")
    return 0


if __name__ == "__main__":
    sys.exit(main())
