"""Zarr and OME-Zarr (OME-NGFF 0.4/0.5): read volumes from .zarr stores, write normalised
volumes as OME-Zarr images with a multiscale pyramid built while streaming.

Reading: a plain Zarr array (axes from `dimension_names` or xarray's `_ARRAY_DIMENSIONS`;
without names, one axis before Y, X counts as Z) or an OME-Zarr image (level 0 of its first
multiscale; axes and physical scale from its metadata). Planes are read a run at a time.

Writing (`OmeZarrWriter`): the NGFF axis order (t, c, z, y, x: axes the volume lacks are left
out), chunks of (1, 1, cz, <=512, <=512) compressed with zstd level 1 (or blosc/zlib/none), the
pyramid halving Y and X per level with `imgops.ops.bin` as each block of cz planes completes,
so memory stays a few blocks. Scale from the physical sizes, `omero` channel windows.
The store is written under a hidden temporary name (`atomic_store`) and renamed into place at
the end; the NGFF `multiscales` metadata is written last, so an interrupted write never leaves
a store that looks like a complete image (only a hidden `.NAME.imgops-tmp-*` folder, which
the next run writing a store into that folder removes once its writer is dead).
"""

from __future__ import annotations

import collections
import contextlib
import math
import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import FileError
from ..volume.stream import release_free_heap
from .ome import ngff_attributes
from .volumes import KNOWN_AXES, VolumeInfo

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "OmeZarrWriter",
    "ZarrReader",
    "atomic_store",
    "default_levels",
    "is_zarr_path",
    "open_zarr_volume",
    "remove_stale_stores",
    "stale_stores",
]

TEMP_MARKER = ".imgops-tmp-"
ZARR_COMPRESSIONS = ("zstd", "blosc", "zlib", "none")
_CHUNK_BYTES = 4 << 20  # uncompressed bytes per chunk, about
_BLOCK_BUFFER_BYTES = 256 << 20  # planes held while blocks of cz planes fill up, at most
_TILE = 512
_BLOCKS_AT_ONCE = 2  # blocks (each with its pyramid levels) being compressed and written at once
_CHUNK_WRITERS = 12  # chunks compressed and stored at once (at most; fewer on fewer cores)


def is_zarr_path(path: Path) -> bool:
    """True for a .zarr path, or a folder holding zarr metadata."""
    path = Path(path)
    if path.name.lower().rstrip("/").endswith(".zarr"):
        return True
    return path.is_dir() and any((path / n).exists() for n in ("zarr.json", ".zarray", ".zgroup"))


# ------------------------------------------------------------------------------ reading


