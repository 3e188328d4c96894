"""The imgops ops on dask arrays: every block runs the imgops op on its worker (GPU where present).

    >>> import dask.array as da
    >>> from imgops.dask import arrays
    >>> volume = da.from_zarr("scan.zarr")            # (Z, Y, X) uint16, any chunks
    >>> low, high = arrays.percentiles(volume, (1, 99.8))
    >>> out = arrays.normalize(volume, percentile=(1, 99.8), clip=True)   # lazy float32

- `normalize` is elementwise, so each block through `imgops.ops.normalize_volume` with the
  global bounds gives exactly the single-process result.
- `percentiles` is exact for 8/16-bit integers: one `imgops.ops.value_histogram` per block,
  summed up a tree (`split_every` histograms per node, 512 KiB each for 16-bit data); the data
  itself never leaves its worker. The order statistics are then read from the total histogram
  with numpy's own float64 steps (imgops.volume.percentile_from_histogram), so the values equal
  `numpy.percentile(data, q)` bit for bit. Float inputs have no finite histogram: percentiles of
  float arrays are refused with a clear error (normalize them with explicit min/max, or
  `data_range`); we never fall back to an approximation silently.
- `gray` and `bin` rechunk first so that each block is self-contained (all three channels in
  one block; binned axes cut at multiples of the factors), then run the op per block.

Bounds that depend on the data (percentiles, the data's max) are computed when `normalize` is
called, on the active scheduler (a `distributed.Client` when one is open); the result is lazy.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from . import _blocks
from ._extra import require_dask

if TYPE_CHECKING:
    import dask.array

__all__ = ["bin", "bounds", "data_range", "gray", "histogram", "normalize", "percentiles"]

#: Input dtypes the normalize op accepts.
NORMALIZE_INPUTS = ("uint8", "uint16", "int16", "float32", "float64")
OUTPUT_DTYPES = ("float32", "float16", "float64")
DEFAULT_SPLIT_EVERY = 8


def _dask_array():
    (da,) = require_dask("dask.array")
    return da


def _check_dtype(arr, accepted: Sequence[str], what: str) -> str:
    name = str(arr.dtype)
    if name not in accepted:
        raise TypeError(f"{what}: unsupported dtype {name} (accepted: {', '.join(accepted)})")
    return name


def histogram(
    arr: dask.array.Array, *, split_every: int = DEFAULT_SPLIT_EVERY, device: str = "auto"
) -> tuple[np.ndarray, int]:
    """(counts, offset): the exact value histogram of an 8/16-bit integer array, by tree reduction.

    `counts[b]` is the number of elements equal to `b + offset` (offset -32768 for int16). Each
    block's histogram is computed where the block lives; only histograms travel.
    """
    import dask

    _dask_array()
    name = _check_dtype(arr, tuple(_blocks.HISTOGRAM_BINS), "exact percentiles")
    bins, offset = _blocks.HISTOGRAM_BINS[name]
    if split_every < 2:
        raise ValueError(f"split_every must be at least 2, got {split_every}")
    histogram_of = dask.delayed(_blocks.histogram_block, pure=True)
    add = dask.delayed(_blocks.add_histograms, pure=True)
    level = [histogram_of(block, device=device) for block in arr.to_delayed().ravel()]
    if not level:
        return np.zeros(bins, dtype=np.int64), offset
    while len(level) > 1:
        level = [add(*level[i : i + split_every]) for i in range(0, len(level), split_every)]
    (counts,) = dask.compute(level[0])
    return counts, offset


def percentiles(
    arr: dask.array.Array,
    qs: Sequence[float],
    *,
    split_every: int = DEFAULT_SPLIT_EVERY,
    device: str = "auto",
) -> list[float]:
    """Exact percentiles of an 8/16-bit integer array: numpy.percentile(data, q) for each q.

    Float arrays raise TypeError: no exact percentile without gathering or sorting the data.

    Example:
        >>> percentiles(da.from_zarr("scan.zarr"), (1, 99.8))
        [112.0, 3391.0]
    """
    from ..volume import percentile_from_histogram

    counts, offset = histogram(arr, split_every=split_every, device=device)
    if not counts.any():
        raise ValueError("percentiles of an empty array")
    return [percentile_from_histogram(counts, float(q), offset) for q in qs]


def data_range(arr: dask.array.Array) -> tuple[float, float]:
    """(min, max) of the data, by dask's own tree reductions (exact for every dtype)."""
    import dask

    _dask_array()
    if arr.size == 0:
        raise ValueError("the data range of an empty array")
    low, high = dask.compute(arr.min(), arr.max())
    return float(low), float(high)


def bounds(
    arr: dask.array.Array,
    minimum: float | str | None = None,
    maximum: float | str | None = None,
    percentile: tuple[float, float] | None = None,
    *,
    split_every: int = DEFAULT_SPLIT_EVERY,
    device: str = "auto",
) -> tuple[float, float]:
    """(low, high) as `normalize` resolves them (computed now where they depend on the data).

    `minimum`/`maximum` may also be "data" (the data's min/max) or "dtype" (the integer input
    type's limits), like `imgops normvol --min/--max`.
    """
    if percentile is not None:
        if minimum is not None or maximum is not None:
            raise ValueError("percentile sets both bounds; do not pass min or max with it")
        lo_q, hi_q = percentile
        if not 0 <= lo_q < hi_q <= 100:
            raise ValueError(f"need 0 <= LO < HI <= 100, got {lo_q:g} {hi_q:g}")
        low, high = percentiles(arr, (lo_q, hi_q), split_every=split_every, device=device)
    else:
        minimum = 0.0 if minimum is None else minimum
        maximum = "data" if maximum is None else maximum
        data = data_range(arr) if "data" in (minimum, maximum) else None
        low = _resolve(minimum, 0, arr, data)
        high = _resolve(maximum, 1, arr, data)
    if not (math.isfinite(low) and math.isfinite(high)):
        raise ValueError(f"bounds must be finite, got min {low} and max {high}")
    if not high > low:
        raise ValueError(
            f"max {high:.10g} is not above min {low:.10g} (a constant volume? pass min/max)"
        )
    return low, high


