"""imgops: images and 3-D scans to analysis-ready data, with fused PyTorch C++/CUDA kernels.

    >>> import imgops, torch
    >>> image = torch.randint(0, 256, (480, 640, 3), dtype=torch.uint8)
    >>> imgops.rgb_to_gray(image).shape
    torch.Size([480, 640])

Tensor ops (imgops.ops): rgb_to_gray, normalize_volume, bin, percentiles, value_histogram,
png_filter. Whole files, the same code the command line runs: gray_file, normalize_file.
Attributes are loaded lazily so that `import imgops` (and `imgops --help`) stays fast: torch is
imported on first use of an op.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing's, without importing typing: a relayed command imports this too
if TYPE_CHECKING:
    from typing import Any

__version__ = "0.1.0"

# Each public name and the module that defines it, imported on first access.
_LAZY = {
    "bin": "ops",
    "normalize_volume": "ops",
    "percentiles": "ops",
    "png_filter": "ops",
    "rgb_to_gray": "ops",
    "value_histogram": "ops",
    "gray_file": "gray_files",
    "normalize_file": "volume_files",
    "build_info": "_extension",
}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'imgops' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