class ZarrReader:
    """An open Zarr array / OME-Zarr image that reads whole planes (the VolumeReader interface)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        import numpy as np
        import zarr

        self.path = Path(path)
        if not self.path.exists():
            raise FileError(self.path, "no such file")
        try:
            node = zarr.open(self.path, mode="r")
        except Exception as error:
            raise FileError(self.path, f"not a readable Zarr store ({_reason(error)})") from error
        attrs = dict(node.attrs)
        ome = attrs.get("ome", attrs)
        scale: dict[str, float] = {}
        units: dict[str, str] = {}
        if isinstance(node, zarr.Group):
            multiscales = ome.get("multiscales")
            if not multiscales:
                raise FileError(self.path, "is a Zarr group without OME-NGFF multiscales")
            first = multiscales[0]
            names = [a["name"] if isinstance(a, dict) else a for a in first.get("axes", [])]
            dataset = first["datasets"][0]
            try:
                array = node[dataset["path"]]
            except Exception as error:
                raise FileError(
                    self.path, f"multiscale level 0 is missing ({_reason(error)})"
                ) from error
            for transform in dataset.get("coordinateTransformations", []):
                if transform.get("type") == "scale":
                    scale = dict(zip([n.upper() for n in names], transform["scale"], strict=False))
            for axis in first.get("axes", []):
                if isinstance(axis, dict) and axis.get("unit"):
                    units[axis["name"].upper()] = axis["unit"]
        else:
            array = node
            names = list(getattr(array.metadata, "dimension_names", None) or [])
            names = names or list(attrs.get("_ARRAY_DIMENSIONS", []))
        self._array = array
        axes = "".join(str(n).upper()[:1] for n in names) if names else ""
        shape = tuple(int(n) for n in array.shape)
        if not axes:
            axes = {2: "YX", 3: "ZYX"}.get(len(shape), "")
            if not axes:
                raise FileError(
                    self.path, f"has {len(shape)} unnamed axes; name them (dimension_names)"
                )
        if len(axes) != len(shape) or not axes.endswith("YX"):
            raise FileError(self.path, f"has axes {axes or '?'} for shape {shape}; need ...YX")
        unknown = sorted({a for a in axes[:-2] if a not in KNOWN_AXES})
        if unknown or len(set(axes)) != len(axes):
            raise FileError(
                self.path,
                f"has axes {axes}; imgops knows T, Z and C before Y and X "
                f"(unknown: {', '.join(unknown) or 'a repeated axis'})",
            )
        dtype = np.dtype(array.dtype).newbyteorder("=").name
        from .volumes import ACCEPTED_DTYPES

        if dtype not in ACCEPTED_DTYPES:
            raise FileError(
                self.path, f"has {dtype} pixels; imgops reads {', '.join(ACCEPTED_DTYPES)}"
            )
        physical = {}
        for axis in "XYZ":
            if axis in scale and axis in axes:
                physical[f"PhysicalSize{axis}"] = float(scale[axis])
                if axis in units:
                    physical[f"PhysicalSize{axis}Unit"] = units[axis]
        windows = None
        omero = ome.get("omero") if isinstance(node, zarr.Group) else None
        if omero and "C" in axes and len(omero.get("channels", [])) == shape[axes.index("C")]:
            windows = tuple(
                (float(c["window"]["start"]), float(c["window"]["end"])) for c in omero["channels"]
            )
        self._lead = shape[:-2]
        self.info = VolumeInfo(
            path=self.path,
            shape=(math.prod(self._lead), shape[-2], shape[-1]),
            dtype=dtype,
            axes=axes,
            sizes=shape,
            compression=_codec_names(array),
            contiguous_offset=None,
            byteorder="=",
            physical_sizes=physical,
            ranges=windows,
            source="zarr",
        )

    def __enter__(self) -> ZarrReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Nothing to close (zarr stores hold no handles)."""

    def read_into(self, start: int, out: np.ndarray) -> None:
        """Fills `out` ((k, Y, X)) with planes start..start+k, a run of the last leading axis at
        a time."""
        import numpy as np

        count = out.shape[0]
        if start < 0 or start + count > self.info.depth or out.shape[1:] != self.info.shape[1:]:
            raise ValueError(f"planes {start}..{start + count} out of a {self.info.shape} stack")
        try:
            if not self._lead:
                out[0] = self._array[...]
                return
            inner = self._lead[-1]
            done = 0
            while done < count:
                plane = start + done
                index = [int(v) for v in np.unravel_index(plane, self._lead)]
                run = min(count - done, inner - index[-1])
                out[done : done + run] = self._array[
                    (*index[:-1], slice(index[-1], index[-1] + run))
                ]
                done += run
        except Exception as error:  # a damaged chunk can make the codecs raise anything
            raise FileError(
                self.path, f"cannot read planes {start}..{start + count}: {_reason(error)}"
            ) from error

    def read(self, start: int, stop: int) -> np.ndarray:
        """Planes start..stop as a new array."""
        import numpy as np

        out = np.empty((stop - start, *self.info.shape[1:]), dtype=self.info.dtype)
        self.read_into(start, out)
        return out


def _codec_names(array) -> str:
    try:
        codecs = list(array.compressors) or ["none"]
    except Exception:
        return "zarr"
    return "+".join(type(c).__name__.replace("Codec", "").upper() for c in codecs)


