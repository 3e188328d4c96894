"""imgops._cli_kernels, the torch-free CPU luma module the command line uses.

It must give exactly the formula's bits (and so the torch op's), for every uint8 pixel, for
uint16, for both channel orders and every length (the SIMD loops have tails), refuse
malformed buffers, and let `imgops gray` on the CPU run without importing torch.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from imgops import _cli_kernels
from imgops.pipeline import GRAY

SAMPLES = Path(__file__).resolve().parent.parent / "samples"


def formula(rgb: np.ndarray) -> np.ndarray:
    """The exact BT.601 integer formula, rounded half up, in int64."""
    wide = rgb.astype(np.int64)
    luma = (299 * wide[..., 0] + 587 * wide[..., 1] + 114 * wide[..., 2] + 500) // 1000
    return luma.astype(rgb.dtype)


def gray(rgb: np.ndarray, bgr: bool = False, isa: str = "best") -> np.ndarray:
    out = np.empty(rgb.shape[:-1], dtype=rgb.dtype)
    _cli_kernels.rgb_to_gray(np.ascontiguousarray(rgb), out, rgb.itemsize, bgr, isa)
    return out


def loops(itemsize: int) -> list[str]:
    """The loops this CPU has for the item size (each is checked on its own)."""
    found = []
    for isa in ("best", "baseline", "sse4.1", "avx2"):
        try:
            gray(np.zeros((1, 3), dtype=np.uint8 if itemsize == 1 else np.uint16), isa=isa)
        except ValueError:
            continue
        found.append(isa)
    return found


def test_the_expected_loops_exist():
    assert {"best", "baseline"} <= set(loops(1)) and {"best", "baseline"} <= set(loops(2))
    assert "sse4.1" not in loops(2)  # the hand-written SSE loop is uint8 only


@pytest.mark.parametrize("isa", loops(1))
def test_every_uint8_triple_matches_the_formula(isa):
    values = np.arange(1 << 24, dtype=np.int64)
    rgb = np.stack([(values >> 16) & 255, (values >> 8) & 255, values & 255], axis=-1)
    rgb = rgb.astype(np.uint8).reshape(4096, 4096, 3)
    expected = formula(rgb)
    np.testing.assert_array_equal(gray(rgb, isa=isa), expected)
    np.testing.assert_array_equal(gray(rgb[..., ::-1], bgr=True, isa=isa), expected)


@given(
    pixels=st.integers(0, 300),
    dtype=st.sampled_from([np.uint8, np.uint16]),
    bgr=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
    isa=st.sampled_from(["best", "baseline", "sse4.1", "avx2"]),
)
def test_random_lengths_and_types_match_the_formula(pixels, dtype, bgr, seed, isa):
    if isa not in loops(np.dtype(dtype).itemsize):
        return
    rng = np.random.default_rng(seed)
    rgb = rng.integers(0, np.iinfo(dtype).max + 1, (pixels, 3), dtype=dtype)
    rgb_order = rgb[:, ::-1] if bgr else rgb
    np.testing.assert_array_equal(gray(rgb, bgr, isa), formula(rgb_order))


def test_uint16_extremes_match_the_formula():
    edges = np.array([0, 1, 499, 500, 32767, 32768, 65534, 65535])
    grid = np.stack(np.meshgrid(edges, edges, edges, indexing="ij"), axis=-1).reshape(-1, 3)
    rgb = grid.astype(np.uint16)
    np.testing.assert_array_equal(gray(rgb), formula(rgb))


def test_equals_the_torch_op_on_a_real_photo():
    torch = pytest.importorskip("torch")
    import imgops

    bgr = cv2.imread(str(SAMPLES / "flower_rgb_3mp.png"), cv2.IMREAD_COLOR)
    expected = imgops.rgb_to_gray(torch.from_numpy(bgr), "bgr").numpy()
    np.testing.assert_array_equal(GRAY.cpu(bgr, "bgr"), expected)


@pytest.mark.parametrize(
    "src, dst, itemsize, problem",
    [
        (np.zeros(9, np.uint8), np.zeros(2, np.uint8), 1, "3 values"),
        (np.zeros(6, np.uint8), np.zeros(2, np.uint8), 4, "itemsize"),
        (np.zeros(6, np.uint16), np.zeros(3, np.uint8), 2, "3 values"),
        (np.zeros(6, np.uint16), np.zeros(2, np.uint16), 2, "no loop"),
    ],
)
def test_malformed_buffers_are_refused(src, dst, itemsize, problem):
    isa = "sse4.1" if problem == "no loop" else "best"
    with pytest.raises(ValueError, match=problem):
        _cli_kernels.rgb_to_gray(src, dst, itemsize, False, isa)


def test_read_only_output_is_refused():
    dst = np.zeros(2, np.uint8)
    dst.flags.writeable = False
    with pytest.raises((TypeError, BufferError, ValueError)):
        _cli_kernels.rgb_to_gray(np.zeros(6, np.uint8), dst, 1, False)


ROCKET = SAMPLES / "rocket_baseline_rgb.jpg"
_TORCH_PROBE = (
    "import atexit, sys\n"
    "atexit.register(lambda: print('TORCH' if 'torch' in sys.modules else 'NO-TORCH',"
    " file=sys.stderr))\n"
    "from imgops.cli import main\n"
    "main()\n"
)


def gray_in_a_process(out: Path, *args: str, env: dict | None = None) -> str:
    """Runs `imgops gray ROCKET -o out ...` in a fresh process; checks the pixels written.

    Returns TORCH or NO-TORCH: whether the process had imported torch when it exited.
    """
    result = subprocess.run(
        [sys.executable, "-c", _TORCH_PROBE, "gray", str(ROCKET), "-o", str(out), *args],
        capture_output=True, text=True, env={**os.environ, **(env or {})},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    bgr = cv2.imread(str(ROCKET), cv2.IMREAD_COLOR)
    np.testing.assert_array_equal(
        cv2.imread(str(out), cv2.IMREAD_UNCHANGED), formula(bgr[..., ::-1])
    )
    return result.stderr.strip().splitlines()[-1]


def test_gray_on_the_cpu_never_imports_torch(tmp_path: Path):
    for device in ("auto", "cpu"):
        assert gray_in_a_process(tmp_path / f"{device}.png", "--device", device) == "NO-TORCH"


def test_without_the_module_gray_uses_the_numpy_formula_and_still_no_torch(tmp_path: Path):
    env = {"IMGOPS_NO_CLI_KERNELS": "1"}
    assert gray_in_a_process(tmp_path / "numpy.png", env=env) == "NO-TORCH"
