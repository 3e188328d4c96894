"""The optional extra `imgops[dask]`: one check, one clear message when it is missing."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from ..errors import ImgopsError

EXTRA_HINT = "pip install 'imgops[dask]'"
#: Import name -> distribution name, for the message.
_PACKAGES = {
    "dask": "dask",
    "dask.array": "dask[array]",
    "distributed": "distributed",
    "zarr": "zarr",
}


class MissingDaskExtra(ImgopsError, ImportError):
    """dask, distributed or zarr is not installed; names the extra that brings them (exit 1)."""


def _installed(name: str) -> bool:
    """Whether the top-level package of `name` can be found (without importing it)."""
    try:
        return importlib.util.find_spec(name.split(".")[0]) is not None
    except (ImportError, ValueError):
        return False


def require_dask(*modules: str) -> list[ModuleType]:
    """Imports `modules` (default: dask.array and distributed); raises MissingDaskExtra if absent.

    Example:
        >>> (da,) = require_dask("dask.array")
    """
    names = modules or ("dask.array", "distributed")
    loaded = []
    for name in names:
        try:
            loaded.append(importlib.import_module(name))
        except ImportError as error:
            package = _PACKAGES.get(name, name.split(".")[0])
            if _installed(name):  # present but broken: say why, not "not installed"
                raise MissingDaskExtra(
                    f"running on a Dask cluster needs the optional extra imgops[dask]: {package} "
                    f"is installed but does not import ({type(error).__name__}: {error}; "
                    f"reinstall with {EXTRA_HINT})"
                ) from error
            raise MissingDaskExtra(
                f"running on a Dask cluster needs the optional extra imgops[dask] "
                f"({package} is not installed: {EXTRA_HINT})"
            ) from error
    return loaded
