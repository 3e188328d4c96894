"""The public tensor API: typed wrappers over torch.ops.imgops.*, with fake kernels and autograd.

Importing this module loads the compiled kernels (building them just in time if needed).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch

from . import _extension

_extension.load()

__all__ = [
    "bin",
    "normalize_volume",
    "percentiles",
    "png_filter",
    "rgb_to_gray",
    "value_histogram",
]

# The float weights, as float32 values (what the kernels use).
_LUMA_WEIGHTS = (0.299, 0.587, 0.114)
_GRAY_DTYPES = (
    torch.uint8,
    torch.uint16,
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
)
_VOLUME_DTYPES = (torch.uint8, torch.uint16, torch.int16, torch.float32, torch.float64)
_NORMALIZED_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_HISTOGRAM_BINS = {torch.uint8: 256, torch.uint16: 65536, torch.int16: 65536}


def _require_tensor(op: str, name: str, value: object) -> None:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{op}: expected {name} to be a torch.Tensor, got {type(value).__name__}")


def rgb_to_gray(
    image: torch.Tensor, channel_order: str = "rgb", *, channel_dim: int = -1
) -> torch.Tensor:
    """BT.601 luma of an image with 3 channels in `channel_dim`; returns it without that dim.

    uint8/uint16 give the exact integer luma, (299 R + 587 G + 114 B + 500) // 1000;
    float32/float16/bfloat16 give 0.299 R + 0.587 G + 0.114 B computed in float32, float64 in
    float64 (all differentiable).
    `channel_order` is "rgb" or "bgr" (OpenCV decodes to BGR). `channel_dim` is where the
    channels are: -1 (default) for (..., H, W, 3), -3 for channels-first (..., 3, H, W), which
    is first copied to interleaved pixels.

    Example:
        >>> rgb_to_gray(torch.tensor([[[255, 0, 0]]], dtype=torch.uint8))
        tensor([[76]], dtype=torch.uint8)
        >>> rgb_to_gray(torch.zeros((2, 3, 4, 5), dtype=torch.uint8), channel_dim=1).shape
        torch.Size([2, 4, 5])
    """
    _require_tensor("rgb_to_gray", "image", image)
    if image.dim() == 0 or not -image.dim() <= channel_dim < image.dim():
        raise IndexError(
            f"rgb_to_gray: channel_dim {channel_dim} is out of range for shape {tuple(image.shape)}"
        )
    if channel_dim % image.dim() != image.dim() - 1:
        image = image.movedim(channel_dim, -1)
    return torch.ops.imgops.rgb_to_gray.default(image, channel_order)


def normalize_volume(
    volume: torch.Tensor,
    *,
    max: float,
    min: float = 0.0,
    dtype: torch.dtype | None = None,
    clip: bool = False,
) -> torch.Tensor:
    """(volume - min) / (max - min) in float32 (or float16/bfloat16/float64), clamped if `clip`.

    Accepts uint8, uint16, int16, float32 or float64 of any shape, computes in float32 (float64 for
    a float64 output) and clamps to [0, 1] when `clip`; float input is differentiable.
    The bounds are keyword-only; `max <= min` is an error. `dtype` None means float32.

    Example:
        >>> normalize_volume(torch.tensor([0, 2048, 4095], dtype=torch.uint16), max=4095)
        tensor([0.0000, 0.5001, 1.0000])
    """
    _require_tensor("normalize_volume", "volume", volume)
    return torch.ops.imgops.normalize_volume.default(
        volume, float(max), float(min), dtype=dtype or torch.float32, clip=clip
    )


def percentiles(x: torch.Tensor, qs: Iterable[float]) -> list[float]:
    """Exact percentiles of all of x's values, as numpy.percentile's default ('linear') gives.

    The value at rank h = (n - 1) * q / 100 of the sorted values, interpolated between the
    neighbouring ranks. uint8, uint16 and int16 use value_histogram (one pass, no sort, on the
    tensor's device); other dtypes sort a copy. NaN in the data gives NaN.

    Example:
        >>> percentiles(torch.arange(101, dtype=torch.uint8), (1, 99.5))
        [1.0, 99.5]
    """
    _require_tensor("percentiles", "x", x)
    qs = [float(q) for q in qs]
    for q in qs:
        if not 0.0 <= q <= 100.0:
            raise ValueError(f"percentiles: each q must be in [0, 100], got {q:g}")
    n = x.numel()
    if n == 0:
        raise ValueError("percentiles: the tensor is empty")
    if x.dtype in _HISTOGRAM_BINS:
        cumulative = torch.cumsum(value_histogram(x), 0).cpu()
        offset = 32768 if x.dtype == torch.int16 else 0

        def order_statistic(k: int) -> torch.Tensor:  # the value of rank k (0-based)
            rank = torch.tensor(k, dtype=torch.int64)
            return torch.searchsorted(cumulative, rank, right=True) - offset

    else:
        ordered = x.detach().reshape(-1).sort().values.cpu()
        if torch.isnan(ordered[-1]):
            return [math.nan] * len(qs)

        def order_statistic(k: int) -> torch.Tensor:
            return ordered[k]

    out = []
    for q in qs:
        h = (n - 1) * (q / 100)
        lo = min(math.floor(h), n - 1)
        hi = min(lo + 1, n - 1)
        a, b = order_statistic(lo), order_statistic(hi)
        diff = float(b - a)  # in the data's dtype, as numpy subtracts
        a, b, t = float(a), float(b), h - lo
        # numpy's _lerp: from the nearer end, so the ends are exact
        out.append(b - diff * (1 - t) if t >= 0.5 else a + diff * t)
    return out


def png_filter(image: torch.Tensor, filter: int) -> torch.Tensor:
    """PNG-filtered rows of an (H, W) or (H, W, C) uint8/uint16 image, C in 1..4.

    Returns uint8 (H, 1 + W * C * itemsize): each row's filter-type byte, then its residual bytes
    (16-bit samples big-endian; the row above the first is zeros), ready for deflate.
    `filter`: -1 adaptive (per row, the smallest sum of |residual| of Sub, Up and Average), 0 None,
    1 Sub, 2 Up, 3 Average, 4 Paeth. The same bytes as `imgops._cli_kernels.png_filter_rows`.

    Example:
        >>> png_filter(torch.tensor([[1, 3, 6]], dtype=torch.uint8), 1)
        tensor([[1, 1, 2, 3]], dtype=torch.uint8)
    """
    _require_tensor("png_filter", "image", image)
    return torch.ops.imgops.png_filter.default(image, int(filter))


def bin(x: torch.Tensor, factors: Sequence[int]) -> torch.Tensor:
    """Block mean over the last len(factors) dims (1 to 3, e.g. (fz, fy, fx) for Z, Y, X).

    Like Fiji's Image > Transform > Bin (average, with crop): trailing partial blocks are
    dropped, so a binned dim of size n becomes n // f. uint8, uint16 and int16 give the exact
    mean rounded half up; float32 and float64 the mean of the block summed in float64, then
    cast (differentiable: each input of a block gets the output's gradient / block size).

    Example:
        >>> bin(torch.tensor([[1, 2, 4], [3, 5, 9]], dtype=torch.uint8), (2, 2))
        tensor([[3]], dtype=torch.uint8)
    """
    _require_tensor("bin", "x", x)
    return torch.ops.imgops.bin.default(x, [int(f) for f in factors])


def value_histogram(values: torch.Tensor) -> torch.Tensor:
    """Counts (int64) of every possible value: 256 bins for uint8, 65,536 for uint16 and int16.

    For int16 the bin of value v is v + 32768.
    """
    _require_tensor("value_histogram", "values", values)
    return torch.ops.imgops.value_histogram.default(values)


@torch.library.register_fake("imgops::rgb_to_gray")
def _rgb_to_gray_fake(image: torch.Tensor, channel_order: str = "rgb") -> torch.Tensor:
    torch._check_value(
        channel_order in ("rgb", "bgr"), lambda: "rgb_to_gray: channel_order must be rgb or bgr"
    )
    torch._check_value(
        image.dim() >= 3 and image.shape[-1] == 3,
        lambda: f"rgb_to_gray: expected an image of shape (..., H, W, 3), got {tuple(image.shape)}",
    )
    torch._check_type(
        image.dtype in _GRAY_DTYPES, lambda: f"rgb_to_gray: unsupported dtype {image.dtype}"
    )
    return image.new_empty(image.shape[:-1])


@torch.library.register_fake("imgops::normalize_volume")
def _normalize_volume_fake(volume, max, min=0.0, *, dtype=None, clip=False):
    out = dtype or torch.float32
    torch._check_type(
        volume.dtype in _VOLUME_DTYPES,
        lambda: f"normalize_volume: unsupported dtype {volume.dtype}",
    )
    torch._check_value(
        math.isfinite(max) and math.isfinite(min), lambda: "normalize_volume: bounds not finite"
    )
    torch._check_value(max > min, lambda: "normalize_volume: max must be greater than min")
    torch._check_type(out in _NORMALIZED_DTYPES, lambda: f"normalize_volume: dtype {out}")
    return volume.new_empty(volume.shape, dtype=out)


@torch.library.register_fake("imgops::value_histogram")
def _value_histogram_fake(values):
    bins = _HISTOGRAM_BINS.get(values.dtype)
    torch._check_type(
        bins is not None, lambda: f"value_histogram: unsupported dtype {values.dtype}"
    )
    return values.new_empty((bins,), dtype=torch.int64)


@torch.library.register_fake("imgops::png_filter")
def _png_filter_fake(image, filter):
    torch._check_value(
        image.dim() == 2 or (image.dim() == 3 and 1 <= image.shape[2] <= 4),
        lambda: f"png_filter: expected (H, W) or (H, W, C), C in 1..4, got {tuple(image.shape)}",
    )
    torch._check_type(
        image.dtype in (torch.uint8, torch.uint16),
        lambda: f"png_filter: expected dtype uint8 or uint16, got {image.dtype}",
    )
    torch._check_value(image.shape[1] >= 1, lambda: "png_filter: rows must hold at least one pixel")
    torch._check_value(
        -1 <= filter <= 4, lambda: f"png_filter: filter must be in -1..4, got {filter}"
    )
    channels = image.shape[2] if image.dim() == 3 else 1
    row_bytes = image.shape[1] * channels * image.element_size()
    return image.new_empty((image.shape[0], 1 + row_bytes), dtype=torch.uint8)


@torch.library.register_fake("imgops::bin")
def _bin_fake(x, factors):
    k = len(factors)
    torch._check_value(1 <= k <= 3, lambda: f"bin: expected 1 to 3 factors (Z, Y, X), got {k}")
    torch._check_value(
        x.dim() >= k, lambda: f"bin: {k} factors need as many dims, got {tuple(x.shape)}"
    )
    torch._check_value(
        all(f >= 1 for f in factors), lambda: f"bin: factors must be >= 1: {factors}"
    )
    torch._check_type(x.dtype in _VOLUME_DTYPES, lambda: f"bin: unsupported dtype {x.dtype}")
    lead = x.shape[: x.dim() - k]
    binned = [size // f for size, f in zip(x.shape[x.dim() - k :], factors, strict=True)]
    return x.new_empty((*lead, *binned))


def _bin_setup(ctx, inputs, output):
    x, factors = inputs
    ctx.factors = list(factors)
    ctx.input_shape = x.shape


def _bin_backward(ctx, grad):
    factors, shape = ctx.factors, ctx.input_shape
    k = len(factors)
    count = 1
    for f in factors:
        count *= f
    up = grad / count
    for offset, f in enumerate(factors):
        up = up.repeat_interleave(f, dim=len(shape) - k + offset)
    pad: list[int] = []
    for offset in reversed(range(k)):  # F.pad lists the last dim first
        dim = len(shape) - k + offset
        pad += [0, shape[dim] - up.shape[dim]]
    return torch.nn.functional.pad(up, pad), None


torch.library.register_autograd("imgops::bin", _bin_backward, setup_context=_bin_setup)


def _rgb_to_gray_setup(ctx, inputs, output):
    _, channel_order = (list(inputs) + ["rgb"])[:2]
    ctx.channel_order = channel_order


def _accumulate_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _rgb_to_gray_backward(ctx, grad):
    weights = _LUMA_WEIGHTS if ctx.channel_order == "rgb" else _LUMA_WEIGHTS[::-1]
    acc = _accumulate_dtype(grad.dtype)
    w = torch.tensor(weights, dtype=acc, device=grad.device)
    grad_image = (grad.to(acc).unsqueeze(-1) * w).to(grad.dtype)
    return grad_image, None


torch.library.register_autograd(
    "imgops::rgb_to_gray", _rgb_to_gray_backward, setup_context=_rgb_to_gray_setup
)


def _normalize_setup(ctx, inputs, keyword_only_inputs, output):
    volume, max_value, min_value = (list(inputs) + [0.0])[:3]
    ctx.min, ctx.range = min_value, max_value - min_value
    ctx.clip = keyword_only_inputs.get("clip", False)
    ctx.volume_dtype = volume.dtype
    ctx.save_for_backward(volume if ctx.clip else None)


def _normalize_backward(ctx, grad):
    (volume,) = ctx.saved_tensors
    acc = _accumulate_dtype(grad.dtype)
    range_ = torch.tensor(ctx.range, dtype=acc, device=grad.device)
    grad_volume = grad.to(acc) / range_
    if ctx.clip:
        lo = torch.tensor(ctx.min, dtype=acc, device=grad.device)
        scaled = (volume.to(acc) - lo) / range_
        grad_volume = grad_volume * ((scaled >= 0) & (scaled <= 1))
    return grad_volume.to(ctx.volume_dtype), None, None


torch.library.register_autograd(
    "imgops::normalize_volume", _normalize_backward, setup_context=_normalize_setup
)
