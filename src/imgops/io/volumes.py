"""TIFF stacks with tifffile: open, describe, read chunks of whole slices, write pages.

Accepted input: plain multi-page TIFF, ImageJ hyperstacks, OME-TIFF and tifffile "shaped" files,
uncompressed or compressed (zlib/deflate needs nothing more; LZW, JPEG, Zstd and the rest go
through the optional `imagecodecs` package), tiled or stripped, and 2-D images (one slice).
Every volume is seen as (Z, Y, X) with dtype uint8, uint16 or int16; anything else (float data,
RGB, more than one axis beyond Y and X, pages of different shapes) is a `FileError` naming the file.

Reading never loads the whole stack: `VolumeReader.read_into(start, out)` fills a caller-owned
buffer with whole slices. Uncompressed contiguous data is read with positional reads straight
into that buffer (one copy from the page cache, like a memory map, but the pages read do not stay
resident in the process: a map's touched pages count in its RSS, which then grows with the
file until the kernel reclaims them); everything else is decoded by tifffile a chunk of
pages at a time, in parallel threads, straight into the buffer.

Writing streams pages: `write_volume(target, pages, info, dtype)` hands tifffile a page iterator, so
only the page being written is needed, and picks BigTIFF when the output can pass 4 GB.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import FileError

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "ACCEPTED_DTYPES",
    "CLASSIC_TIFF_LIMIT",
    "OUTPUT_DTYPES",
    "VolumeInfo",
    "VolumeReader",
    "needs_bigtiff",
    "open_volume",
    "output_flavour",
    "quiet_tifffile",
    "write_volume",
]

ACCEPTED_DTYPES = ("uint8", "uint16", "int16")
OUTPUT_DTYPES = ("float32", "float16")
# tifffile's own threshold for switching to BigTIFF (4 GiB less 32 MiB of headroom for IFDs/tags).
CLASSIC_TIFF_LIMIT = 2**32 - 2**25
# Generous per-page allowance for an IFD, its tags and the strip offset/count arrays.
_PAGE_OVERHEAD_BYTES = 4096
# Axes a single leading (slice) axis may carry: tifffile names it Z, T, C, I or Q (unknown).
_SLICE_AXES = "ZTCIQRHEVLP"
_BUILTIN_CODECS = {"NONE", "ADOBE_DEFLATE", "DEFLATE", "PACKBITS"}
# Threads tifffile may use to decode the pages of one chunk.
_DECODE_WORKERS = max(1, min(8, (os.cpu_count() or 1)))


@dataclass(frozen=True)
class VolumeInfo:
    """What a stack is: shape (Z, Y, X), dtype and the metadata to carry to the output."""

    path: Path
    shape: tuple[int, int, int]
    dtype: str
    axes: str
    compression: str
    contiguous_offset: int | None
    byteorder: str
    resolution: tuple[float, float] | None = None
    resolution_unit: int | None = None
    spacing: float | None = None
    unit: str | None = None
    imagej: bool = False
    ome: bool = False
    physical_sizes: dict[str, float] = field(default_factory=dict)

    @property
    def depth(self) -> int:
        """Number of slices (Z)."""
        return self.shape[0]

    @property
    def slice_bytes(self) -> int:
        """Bytes of one slice in memory (input dtype)."""
        return self.shape[1] * self.shape[2] * _itemsize(self.dtype)

    @property
    def nbytes(self) -> int:
        """Bytes of the whole stack in memory."""
        return self.depth * self.slice_bytes

    @property
    def read_mode(self) -> str:
        """`direct` (positional reads of contiguous raw data) or `pages` (tifffile decodes)."""
        return "direct" if self.contiguous_offset is not None else "pages"


def _itemsize(dtype: str) -> int:
    import numpy as np

    return np.dtype(dtype).itemsize


def _require_tifffile(path: Path):
    try:
        import tifffile
    except ImportError as error:  # pragma: no cover - tifffile is a dependency
        raise FileError(path, "reading TIFF stacks needs the 'tifffile' package") from error
    return tifffile


def _codec_available(name: str) -> bool:
    if name in _BUILTIN_CODECS:
        return True
    try:
        import imagecodecs  # noqa: F401
    except ImportError:
        return False
    return True


def _ome_physical_sizes(ome_xml: str | None) -> dict[str, float]:
    """PhysicalSizeX/Y/Z (and their units) of the first OME Pixels element, if any."""
    if not ome_xml:
        return {}
    try:
        root = ET.fromstring(ome_xml)
    except ET.ParseError:
        return {}
    for element in root.iter():
        if element.tag.endswith("Pixels"):
            sizes: dict[str, Any] = {}
            for key, value in element.attrib.items():
                if key.startswith("PhysicalSize"):
                    try:
                        sizes[key] = value if key.endswith("Unit") else float(value)
                    except ValueError:
                        continue
            return sizes
    return {}


def _check_pages(path: Path, tif) -> None:
    if len(tif.series) <= 1:
        return
    first = tif.series[0]
    for other in tif.series[1:]:
        if other.shape[-2:] != first.shape[-2:] or other.dtype != first.dtype:
            where = other.pages[0].index if other.pages and other.pages[0] is not None else "?"
            raise FileError(
                path,
                f"pages of different shapes or types: page 0 is {_describe(first)}, "
                f"page {where} is {_describe(other)}; a stack needs identical pages",
            )
    raise FileError(path, f"holds {len(tif.series)} image series; normvol reads single stacks")


def _describe(series) -> str:
    return f"{'x'.join(str(n) for n in series.shape[-2:])} {series.dtype}"


def _volume_shape(path: Path, shape: tuple[int, ...], axes: str) -> tuple[int, int, int]:
    """(Z, Y, X) from the series shape; squeezes length-1 axes and rejects anything beyond Z."""
    if "S" in axes and shape[axes.index("S")] > 1:
        samples = shape[axes.index("S")]
        raise FileError(path, f"has {samples} samples per pixel (RGB/colour); normvol needs gray")
    kept = [(n, a) for n, a in zip(shape, axes, strict=True) if n > 1 or a in "YX"]
    kept_axes = "".join(a for _, a in kept)
    if not kept_axes.endswith("YX") or len(kept) > 3:
        dims = "x".join(str(n) for n, _ in kept)
        raise FileError(
            path,
            f"has shape {dims} (axes {kept_axes}); normvol reads 2-D images or 3-D stacks "
            "with one axis beyond Y and X",
        )
    if len(kept) == 2:
        return (1, kept[0][0], kept[1][0])
    return (kept[0][0], kept[1][0], kept[2][0])


def _output_axes(axes: str, shape: tuple[int, ...]) -> str:
    kept = "".join(a for n, a in zip(shape, axes, strict=True) if n > 1 or a in "YX")
    if len(kept) == 2:
        return "ZYX"
    return ("Z" if kept[0] in "QI" else kept[0]) + "YX"


def describe_volume(path: Path, tif) -> VolumeInfo:
    """A VolumeInfo for an open tifffile.TiffFile; raises FileError for unsupported stacks."""
    import numpy as np

    if not tif.series or not tif.pages:
        raise FileError(path, "holds no images")
    _check_pages(path, tif)
    series = tif.series[0]
    dtype = np.dtype(series.dtype)
    if dtype.newbyteorder("=").name not in ACCEPTED_DTYPES:
        raise FileError(
            path, f"has {dtype.name} pixels; normvol reads {', '.join(ACCEPTED_DTYPES)} stacks"
        )
    shape = _volume_shape(path, tuple(series.shape), series.axes)
    _check_declared_size(path, shape)
    page = series.keyframe
    compression = page.compression.name
    if not _codec_available(compression):
        raise FileError(
            path,
            f"is {compression}-compressed; reading it needs the 'imagecodecs' package "
            "(pip install imagecodecs)",
        )
    offset = series.dataoffset if compression == "NONE" else None
    if offset is not None and not _contiguous_data_plausible(page, int(offset), shape, dtype):
        offset = None  # damaged offsets: let tifffile read page by page (and report the damage)
    resolution = tuple(float(v) for v in page.resolution) if page.resolution else None
    meta = tif.imagej_metadata or {}
    spacing = meta.get("spacing")
    return VolumeInfo(
        path=path,
        shape=shape,
        dtype=dtype.newbyteorder("=").name,
        axes=_output_axes(series.axes, tuple(series.shape)),
        compression=compression,
        contiguous_offset=int(offset) if offset is not None else None,
        byteorder=tif.byteorder,
        resolution=resolution if resolution and resolution != (1.0, 1.0) else None,
        resolution_unit=int(page.resolutionunit) if resolution else None,
        spacing=float(spacing) if spacing is not None else None,
        unit=meta.get("unit"),
        imagej=bool(tif.is_imagej),
        ome=bool(tif.is_ome),
        physical_sizes=_ome_physical_sizes(tif.ome_metadata) if tif.is_ome else {},
    )


def _contiguous_data_plausible(page, offset: int, shape, dtype) -> bool:
    """The direct path reads shape's bytes from `offset`: only when the first page's strips
    start there (past the header), are contiguous and hold one slice. (A file that ends early
    is still read directly: the read then reports it as truncated.)"""
    slice_bytes = shape[1] * shape[2] * dtype.itemsize
    offsets, counts = tuple(page.dataoffsets), tuple(page.databytecounts)
    if offset < 8 or not offsets or offsets[0] != offset or sum(counts) != slice_bytes:
        return False
    return all(o + c == n for o, c, n in zip(offsets, counts, offsets[1:], strict=False))


def _check_declared_size(path: Path, shape: tuple[int, int, int]) -> None:
    """Refuses slices over the image pixel limit (a header claiming huge dimensions: a bomb)."""
    from .images import MAX_PIXELS_ENV, default_max_pixels

    pixels, limit = shape[1] * shape[2], default_max_pixels()
    if pixels > limit:
        raise FileError(
            path,
            f"slices are {shape[2]}x{shape[1]} ({pixels} pixels), over the limit of {limit} "
            f"pixels (set {MAX_PIXELS_ENV} to raise it)",
        )


class VolumeReader:
    """An open TIFF stack that reads whole slices into caller-owned buffers (a context manager)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        tifffile = _require_tifffile(self.path)
        if not self.path.exists():
            raise FileError(self.path, "no such file")
        if self.path.is_dir():
            raise FileError(self.path, "is a directory, not a TIFF stack")
        try:
            self._tif = tifffile.TiffFile(self.path)
        except MemoryError as error:
            raise FileError(self.path, "not a readable TIFF (out of memory parsing it)") from error
        except Exception as error:  # a damaged file can make the parser raise anything
            raise FileError(self.path, f"not a readable TIFF ({_reason(error)})") from error
        try:
            self.info = describe_volume(self.path, self._tif)
            self._series = self._tif.series[0]
            self._fd = os.open(self.path, os.O_RDONLY) if self.info.read_mode == "direct" else None
        except BaseException as error:
            self._tif.close()
            if isinstance(error, FileError) or not isinstance(error, Exception):
                raise
            raise FileError(self.path, f"not a readable TIFF ({_reason(error)})") from error

    def __enter__(self) -> VolumeReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Closes the file."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._tif.close()

    def read_into(self, start: int, out: np.ndarray) -> None:
        """Fills `out` ((k, Y, X), the volume's dtype, contiguous) with slices start..start+k."""
        count = out.shape[0]
        if start < 0 or start + count > self.info.depth or out.shape[1:] != self.info.shape[1:]:
            raise ValueError(f"slices {start}..{start + count} out of a {self.info.shape} stack")
        try:
            if self._fd is not None:
                self._read_direct(start, out)
            else:
                self._read_pages(start, out)
        except FileError:
            raise
        except Exception as error:  # damaged data can make the decoders raise anything
            raise FileError(
                self.path, f"cannot read slices {start}..{start + count}: {_reason(error)}"
            ) from error

    def read(self, start: int, stop: int) -> np.ndarray:
        """Slices start..stop as a new array (convenience; the engine uses read_into)."""
        import numpy as np

        out = np.empty((stop - start, *self.info.shape[1:]), dtype=self.info.dtype)
        self.read_into(start, out)
        return out

    def _read_direct(self, start: int, out: np.ndarray) -> None:
        view = memoryview(out).cast("B")
        position = self.info.contiguous_offset + start * self.info.slice_bytes
        done = 0
        while done < len(view):
            got = os.preadv(self._fd, [view[done:]], position + done)
            if got == 0:
                raise FileError(self.path, "file is truncated (image data ends early)")
            done += got
        if self.info.byteorder != _native_byteorder() and out.dtype.itemsize > 1:
            out.byteswap(inplace=True)

    def _read_pages(self, start: int, out: np.ndarray) -> None:
        """tifffile decodes the pages (in parallel threads; zlib and friends release the GIL)."""
        self._check_strips(start, out.shape[0])
        self._tif.asarray(
            key=range(start, start + out.shape[0]), series=0, out=out, maxworkers=_DECODE_WORKERS
        )

    def _check_strips(self, start: int, count: int) -> None:
        """Refuses pages whose data would come from the file header or from past its end
        (tifffile reads what the offsets say; a damaged offset would give wrong pixels)."""
        size = self._tif.filehandle.size
        pages = self._series.pages
        for index in range(start, start + count):
            page = pages[index] if index < len(pages) else None
            if page is None:  # a shaped series of contiguous pages lists only the first
                continue
            for offset, length in zip(page.dataoffsets, page.databytecounts, strict=False):
                if length and (offset < 8 or offset + length > size):
                    raise FileError(
                        self.path,
                        f"is damaged: slice {index} claims image data at bytes "
                        f"{offset}..{offset + length} of a {size}-byte file",
                    )


