"""The file API for volumes: `normalize_file(src, dst, **options)`, what `imgops normvol` runs.

Semantics (docs/VOLUMES.md has the full statement):

- out = (x - min) / (max - min), computed in float32 (float64 for 32-bit integer input, then
  rounded), by `imgops.ops.normalize_volume`, per group of planes: per channel by default
  wherever a C axis exists (`per="channel"`), or per time point, per (channel, time), or one
  group for the whole stack (`per="none"`).
- Bounds: a number, "dtype" (the integer type's limit), "data" (the group's finite min/max) or a
  list with one number per channel. Defaults: max "data"; min 0 for unsigned integer input and
  "data" for signed and float input (what is printed is what is used).
- `percentiles=(lo, hi)`: CSBDeep's `normalize(x, pmin, pmax, clip, eps)`: the exact numpy
  percentiles of each group, then (x - mi) / (ma - mi + eps) with x, mi, ma and eps in float32.
- NaN and +-inf are left out of every statistic and go through the formula (NaN stays NaN,
  +-inf stays +-inf, clamped to 1/0 by `clip`).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .errors import FileError

__all__ = [
    "PER_CHOICES",
    "BinResult",
    "NormalizeResult",
    "bin_file",
    "normalize_file",
    "plane_groups",
]

PER_CHOICES = ("channel", "time", "channel,time", "none")
FLOAT32_MAX = float(np.finfo(np.float32).max)
_TYPE_RANGE = {
    "uint8": (0, 255),
    "uint16": (0, 65535),
    "int16": (-32768, 32767),
    "uint32": (0, 2**32 - 1),
    "int32": (-(2**31), 2**31 - 1),
}
Message = Callable[[str, str], None]  # (kind: "info" | "detail" | "warning", text)


@dataclass
class NormalizeResult:
    """What `normalize_file` did: the bounds used per group and the counts worth a warning."""

    source: Path
    target: Path
    labels: list[str]
    lows: list[float]
    highs: list[float]
    outside: int = 0  # outputs outside [0, 1] (without clip)
    overflow: int = 0  # float16 outputs that overflowed to +-inf
    nonfinite: int = 0  # NaN/inf inputs left out of the statistics
    values: int = 0
    flavour: str = ""
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> str:
        """One line naming the output and the bounds used."""
        if len(self.labels) == 1:
            bounds = f"min {self.lows[0]:.10g}, max {self.highs[0]:.10g}"
        elif len(self.labels) <= 4:
            bounds = "; ".join(
                f"{label}: min {lo:.10g}, max {hi:.10g}"
                for label, lo, hi in zip(self.labels, self.lows, self.highs, strict=True)
            )
        else:
            bounds = (
                f"{len(self.labels)} groups, min {min(self.lows):.10g}..{max(self.lows):.10g}, "
                f"max {min(self.highs):.10g}..{max(self.highs):.10g}"
            )
        return f"{self.target}: written ({bounds})"


def plane_groups(axes: str, sizes: Sequence[int], per: str) -> tuple[np.ndarray | None, list[str]]:
    """(group id of each plane, group labels) for `per` over a volume's axes.

    An axis `per` names that the volume lacks is left out (per channel on a stack without C is
    one group). None as ids means one group.
    """
    if per not in PER_CHOICES:
        raise ValueError(f"per must be one of {PER_CHOICES}, got {per!r}")
    lead_axes, lead_sizes = axes[:-2], tuple(sizes[:-2])
    keys = [a for a in "CT" if a in per.upper().replace("CHANNEL", "C").replace("TIME", "T")]
    keys = [a for a in keys if a in lead_axes]
    if not keys:
        return None, ["all"]
    index = np.indices(lead_sizes, dtype=np.int64).reshape(len(lead_sizes), -1)
    dims = [lead_sizes[lead_axes.index(a)] for a in keys]
    ids = np.ravel_multi_index([index[lead_axes.index(a)] for a in keys], dims)
    labels = [
        " ".join(f"{a.lower()}{v}" for a, v in zip(keys, np.unravel_index(g, dims), strict=True))
        for g in range(math.prod(dims))
    ]
    return ids, labels


def _channel_of_group(axes: str, sizes, per: str, labels: list[str]) -> list[int | None]:
    if "C" not in axes[:-2] or "channel" not in per:
        return [None] * len(labels)
    return [int(label.split()[0][1:]) for label in labels]


def _default_min(dtype: str) -> Any:
    return 0.0 if dtype.startswith("uint") else "data"


def _resolve(path: Path, bound: Any, end: str, dtype: str, stats, group: int, channel) -> float:
    if isinstance(bound, (list, tuple)):
        return float(bound[channel])
    if isinstance(bound, (int, float)):
        return float(bound)
    if bound == "dtype":
        if dtype not in _TYPE_RANGE:
            raise FileError(path, f"--{end} dtype: {dtype} has no fixed range; give a number")
        low, high = _TYPE_RANGE[dtype]
        return float(high if end == "max" else low)
    if bound == "data":
        g = stats.groups[group]
        if g.count == 0:
            raise FileError(path, f"group {group} has no finite values to take a {end} from")
        return float(g.maximum if end == "max" else g.minimum)
    raise ValueError(f"bad bound {bound!r}")


def check_bounds(path: Path, low: float, high: float, label: str = "") -> None:
    """Refuses bounds the float32 kernel cannot use: beyond float32, or equal in float32."""
    where = f" ({label})" if label and label != "all" else ""
    for name, value in (("min", low), ("max", high)):
        if not math.isfinite(value) or abs(value) > FLOAT32_MAX:
            raise FileError(
                path, f"{name} {value:.10g}{where} is outside float32's range (|x| <= 3.4e38)"
            )
    if abs(high - low) > FLOAT32_MAX:
        raise FileError(path, f"max - min = {high - low:.10g}{where} overflows float32")
    if not np.float32(high - low) > 0:
        raise FileError(
            path,
            f"max {high:.10g} is not above min {low:.10g}{where} in float32 "
            "(a constant volume? set --max/--min explicitly)",
        )


def csbdeep_bounds(low: float, high: float, eps: float) -> tuple[float, float]:
    """(min, max) for the kernel so that it computes CSBDeep's (x - mi) / (ma - mi + eps) with
    mi, ma, eps and the arithmetic in float32 (normalize_mi_ma with dtype=float32)."""
    mi = np.float32(low)
    span = np.float32(np.float32(high) - mi) + np.float32(eps)
    return float(mi), float(mi) + float(span)


def _target_kind(target: Path) -> str:
    return "zarr" if target.name.lower().endswith(".zarr") else "tiff"


def _hands_back_device_memory(function):
    """Decorator for the file functions: once a call is over (its frame and tensors gone), the
    CUDA allocator's cache goes back to the driver, so nothing stays reserved between files."""

    @functools.wraps(function)
    def call(*args, **kwargs):
        from .volume.stream import release_cached_memory

        device = kwargs.get("device", "cpu")
        try:
            result = function(*args, **kwargs)
        except BaseException:
            with contextlib.suppress(Exception):  # never hide the error itself
                release_cached_memory(device)
            raise
        release_cached_memory(device)
        return result

    return call


