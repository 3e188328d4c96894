"""The PNG encoder fed by the png_filter op (CPU, and CUDA on a GPU host): the file written from
the op's rows is byte for byte encode_png's, at every level, so the GPU engine's PNGs are the
CPU path's."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from imgops.io import png

torch = pytest.importorskip("torch")
ops = pytest.importorskip("imgops.ops")

SAMPLES = Path(__file__).resolve().parents[1] / "samples"


def _op_rows(image: np.ndarray, code: int, device: str) -> np.ndarray:
    try:
        rows = ops.png_filter(torch.from_numpy(image).to(device), code)
    except (RuntimeError, ValueError, NotImplementedError) as error:
        pytest.skip(f"png_filter op unavailable here: {error}")
    return rows.cpu().numpy()


def _images() -> list[np.ndarray]:
    photo = cv2.imread(str(SAMPLES / "coffee_rgb.png"), cv2.IMREAD_UNCHANGED)
    room = cv2.imread(str(SAMPLES / "room_rgb16.png"), cv2.IMREAD_UNCHANGED)
    rng = np.random.default_rng(3)
    return [
        cv2.cvtColor(photo, cv2.COLOR_BGR2GRAY),
        np.ascontiguousarray(photo[..., ::-1]),
        cv2.cvtColor(room, cv2.COLOR_BGR2GRAY),
        rng.integers(0, 256, (37, 53, 4), dtype=np.uint8),
        rng.integers(0, 65536, (5, 17, 2), dtype=np.uint16),
    ]


@pytest.mark.parametrize(
    "device", [pytest.param("cpu"), pytest.param("cuda", marks=pytest.mark.cuda)]
)
@pytest.mark.parametrize("level", [0, 1, 2, 6])
def test_files_from_the_op_rows_equal_encode_png(device: str, level: int) -> None:
    for image in _images():
        rows = _op_rows(image, png.filter_code_for(level), device)
        data = png.encode_png_filtered(
            rows,
            width=image.shape[1],
            height=image.shape[0],
            channels=1 if image.ndim == 2 else image.shape[2],
            bit_depth=8 * image.itemsize,
            level=level,
        )
        assert data == png.encode_png(image, level=level), (image.shape, image.dtype)
