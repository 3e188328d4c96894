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

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .errors import FileError

__all__ = ["PER_CHOICES", "NormalizeResult", "normalize_file", "plane_groups"]

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
    return "zarr" if target.name.lower().rstrip("/").endswith(".zarr") else "tiff"


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
    on_message: Message | None = None,
    progress: Callable[[str, int], Any] | None = None,
) -> NormalizeResult:
    """Normalises the stack `src` into `dst` (.tif/.ome.tif, or .zarr/.ome.zarr); see the module.

    Raises FileError (naming the file) for a bad input, bounds float32 cannot use, or a write
    that fails; the output is written atomically (nothing is left on failure).

    Example:
        >>> normalize_file("scan.tif", "scan_norm.tif", percentiles=(1, 99.8), clip=True)
    """
    import contextlib
    import time

    import torch

    from .io.atomic import OutputExistsError, atomic_output, check_output_folder
    from .io.volumes import open_volume, write_volume
    from .volume import normalize as engine
    from .volume import plan_chunks, run_with_smaller_chunks
    from .volume.stream import map_volume

    src, target = Path(src), Path(dst)
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
        plan = plan_chunks(info.shape, info.dtype, dtype, chunk_mb, pinned=device.type == "cuda")
        say(
            "detail",
            (
                f"{src}: {'x'.join(map(str, info.sizes))} {info.dtype} ({info.axes}, "
                f"{info.compression}, {info.read_mode} reads); {len(labels)} group(s) ({per}); "
                f"{plan.chunk_count} chunks of {plan.slices_per_chunk} planes, "
                f"{plan.buffer_bytes / 2**20:.0f} MiB of buffers, {device}"
            ),
        )

        def retry(old, new) -> None:
            say(
                "info",
                f"{src}: out of memory with {old.slices_per_chunk} planes per chunk; "
                f"retrying with {new.slices_per_chunk}",
            )

        needs_scan = percentiles is not None or "data" in (max, minimum)
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

            stats, plan = run_with_smaller_chunks(scan, plan, device, on_retry=retry)
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

        def normalise(plan):
            counter.__init__(clip=clip, float16=dtype == "float16")
            bar = progress(src.name, info.depth) if progress else None
            with (
                atomic_output(target, overwrite=overwrite) as temp,
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
            stream, plan = run_with_smaller_chunks(normalise, plan, device, on_retry=retry)
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