def _refuse_own_input(src: Path, target: Path) -> None:
    """FileError when `target` is `src` (the same path, or another name of the same file)."""
    try:
        same = src.resolve() == target.resolve() or (
            target.exists() and os.path.samefile(src, target)
        )
    except OSError:
        same = False
    if same:
        raise FileError(target, "the output would replace its input")


@_hands_back_device_memory
def normalize_file(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    max: Any = "data",
    min: Any = None,
    percentiles: tuple[float, float] | None = None,
    per: str = "channel",
    clip: bool = False,
    eps: float = 1e-20,
    dtype: str = "float32",
    compress: str = "auto",
    predictor: bool | None = None,
    chunk_mb: float = 256,
    device: Any = "cpu",
    overwrite: bool = False,
    pyramid: int | None = None,
    ngff: str = "0.5",
    on_message: Message | None = None,
    progress: Callable[[str, int], Any] | None = None,
) -> NormalizeResult:
    """Normalises the stack `src` into `dst` (.tif/.ome.tif, or .zarr/.ome.zarr); see the module.

    Raises FileError (naming the file) for a bad input, bounds float32 cannot use, or a write
    that fails; the output is written atomically (nothing is left on failure).

    Example:
        >>> normalize_file("scan.tif", "scan_norm.tif", percentiles=(1, 99.8), clip=True)
    """
    import time

    import torch

    from .io.atomic import OutputExistsError, atomic_output, check_output_folder
    from .io.volumes import open_volume, write_volume
    from .io.zarr_io import atomic_store
    from .volume import normalize as engine
    from .volume import plan_chunks, run_with_smaller_chunks
    from .volume.stream import map_volume

    src, target = Path(src), Path(dst)
    _refuse_own_input(src, target)
    say = on_message or (lambda kind, text: None)
    device = torch.device(device) if not isinstance(device, torch.device) else device
    started = time.perf_counter()
    if percentiles is not None:
        low_q, high_q = percentiles
        if not 0 <= low_q < high_q <= 100:
            raise ValueError(f"percentiles need 0 <= lo < hi <= 100, got {percentiles}")
    with open_volume(src) as reader:
        info = reader.info
        if not overwrite and (target.exists() or target.is_symlink()):
            raise FileError(target, "output exists (use --overwrite)")
        try:
            check_output_folder(target)
        except OSError as error:
            raise FileError(target, f"cannot write: {error.strerror}") from error
        ids, labels = plane_groups(info.axes, info.sizes, per)
        channel_of = _channel_of_group(info.axes, info.sizes, per, labels)
        minimum = _default_min(info.dtype) if min is None else min
        for end, bound in (("max", max), ("min", minimum)):
            if isinstance(bound, (list, tuple)):
                if channel_of[0] is None:
                    raise FileError(
                        src,
                        f"--{end} lists {len(bound)} values, but the stack is not "
                        "normalised per channel (it has no C axis, or --per leaves C out)",
                    )
                if len(bound) != info.channels:
                    raise FileError(
                        src,
                        f"--{end} lists {len(bound)} values, the stack has "
                        f"{info.channels} channels",
                    )
        plan = plan_chunks(
            info.shape,
            info.dtype,
            dtype,
            _engine_mb(chunk_mb, target, info, dtype, cuda=device.type == "cuda"),
            pinned=device.type == "cuda",
        )
        say(
            "detail",
            (
                f"{src}: {'x'.join(map(str, info.sizes))} {info.dtype} ({info.axes}, "
                f"{info.compression}, {info.read_mode} reads); {len(labels)} group(s) ({per}); "
                f"{plan.chunk_count} chunks of {plan.slices_per_chunk} planes, "
                f"{plan.buffer_bytes / 2**20:.0f} MiB of buffers, {device}"
            ),
        )

        def retry(note: str) -> None:
            say("info", f"{src}: {note}")

        needs_scan = percentiles is not None or "data" in (max, minimum)
        kind = _target_kind(target)
        _check_compression(target, kind, _auto_compression(info, compress, kind))
        stats = None
        if needs_scan:

            def scan(plan):
                bar = progress(f"{src.name}: scanning", info.depth) if progress else None
                with bar or contextlib.nullcontext(lambda n=1: None) as advance:
                    return engine.scan_groups(
                        reader,
                        plan,
                        device,
                        group_ids=ids,
                        groups=len(labels),
                        histogram=percentiles is not None,
                        percentiles=percentiles or (),
                        on_progress=advance,
                    )

            stats, plan = run_with_smaller_chunks(scan, plan, device, on_note=retry)
            if stats.nonfinite:
                say(
                    "warning",
                    f"{src}: {stats.nonfinite} NaN/inf values left out of the "
                    "statistics (written as NaN/inf)",
                )
        lows, highs, kernel_lows, kernel_highs = [], [], [], []
        for group, label in enumerate(labels):
            if percentiles is not None:
                if stats.groups[group].count == 0:
                    raise FileError(src, f"group {label} has no finite values")
                lo = stats.percentile(percentiles[0], group)
                hi = stats.percentile(percentiles[1], group)
                check_bounds(src, lo, hi, label)
                k_lo, k_hi = csbdeep_bounds(lo, hi, eps)
            else:
                lo = _resolve(src, minimum, "min", info.dtype, stats, group, channel_of[group])
                hi = _resolve(src, max, "max", info.dtype, stats, group, channel_of[group])
                check_bounds(src, lo, hi, label)
                k_lo, k_hi = lo, hi
            lows.append(lo)
            highs.append(hi)
            kernel_lows.append(k_lo)
            kernel_highs.append(k_hi)
        counter = engine.OutsideCounter(clip=clip, float16=dtype == "float16")
        fn = engine.normalize_fn(
            kernel_lows, kernel_highs, group_ids=ids, dtype=dtype, clip=clip, counter=counter
        )
        ranges = _output_ranges(info, channel_of, kernel_lows, kernel_highs, clip)
        kind = _target_kind(target)
        compression = _auto_compression(info, compress, kind)
        flavour = "ome-zarr" if kind == "zarr" else ""
        _check_compression(target, kind, compression)

        def normalise(plan):
            counter.__init__(clip=clip, float16=dtype == "float16")
            bar = progress(src.name, info.depth) if progress else None
            output = atomic_store if kind == "zarr" else atomic_output
            with (
                output(target, overwrite=overwrite) as temp,
                bar or contextlib.nullcontext(lambda n=1: None) as advance,
            ):
                if kind == "zarr":
                    from .io.zarr_io import OmeZarrWriter

                    writer = OmeZarrWriter(
                        temp,
                        info,
                        dtype,
                        compression=compression,
                        levels=pyramid,
                        windows=ranges,
                        name=src.name,
                        ngff_version=ngff,
                    )
                    write_pages = writer.write_pages
                else:

                    def write_pages(pages):
                        nonlocal flavour
                        flavour = write_volume(
                            temp,
                            pages,
                            info,
                            dtype,
                            compression=compression,
                            predictor=predictor,
                            ranges=ranges,
                        )

                return map_volume(reader, fn, write_pages, plan, device, on_progress=advance)

        try:
            stream, plan = run_with_smaller_chunks(normalise, plan, device, on_note=retry)
        except OutputExistsError as error:
            raise FileError(target, "output exists (use --overwrite)") from error
        except OSError as error:
            problem = error.strerror or f"{error} (disk full?)"
            raise FileError(target, f"cannot write: {problem}") from error
    outside, overflow = counter.totals()
    values = info.depth * info.shape[1] * info.shape[2]
    result = NormalizeResult(
        src,
        target,
        labels,
        lows,
        highs,
        outside,
        overflow,
        stats.nonfinite if stats is not None else 0,
        values,
        flavour,
        time.perf_counter() - started,
    )
    if outside:
        say(
            "warning",
            f"{src}: {outside} values ({100 * outside / values:.3g}%) lie outside "
            "[min, max] and map outside [0, 1] (use --clip to clamp them)",
        )
    if overflow:
        say(
            "warning",
            f"{src}: {overflow} values overflowed float16 to +-inf "
            "(use --dtype float32, or --clip)",
        )
    say(
        "detail",
        f"{target}: {stream.slices} planes in {stream.chunks} chunks, "
        f"{stream.seconds:.2f} s, peak buffers {stream.peak_buffer_bytes / 2**20:.1f} MiB",
    )
    return result