def _reason(error: BaseException) -> str:
    text = " ".join(str(error).split())[:200]
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def open_zarr_volume(path: str | os.PathLike[str]) -> ZarrReader:
    """Opens a Zarr array or OME-Zarr image for chunked reading; FileError if unsupported."""
    return ZarrReader(path)


# ------------------------------------------------------------------------------ writing


def default_levels(height: int, width: int, smallest: int = 256) -> int:
    """Pyramid levels: halve Y and X until the larger side is at most `smallest` pixels."""
    levels = 1
    while max(height, width) > smallest and min(height, width) >= 2:
        height, width, levels = height // 2, width // 2, levels + 1
    return levels


def _physical_scale(info: VolumeInfo) -> tuple[dict[str, float], dict[str, str | None]]:
    sizes, units = {}, {}
    p = info.physical_sizes
    for axis in "XY":
        if f"PhysicalSize{axis}" in p:
            sizes[axis] = float(p[f"PhysicalSize{axis}"])
            units[axis] = p.get(f"PhysicalSize{axis}Unit", "µm")
        elif info.resolution:
            resolution = info.resolution[0 if axis == "X" else 1]
            if resolution > 0:
                sizes[axis] = 1.0 / resolution
                units[axis] = info.unit
    if "PhysicalSizeZ" in p:
        sizes["Z"] = float(p["PhysicalSizeZ"])
        units["Z"] = p.get("PhysicalSizeZUnit", "µm")
    elif info.spacing:
        sizes["Z"] = info.spacing
        units["Z"] = info.unit
    finterval = info.imagej_extra.get("finterval") if info.imagej_extra else None
    if "TimeIncrement" in p or finterval:
        sizes["T"] = float(p.get("TimeIncrement", finterval))
        units["T"] = p.get("TimeIncrementUnit", "s")
    return sizes, units


def _compressors(compression: str, zarr_format: int):
    if compression not in ZARR_COMPRESSIONS:
        raise ValueError(
            f"Zarr compression must be one of {ZARR_COMPRESSIONS}, got {compression!r}"
        )
    if compression == "none":
        return None
    if zarr_format == 2:
        import numcodecs

        return {
            "zstd": numcodecs.Zstd(level=1),
            "blosc": numcodecs.Blosc(cname="zstd", clevel=1, shuffle=numcodecs.Blosc.SHUFFLE),
            "zlib": numcodecs.Zlib(level=1),
        }[compression]
    from zarr.codecs import BloscCodec, GzipCodec, ZstdCodec

    return [
        {
            "zstd": ZstdCodec(level=1),
            "blosc": BloscCodec(cname="zstd", clevel=1, shuffle="shuffle"),
            "zlib": GzipCodec(level=1),
        }[compression]
    ]


def downsample_yx(block: np.ndarray) -> np.ndarray:
    """One pyramid step: the 2x2 block mean over Y and X (`imgops.ops.bin`, on the CPU)."""
    import torch

    from .. import ops

    if not hasattr(ops, "bin"):
        raise RuntimeError(
            "OME-Zarr pyramids need imgops.ops.bin, which this build lacks; use --pyramid 1"
        )
    return ops.bin(torch.from_numpy(block), [2, 2]).numpy()