def _resolve(bound, end: int, arr, data: tuple[float, float] | None) -> float:
    """One bound: a number, "data" (the data's min or max) or "dtype" (the type's limit)."""
    if bound == "data":
        return data[end]
    if bound == "dtype":
        if not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"'dtype' bounds need integer data, got {arr.dtype}")
        limits = np.iinfo(arr.dtype)
        return float(limits.max if end else limits.min)
    return float(bound)


def normalize(
    arr: dask.array.Array,
    *,
    min: float | str | None = None,
    max: float | str | None = None,
    percentile: tuple[float, float] | None = None,
    clip: bool = False,
    dtype: str = "float32",
    split_every: int = DEFAULT_SPLIT_EVERY,
    device: str = "auto",
) -> dask.array.Array:
    """(arr - min) / (max - min) per block through imgops.ops.normalize_volume; lazy result.

    Bounds like `imgops normvol`: `max` defaults to the data's max and `min` to 0, or
    `percentile=(LO, HI)` maps the exact LO and HI percentiles to 0 and 1 (8/16-bit inputs).
    `device` "auto" uses each worker's GPU where one is usable. Identical, bit for bit, to
    imgops.ops.normalize_volume on the whole array.
    """
    _dask_array()
    _check_dtype(arr, NORMALIZE_INPUTS, "normalize")
    if dtype not in OUTPUT_DTYPES:
        raise ValueError(f"normalize: dtype must be one of {', '.join(OUTPUT_DTYPES)}, got {dtype}")
    low, high = bounds(arr, min, max, percentile, split_every=split_every, device=device)
    return arr.map_blocks(
        _blocks.normalize_block,
        dtype=np.dtype(dtype),
        token="imgops-normalize",
        low=low,
        high=high,
        out_dtype=dtype,
        clip=bool(clip),
        device=device,
    )


def gray(
    arr: dask.array.Array,
    channel_dim: int = -1,
    *,
    channel_order: str = "rgb",
    device: str = "auto",
) -> dask.array.Array:
    """BT.601 gray of RGB images through imgops.ops.rgb_to_gray; drops `channel_dim`.

    The channel axis becomes one chunk (and the last axis) first. uint8/uint16 give the exact
    integer luma, identical to the single-process op.
    """
    da = _dask_array()
    axis = channel_dim % arr.ndim if arr.ndim else 0
    if arr.ndim < 3 or arr.shape[axis] != 3:
        raise ValueError(f"gray: expected 3 channels on axis {channel_dim}, got shape {arr.shape}")
    if channel_order not in ("rgb", "bgr"):
        raise ValueError(f"gray: channel_order must be 'rgb' or 'bgr', got {channel_order!r}")
    if axis != arr.ndim - 1:
        arr = da.moveaxis(arr, axis, -1)
    last = arr.ndim - 1
    arr = arr.rechunk({last: -1})
    return arr.map_blocks(
        _blocks.gray_block,
        drop_axis=last,
        dtype=arr.dtype,
        token="imgops-gray",
        channel_order=channel_order,
        device=device,
    )


def _aligned_chunk(chunk: int, factor: int) -> int:
    """A chunk size near `chunk` that is a multiple of `factor`."""
    return factor * builtins.max(1, round(chunk / factor))


def bin(  # noqa: A001 - the op's name
    arr: dask.array.Array, factors: Sequence[int], *, device: str = "auto"
) -> dask.array.Array:
    """Block mean over the last len(factors) axes through imgops.ops.bin (trailing partial blocks
    dropped, integers rounded half up), with block boundaries on multiples of the factors.

    Each binned axis is cropped to a multiple of its factor and rechunked so that every chunk is
    a multiple too; then no bin straddles two blocks and the result equals the op on the whole
    array.
    """
    _dask_array()
    factors = tuple(int(f) for f in factors)
    if not factors or len(factors) > arr.ndim:
        raise ValueError(f"bin: need 1..{arr.ndim} factors, got {len(factors)}")
    if any(f < 1 for f in factors):
        raise ValueError(f"bin: factors must be positive, got {factors}")
    lead = arr.ndim - len(factors)
    crop = [slice(None)] * lead
    for size, factor in zip(arr.shape[lead:], factors, strict=True):
        if size < factor:
            raise ValueError(f"bin: factor {factor} exceeds the axis size {size}")
        crop.append(slice(0, size - size % factor))
    arr = arr[tuple(crop)]
    aligned = {lead + i: _aligned_chunk(arr.chunksize[lead + i], f) for i, f in enumerate(factors)}
    arr = arr.rechunk(aligned)
    out_chunks = arr.chunks[:lead] + tuple(
        tuple(c // f for c in arr.chunks[lead + i]) for i, f in enumerate(factors)
    )
    return arr.map_blocks(
        _blocks.bin_block,
        chunks=out_chunks,
        dtype=arr.dtype,
        token="imgops-bin",
        factors=factors,
        device=device,
    )