def quiet_tifffile() -> None:
    """Silences tifffile's own warnings on stderr (imgops reports each failure in one line)."""
    import logging

    logging.getLogger("tifffile").setLevel(logging.CRITICAL)


def _reason(error: BaseException) -> str:
    """One line saying what went wrong (tifffile's and zlib's messages can span lines)."""
    text = " ".join(str(error).split())
    if len(text) > 200:
        text = text[:197] + "..."
    kind = type(error).__name__
    if not text:
        return kind
    if isinstance(error, (OSError, ValueError)):  # their messages say what they are
        return text
    return f"{kind}: {text}"  # IndexError: index 1 out of range, ...


def _native_byteorder() -> str:
    import sys

    return "<" if sys.byteorder == "little" else ">"


def open_volume(path: str | os.PathLike[str]) -> VolumeReader:
    """Opens a TIFF stack for chunked reading; raises FileError (naming the file) if unsupported.

    Example:
        >>> with open_volume("scan.tif") as reader:
        ...     first = reader.read(0, 4)
    """
    return VolumeReader(path)


def needs_bigtiff(data_bytes: int, pages: int) -> bool:
    """True when image data plus per-page overhead could pass the classic TIFF 4 GB limit."""
    return data_bytes + pages * _PAGE_OVERHEAD_BYTES > CLASSIC_TIFF_LIMIT


