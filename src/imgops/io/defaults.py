"""Defaults every command shares, in a module that imports neither numpy nor OpenCV, so the
command line can check them (and start a GPU) before those imports: the PNG level and the
decompression-bomb limit."""

from __future__ import annotations

import os

__all__ = ["DEFAULT_PNG_LEVEL", "LUMAS", "MAX_PIXELS_ENV", "default_max_pixels"]

#: imgops' PNG encoder level: smaller than OpenCV's default PNG on photos, and faster.
DEFAULT_PNG_LEVEL = 2
#: Environment variable that overrides the decompression-bomb limit (pixels per image).
MAX_PIXELS_ENV = "IMGOPS_MAX_IMAGE_PIXELS"
DEFAULT_MAX_PIXELS = 1 << 28  # 268 megapixels, e.g. 16384 x 16384
#: Where gray comes from (`imgops gray --luma`): "exact", the BT.601 luma of the decoded RGB
#: pixels; "stored", a colour JPEG's own luma plane, decoded without its colour planes.
LUMAS = ("exact", "stored")


def default_max_pixels() -> int:
    """The decompression-bomb limit: $IMGOPS_MAX_IMAGE_PIXELS, else 2**28 pixels.

    Raises:
        ValueError: the variable is set but not a positive whole number (the message names it;
            the CLI checks it once before any work and makes it a usage error).
    """
    raw = os.environ.get(MAX_PIXELS_ENV)
    if raw is None or not raw.strip():
        return DEFAULT_MAX_PIXELS
    value = raw.strip()
    if not value.isdigit() or int(value) <= 0:
        raise ValueError(f"{MAX_PIXELS_ENV} must be a positive whole number of pixels, got {raw!r}")
    return int(value)
