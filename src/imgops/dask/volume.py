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

Output: `*.ome.zarr` (or `ome=True`) is an OME-Zarr image written as `imgops normvol` writes
one (NGFF 0.5 on zarr v3 by default, 0.4 on zarr v2; zstd level 1; the metadata of
imgops.io.ome.ngff_attributes) with a pyramid: level k+1 is `imgops.dask.arrays.bin` (2x2 in Y
and X) of level k, each level's chunks written by the workers that compute them. Level 0 keeps
the input's chunks (the stores differ from a single-process run's in chunking only; the values
are the same, bit for bit). Any other name is a plain zarr (format 3) array.
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
    target: Path | None = None
    levels: int = 1
    #: Values of level 0 outside [0, 1] (not counted with clip); the voxel count.
    outside: int = 0
    values: int = 0

    def summary(self) -> str:
        """One line naming the output and the bounds used (as `imgops normvol` prints it)."""
        return f"{self.target}: written (min {self.low:.10g}, max {self.high:.10g})"


@dataclass(frozen=True)
class OmeLayout:
    """How an OME-Zarr output is laid out: NGFF version, compression, levels, metadata."""

    ngff: str = "0.5"
    compression: str = "zstd"
    levels: int | None = None  # None: halve Y and X down to 256 pixels (zarr_io.default_levels)
    axes: str | None = None  # "ZYX", "CZYX", ...: the input's axes; None: from the source
    scales: dict[str, float] = field(default_factory=dict)  # physical size per axis
    units: dict[str, str | None] = field(default_factory=dict)
    #: The input's display range per channel (mapped through the bounds into the output's
    #: `omero` windows); None: [0, 1] for each of `channels`.
    ranges: tuple[tuple[float, float], ...] | None = None
    channels: int = 1

    def windows(self, low: float, high: float, clip: bool) -> list[tuple[float, float]]:
        """The output's display windows for kernel bounds (low, high), as imgops.volume_files
        maps them for one set of bounds."""
        if self.ranges is None:
            return [(0.0, 1.0)] * self.channels
        out = []
        for r0, r1 in self.ranges:
            mapped = ((r0 - low) / (high - low), (r1 - low) / (high - low))
            if clip:
                mapped = tuple(min(1.0, max(0.0, v)) for v in mapped)
            out.append(mapped)
        return out


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


def write_block(
    block: np.ndarray, *, store: str, count_outside: bool = False, block_info=None
) -> np.ndarray:
    """On a worker: writes one block into its region of the output array; returns its count
    of values outside [0, 1] (`count_outside`; NaN is not counted), else 0, as a 1-element
    int64 array."""
    location = block_info[0]["array-location"]
    region = tuple(slice(start, stop) for start, stop in location)
    if not any(os.path.exists(os.path.join(store, name)) for name in (".zarray", "zarr.json")):
        raise FileNotFoundError(f"{store}: the output store was removed (the run was stopped)")
    _open_for_writing(store)[region] = block
    outside = int(np.count_nonzero((block < 0) | (block > 1))) if count_outside else 0
    return np.full((1,) * block.ndim, outside, dtype=np.int64)


def _level_arrays(normalized, levels: int, device: str) -> list:
    """Level 0 and each pyramid level: the 2x2 (Y, X) block mean of the level before."""
    out = [normalized]
    for _ in range(1, levels):
        out.append(arrays.bin(out[-1], (2, 2), device=device))
    return out


def _store_chunks(arr) -> tuple[int, ...]:
    """The regular chunk shape of a dask array (its first chunk along each axis)."""
    return tuple(int(c[0]) if c else 1 for c in arr.chunks)


def _largest_divisor(size: int, limit: int) -> int:
    """The largest divisor of `size` that is at most `limit` (at least 1)."""
    for d in range(min(size, max(1, limit)), 0, -1):
        if size % d == 0:
            return d
    return 1


