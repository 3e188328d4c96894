"""What one worker does to one block: numpy in, the imgops op (its GPU if any), numpy out.

These functions run inside Dask tasks, so they import torch and imgops.ops themselves (once
per worker process) and are plain module-level functions (picklable by reference).
"""

from __future__ import annotations

import functools
import warnings
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

#: value_histogram: bins and the value of bin 0, per input dtype.
HISTOGRAM_BINS = {"uint8": (256, 0), "uint16": (65536, 0), "int16": (65536, -32768)}


@functools.lru_cache(maxsize=4)
def block_device(device: str = "auto") -> torch.device:
    """The device a worker runs the ops on: its GPU where one is usable ("auto"), else the CPU.

    Under dask-cuda each worker sees only its own GPU (CUDA_VISIBLE_DEVICES), so "cuda" is it.
    """
    import torch

    if device == "auto":
        from .. import _extension

        usable = torch.cuda.is_available() and bool(_extension.load().get("cuda_kernels"))
        return torch.device("cuda" if usable else "cpu")
    return torch.device(device)


def _ops():
    from .. import ops

    return ops


def to_tensor(block: np.ndarray, device: str) -> torch.Tensor:
    """The block as a torch tensor on the worker's device (no copy on the CPU when contiguous)."""
    import torch

    block = np.ascontiguousarray(block)
    with warnings.catch_warnings():  # zarr hands out read-only blocks; the ops never write them
        warnings.simplefilter("ignore", UserWarning)
        tensor = torch.from_numpy(block)
    target = block_device(device)
    return tensor if target.type == "cpu" else tensor.to(target, non_blocking=False)


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A host numpy array of a result tensor."""
    return tensor.cpu().numpy()


def normalize_block(
    block: np.ndarray, *, low: float, high: float, out_dtype: str, clip: bool, device: str
) -> np.ndarray:
    """imgops.ops.normalize_volume of one block with the global bounds."""
    import torch

    torch_dtype = getattr(torch, out_dtype)
    result = _ops().normalize_volume(
        to_tensor(block, device), max=high, min=low, dtype=torch_dtype, clip=clip
    )
    return to_numpy(result)


def histogram_block(block: np.ndarray, *, device: str) -> np.ndarray:
    """imgops.ops.value_histogram of one block as int64 counts (256 or 65,536 bins)."""
    bins, _ = HISTOGRAM_BINS[str(block.dtype)]
    if block.size == 0:
        return np.zeros(bins, dtype=np.int64)
    return to_numpy(_ops().value_histogram(to_tensor(block, device)))


def add_histograms(*parts: np.ndarray) -> np.ndarray:
    """The sum of histograms (one node of the tree reduction)."""
    total = np.array(parts[0], dtype=np.int64, copy=True)
    for part in parts[1:]:
        total += part
    return total


def gray_block(block: np.ndarray, *, channel_order: str, device: str) -> np.ndarray:
    """imgops.ops.rgb_to_gray of one (..., H, W, 3) block."""
    result = _ops().rgb_to_gray(to_tensor(block, device), channel_order=channel_order)
    return to_numpy(result)


def bin_block(block: np.ndarray, *, factors: tuple[int, ...], device: str) -> np.ndarray:
    """imgops.ops.bin of one block whose binned sizes are multiples of `factors`.

    Where the installed imgops has no `ops.bin` yet, `bin_numpy` (the same definition) runs.
    """
    ops = _ops()
    if hasattr(ops, "bin"):
        return to_numpy(ops.bin(to_tensor(block, device), list(factors)))
    return bin_numpy(block, factors)


def bin_numpy(block: np.ndarray, factors: tuple[int, ...]) -> np.ndarray:
    """Block mean over the last len(factors) dims, numpy only (sizes must be multiples).

    The definition of imgops.ops.bin: integers get the mean rounded half up, floor((2 s + n) /
    (2 n)) of the exact int64 sum s of n values; floats the float64 mean rounded once to the
    input dtype. Fallback for an imgops without the op; also the tests' reference.
    """
    lead = block.ndim - len(factors)
    shape = list(block.shape[:lead])
    for size, factor in zip(block.shape[lead:], factors, strict=True):
        if size % factor:
            raise ValueError(f"bin_numpy: size {size} is not a multiple of the factor {factor}")
        shape += [size // factor, factor]
    grouped = block.reshape(shape)
    axes = tuple(lead + 2 * i + 1 for i in range(len(factors)))
    count = int(np.prod(factors))
    if np.issubdtype(block.dtype, np.integer):
        sums = grouped.sum(axis=axes, dtype=np.int64)
        return ((2 * sums + count) // (2 * count)).astype(block.dtype)
    return (grouped.sum(axis=axes, dtype=np.float64) / count).astype(block.dtype)