#: The engine's share of host memory when writing OME-Zarr on CUDA: the writer gathers its
#: blocks of cz planes from pages whatever the engine's chunk, so larger chunks would only hold
#: more memory, and torch's CUDA libraries leave little of the 1 GB goal (issue 12).
ZARR_ENGINE_MB = 16


def _engine_mb(chunk_mb: float, target: Path, info, dtype: str, *, cuda: bool = False) -> float:
    """The engine's share of --chunk-mb: all of it for TIFF; for Zarr, less what the OME-Zarr
    writer holds (its open blocks and those being compressed), at least half; on CUDA at most
    `ZARR_ENGINE_MB` (one plane per chunk still fits: plan_chunks keeps at least one). On the
    CPU device one plane per chunk is slow (torch's OpenMP threads spin between the many small
    kernel calls: the 3 GB stack took 2.27x zarr alone on the H200 host, against 1.12x with
    the full share), and the CPU process has the room."""
    if _target_kind(target) != "zarr":
        return chunk_mb
    from .io.zarr_io import OmeZarrWriter

    writer_mb = OmeZarrWriter(target, info, dtype, levels=1).buffer_bytes / 2**20
    share = max(chunk_mb / 2, chunk_mb - writer_mb)
    return min(share, ZARR_ENGINE_MB) if cuda else share


