"""imgops._cli_kernels, the command line's torch-free CPU kernels, loaded once for every user.

The module is built ahead of time beside imgops._C (csrc/standalone/). Where it is missing (a
just-in-time install) or `IMGOPS_NO_CLI_KERNELS` is set, callers fall back to the torch
extension (gray) or numpy (PNG row filters), with the same results.
"""

from __future__ import annotations

import functools
import os
from typing import Any


@functools.cache
def cli_kernels() -> Any:
    """The imgops._cli_kernels module, or None where it was not built or is disabled."""
    if os.environ.get("IMGOPS_NO_CLI_KERNELS"):
        return None
    try:
        from . import _cli_kernels
    except ImportError:
        return None
    return _cli_kernels
