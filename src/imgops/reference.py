"""Pure-torch references for every op: the test oracle and `imgops bench`'s baseline.

Written for clarity, not speed; each follows the definition in ops.py independently of the C++.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["normalize_volume_reference", "rgb_to_gray_reference", "value_histogram_reference"]


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
