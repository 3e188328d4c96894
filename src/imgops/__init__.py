"""imgops: images and 3-D scans to analysis-ready data, with fused PyTorch C++/CUDA kernels.

    >>> import imgops, torch
    >>> image = torch.randint(0, 256, (480, 640, 3), dtype=torch.uint8)
    >>> imgops.rgb_to_gray(image).shape
    torch.Size([480, 640])

Attributes are loaded lazily so that `import imgops` (and `imgops --help`) stays fast.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["build_info", "normalize_volume", "rgb_to_gray", "value_histogram", "__version__"]

_OPS = {"rgb_to_gray", "normalize_volume", "value_histogram"}


def __getattr__(name: str) -> Any:
    if name in _OPS:
        from . import ops

        return getattr(ops, name)
    if name == "build_info":
        from ._extension import build_info

        return build_info
    raise AttributeError(f"module 'imgops' has no attribute {name!r}")