def _check_compression(target: Path, kind: str, compression: str) -> None:
    from .io.volumes import COMPRESSIONS
    from .io.zarr_io import ZARR_COMPRESSIONS

    allowed = ZARR_COMPRESSIONS if kind == "zarr" else COMPRESSIONS
    if compression not in allowed:
        raise FileError(
            target, f"--compress {compression} is not for {kind.upper()} ({', '.join(allowed)})"
        )


def _auto_compression(info, compress: str, kind: str) -> str:
    """--compress auto: zlib (ImageJ reads it) when the input was compressed, else none; zstd
    for Zarr."""
    if compress != "auto":
        return compress
    if kind == "zarr":
        return "zstd"
    return "none" if info.compression == "NONE" else "zlib"


def _output_ranges(info, channel_of, lows, highs, clip) -> tuple[tuple[float, float], ...]:
    """Display range per channel in the output: the input's range mapped through the channel's
    bounds when one pair of bounds covers the channel, else [0, 1]."""
    channels = info.channels
    out = []
    for c in range(channels):
        groups = [g for g, ch in enumerate(channel_of) if ch in (c, None)]
        pairs = {(lows[g], highs[g]) for g in groups}
        if info.ranges is not None and len(pairs) == 1:
            lo, hi = pairs.pop()
            r0, r1 = info.ranges[c]
            mapped = ((r0 - lo) / (hi - lo), (r1 - lo) / (hi - lo))
            if clip:
                mapped = tuple(min(1.0, max(0.0, v)) for v in mapped)
            out.append(mapped)
        else:
            out.append((0.0, 1.0))
    return tuple(out)