def output_flavour(info: VolumeInfo, dtype: str, bigtiff: bool) -> str:
    """How to write the output: `imagej`, `ome` or `shaped` (tifffile's JSON description).

    ImageJ input stays ImageJ when ImageJ can hold the result (float32, classic TIFF);
    OME input stays OME for float32 (OME has no float16); everything else is shaped, which
    keeps axes, spacing and unit in its JSON description.
    """
    if info.imagej and dtype == "float32" and not bigtiff:
        return "imagej"
    if info.ome and dtype == "float32":
        return "ome"
    return "shaped"


def _write_options(info: VolumeInfo, dtype: str, flavour: str) -> dict[str, Any]:
    options: dict[str, Any] = {"dtype": dtype, "shape": info.shape}
    metadata: dict[str, Any] = {"axes": info.axes}
    if info.resolution:
        options["resolution"] = info.resolution
        if flavour != "imagej" and info.resolution_unit:
            options["resolutionunit"] = info.resolution_unit
    if flavour == "ome":
        metadata.update(info.physical_sizes)
    else:
        if info.spacing is not None:
            metadata["spacing"] = info.spacing
        if info.unit is not None:
            metadata["unit"] = info.unit
        if flavour == "shaped" and info.physical_sizes:
            metadata.update(info.physical_sizes)
    if flavour != "imagej":
        options["photometric"] = "minisblack"
    options["metadata"] = metadata
    return options


