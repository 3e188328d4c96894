"""Normalisation on the volume engine: the per-group first pass and the per-group kernel calls.

Planes are grouped (by channel, time point, both, or all in one) through `group_ids[plane]`.
The first pass reduces each chunk to per-group statistics (`stats.GroupStats`); on CUDA, 8- and
16-bit integer data is histogrammed on the device (`imgops.ops.value_histogram`), everything else
in numpy on the host. The second pass calls `imgops.ops.normalize_volume` once per run of planes
of one group, so the exact kernel (and its CUDA twin) does the arithmetic.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from .chunks import ChunkPlan
from .stats import GroupStats, PercentileRefinement, VolumeStats, values_from_keys
from .stream import Span, StreamStats, map_volume, reduce_volume

if TYPE_CHECKING:
    import torch

__all__ = ["OutsideCounter", "group_runs", "normalize_fn", "normalize_stream", "scan_volume"]

_DEVICE_HISTOGRAM = ("uint8", "uint16", "int16")


def group_runs(group_ids: np.ndarray | None, start: int, stop: int) -> list[tuple[int, int, int]]:
    """(i, j, group) runs of planes start..stop (i, j relative to start) sharing one group."""
    if group_ids is None:
        return [(0, stop - start, 0)]
    ids = group_ids[start:stop]
    cuts = np.flatnonzero(np.diff(ids)) + 1
    edges = [0, *cuts.tolist(), stop - start]
    return [(a, b, int(ids[a])) for a, b in zip(edges, edges[1:], strict=False)]


def _host(x: torch.Tensor) -> np.ndarray:
    return x.cpu().numpy() if x.device.type != "cpu" else x.numpy()


def _device_part(x: torch.Tensor, dtype: str, histogram: bool) -> GroupStats:
    """Statistics of an 8/16-bit integer run computed on its (CUDA) device."""
    import torch

    from .. import ops

    if histogram:
        counts = ops.value_histogram(x).cpu().numpy()
        return _from_histogram(counts, dtype)
    if x.dtype == torch.uint16:  # no aminmax for uint16: flip the sign bit (order-preserving)
        low, high = torch.aminmax(x.view(torch.int16) ^ -32768)
        low, high = int(low) + 32768, int(high) + 32768
    else:
        low, high = (int(v) for v in torch.aminmax(x))
    return GroupStats(low, high, x.numel())


def _from_histogram(counts: np.ndarray, dtype: str) -> GroupStats:
    occupied = np.flatnonzero(counts)
    if occupied.size == 0:
        return GroupStats(histogram=counts)
    low, high = (int(v) for v in values_from_keys(occupied[[0, -1]], dtype))
    return GroupStats(low, high, int(counts.sum()), 0, counts)


def scan_groups(
    reader,
    plan: ChunkPlan,
    device,
    *,
    group_ids: np.ndarray | None = None,
    groups: int = 1,
    histogram: bool = False,
    percentiles: Sequence[float] = (),
    on_progress: Callable[[int], None] | None = None,
) -> VolumeStats:
    """First pass: per-group min, max, counts (and exact histograms) of every chunk, merged.

    For 32-bit types with `percentiles`, a second pass counts the fine bins they fall in, so
    `VolumeStats.percentile` is exact for every type.
    """
    dtype = reader.info.dtype
    on_device = device.type == "cuda" and dtype in _DEVICE_HISTOGRAM

    def fn(chunk: torch.Tensor, span: Span) -> dict[int, GroupStats]:
        planes = chunk[span.core]
        part: dict[int, GroupStats] = {}
        for i, j, g in group_runs(group_ids, span.start, span.stop):
            if on_device:
                stats = _device_part(planes[i:j], dtype, histogram)
            else:
                from .stats import plane_stats

                stats = plane_stats(_host(planes[i:j]), histogram=histogram)
            part[g] = part[g].merge(stats) if g in part else stats
        return part

    def merge(acc: dict, part: dict) -> dict:
        for g, stats in part.items():
            acc[g] = acc[g].merge(stats) if g in acc else stats
        return acc

    merged = reduce_volume(reader, fn, merge, plan, device, initial={}, on_progress=on_progress)
    result = VolumeStats(dtype, [merged.get(g, GroupStats()) for g in range(groups)])
    if histogram and percentiles and result.needs_refinement():
        refinement = result.refinement(tuple(percentiles))

        def fine(chunk: torch.Tensor, span: Span) -> dict:
            out: dict = {}
            planes = chunk[span.core]
            for i, j, g in group_runs(group_ids, span.start, span.stop):
                PercentileRefinement.merge(out, refinement.count(g, _host(planes[i:j])))
            return out

        result.refined = reduce_volume(
            reader, fine, PercentileRefinement.merge, plan, device, initial={}
        )
    return result


class OutsideCounter:
    """Counts outputs outside [0, 1] (without --clip) and float16 overflows to +-inf.

    On the CPU a run is counted only when its min/max show something outside (one cheap pass),
    then only on the side that is outside, in numpy, plane by plane into one reused mask (torch's
    comparisons cost more than the kernel itself here; whole-chunk boolean temporaries of tens
    of MB grow the heap of a long run through fragmentation). On CUDA the counts stay on the
    device until `totals()`, so nothing waits.
    """

    def __init__(self, *, clip: bool, float16: bool) -> None:
        self.clip, self.float16 = clip, float16
        self._outside: list = []
        self._overflow: list = []
        self._cpu_outside = 0
        self._cpu_overflow = 0
        self._masks: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}

    def add(self, out: torch.Tensor, x: torch.Tensor) -> None:
        """Counts one run's output `out` (from input `x`)."""
        if out.numel() == 0:
            return
        if out.device.type == "cpu":
            self._add_cpu(out, x)
        else:
            self._add_device(out, x)

    def _add_cpu(self, out: torch.Tensor, x: torch.Tensor) -> None:
        import torch

        low, high = (float(v) for v in torch.aminmax(out))
        below, above = not low >= 0.0, not high <= 1.0  # NaN makes both true
        if not (below or above):
            return
        values = out.numpy()
        mask, finite = self._mask(values.shape[1:])
        source = x.numpy() if self.float16 and x.is_floating_point() else None
        for i, plane in enumerate(values):
            if not self.clip:
                if below:
                    self._cpu_outside += int(np.count_nonzero(np.less(plane, 0, out=mask)))
                if above:
                    self._cpu_outside += int(np.count_nonzero(np.greater(plane, 1, out=mask)))
            if self.float16:
                np.isinf(plane, out=mask)
                if source is not None:
                    mask &= np.isfinite(source[i], out=finite)
                self._cpu_overflow += int(np.count_nonzero(mask))

    def _mask(self, shape: tuple) -> tuple[np.ndarray, np.ndarray]:
        masks = self._masks.get(shape)
        if masks is None:
            masks = self._masks[shape] = (np.empty(shape, bool), np.empty(shape, bool))
        return masks

    def _add_device(self, out: torch.Tensor, x: torch.Tensor) -> None:
        import torch

        if not self.clip:
            self._outside.append(torch.count_nonzero((out < 0) | (out > 1)))
        if self.float16:
            overflow = torch.isinf(out)
            if x.is_floating_point():
                overflow &= torch.isfinite(x)
            self._overflow.append(torch.count_nonzero(overflow))

    def totals(self) -> tuple[int, int]:
        """(values outside [0, 1], float16 overflows)."""
        outside = self._cpu_outside + sum(int(v) for v in self._outside)
        overflow = self._cpu_overflow + sum(int(v) for v in self._overflow)
        return outside, overflow


