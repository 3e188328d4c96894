"""Pure-torch references for every op: the test oracle and `imgops bench`'s baseline.

Written for clarity, not speed; each follows the definition in ops.py independently of the C++.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = [
    "bin_reference",
    "normalize_volume_reference",
    "png_filter_reference",
    "rgb_to_gray_reference",
    "value_histogram_reference",
]

# PNG's adaptive choice: these filters scored per row in this order, ties to the earlier one.
_PNG_ADAPTIVE_CANDIDATES = (1, 2, 3)
_PNG_SCORE_STRIDE = 4


def rgb_to_gray_reference(image: torch.Tensor, channel_order: str = "rgb") -> torch.Tensor:
    """BT.601 luma: exact integer rounding for uint8/uint16, float32 (float64) math for floats."""
    c0, g, c2 = image.unbind(-1)
    r, b = (c0, c2) if channel_order == "rgb" else (c2, c0)
    if not image.dtype.is_floating_point:
        wide = [c.to(torch.int64) for c in (r, g, b)]
        y = (299 * wide[0] + 587 * wide[1] + 114 * wide[2] + 500) // 1000
        return y.to(image.dtype)
    acc = torch.float64 if image.dtype == torch.float64 else torch.float32
    r, g, b = (c.to(acc) for c in (r, g, b))
    return (0.299 * r + 0.587 * g + 0.114 * b).to(image.dtype)


def normalize_volume_reference(
    volume: torch.Tensor,
    max: float,
    min: float = 0.0,
    *,
    dtype: torch.dtype = torch.float32,
    clip: bool = False,
) -> torch.Tensor:
    """(x - min) / (max - min) with IEEE division, in float32 (float64 for a float64 output)."""
    acc = np.float64 if dtype == torch.float64 else np.float32
    lo = torch.tensor(acc(min), device=volume.device)
    range_ = torch.tensor(acc(float(max) - float(min)), device=volume.device)
    out = (volume.to(lo.dtype) - lo) / range_
    if clip:
        out = out.clamp(0.0, 1.0)
    return out.to(dtype)


def value_histogram_reference(values: torch.Tensor) -> torch.Tensor:
    """torch.bincount over every possible value (int16 shifted by 32768)."""
    bins = 256 if values.dtype == torch.uint8 else 65536
    offset = 32768 if values.dtype == torch.int16 else 0
    flat = values.reshape(-1).to(torch.int64) + offset
    return torch.bincount(flat, minlength=bins)


def _png_residuals(code: int, x: np.ndarray, a: np.ndarray, b: np.ndarray, c: np.ndarray):
    """Residual bytes of one PNG filter (PNG specification, section 9), in int64."""
    if code == 0:
        predictor = np.zeros_like(x)
    elif code == 1:
        predictor = a
    elif code == 2:
        predictor = b
    elif code == 3:
        predictor = (a + b) // 2
    else:
        p = a + b - c
        pa, pb, pc = np.abs(p - a), np.abs(p - b), np.abs(p - c)
        predictor = np.where((pa <= pb) & (pa <= pc), a, np.where(pb <= pc, b, c))
    return (x - predictor) % 256


def png_filter_reference(image: np.ndarray, filter: int) -> np.ndarray:
    """PNG-filtered rows (filter byte, then residuals; 16-bit big-endian) straight from the spec.

    filter -1 picks per row the first of Sub, Up, Average with the smallest sum of |residual|
    (residuals as signed bytes), scored on every 4th byte of rows of at least 64 bytes.
    """
    height = image.shape[0]
    data = np.ascontiguousarray(image.astype(image.dtype.newbyteorder(">"), copy=False))
    rows = data.view(np.uint8).reshape(height, -1).astype(np.int64)
    bpp = (image.shape[2] if image.ndim == 3 else 1) * image.dtype.itemsize
    row_bytes = rows.shape[1]
    up = np.vstack([np.zeros((1, row_bytes), np.int64), rows[:-1]])
    left = np.hstack([np.zeros((height, bpp), np.int64), rows[:, :-bpp]])[:, :row_bytes]
    up_left = np.hstack([np.zeros((height, bpp), np.int64), up[:, :-bpp]])[:, :row_bytes]
    out = np.empty((height, 1 + row_bytes), np.uint8)
    if filter >= 0:
        out[:, 0] = filter
        out[:, 1:] = _png_residuals(filter, rows, left, up, up_left)
        return out
    stride = _PNG_SCORE_STRIDE if row_bytes >= 16 * _PNG_SCORE_STRIDE else 1
    candidates = [_png_residuals(f, rows, left, up, up_left) for f in _PNG_ADAPTIVE_CANDIDATES]
    scores = np.stack([np.minimum(r, 256 - r)[:, ::stride].sum(axis=1) for r in candidates])
    best = np.argmin(scores, axis=0)  # the first minimum: ties to the earlier filter
    for k, code in enumerate(_PNG_ADAPTIVE_CANDIDATES):
        chosen = best == k
        out[chosen, 0] = code
        out[chosen, 1:] = candidates[k][chosen]
    return out


def bin_reference(x: np.ndarray, factors: tuple[int, ...]) -> np.ndarray:
    """Block mean over the last len(factors) axes in float64, partial blocks cropped; integers
    rounded half up (floor(mean + 0.5), exact for these sums), floats cast back."""
    k = len(factors)
    lead = x.shape[: x.ndim - k]
    crop = tuple(
        slice(0, (n // f) * f) for n, f in zip(x.shape[x.ndim - k :], factors, strict=True)
    )
    cropped = x[(..., *crop)].astype(np.float64)
    split = [*lead]
    for n, f in zip(cropped.shape[x.ndim - k :], factors, strict=True):
        split += [n // f, f]
    axes = tuple(len(lead) + 2 * i + 1 for i in range(k))
    mean = cropped.reshape(split).mean(axis=axes)
    if np.issubdtype(x.dtype, np.integer):
        mean = np.floor(mean + 0.5)
    return mean.astype(x.dtype)
