"""Zarr / OME-Zarr volumes in and out on a Dask cluster: `normalize_zarr(src, dst, ...)`.

    $ imgops normvol scan.zarr -o scan_norm.ome.zarr --percentile 1 99.8 --scheduler local:2

1. `open_zarr` reads a zarr array, or the full-resolution image of an OME-Zarr (NGFF 0.4 or
   0.5) group, as a dask array with the store's own chunks (`dask.array.from_zarr`): each task
   reads its chunk on its worker.
2. Bounds: exact percentiles by the histogram tree reduction (imgops.dask.arrays), the data's
   max, or the numbers given.
3. Every block is normalised by imgops.ops.normalize_volume on its worker and written by that
   worker straight into its chunk of the output store (output chunks = input blocks, so no two
   tasks touch one chunk). Only histograms and per-task acknowledgements reach the client.
4. The store is written under a temporary name beside the target (".<name>.imgops-tmp-...");
   the NGFF metadata is written last and the folder renamed to `dst` at the end. An interrupted
   or failed run removes the temporary store; a killed client leaves only the hidden temporary,
   never a store under the target name. Existing targets are replaced only with `overwrite`.

Output: `*.ome.zarr` is an OME-Zarr NGFF 0.4 image (zarr format 2; array "0", the input's axes
and scale); any other name a plain zarr (format 3) array.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import FileError
from . import arrays, ngff
from ._extra import require_dask
from .cluster import wait_until_not_running

if TYPE_CHECKING:
    import dask.array
    import distributed

__all__ = ["VolumeRun", "ZarrSource", "normalize_zarr", "open_zarr"]


@dataclass
class ZarrSource:
    """A zarr image as a dask array, with the NGFF axes and scale to carry to the output."""

    path: Path
    array: dask.array.Array
    axes: list[dict[str, Any]] | None = None
    scale: list[float] | None = None
    component: str | None = None


@dataclass
class VolumeRun:
    """What `normalize_zarr` did: bounds, sizes, tasks and seconds (for -v and the benchmark)."""

    low: float
    high: float
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    blocks: int
    seconds: dict[str, float] = field(default_factory=dict)


def is_zarr(path: Path) -> bool:
    """Whether `path` names a zarr store (by its suffix, or the metadata files inside it)."""
    path = Path(path)
    if path.name.lower().endswith(".zarr"):
        return True
    return path.is_dir() and any(
        (path / name).exists() for name in ("zarr.json", ".zarray", ".zgroup")
    )


def is_ome_target(path: Path) -> bool:
    """Whether an output name asks for OME-Zarr (`*.ome.zarr`)."""
    return Path(path).name.lower().endswith(".ome.zarr")


def open_zarr(path: str | os.PathLike[str]) -> ZarrSource:
    """The image of a zarr array or OME-Zarr group as a dask array; FileError if it is neither."""
    (zarr,) = require_dask("zarr")
    (da,) = require_dask("dask.array")
    path = Path(path)
    try:
        node = zarr.open(str(path), mode="r")
    except Exception as error:  # missing, not a store, unreadable metadata: one line
        raise FileError(path, f"cannot open as zarr ({_reason(error)})") from error
    if isinstance(node, zarr.Array):
        return ZarrSource(path, da.from_zarr(node))
    meta = ngff.image_metadata(dict(node.attrs))
    if meta is None:
        names = sorted(name for name, _ in node.arrays())
        raise FileError(
            path,
            "a zarr group without OME-NGFF multiscales metadata; name the array inside it"
            + (f" (e.g. {path / names[0]})" if names else " (it holds no array)"),
        )
    try:
        component, axes, scale = ngff.full_resolution(meta)
        image = node[component]
    except (KeyError, ValueError) as error:
        raise FileError(path, f"bad OME-Zarr metadata ({_reason(error)})") from error
    return ZarrSource(path, da.from_zarr(image), axes, scale, component)


def _reason(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


def temporary_store_for(target: Path) -> Path:
    """A hidden, unique folder name beside `target` (imgops.io.atomic's marker, so doctor's
    stale-temporaries check finds one a killed run left)."""
    from ..io.atomic import TEMP_MARKER

    return target.with_name(f".{target.name}{TEMP_MARKER}{os.getpid()}-{secrets.token_hex(4)}")


@functools.lru_cache(maxsize=8)
def _open_for_writing(path: str):
    import zarr

    return zarr.open_array(path, mode="r+")


def write_block(block: np.ndarray, *, store: str, block_info=None) -> np.ndarray:
    """On a worker: writes one block into its region of the output array; returns an ack."""
    location = block_info[0]["array-location"]
    region = tuple(slice(start, stop) for start, stop in location)
    if not any(os.path.exists(os.path.join(store, name)) for name in (".zarray", "zarr.json")):
        raise FileNotFoundError(f"{store}: the output store was removed (the run was stopped)")
    _open_for_writing(store)[region] = block
    return np.ones((1,) * block.ndim, dtype=np.int8)


def _create_output(temp: Path, source: ZarrSource, dtype: str, ome: bool) -> str:
    """Creates the empty output (group + array "0" for OME, else a plain array); returns the
    path of the array the workers write."""
    import zarr

    arr = source.array
    chunks = tuple(int(c) for c in arr.chunksize)
    if ome:
        group = zarr.open_group(str(temp), mode="w-", zarr_format=2)
        group.create_array("0", shape=arr.shape, chunks=chunks, dtype=dtype, fill_value=0)
        return str(temp / "0")
    zarr.create_array(
        str(temp), shape=arr.shape, chunks=chunks, dtype=dtype, fill_value=0, zarr_format=3
    )
    return str(temp)


def _write_metadata(temp: Path, source: ZarrSource, ome: bool, provenance: dict) -> None:
    import zarr

    if ome:
        group = zarr.open_group(str(temp), mode="r+")
        group.attrs["multiscales"] = ngff.multiscales(
            source.array.ndim, axes=source.axes, scale=source.scale, name=source.path.stem
        )
        group.attrs["imgops"] = provenance
    else:
        zarr.open_array(str(temp), mode="r+").attrs["imgops"] = provenance


def _commit(temp: Path, target: Path, overwrite: bool) -> None:
    """Renames the finished store onto `target` (an existing one only with `overwrite`)."""
    if target.exists() or target.is_symlink():
        if not overwrite:
            raise FileError(target, "output exists (use --overwrite)")
        aside = temporary_store_for(target)
        os.rename(target, aside)
        os.rename(temp, target)
        shutil.rmtree(aside, ignore_errors=True) if aside.is_dir() else aside.unlink()
        return
    os.rename(temp, target)


def _run_writes(blocks: list, client, on_progress: Callable[[int], None] | None) -> None:
    """Computes the per-block write tasks on the cluster (or here, threaded), with progress.

    On any error or interrupt, returns only once no write task runs any more (cancelled tasks
    that had started finish on their worker first), so the caller can remove the store.
    """
    import dask

    if client is None:
        from concurrent.futures import ThreadPoolExecutor

        from dask.callbacks import Callback

        class _Progress(Callback):
            def _posttask(self, key, result, dsk, state, worker_id):
                if on_progress is not None and isinstance(key, tuple) and "imgops-write" in key[0]:
                    on_progress(1)

        pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 1)
        try:
            with _Progress():
                dask.compute(*blocks, scheduler="threads", pool=pool)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        return
    import distributed

    futures = client.compute(blocks)
    try:
        for future in distributed.as_completed(futures):
            future.result()  # raises the task's error (a bad chunk, a full disk)
            if on_progress is not None:
                on_progress(1)
    except BaseException:
        client.cancel(futures, force=True)
        wait_until_not_running(client, {f.key for f in futures})
        raise


def normalize_zarr(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    min: float | None = None,
    max: float | None = None,
    percentile: tuple[float, float] | None = None,
    clip: bool = False,
    dtype: str = "float32",
    overwrite: bool = False,
    client: distributed.Client | None = None,
    on_progress: Callable[[int], None] | None = None,
    on_bounds: Callable[[float, float], None] | None = None,
    device: str = "auto",
) -> VolumeRun:
    """Normalises a zarr / OME-Zarr volume into `dst`, chunk-parallel on the cluster of `client`.

    `client` None runs in this process (dask's threaded scheduler); otherwise every read,
    histogram, kernel and chunk write runs on the workers. `on_progress(n)` gets blocks written
    (total: `VolumeRun.blocks`, also given by `count_blocks`), `on_bounds(low, high)` the
    bounds once known. Bounds as in `imgops.dask.arrays.normalize`.
    """
    (da,) = require_dask("dask.array")
    src, dst = Path(src), Path(dst)
    if dst.exists() and not overwrite:
        raise FileError(dst, "output exists (use --overwrite)")
    if not dst.parent.is_dir():
        raise FileError(dst, "cannot write: output folder does not exist")
    source = open_zarr(src)
    arr = source.array
    times: dict[str, float] = {}
    started = time.perf_counter()
    with _on_scheduler(client):
        low, high = arrays.bounds(arr, min, max, percentile, device=device)
    times["bounds"] = time.perf_counter() - started
    if on_bounds is not None:
        on_bounds(low, high)
    normalized = arrays.normalize(arr, min=low, max=high, clip=clip, dtype=dtype, device=device)
    ome = is_ome_target(dst)
    temp = temporary_store_for(dst)
    provenance = {
        "operation": "normvol",
        "source": str(src),
        "min": low,
        "max": high,
        "percentile": list(percentile) if percentile else None,
        "clip": bool(clip),
        "dtype": dtype,
    }
    write_started = time.perf_counter()
    try:
        store = _create_output(temp, source, dtype, ome)
        acks = da.map_blocks(
            write_block,
            normalized,
            store=store,
            chunks=(1,) * arr.ndim,
            dtype=np.int8,
            name=f"imgops-write-{temp.name[-8:]}",
        )
        _run_writes(list(acks.to_delayed().ravel()), client, on_progress)
        _write_metadata(temp, source, ome, provenance)
        _commit(temp, dst, overwrite)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    times["write"] = time.perf_counter() - write_started
    return VolumeRun(
        low, high, tuple(arr.shape), tuple(int(c) for c in arr.chunksize), count_blocks(arr), times
    )


def count_blocks(arr: dask.array.Array) -> int:
    """Number of blocks (write tasks) of a dask array."""
    return int(np.prod(arr.numblocks)) if arr.ndim else 1


@contextlib.contextmanager
def _on_scheduler(client):
    """Makes `client` dask's scheduler (or the threaded one) for computations inside."""
    import dask

    if client is None:
        with dask.config.set(scheduler="threads"):
            yield
    else:
        with dask.config.set(scheduler=client):
            yield