def ome_chunks(arr, axes: str, dtype: str) -> tuple[int, ...]:
    """Output chunks near imgops.io.zarr_io's (<= 512 x 512 tiles, ~4 MiB, 1 per C and T) that
    divide the dask blocks, so each block still writes whole chunks no other task touches."""
    from ..io.zarr_io import _CHUNK_BYTES, _TILE

    blocks = _store_chunks(arr)
    tile_y, tile_x = (_largest_divisor(b, _TILE) for b in blocks[-2:])
    itemsize = np.dtype(dtype).itemsize
    depth = max(1, min(_CHUNK_BYTES // max(1, tile_y * tile_x * itemsize), 64))
    lead = []
    for axis, block in zip(axes[:-2], blocks[:-2], strict=True):
        lead.append(_largest_divisor(block, depth) if axis == "Z" else 1)
    return (*lead, tile_y, tile_x)


def _create_plain(temp: Path, arr, dtype: str) -> list[str]:
    import zarr

    zarr.create_array(
        str(temp), shape=arr.shape, chunks=_store_chunks(arr), dtype=dtype, fill_value=0,
        zarr_format=3,
    )  # fmt: skip
    return [str(temp)]


def _create_ome(temp: Path, levels: list, dtype: str, layout: OmeLayout, axes: str) -> list[str]:
    """Creates the group and one empty array per level (as imgops.io.zarr_io's writer names
    and encodes them); returns the paths of the arrays the workers write."""
    import zarr

    from ..io.zarr_io import _compressors

    zarr_format = 3 if layout.ngff == "0.5" else 2
    group = zarr.open_group(str(temp), mode="w-", zarr_format=zarr_format)
    compressors = _compressors(layout.compression, zarr_format)
    paths = []
    for index, level in enumerate(levels):
        options: dict[str, Any] = {
            "shape": level.shape,
            "chunks": ome_chunks(level, axes, dtype),
            "dtype": dtype,
            "fill_value": 0,
            "compressors": compressors,
        }
        if zarr_format == 3:
            options["dimension_names"] = [a.lower() for a in axes]
        else:
            options["chunk_key_encoding"] = {"name": "v2", "separator": "/"}
        group.create_array(str(index), **options)
        paths.append(str(temp / str(index)))
    return paths


def _ome_attributes(
    source: ZarrSource, layout: OmeLayout, axes: str, levels: int, windows: list
) -> dict:
    """The NGFF attributes of imgops.io.ome (the single-process writer's definition)."""
    from ..io.ome import ngff_attributes

    sizes = dict(layout.scales)
    units = dict(layout.units)
    if not sizes and source.scale and len(source.scale) == len(axes):  # the input's own NGFF
        sizes = {axis: float(value) for axis, value in zip(axes, source.scale, strict=True)}
    if not units and source.axes:
        units = {a: e.get("unit") for a, e in zip(axes, source.axes, strict=False) if e.get("unit")}
    scales = []
    for level in range(levels):
        scale = []
        for axis in axes:
            value = sizes.get(axis, 1.0) if axis != "C" else 1.0
            scale.append(value * (2**level) if axis in "YX" else value)
        scales.append(scale)
    return ngff_attributes(
        axes=axes,
        scales=scales,
        units=units,
        windows=windows,
        channel_names=None,
        name=source.path.name,
        version=layout.ngff,
    )


def _source_axes(source: ZarrSource) -> str:
    """The source's axes as letters ("ZYX"): its NGFF axes, else by dimension count."""
    if source.axes:
        return "".join(str(a.get("name", "?"))[:1].upper() for a in source.axes)
    return {2: "YX", 3: "ZYX", 4: "CZYX", 5: "TCZYX"}.get(source.array.ndim, "")


def _write_metadata(temp: Path, attrs: dict, ome: bool, provenance: dict) -> None:
    import zarr

    if ome:
        group = zarr.open_group(str(temp), mode="r+")
        group.attrs.update(attrs)
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


def _run_writes(blocks: list, client, on_progress: Callable[[int], None] | None) -> int:
    """Computes the per-block write tasks on the cluster (or here, threaded), with progress;
    returns the sum of their results (values outside [0, 1]).

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
                results = dask.compute(*blocks, scheduler="threads", pool=pool)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        return int(sum(int(r.sum()) for r in results))
    import distributed

    futures = client.compute(blocks)
    total = 0
    try:
        for future in distributed.as_completed(futures):
            total += int(future.result().sum())  # raises the task's error (bad chunk, full disk)
            if on_progress is not None:
                on_progress(1)
    except BaseException:
        client.cancel(futures, force=True)
        wait_until_not_running(client, {f.key for f in futures})
        raise
    return total


def normalize_zarr(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    min: float | str | None = None,
    max: float | str | None = None,
    percentile: tuple[float, float] | None = None,
    eps: float | None = None,
    clip: bool = False,
    dtype: str = "float32",
    overwrite: bool = False,
    client: distributed.Client | None = None,
    on_progress: Callable[[int], None] | None = None,
    on_bounds: Callable[[float, float], None] | None = None,
    device: str = "auto",
    ome: bool | None = None,
    layout: OmeLayout | None = None,
) -> VolumeRun:
    """Normalises a zarr / OME-Zarr volume into `dst`, chunk-parallel on the cluster of `client`.

    `client` None runs in this process (dask's threaded scheduler); otherwise every read,
    histogram, kernel and chunk write runs on the workers. `on_progress(n)` gets blocks written
    (total: `count_writes(src, ...)`), `on_bounds(low, high)` the bounds once known (it may
    raise to refuse them before anything is written). Bounds as in
    `imgops.dask.arrays.normalize`; with `percentile` and `eps`, CSBDeep's (x - lo) / (hi - lo +
    eps) in float32, as `imgops normvol --percentile` computes it. `ome` (default: the name
    ends in .ome.zarr) writes an OME-Zarr image laid out by `layout` (default OmeLayout()).
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
    kernel_low, kernel_high = low, high
    if percentile is not None and eps is not None:
        kernel_low, kernel_high = csbdeep_bounds(low, high, eps)
    normalized = arrays.normalize(
        arr, min=kernel_low, max=kernel_high, clip=clip, dtype=dtype, device=device
    )
    ome = is_ome_target(dst) if ome is None else ome
    layout = layout or OmeLayout()
    axes = layout.axes or _source_axes(source)
    levels = _level_arrays(normalized, _level_count(arr, layout) if ome else 1, device)
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
        if ome:
            stores = _create_ome(temp, levels, dtype, layout, axes)
        else:
            stores = _create_plain(temp, normalized, dtype)
        acks = []
        for index, (level, store) in enumerate(zip(levels, stores, strict=True)):
            written = da.map_blocks(
                write_block,
                level,
                store=store,
                count_outside=index == 0 and not clip,
                chunks=(1,) * level.ndim,
                dtype=np.int64,
                name=f"imgops-write-{temp.name[-8:]}-{index}",
            )
            acks.extend(written.to_delayed().ravel())
        outside = _run_writes(acks, client, on_progress)
        windows = layout.windows(kernel_low, kernel_high, clip)
        attrs = _ome_attributes(source, layout, axes, len(levels), windows) if ome else {}
        _write_metadata(temp, attrs, ome, provenance)
        _commit(temp, dst, overwrite)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    times["write"] = time.perf_counter() - write_started
    return VolumeRun(
        low,
        high,
        tuple(arr.shape),
        tuple(int(c) for c in arr.chunksize),
        sum(count_blocks(level) for level in levels),
        times,
        dst,
        len(levels),
        outside,
        int(arr.size),
    )


def csbdeep_bounds(low: float, high: float, eps: float) -> tuple[float, float]:
    """Kernel bounds giving CSBDeep's (x - lo) / (hi - lo + eps) with float32 arithmetic (the
    definition of imgops.volume_files.csbdeep_bounds, which `imgops normvol` uses)."""
    from ..volume_files import csbdeep_bounds as single_process

    return single_process(low, high, eps)


def _level_count(arr, layout: OmeLayout) -> int:
    from ..io.zarr_io import default_levels

    if arr.ndim < 2:
        return 1
    return layout.levels or default_levels(int(arr.shape[-2]), int(arr.shape[-1]))


def count_writes(arr, *, ome: bool, layout: OmeLayout | None = None) -> int:
    """Write tasks `normalize_zarr` will run for `arr` (every block of every level)."""
    if not ome:
        return count_blocks(arr)
    levels = _level_arrays(arr, _level_count(arr, layout or OmeLayout()), "cpu")
    return sum(count_blocks(level) for level in levels)


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