class OmeZarrWriter:
    """Writes a volume's planes (in file order) as an OME-Zarr image with a pyramid."""

    def __init__(
        self,
        path: Path,
        info: VolumeInfo,
        dtype: str,
        *,
        compression: str = "zstd",
        levels: int | None = None,
        windows: Iterable[tuple[float, float]] | None = None,
        name: str = "",
        ngff_version: str = "0.5",
        chunk_bytes: int = _CHUNK_BYTES,
        blocks_at_once: int | None = None,
    ) -> None:
        import numpy as np

        self.path, self.info, self.dtype = Path(path), info, dtype
        self.zarr_format = 3 if ngff_version == "0.5" else 2
        self.ngff_version = ngff_version
        self.compression = "zstd" if compression == "auto" else compression
        _compressors(self.compression, self.zarr_format)  # validates
        lead_axes, lead_sizes = info.axes[:-2], info.sizes[:-2]
        self.lead_axes, self.lead_sizes = lead_axes, tuple(lead_sizes)
        self.axes = "".join(a for a in "TCZ" if a in lead_axes) + "YX"
        self.height, self.width = info.shape[1], info.shape[2]
        self.levels = levels or default_levels(self.height, self.width)
        self.windows = list(windows) if windows is not None else None
        self.name = name or info.path.name
        itemsize = np.dtype(dtype).itemsize
        tile_y, tile_x = min(self.height, _TILE), min(self.width, _TILE)
        depth = lead_sizes[lead_axes.index("Z")] if "Z" in lead_axes else 1
        # planes inside Z in file order (e.g. C in ZCYX) fill their blocks at the same time
        inner = math.prod(lead_sizes[lead_axes.index("Z") + 1 :]) if "Z" in lead_axes else 1
        plane_bytes = self.height * self.width * itemsize
        cz = max(1, min(depth, chunk_bytes // max(1, tile_y * tile_x * itemsize), 64))
        cz = max(1, min(cz, _BLOCK_BUFFER_BYTES // max(1, inner * plane_bytes)))
        self.chunk_depth = cz
        # one chunk layer per write: 4 layers per write measured slower and 15 % more RSS
        self.block_depth = cz
        self.tile = (tile_y, tile_x)
        self.blocks_at_once = max(1, int(blocks_at_once or _BLOCKS_AT_ONCE))
        self.chunk_writers = max(1, min(_CHUNK_WRITERS, os.cpu_count() or 1))
        self.inner = inner
        self._block_shape = (cz, self.height, self.width)
        chunk = cz * tile_y * tile_x * itemsize
        # the blocks filling up (one per plane index inside Z) and those being written, with
        # their pyramid levels (a third more), and per chunk writer a contiguous chunk and its
        # compressed bytes: what the writer holds at most (taken off the engine's budget)
        self.buffer_bytes = (inner + self.blocks_at_once) * cz * plane_bytes * 4 // 3
        self.buffer_bytes += self.chunk_writers * 2 * chunk

    def _level_shape(self, level: int) -> tuple[int, ...]:
        lead = tuple(self.lead_sizes[self.lead_axes.index(a)] for a in self.axes[:-2])
        return (*lead, self.height >> level, self.width >> level)

    def _create(self):
        import zarr

        group = zarr.open_group(self.path, mode="w-", zarr_format=self.zarr_format)
        compressors = _compressors(self.compression, self.zarr_format)
        arrays = []
        for level in range(self.levels):
            shape = self._level_shape(level)
            lead_chunks = tuple(self.chunk_depth if a == "Z" else 1 for a in self.axes[:-2])
            chunks = (*lead_chunks, min(self.tile[0], shape[-2]), min(self.tile[1], shape[-1]))
            options: dict[str, Any] = {
                "shape": shape,
                "chunks": chunks,
                "dtype": self.dtype,
                "fill_value": 0,
                "compressors": compressors,
            }
            if self.zarr_format == 3:
                options["dimension_names"] = [a.lower() for a in self.axes]
            else:
                options["chunk_key_encoding"] = {"name": "v2", "separator": "/"}
            arrays.append(group.create_array(str(level), **options))
        return group, arrays

    def write_pages(self, pages: Iterable[np.ndarray]) -> None:
        """Consumes every page (file order), writes blocks of cz planes and their pyramid levels,
        then the NGFF metadata (last)."""
        import numpy as np

        if self.levels > 1 and min(self.height, self.width) >= 2:
            downsample_yx(np.zeros((1, 2, 2), self.dtype))  # fails now, not after the first block
        group, arrays = self._create()
        self._buffers = _BlockBuffers(self._block_shape, self.dtype)
        with (
            _ChunkWriters(self.chunk_writers if self.blocks_at_once > 1 else 1) as chunks,
            _BlockWriter(self._write_block, arrays, self.blocks_at_once) as blocks,
        ):
            self._chunks = chunks
            self._fill_blocks(pages, blocks.submit)
        self._buffers = self._chunks = None
        group.attrs.update(self._attributes())
        release_free_heap()

    def _fill_blocks(self, pages: Iterable[np.ndarray], submit) -> None:
        """Copies the pages into blocks of cz planes; `submit(key, block)` each one complete."""
        import numpy as np

        depth = self.lead_sizes[self.lead_axes.index("Z")] if "Z" in self.lead_axes else 1
        open_blocks: dict[tuple, list] = {}
        count = 0
        for page in pages:
            index = dict(zip(self.lead_axes, np.unravel_index(count, self.lead_sizes), strict=True))
            count += 1
            z = int(index.get("Z", 0))
            z0 = z - z % self.block_depth
            key = tuple(int(index[a]) for a in self.axes[:-2] if a != "Z") + (z0,)
            entry = open_blocks.get(key)
            if entry is None:
                size = min(self.block_depth, depth - z0)
                entry = open_blocks[key] = [self._buffers.take(size), 0]
            entry[0][z - z0] = page
            entry[1] += 1
            if entry[1] == entry[0].shape[0]:
                del open_blocks[key]
                submit(key, entry[0])
        if count != self.info.depth or open_blocks:
            raise ValueError(f"expected {self.info.depth} planes, got {count}")

    def _write_block(self, arrays, key: tuple, block: np.ndarray) -> None:
        """Writes one block of cz planes and its pyramid levels, chunk by chunk on the chunk
        writers; the block's buffer is reused once every chunk is stored."""
        try:
            z0 = key[-1]
            lead = list(key[:-1])
            writes = []
            level_block = block
            for level, array in enumerate(arrays):
                if level:
                    level_block = downsample_yx(level_block)
                where = []
                fixed = iter(lead)
                for axis in self.axes[:-2]:
                    if axis == "Z":
                        where.append(slice(z0, z0 + level_block.shape[0]))
                    else:
                        index = next(fixed)
                        where.append(slice(index, index + 1))
                writes.extend(self._chunk_writes(array, tuple(where), level_block))
            self._chunks.store(writes)
        finally:
            self._buffers.give_back(block)
        # the pyramid levels and zstd's output buffers were allocated and freed by several
        # threads: without this their arenas keep them resident (measured: data RSS 150 ->
        # 115 MiB on a 1 GB stack)
        release_free_heap()

    def _chunk_writes(self, array, where: tuple, block: np.ndarray) -> list:
        """(array, region, data) for every chunk a block covers. `data` has the region's full
        shape (the length-1 lead axes included), so that zarr stores a complete chunk as it is
        (without a copy of its own) when the data is contiguous."""
        if "Z" in self.axes:  # the last lead axis (NGFF order t, c, z)
            lead = (1,) * (len(where) - 1)
        else:
            block, lead = block[0], (1,) * len(where)
        tile_y, tile_x = array.chunks[-2], array.chunks[-1]
        height, width = block.shape[-2], block.shape[-1]
        writes = []
        for y0 in range(0, height, tile_y):
            for x0 in range(0, width, tile_x):
                ys, xs = slice(y0, min(y0 + tile_y, height)), slice(x0, min(x0 + tile_x, width))
                data = block[..., ys, xs]
                writes.append((array, (*where, ys, xs), data.reshape(*lead, *data.shape)))
        return writes

    def _attributes(self) -> dict[str, Any]:
        sizes, units = _physical_scale(self.info)
        scales = []
        for level in range(self.levels):
            scale = []
            for axis in self.axes:
                value = sizes.get(axis, 1.0) if axis != "C" else 1.0
                scale.append(value * (2**level) if axis in "YX" else value)
            scales.append(scale)
        return ngff_attributes(
            axes=self.axes,
            scales=scales,
            units=units,
            windows=self.windows if "C" in self.axes or self.windows else None,
            channel_names=list(self.info.channel_names) or None,
            name=self.name,
            version=self.ngff_version,
        )


class _BlockBuffers:
    """Reused block buffers ((cz, Y, X)): the blocks filling up and those being written. No
    more are ever made than are held at once (the open blocks and `_BlockWriter`'s blocks in
    flight), and reusing them spares the allocator a fresh block per cz planes."""

    def __init__(self, shape: tuple[int, ...], dtype: str) -> None:
        import threading

        self.shape, self.dtype = shape, dtype
        self._free: list = []
        self._lock = threading.Lock()

    def take(self, depth: int) -> np.ndarray:
        """A buffer of `depth` <= cz planes (a view of a whole block buffer)."""
        import numpy as np

        with self._lock:
            whole = self._free.pop() if self._free else None
        if whole is None:
            whole = np.empty(self.shape, self.dtype)
        return whole[:depth]

    def give_back(self, block: np.ndarray) -> None:
        """Returns a buffer `take` gave (any view of it)."""
        whole = block.base if block.base is not None else block
        if whole.shape == self.shape:
            with self._lock:
                self._free.append(whole)


class _ChunkWriters:
    """Stores chunks on a few threads (`count`), each chunk's data first copied into a
    contiguous chunk buffer of that thread (reused), so that zarr encodes it without copies of
    its own. Chunks compressing at once, and their buffers, are at most `count`, whatever the
    number of blocks in flight (each block's chunks queue here)."""

    def __init__(self, count: int) -> None:
        import threading

        self.count = count
        self.pool = None
        self._local = threading.local()

    def __enter__(self) -> _ChunkWriters:
        if self.count > 1:
            from concurrent.futures import ThreadPoolExecutor

            self.pool = ThreadPoolExecutor(self.count, thread_name_prefix="imgops-chunk")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)

    def store(self, writes: list) -> None:
        """`array[where] = data` for every write; returns when all are stored (raises the
        first error, after every started write has finished)."""
        if self.pool is None:
            for write in writes:
                self._store_one(*write)
            return
        futures = [self.pool.submit(self._store_one, *write) for write in writes]
        try:
            for future in futures:
                future.result()
        finally:
            for future in futures:
                future.cancel()
            for future in futures:
                if not future.cancelled():
                    future.exception()  # waits: no write outlives the block's buffer

    def _store_one(self, array, where: tuple, data: np.ndarray) -> None:
        import numpy as np

        chunk_shape = tuple(array.chunks)
        if data.shape == chunk_shape and not data.flags.c_contiguous:
            buffers = self._local.__dict__.setdefault("buffers", {})
            key = (chunk_shape, data.dtype.str)
            buffer = buffers.get(key)
            if buffer is None:
                buffer = buffers[key] = np.empty(chunk_shape, data.dtype)
            np.copyto(buffer, data)
            data = buffer
        array[where] = data


class _BlockWriter:
    """Writes complete blocks (every pyramid level of each) on a few threads, in order of
    submission, at most `at_once` blocks in flight (so memory stays a few blocks).

    One block's level writes compress a handful of chunks (a pyramid level's block is often one
    chunk); writing several blocks at once keeps every core compressing while the next block
    fills. Blocks touch disjoint chunks, so the store is the same whatever the order. The first
    error of a write is raised by the next `submit` or at the end; on the way out every write
    still running is waited for (none outlives the temporary store).
    """

    def __init__(self, write_block, arrays, at_once: int) -> None:
        self.write_block, self.arrays, self.at_once = write_block, arrays, at_once
        self.pool = None
        self.pending: collections.deque = collections.deque()

    def __enter__(self) -> _BlockWriter:
        if self.at_once > 1:
            from concurrent.futures import ThreadPoolExecutor

            self.pool = ThreadPoolExecutor(self.at_once, thread_name_prefix="imgops-zarr")
        return self

    def submit(self, key: tuple, block: np.ndarray) -> None:
        """Writes `block` now (one at a time) or queues it, waiting while too many are queued."""
        if self.pool is None:
            self.write_block(self.arrays, key, block)
            return
        self.pending.append(self.pool.submit(self.write_block, self.arrays, key, block))
        while len(self.pending) > self.at_once or (self.pending and self.pending[0].done()):
            self.pending.popleft().result()

    def __exit__(self, kind, error, trace) -> None:
        if self.pool is None:
            return
        try:
            if kind is None:
                while self.pending:
                    self.pending.popleft().result()
        finally:
            for future in self.pending:
                future.cancel()
            self.pool.shutdown(wait=True)


@contextlib.contextmanager
def atomic_store(target: Path, *, overwrite: bool) -> Iterator[Path]:
    """Yields a hidden temporary store path beside `target`; on success it is renamed onto
    `target` (an old store is moved aside first and removed after), on any error removed.

    The temporary names are those of `imgops.io.atomic` (`.<stem>.imgops-tmp-<pid>-<hex>.zarr`),
    so a store left by a killed run is recognised: the first store this process writes into a
    folder removes the stale ones there (`remove_stale_stores`).
    """
    from .atomic import OutputExistsError, temporary_path_for

    target = Path(target)
    if not overwrite and (target.exists() or target.is_symlink()):
        raise OutputExistsError(f"{target}: output exists (use --overwrite)")
    _sweep_once(target.parent)
    temp = temporary_path_for(target)
    try:
        yield temp
        if target.exists() or target.is_symlink():
            old = temporary_path_for(target)
            os.replace(target, old)
            os.replace(temp, target)
            _remove(old)
        else:
            os.replace(temp, target)
    finally:
        _remove(temp)


def stale_stores(folder: str | os.PathLike[str], *, min_age_seconds: float | None = None) -> list:
    """Temporary Zarr stores (folders) in `folder` left by dead imgops processes and untouched
    for `min_age_seconds` (default `imgops.io.atomic.STALE_AFTER_SECONDS`)."""
    import time

    from .atomic import STALE_AFTER_SECONDS, temporary_owner

    age = STALE_AFTER_SECONDS if min_age_seconds is None else min_age_seconds
    found = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return found
    for entry in entries:
        if TEMP_MARKER not in entry.name or not entry.name.endswith(".zarr"):
            continue
        pid = temporary_owner(Path(entry.name))
        if pid is None or pid == os.getpid() or _alive(pid):
            continue
        try:
            if not entry.is_dir(follow_symlinks=False):
                continue
            newest = max(entry.stat(follow_symlinks=False).st_mtime, _newest_metadata(entry.path))
        except OSError:
            continue
        if time.time() - newest >= age:
            found.append(Path(entry.path))
    return sorted(found)


def remove_stale_stores(
    folder: str | os.PathLike[str], *, min_age_seconds: float | None = None
) -> list:
    """Removes the stale temporary stores of `folder` (see `stale_stores`); returns them."""
    removed = []
    for path in stale_stores(folder, min_age_seconds=min_age_seconds):
        _remove(path)
        if not path.exists():
            removed.append(path)
    return removed


_swept: set[str] = set()


def _sweep_once(folder: Path) -> None:
    key = os.path.abspath(folder)
    if key not in _swept:
        _swept.add(key)
        remove_stale_stores(folder)


def _newest_metadata(store: str) -> float:
    """The newest mtime of a store's top level and its arrays' folders (chunks land there)."""
    newest = 0.0
    with contextlib.suppress(OSError):
        for entry in os.scandir(store):
            newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
    return newest


def _alive(pid: int) -> bool:
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, owned by someone else
        return True
    return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