def write_volume(
    target: str | os.PathLike[str],
    pages: Iterable[np.ndarray],
    info: VolumeInfo,
    dtype: str = "float32",
) -> str:
    """Writes `pages` (info.depth (Y, X) arrays of `dtype`) as one stack; returns the flavour.

    Pages are consumed one at a time, so memory stays one page (tifffile writes each as it comes).
    Axes, resolution and ImageJ spacing/unit of `info` are carried over; BigTIFF when needed.
    """
    import numpy as np
    import tifffile

    if dtype not in OUTPUT_DTYPES:
        raise ValueError(f"output dtype must be one of {OUTPUT_DTYPES}, got {dtype!r}")
    data_bytes = info.depth * info.shape[1] * info.shape[2] * np.dtype(dtype).itemsize
    bigtiff = needs_bigtiff(data_bytes, info.depth)
    flavour = output_flavour(info, dtype, bigtiff)
    options = _write_options(info, dtype, flavour)
    with tifffile.TiffWriter(
        target, bigtiff=bigtiff, imagej=flavour == "imagej", ome=flavour == "ome"
    ) as writer:
        writer.write(_checked_pages(pages, info, dtype), **options)
    return flavour


def _checked_pages(pages: Iterable[np.ndarray], info: VolumeInfo, dtype: str) -> Iterator:
    count = 0
    for page in pages:
        if page.shape != info.shape[1:] or page.dtype.name != dtype:
            raise ValueError(f"page {count}: expected {info.shape[1:]} {dtype}, got {page.shape}")
        count += 1
        yield page
    if count != info.depth:
        raise ValueError(f"expected {info.depth} pages, got {count}")
