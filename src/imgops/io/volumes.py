"""TIFF stacks with tifffile: open, describe, read chunks of whole planes, write pages.

Accepted input: plain multi-page TIFF, ImageJ hyperstacks, OME-TIFF and tifffile "shaped" files,
with any codec tifffile reads (zlib/deflate/packbits built in; LZW, Zstd, JPEG, JPEG 2000,
WebP, LERC, ... through `imagecodecs`, a dependency; `codec_status()` says which work), tiled or
stripped, classic or BigTIFF, and 2-D images. Pixel types: uint8, uint16, int16, uint32, int32,
float16, float32. Axes come from the ImageJ/OME/shaped metadata (`series.axes`): any of T, Z and
C before Y and X (TZCYX, ZCYX, CZYX, ...; one unnamed leading axis counts as Z). Planar
(separate) samples count as channels; interleaved RGB and other axes are refused. A file with
several series of different shapes is refused; of one series, all its pages are the volume.

Every volume is seen by the engine as N planes (Y, X) in file order (N = product of the axes
before Y and X). Reading never loads the whole stack: `VolumeReader.read_into(start, out)`
fills a caller-owned buffer with whole planes. Uncompressed contiguous data is read with
positional reads straight into that buffer; compressed pages are decoded by tifffile, a chunk
of pages at a time, in parallel threads, straight into the buffer; planar samples are read
through `tifffile.aszarr`, plane by plane. A page may hold several planes: tifffile writes a
shaped stack whose third-last length is 3 or 4 (or whose last one is) as RGB pages, planar or
interleaved, though its metadata names gray axes (`metadata={"axes": "ZYX"}`); those planes are
the page's samples, in file order, and are read as such.

Writing streams pages: `write_volume(target, pages, info, dtype, ...)` hands tifffile a page
iterator, so only the page being written is needed, and picks BigTIFF when the output can pass
4 GB. The input's axes, resolution, ImageJ spacing/unit/Info/Labels/LUTs, display ranges and
OME-XML (with the pixel type updated) are carried to the output; a 2-D input stays 2-D.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import FileError
from .ome import ome_channel_names, ome_physical_sizes, ome_xml_for_output

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "ACCEPTED_DTYPES",
    "CLASSIC_TIFF_LIMIT",
    "COMPRESSIONS",
    "OUTPUT_DTYPES",
    "VolumeInfo",
    "VolumeReader",
    "codec_status",
    "needs_bigtiff",
    "open_volume",
    "output_flavour",
    "quiet_tifffile",
    "write_volume",
]

ACCEPTED_DTYPES = ("uint8", "uint16", "int16", "uint32", "int32", "float16", "float32")
OUTPUT_DTYPES = ("float32", "float16")
COMPRESSIONS = ("none", "zlib", "zstd", "lzw")
# ImageJ 1.x reads uncompressed, deflate and LZW TIFF (not zstd).
IMAGEJ_COMPRESSIONS = ("none", "zlib", "lzw")
# tifffile's own threshold for switching to BigTIFF (4 GiB less 32 MiB of headroom for IFDs/tags).
CLASSIC_TIFF_LIMIT = 2**32 - 2**25
# Generous per-page allowance for an IFD, its tags and the strip offset/count arrays.
_PAGE_OVERHEAD_BYTES = 4096
KNOWN_AXES = "TZC"
_BUILTIN_CODECS = {"NONE", "ADOBE_DEFLATE", "DEFLATE", "PACKBITS"}
# Threads tifffile may use to decode the pages of one chunk.
_DECODE_WORKERS = max(1, min(8, (os.cpu_count() or 1)))
# ImageJ metadata carried to the output as it is (Ranges/min/max are remapped).
_IMAGEJ_KEPT = ("Info", "Labels", "LUTs", "Properties", "finterval", "fps", "loop", "mode")
# TIFF codecs named by tifffile and the imagecodecs codec that decodes each.
_CODECS = {
    "LZW": "LZW",
    "ZSTD": "ZSTD",
    "JPEG": "JPEG8",
    "JPEG2000": "JPEG2K",
    "JPEGXL": "JPEGXL",
    "JPEGXR": "JPEGXR",
    "LZMA": "LZMA",
    "WEBP": "WEBP",
    "PNG": "PNG",
    "LERC": "LERC",
    "DEFLATE": "ZLIB",
    "ADOBE_DEFLATE": "ZLIB",
    "PACKBITS": "PACKBITS",
}


def codec_status() -> dict[str, bool]:
    """For `imgops doctor`: which TIFF codecs can be decoded here (name -> usable)."""
    try:
        import imagecodecs
    except ImportError:
        imagecodecs = None
    status = {}
    for tiff_name, codec in _CODECS.items():
        if tiff_name in _BUILTIN_CODECS:
            status[tiff_name] = True
            continue
        status[tiff_name] = bool(
            imagecodecs is not None and getattr(getattr(imagecodecs, codec, None), "available", 0)
        )
    return status


@dataclass(frozen=True)
class VolumeInfo:
    """What a stack is: planes (N, Y, X), its axes and dtype, and the metadata to carry over."""

    path: Path
    shape: tuple[int, int, int]  # (planes, Y, X): what the engine streams
    dtype: str
    axes: str  # every axis of the output, ending in YX ("YX" for a 2-D image)
    sizes: tuple[int, ...]  # the length of each of `axes`
    compression: str
    contiguous_offset: int | None
    byteorder: str
    resolution: tuple[float, float] | None = None
    resolution_unit: int | None = None
    spacing: float | None = None
    unit: str | None = None
    imagej: bool = False
    ome: bool = False
    physical_sizes: dict[str, Any] = field(default_factory=dict)
    imagej_extra: dict[str, Any] = field(default_factory=dict)  # Info, Labels, LUTs, ...
    ranges: tuple[tuple[float, float], ...] | None = None  # display range per channel
    ome_xml: str | None = None
    channel_names: tuple[str, ...] = ()
    planar: bool = False  # separate samples read as channels (through tifffile.aszarr)
    page_planes: int = 1  # planes each TIFF page holds (more: a shaped stack stored as RGB pages)
    source: str = "tiff"  # or "zarr"

    @property
    def depth(self) -> int:
        """Number of planes."""
        return self.shape[0]

    @property
    def channels(self) -> int:
        """Length of the C axis (1 without one)."""
        return self.sizes[self.axes.index("C")] if "C" in self.axes else 1

    @property
    def slice_bytes(self) -> int:
        """Bytes of one plane in memory (input dtype)."""
        return self.shape[1] * self.shape[2] * _itemsize(self.dtype)

    @property
    def nbytes(self) -> int:
        """Bytes of the whole stack in memory."""
        return self.depth * self.slice_bytes

    @property
    def read_mode(self) -> str:
        """`direct` (positional reads of raw data), `pages` (tifffile decodes) or `zarr`."""
        if self.planar or self.source == "zarr":
            return "zarr"
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


def _check_series(path: Path, tif) -> None:
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
    raise FileError(
        path,
        f"holds {len(tif.series)} image series; imgops reads files of one series "
        "(split them, e.g. with tifffile or Fiji)",
    )


def _describe(series) -> str:
    return f"{'x'.join(str(n) for n in series.shape[-2:])} {series.dtype}"


def _plane_axes(path: Path, shape: tuple[int, ...], axes: str) -> tuple[str, tuple[int, ...], bool]:
    """(axes, sizes, planar) of the volume: length-1 axes dropped, planar samples as C,
    one unnamed leading axis as Z; refuses interleaved samples and unknown axes."""
    planar = False
    if "S" in axes and shape[axes.index("S")] > 1:
        samples = shape[axes.index("S")]
        if not axes.endswith("SYX") or "C" in axes:
            raise FileError(
                path, f"has {samples} interleaved samples per pixel (RGB/colour); imgops needs gray"
            )
        planar = True
        axes = axes.replace("S", "C")
    kept = [(a, n) for a, n in zip(axes, shape, strict=True) if n > 1 or a in "YX"]
    names = "".join(a for a, _ in kept)
    if not names.endswith("YX"):
        raise FileError(path, f"has axes {axes} (shape {shape}); the last two must be Y and X")
    leading = names[:-2]
    if len(leading) == 1 and leading in "QIRHELVP":
        leading = "Z"
    unknown = sorted({a for a in leading if a not in KNOWN_AXES})
    if unknown or len(set(leading)) != len(leading):
        dims = "x".join(str(n) for _, n in kept)
        raise FileError(
            path,
            f"has axes {names} (shape {dims}); imgops knows T, Z and C before Y and X "
            f"(unknown: {', '.join(unknown) or 'a repeated axis'})",
        )
    return leading + "YX", tuple(n for _, n in kept), planar


def _check_ifd_chain(path: Path, tif, plane_pixels: int) -> None:
    """The pixel limit, from every IFD of the file (not only the first page's header): a page
    claiming more pixels than the limit, or more than the series' planes, is refused."""
    from .images import MAX_PIXELS_ENV, default_max_pixels

    limit = default_max_pixels()
    for page in tif.pages:
        if page is None:
            continue
        shape = getattr(page, "shape", ())
        pixels = math.prod(shape) if shape else 0
        samples = getattr(page, "samplesperpixel", 1) or 1
        if pixels // max(1, samples) > limit or plane_pixels > limit:
            width, height = (page.imagewidth, page.imagelength)
            raise FileError(
                path,
                f"page {page.index} is {width}x{height} ({width * height} pixels), over the limit "
                f"of {limit} pixels (set {MAX_PIXELS_ENV} to raise it)",
            )


def describe_volume(path: Path, tif) -> VolumeInfo:
    """A VolumeInfo for an open tifffile.TiffFile; raises FileError for unsupported stacks."""
    import numpy as np

    if not tif.series or not tif.pages:
        raise FileError(path, "holds no images")
    _check_series(path, tif)
    series = tif.series[0]
    dtype = np.dtype(series.dtype)
    name = dtype.newbyteorder("=").name
    if name not in ACCEPTED_DTYPES:
        raise FileError(path, f"has {dtype.name} pixels; imgops reads {', '.join(ACCEPTED_DTYPES)}")
    axes, sizes, planar = _plane_axes(path, tuple(series.shape), series.axes)
    shape = (math.prod(sizes[:-2]), sizes[-2], sizes[-1])
    _check_ifd_chain(path, tif, shape[1] * shape[2])
    page_planes = _planes_per_page(path, series, axes, sizes)
    page = series.keyframe
    compression = page.compression.name
    if not codec_status().get(compression, compression in _BUILTIN_CODECS):
        raise FileError(
            path,
            f"is {compression}-compressed and no installed codec decodes it "
            "(imagecodecs lacks it: run `imgops doctor`)",
        )
    offset = series.dataoffset if compression == "NONE" and not planar else None
    if offset is not None and not _contiguous_data_plausible(
        page, int(offset), shape, dtype, page_planes
    ):
        offset = None  # damaged offsets: let tifffile read page by page (and report the damage)
    if offset is None and not planar:  # read page by page: the series must have its pages
        _check_page_count(path, series, page_planes, axes, sizes)
    resolution = tuple(float(v) for v in page.resolution) if page.resolution else None
    meta = tif.imagej_metadata or {}
    spacing = meta.get("spacing")
    ome_xml = tif.ome_metadata if tif.is_ome else None
    channels = sizes[axes.index("C")] if "C" in axes else 1
    return VolumeInfo(
        path=path,
        shape=shape,
        dtype=name,
        axes=axes,
        sizes=sizes,
        compression=compression,
        contiguous_offset=int(offset) if offset is not None else None,
        byteorder=tif.byteorder,
        resolution=resolution if resolution and resolution != (1.0, 1.0) else None,
        resolution_unit=int(page.resolutionunit) if resolution else None,
        spacing=float(spacing) if spacing is not None else None,
        unit=meta.get("unit"),
        imagej=bool(tif.is_imagej),
        ome=bool(tif.is_ome),
        physical_sizes=ome_physical_sizes(ome_xml),
        imagej_extra={k: meta[k] for k in _IMAGEJ_KEPT if k in meta},
        ranges=_display_ranges(meta, channels),
        ome_xml=ome_xml,
        channel_names=tuple(ome_channel_names(ome_xml)),
        planar=planar,
        page_planes=page_planes,
    )


def _planes_per_page(path: Path, series, axes: str, sizes: tuple[int, ...]) -> int:
    """How many (Y, X) planes each page of the series holds, in file order: 1 for a page per
    plane; the page's samples when tifffile stored a shaped gray stack as RGB pages (a
    `metadata={"axes": "ZYX"}` stack of 3 or 4 planes, or 3 or 4 pixels wide). Refuses pages
    that do not hold whole planes."""
    page_shape = tuple(series.keyframe.shape)
    plane = sizes[-2] * sizes[-1]
    page_size = math.prod(page_shape)
    if not page_size or page_size % plane:
        raise FileError(
            path,
            f"has pages of shape {'x'.join(str(n) for n in page_shape)} that do not hold whole "
            f"{sizes[-2]}x{sizes[-1]} planes of its {axes} shape {_dims(sizes)}; "
            "imgops cannot map them",
        )
    return page_size // plane


def _check_page_count(
    path: Path, series, page_planes: int, axes: str, sizes: tuple[int, ...]
) -> None:
    """Refuses a series read page by page with too few pages for the planes it names (the
    contiguous data of the direct path needs no pages: a short file reads as truncated)."""
    planes = math.prod(sizes[:-2])
    if len(series) * page_planes < planes:
        raise FileError(
            path,
            f"has {len(series)} page(s) of {page_planes} plane(s) each for the {planes} planes "
            f"of its {axes} shape {_dims(sizes)} (damaged or inconsistent metadata)",
        )


def _dims(sizes: tuple[int, ...]) -> str:
    return "x".join(str(n) for n in sizes)


def _display_ranges(meta: dict, channels: int) -> tuple[tuple[float, float], ...] | None:
    """ImageJ display ranges per channel (`Ranges`, or `min`/`max` for one channel)."""
    ranges = meta.get("Ranges")
    if ranges is not None and len(ranges) == 2 * channels:
        return tuple((float(ranges[2 * c]), float(ranges[2 * c + 1])) for c in range(channels))
    if channels == 1 and "min" in meta and "max" in meta:
        return ((float(meta["min"]), float(meta["max"])),)
    return None


def _contiguous_data_plausible(page, offset: int, shape, dtype, page_planes: int = 1) -> bool:
    """The direct path reads shape's bytes from `offset`: only when the first page's strips
    start there (past the header), are contiguous and hold its `page_planes` planes. (A file
    that ends early is still read directly: the read then reports it as truncated.)"""
    page_bytes = page_planes * shape[1] * shape[2] * dtype.itemsize
    offsets, counts = tuple(page.dataoffsets), tuple(page.databytecounts)
    if offset < 8 or not offsets or offsets[0] != offset or sum(counts) != page_bytes:
        return False
    return all(o + c == n for o, c, n in zip(offsets, counts, offsets[1:], strict=False))


class VolumeReader:
    """An open TIFF stack that reads whole planes into caller-owned buffers (a context manager)."""

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
        self._fd = None
        self._zarr = None
        self._held_page: tuple[int, np.ndarray] | None = None  # the last page read in part
        try:
            self.info = describe_volume(self.path, self._tif)
            self._series = self._tif.series[0]
            if self.info.read_mode == "direct":
                self._fd = os.open(self.path, os.O_RDONLY)
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
        self._zarr = None
        self._held_page = None
        self._tif.close()

    def read_into(self, start: int, out: np.ndarray) -> None:
        """Fills `out` ((k, Y, X), the volume's dtype, contiguous) with planes start..start+k."""
        count = out.shape[0]
        if start < 0 or start + count > self.info.depth or out.shape[1:] != self.info.shape[1:]:
            raise ValueError(f"planes {start}..{start + count} out of a {self.info.shape} stack")
        try:
            if self._fd is not None:
                self._read_direct(start, out)
            elif self.info.planar:
                self._read_zarr(start, out)
            else:
                self._read_pages(start, out)
        except FileError:
            raise
        except Exception as error:  # damaged data can make the decoders raise anything
            raise FileError(
                self.path, f"cannot read planes {start}..{start + count}: {_reason(error)}"
            ) from error

    def read(self, start: int, stop: int) -> np.ndarray:
        """Planes start..stop as a new array (convenience; the engine uses read_into)."""
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
        """tifffile decodes the pages (in parallel threads; zlib and friends release the GIL).
        Pages of several planes: whole pages straight into `out`, a page the chunk holds only
        part of through a buffer (kept, since the next chunk starts with the rest of it)."""
        per = self.info.page_planes
        if per == 1:
            self._decode_pages(start, out)
            return
        stop, done = start + out.shape[0], 0
        while start + done < stop:
            plane = start + done
            page, skip = divmod(plane, per)
            whole = (stop - plane) // per if skip == 0 else 0
            if whole:
                self._decode_pages(page, out[done : done + whole * per])
                done += whole * per
                continue
            take = min(per - skip, stop - plane)
            out[done : done + take] = self._partial_page(page)[skip : skip + take]
            done += take

    def _partial_page(self, index: int) -> np.ndarray:
        """Page `index` as (page_planes, Y, X), decoded once for the chunks that share it."""
        import numpy as np

        if self._held_page is None or self._held_page[0] != index:
            planes = np.empty((self.info.page_planes, *self.info.shape[1:]), self.info.dtype)
            self._held_page = None
            self._decode_pages(index, planes)
            self._held_page = (index, planes)
        return self._held_page[1]

    def _decode_pages(self, first: int, out: np.ndarray) -> None:
        """Decodes pages first.. of the series into `out` (their planes, (k, Y, X))."""
        count = out.shape[0] // self.info.page_planes
        self._check_strips(first, count)
        # tifffile fills (pages, *page shape) and sets that shape on the array it is given (one
        # page: the page's own shape), so it gets a view: `out` keeps its (k, Y, X) shape.
        view = out.reshape(count, *self._series.keyframe.shape)
        self._tif.asarray(
            key=range(first, first + count), series=0, out=view, maxworkers=_DECODE_WORKERS
        )

    def _read_zarr(self, start: int, out: np.ndarray) -> None:
        """Planar samples: each plane through tifffile's zarr view of the series."""
        import numpy as np
        import zarr

        if self._zarr is None:
            self._zarr = zarr.open(self._series.aszarr(), mode="r")
        leading = tuple(self._series.shape[:-2])
        for i in range(out.shape[0]):
            index = tuple(int(v) for v in np.unravel_index(start + i, leading))
            out[i] = self._zarr[index]

    def _check_strips(self, start: int, count: int) -> None:
        """Refuses pages start..start+count that the file lacks (metadata naming more pages
        than it holds) or whose data would come from the file header or from past its end
        (tifffile reads what the offsets say; a damaged offset would give wrong pixels)."""
        size = self._tif.filehandle.size
        pages = self._series.pages
        per = self.info.page_planes
        for index in range(start, start + count):
            where = f"plane {index}"
            if per > 1:
                where = f"page {index} (planes {index * per}..{(index + 1) * per})"
            try:
                page = pages[index] if index < len(pages) else None
            except IndexError:  # a shaped series finds its pages after its first one
                raise FileError(
                    self.path,
                    f"is damaged or inconsistent: {where} is missing (its {self.info.axes} "
                    f"metadata, shape {_dims(self.info.sizes)}, names {len(pages)} pages; "
                    "the file holds fewer)",
                ) from None
            if page is None:  # a page tifffile lists as missing (OME, multi-file): not read
                continue
            for offset, length in zip(page.dataoffsets, page.databytecounts, strict=False):
                if length and (offset < 8 or offset + length > size):
                    raise FileError(
                        self.path,
                        f"is damaged: {where} claims image data at bytes "
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

    A .zarr store (a Zarr array or an OME-Zarr image) opens as a `zarr_io.ZarrReader`.

    Example:
        >>> with open_volume("scan.tif") as reader:
        ...     first = reader.read(0, 4)
    """
    from .zarr_io import is_zarr_path

    if is_zarr_path(Path(path)):
        from .zarr_io import ZarrReader

        return ZarrReader(path)
    return VolumeReader(path)


def needs_bigtiff(data_bytes: int, pages: int) -> bool:
    """True when image data plus per-page overhead could pass the classic TIFF 4 GB limit."""
    return data_bytes + pages * _PAGE_OVERHEAD_BYTES > CLASSIC_TIFF_LIMIT


def output_flavour(info: VolumeInfo, dtype: str, bigtiff: bool, compression: str = "none") -> str:
    """How to write the output: `imagej`, `ome` or `shaped` (tifffile's JSON description).

    ImageJ input stays ImageJ when ImageJ can read the result (float32, classic TIFF, no zstd);
    OME input stays OME for float32 (OME has no float16) with its XML kept; everything else is
    shaped, which keeps axes, spacing, unit, Info, Labels and ranges in its JSON description.
    """
    imagej_type = dtype in ("float32", "uint8", "uint16")  # what ImageJ 1.x stacks hold
    if info.imagej and imagej_type and not bigtiff and compression in IMAGEJ_COMPRESSIONS:
        return "imagej"
    if info.ome and dtype != "float16" and info.ome_xml:
        return "ome"
    return "shaped"


def _write_options(
    info: VolumeInfo, dtype: str, flavour: str, ranges, description: str | None
) -> dict[str, Any]:
    shape = info.sizes
    options: dict[str, Any] = {"dtype": dtype, "shape": shape}
    if info.resolution:
        options["resolution"] = info.resolution
        if flavour != "imagej" and info.resolution_unit:
            options["resolutionunit"] = info.resolution_unit
    if flavour != "imagej":
        options["photometric"] = "minisblack"
    if flavour == "ome":
        options["description"] = description
        options["metadata"] = None
        return options
    metadata: dict[str, Any] = {"axes": info.axes}
    if info.spacing is not None:
        metadata["spacing"] = info.spacing
    if info.unit is not None:
        metadata["unit"] = info.unit
    metadata.update(info.imagej_extra)
    if ranges is not None:
        flat = [float(v) for pair in ranges for v in pair]
        if flavour == "imagej":
            metadata["Ranges"] = tuple(flat)
            if len(ranges) == 1:
                metadata["min"], metadata["max"] = flat
        else:
            metadata["Ranges"] = flat
    if flavour == "shaped":
        metadata.update(info.physical_sizes)
        if info.channel_names:
            metadata["ChannelNames"] = list(info.channel_names)
        if "LUTs" in metadata:
            metadata["LUTs"] = [lut.tolist() for lut in metadata["LUTs"]]
    options["metadata"] = metadata
    return options


def compression_options(compression: str, dtype: str, predictor: bool | None) -> dict[str, Any]:
    """tifffile's compression arguments for --compress (a float predictor where it helps:
    by default with zstd; with zlib/lzw only when asked, since ImageJ reads no float predictor)."""
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression must be one of {COMPRESSIONS}, got {compression!r}")
    if compression == "none":
        return {}
    options: dict[str, Any] = {"compression": compression}
    if compression == "zstd":
        options["compressionargs"] = {"level": 1}
    use_predictor = predictor if predictor is not None else compression == "zstd"
    if use_predictor:
        options["predictor"] = "floatingpoint" if dtype.startswith("float") else "horizontal"
    return options


def write_volume(
    target: str | os.PathLike[str],
    pages: Iterable[np.ndarray],
    info: VolumeInfo,
    dtype: str = "float32",
    *,
    compression: str = "none",
    predictor: bool | None = None,
    ranges: tuple[tuple[float, float], ...] | None = None,
) -> str:
    """Writes `pages` (info.depth (Y, X) arrays of `dtype`) as one stack; returns the flavour.

    Pages are consumed one at a time, so memory stays one page (tifffile writes each as it comes).
    Axes, resolution, ImageJ spacing/unit/Info/Labels/LUTs, `ranges` (display range per channel)
    and OME-XML of `info` are carried over; BigTIFF when needed.
    """
    import numpy as np
    import tifffile

    if dtype not in OUTPUT_DTYPES + ACCEPTED_DTYPES:
        raise ValueError(f"output dtype must be one of {ACCEPTED_DTYPES}, got {dtype!r}")
    data_bytes = info.depth * info.shape[1] * info.shape[2] * np.dtype(dtype).itemsize
    bigtiff = needs_bigtiff(data_bytes, info.depth)
    flavour = output_flavour(info, dtype, bigtiff, compression)
    description = None
    if flavour == "ome":
        description = ome_xml_for_output(
            info.ome_xml,
            dtype,
            Path(target).name,
            sizes=dict(zip(info.axes, info.sizes, strict=True)),
            physical=info.physical_sizes,
        )
        if description is None:
            flavour = "shaped"
    options = _write_options(info, dtype, flavour, ranges, description)
    options.update(compression_options(compression, dtype, predictor))
    checked = _checked_pages(pages, info, dtype)
    with tifffile.TiffWriter(target, bigtiff=bigtiff, imagej=flavour == "imagej") as writer:
        writer.write(checked, **options)
    if next(checked, None) is not None:  # tifffile stops after the last page: drain the source
        raise ValueError(f"more than {info.depth} pages")
    return flavour


class _CheckedPages:
    """Pages checked for shape, dtype and count. A plain iterator (no close()): tifffile closes
    generators it has read enough of, and the source must still be run to its end."""

    def __init__(self, pages: Iterable[np.ndarray], info: VolumeInfo, dtype: str) -> None:
        self._pages, self._info, self._dtype, self.count = iter(pages), info, dtype, 0

    def __iter__(self) -> _CheckedPages:
        return self

    def __next__(self) -> np.ndarray:
        try:
            page = next(self._pages)
        except StopIteration:
            if self.count != self._info.depth:
                raise ValueError(f"expected {self._info.depth} pages, got {self.count}") from None
            raise
        if page.shape != self._info.shape[1:] or page.dtype.name != self._dtype:
            raise ValueError(
                f"page {self.count}: expected {self._info.shape[1:]} {self._dtype}, "
                f"got {page.shape} {page.dtype}"
            )
        self.count += 1
        return page


def _checked_pages(pages: Iterable[np.ndarray], info: VolumeInfo, dtype: str) -> _CheckedPages:
    return _CheckedPages(pages, info, dtype)