def _kernel_input(x: torch.Tensor):
    """The input the kernel takes and the dtype it computes in (float16 -> float32, 32-bit
    integers -> float64 so that every value is exact)."""
    import torch

    if x.dtype == torch.float16:
        return x.float(), None
    if x.dtype in (torch.uint32, torch.int32):
        return x.to(torch.float64), torch.float64
    return x, None


def normalize_fn(
    lows: Sequence[float],
    highs: Sequence[float],
    *,
    group_ids: np.ndarray | None = None,
    dtype: str = "float32",
    clip: bool = False,
    counter: OutsideCounter | None = None,
):
    """The per-chunk op: each run of one group's planes through ops.normalize_volume."""
    import torch

    from .. import ops

    out_dtype = getattr(torch, dtype)

    def fn(chunk: torch.Tensor, span: Span) -> list[torch.Tensor]:
        planes = chunk[span.core]
        pieces = []
        for i, j, g in group_runs(group_ids, span.start, span.stop):
            x, compute = _kernel_input(planes[i:j])
            out = ops.normalize_volume(
                x, max=highs[g], min=lows[g], dtype=compute or out_dtype, clip=clip
            )
            if compute is not None:
                out = out.to(out_dtype)
            if counter is not None:
                counter.add(out, x)
            pieces.append(out)
        return pieces

    return fn


def scan_volume(
    reader, plan: ChunkPlan, device, *, histogram: bool = False, on_progress=None
) -> VolumeStats:
    """The whole volume as one group: min, max (and histogram); see `scan_groups`."""
    return scan_groups(reader, plan, device, histogram=histogram, on_progress=on_progress)


def normalize_stream(
    reader,
    write_pages,
    plan: ChunkPlan,
    device,
    *,
    maximum: float,
    minimum: float = 0.0,
    dtype: str = "float32",
    clip: bool = False,
    on_progress=None,
) -> StreamStats:
    """The whole volume normalised with one (min, max); `write_pages` consumes the pages."""
    fn = normalize_fn([minimum], [maximum], dtype=dtype, clip=clip)
    return map_volume(reader, fn, write_pages, plan, device, on_progress=on_progress)