BIN_DTYPES = ("uint8", "uint16", "int16", "float32")


@dataclass
class BinResult:
    """What `bin_file` did."""

    source: Path
    target: Path
    factors: tuple[int, int, int]
    shape: tuple[int, ...]
    seconds: float = 0.0

    def summary(self) -> str:
        """One line naming the output."""
        fz, fy, fx = self.factors
        dims = "x".join(map(str, self.shape))
        return f"{self.target}: written (binned {fz}x{fy}x{fx} in Z, Y, X: {dims})"


def binned_info(info, factors: tuple[int, int, int]):
    """The VolumeInfo of `info` binned by (fz, fy, fx): sizes, resolution, spacing and
    physical sizes scaled; per-plane labels dropped when Z changes."""
    import dataclasses

    fz, fy, fx = factors
    scale = {"Z": fz, "Y": fy, "X": fx}
    sizes = tuple(n // scale.get(a, 1) for a, n in zip(info.axes, info.sizes, strict=True))
    physical = dict(info.physical_sizes)
    for axis, f in scale.items():
        key = f"PhysicalSize{axis}"
        if key in physical and not isinstance(physical[key], str):
            physical[key] = physical[key] * f
    extra = dict(info.imagej_extra)
    if fz != 1:
        extra.pop("Labels", None)
    resolution = None
    if info.resolution:
        resolution = (info.resolution[0] / fx, info.resolution[1] / fy)
    return dataclasses.replace(
        info,
        sizes=sizes,
        shape=(math.prod(sizes[:-2]), sizes[-2], sizes[-1]),
        resolution=resolution,
        spacing=info.spacing * fz if info.spacing is not None else None,
        physical_sizes=physical,
        imagej_extra=extra,
    )


def bin_spans(axes: str, sizes, fz: int) -> tuple[tuple[tuple[int, int], ...], int]:
    """(plane spans, planes per Z block) for Z binning: for each index of the axes before Z,
    the planes of its whole Z blocks (trailing partial blocks dropped)."""
    lead_axes, lead_sizes = axes[:-2], tuple(sizes[:-2])
    if "Z" not in lead_axes:
        return ((0, math.prod(lead_sizes)),), 1
    at = lead_axes.index("Z")
    outer = math.prod(lead_sizes[:at])
    inner = math.prod(lead_sizes[at + 1 :])
    depth = lead_sizes[at]
    kept = (depth // fz) * fz * inner
    spans = tuple((o * depth * inner, o * depth * inner + kept) for o in range(outer))
    return spans, fz * inner


def bin_fn(fz: int, fy: int, fx: int, inner: int):
    """The per-chunk op: the block mean of whole Z blocks of planes (imgops.ops.bin)."""
    from . import ops

    def fn(chunk, span):
        planes = chunk[span.core]
        if fz == 1:
            return ops.bin(planes, [fy, fx])
        height, width = planes.shape[1:]
        units = planes.shape[0] // (fz * inner)
        blocks = planes.reshape(units, fz, inner, height, width).transpose(1, 2).contiguous()
        out = ops.bin(blocks, [fz, fy, fx])  # (units, inner, 1, Y', X')
        return out.reshape(units * inner, *out.shape[-2:])

    return fn


@_hands_back_device_memory
def bin_file(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    factors: Sequence[int],
    *,
    chunk_mb: float = 256,
    device: Any = "cpu",
    compress: str = "auto",
    overwrite: bool = False,
    on_message: Message | None = None,
    progress: Callable[[str, int], Any] | None = None,
) -> BinResult:
    """Bins the stack `src` by (fz, fy, fx) into `dst`: the mean of each block (Fiji's
    Image > Transform > Bin, average, with crop), streamed through the volume engine.

    Integer types give the exact mean rounded half up, float32 the float64 mean cast;
    uint8/uint16/int16/float32 stacks; the output keeps the input's dtype and metadata.
    """
    import time

    import torch

    from .io.atomic import OutputExistsError, atomic_output, check_output_folder
    from .io.volumes import open_volume, write_volume
    from .volume import plan_chunks, run_with_smaller_chunks
    from .volume.stream import map_volume

    src, target = Path(src), Path(dst)
    _refuse_own_input(src, target)
    say = on_message or (lambda kind, text: None)
    fz, fy, fx = (int(f) for f in factors)
    if min(fz, fy, fx) < 1:
        raise ValueError(f"factors must be >= 1, got {tuple(factors)}")
    device = torch.device(device) if not isinstance(device, torch.device) else device
    started = time.perf_counter()
    with open_volume(src) as reader:
        info = reader.info
        if info.dtype not in BIN_DTYPES:
            raise FileError(src, f"has {info.dtype} pixels; bin reads {', '.join(BIN_DTYPES)}")
        if fz > 1 and "Z" not in info.axes:
            raise FileError(src, f"has no Z axis (axes {info.axes}) to bin by {fz}")
        depth = info.sizes[info.axes.index("Z")] if "Z" in info.axes else 1
        if depth < fz or info.shape[1] < fy or info.shape[2] < fx:
            raise FileError(
                src,
                f"is {'x'.join(map(str, info.sizes))} ({info.axes}): smaller than one "
                f"{fz}x{fy}x{fx} block",
            )
        if not overwrite and (target.exists() or target.is_symlink()):
            raise FileError(target, "output exists (use --overwrite)")
        try:
            check_output_folder(target)
        except OSError as error:
            raise FileError(target, f"cannot write: {error.strerror}") from error
        out_info = binned_info(info, (fz, fy, fx))
        spans, unit = bin_spans(info.axes, info.sizes, fz)
        plan = plan_chunks(
            info.shape,
            info.dtype,
            info.dtype,
            chunk_mb,
            pinned=device.type == "cuda",
            align=unit,
            out_ratio=1 / (fz * fy * fx),
            spans=spans,
        )
        fn = bin_fn(fz, fy, fx, unit // fz)
        compression = _auto_compression(info, compress, "tiff")
        say(
            "detail",
            f"{src}: {plan.chunk_count} chunks of {plan.slices_per_chunk} planes, "
            f"{plan.buffer_bytes / 2**20:.0f} MiB of buffers, {device}",
        )

        def run(plan):
            bar = progress(src.name, info.depth) if progress else None
            with (
                atomic_output(target, overwrite=overwrite) as temp,
                bar or contextlib.nullcontext(lambda n=1: None) as advance,
            ):
                return map_volume(
                    reader,
                    fn,
                    lambda pages: write_volume(
                        temp, pages, out_info, info.dtype, compression=compression
                    ),
                    plan,
                    device,
                    on_progress=advance,
                )

        def retry(note: str) -> None:
            say("info", f"{src}: {note}")

        try:
            run_with_smaller_chunks(run, plan, device, on_note=retry)
        except OutputExistsError as error:
            raise FileError(target, "output exists (use --overwrite)") from error
        except OSError as error:
            raise FileError(target, f"cannot write: {error.strerror or error}") from error
    return BinResult(src, target, (fz, fy, fx), out_info.sizes, time.perf_counter() - started)
