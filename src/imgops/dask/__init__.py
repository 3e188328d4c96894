"""imgops on a Dask cluster: the ops on dask arrays, batches and volumes spread over workers.

Needs the optional extra `imgops[dask]` (dask, distributed, zarr; dask-cuda for
`--scheduler local-cuda`). Nothing here imports dask until it is used, so `import imgops` and
`imgops --help` never pay for it:

    >>> import dask.array as da
    >>> from imgops import dask as idask
    >>> volume = da.from_zarr("scan.zarr")
    >>> idask.normalize(volume, percentile=(1, 99.8), clip=True).to_zarr("out.zarr")

`imgops.dask.arrays`: normalize, percentiles, gray, bin on dask arrays (bit-identical to the
single-process ops for integer inputs); `imgops.dask.cluster.connect(spec)`: a client for
"local:N", "local-cuda" or "tcp://HOST:PORT"; `imgops.dask.batch.run_batch_distributed`: the
photo batch engine per partition of the file list; `imgops.dask.volume`: zarr / OME-Zarr in and
out, written chunk-parallel by the workers; `imgops.dask.run`: what the commands run with
`--scheduler SPEC` (the option itself is imgops.cli_common.scheduler_option).
"""

from __future__ import annotations

from typing import Any

from ._extra import MissingDaskExtra, require_dask

__all__ = [
    "MissingDaskExtra",
    "bin",
    "connect",
    "gray",
    "normalize",
    "percentiles",
    "require_dask",
]

_ARRAY_FUNCTIONS = {"normalize", "percentiles", "gray", "bin", "data_range"}


def __getattr__(name: str) -> Any:
    if name in _ARRAY_FUNCTIONS:
        from . import arrays

        return getattr(arrays, name)
    if name == "connect":
        from .cluster import connect

        return connect
    raise AttributeError(f"module 'imgops.dask' has no attribute {name!r}")
