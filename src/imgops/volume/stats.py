"""Exact statistics of a volume, per group of planes, in numpy (no torch needed).

Percentiles follow numpy's default definition exactly (`numpy.percentile(data, q)`, method
"linear", Hyndman & Fan type 7): with the n values sorted as x[0..n-1], h = (n - 1) * q / 100,
i = floor(h), g = h - i, the result is x[i] + g * (x[i+1] - x[i]), evaluated with numpy's own
float64 steps (for g >= 0.5 as x[i+1] - (1 - g) * (x[i+1] - x[i])). Both order statistics are
read from a cumulative histogram, so the result equals numpy's bit for bit.

Every dtype is histogrammed through an order-preserving unsigned key (`sortable_keys`): 8- and
16-bit types in one pass (256 or 65,536 bins), 32-bit types in two: a histogram of the high 16
key bits, then, for the few coarse bins that hold the wanted order statistics, a histogram of
the low 16 bits (`PercentileRefinement`). Memory stays a few 65,536-bin tables per group.

NaN and +-inf are not data for the statistics: min, max and percentiles are those of the finite
values (numpy.nanpercentile over the finite values); `nonfinite` counts what was left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "KEY_BITS",
    "GroupStats",
    "PercentileRefinement",
    "VolumeStats",
    "percentile_from_histogram",
    "percentile_rank",
    "sortable_keys",
    "values_from_keys",
]

KEY_BITS = {
    "uint8": 8,
    "uint16": 16,
    "int16": 16,
    "float16": 16,
    "uint32": 32,
    "int32": 32,
    "float32": 32,
}
_UINT = {8: np.uint8, 16: np.uint16, 32: np.uint32}


def sortable_keys(values: np.ndarray) -> np.ndarray:
    """Unsigned integer keys in the same order as `values` (finite floats; ints of any sign).

    Signed ints flip the sign bit; floats flip every bit of negatives and the sign bit of the
    rest (IEEE order), so -0.0 and +0.0 get neighbouring keys.
    """
    name = values.dtype.name
    bits = KEY_BITS[name]
    unsigned = _UINT[bits]
    sign = unsigned(1 << (bits - 1))
    if name.startswith("uint"):
        return values
    raw = values.view(unsigned)
    if name.startswith("int"):
        return raw ^ sign
    negative = (raw & sign) != 0
    return np.where(negative, ~raw, raw | sign).astype(unsigned, copy=False)


def values_from_keys(keys: np.ndarray, dtype: str) -> np.ndarray:
    """The inverse of `sortable_keys`: the values of `dtype` whose keys are `keys`."""
    bits = KEY_BITS[dtype]
    unsigned = _UINT[bits]
    sign = unsigned(1 << (bits - 1))
    keys = np.asarray(keys).astype(unsigned)
    if dtype.startswith("uint"):
        return keys
    if dtype.startswith("int"):
        return (keys ^ sign).view(dtype)
    positive = (keys & sign) != 0
    return np.where(positive, keys ^ sign, ~keys).astype(unsigned).view(dtype)


def percentile_rank(n: int, q: float) -> tuple[int, int, float]:
    """(below, above, gamma): the 0-based order statistics numpy interpolates between, and g."""
    if not 0.0 <= q <= 100.0 or math.isnan(q):
        raise ValueError(f"percentile must be within 0..100, got {q}")
    if n == 0:
        raise ValueError("percentile of an empty volume")
    virtual = (n - 1) * float(np.true_divide(q, 100))
    if virtual >= n - 1:
        return n - 1, n - 1, 0.0
    if virtual < 0:
        return 0, 0, 0.0
    below = math.floor(virtual)
    return below, below + 1, virtual - below


def _interpolate(a: float, b: float, gamma: float) -> float:
    diff = b - a
    if gamma >= 0.5:
        return float(b - diff * (1 - gamma))
    return float(a + diff * gamma)


def _order_statistic(cumulative: np.ndarray, k: int) -> int:
    """Bin index of the k-th smallest value (0-based) given cumulative counts."""
    return int(np.searchsorted(cumulative, k, side="right"))


def percentile_from_histogram(histogram: np.ndarray, q: float, offset: int = 0) -> float:
    """numpy.percentile(values, q) (default "linear" method) from the values' full histogram.

    `histogram[b]` counts the value `b + offset`. The float64 steps are numpy's own, so the result
    equals numpy's bit for bit (for int16 data numpy subtracts the neighbours in int16 and can wrap
    when they are more than 32767 apart; here the difference is exact).
    """
    cumulative = np.cumsum(np.asarray(histogram, dtype=np.int64))
    n = int(cumulative[-1]) if cumulative.size else 0
    below, above, gamma = percentile_rank(n, q)
    a = _order_statistic(cumulative, below) + offset
    b = _order_statistic(cumulative, above) + offset
    return _interpolate(a, b, gamma if below != above else 0.0)


@dataclass
class GroupStats:
    """Min, max and counts of one group's finite values, and its key histogram if kept."""

    minimum: float = math.inf
    maximum: float = -math.inf
    count: int = 0  # finite values
    nonfinite: int = 0  # NaN and +-inf, left out of every statistic
    histogram: np.ndarray | None = None  # over sortable keys (high 16 bits for 32-bit types)

    def merge(self, other: GroupStats) -> GroupStats:
        """Combines two partial results (the reduction's merge)."""
        hist = self.histogram
        if other.histogram is not None:
            hist = other.histogram.copy() if hist is None else hist + other.histogram
        return GroupStats(
            min(self.minimum, other.minimum),
            max(self.maximum, other.maximum),
            self.count + other.count,
            self.nonfinite + other.nonfinite,
            hist,
        )


def plane_stats(planes: np.ndarray, *, histogram: bool) -> GroupStats:
    """Statistics of some planes of one group (numpy; any supported dtype)."""
    values = planes
    nonfinite = 0
    if values.dtype.kind == "f":
        finite = np.isfinite(values)
        nonfinite = int(values.size - np.count_nonzero(finite))
        if nonfinite:
            values = values[finite]
    if values.size == 0:
        hist = np.zeros(_bins(planes.dtype.name), np.int64) if histogram else None
        return GroupStats(nonfinite=nonfinite, histogram=hist)
    low, high = values.min(), values.max()
    hist = key_histogram(values) if histogram else None
    convert = float if values.dtype.kind == "f" else int
    return GroupStats(convert(low), convert(high), int(values.size), nonfinite, hist)


def _bins(dtype: str) -> int:
    return 1 << min(16, KEY_BITS[dtype])


def key_histogram(values: np.ndarray) -> np.ndarray:
    """Counts of the sortable keys (of their high 16 bits for 32-bit types); finite values only."""
    keys = sortable_keys(np.ascontiguousarray(values)).ravel()
    if KEY_BITS[values.dtype.name] == 32:
        keys = keys >> np.uint32(16)
    return np.bincount(keys, minlength=_bins(values.dtype.name)).astype(np.int64, copy=False)


@dataclass
class VolumeStats:
    """Per-group statistics of a whole volume (the result of the first pass)."""

    dtype: str
    groups: list[GroupStats]
    refined: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)

    @property
    def minimum(self) -> float:
        """The smallest finite value of any group."""
        return min(g.minimum for g in self.groups)

    @property
    def maximum(self) -> float:
        """The largest finite value of any group."""
        return max(g.maximum for g in self.groups)

    @property
    def count(self) -> int:
        """Finite values counted, over all groups."""
        return sum(g.count for g in self.groups)

    @property
    def histogram(self) -> np.ndarray | None:
        """The key histogram of group 0 (the whole volume when there is one group)."""
        return self.groups[0].histogram if self.groups else None

    @property
    def nonfinite(self) -> int:
        """NaN and +-inf values left out of the statistics."""
        return sum(g.nonfinite for g in self.groups)

    def needs_refinement(self) -> bool:
        """32-bit types: percentiles need a second pass over the coarse bins they fall in."""
        return KEY_BITS[self.dtype] == 32

    def refinement(self, qs: tuple[float, ...]) -> PercentileRefinement:
        """What the second pass must count for percentiles `qs` (32-bit types)."""
        wanted: dict[int, set[int]] = {}
        for index, group in enumerate(self.groups):
            cumulative = np.cumsum(group.histogram)
            for q in qs:
                for rank in percentile_rank(group.count, q)[:2]:
                    wanted.setdefault(index, set()).add(_order_statistic(cumulative, rank))
        return PercentileRefinement(self.dtype, {g: sorted(b) for g, b in wanted.items()})

    def percentile(self, q: float, group: int = 0) -> float:
        """numpy.percentile of the group's finite values, exactly."""
        stats = self.groups[group]
        if stats.histogram is None:
            raise ValueError("percentiles need the histogram pass (scan_volume(histogram=True))")
        if KEY_BITS[self.dtype] <= 16:
            cumulative = np.cumsum(stats.histogram)
            below, above, gamma = percentile_rank(int(cumulative[-1]), q)
            keys = [_order_statistic(cumulative, r) for r in (below, above)]
        else:
            below, above, gamma = percentile_rank(stats.count, q)
            keys = [self._refined_key(group, r) for r in (below, above)]
        a, b = (float(v) for v in values_from_keys(np.array(keys), self.dtype))
        return _interpolate(a, b, gamma if below != above else 0.0)

    def _refined_key(self, group: int, rank: int) -> int:
        cumulative = np.cumsum(self.groups[group].histogram)
        coarse = _order_statistic(cumulative, rank)
        before = int(cumulative[coarse - 1]) if coarse else 0
        fine = self.refined.get((group, coarse))
        if fine is None:
            raise ValueError("32-bit percentiles need the refinement pass")
        return (coarse << 16) | _order_statistic(np.cumsum(fine), rank - before)


@dataclass
class PercentileRefinement:
    """The second pass for 32-bit types: low-16-bit histograms of the wanted coarse bins."""

    dtype: str
    wanted: dict[int, list[int]]  # group -> coarse bins (high 16 key bits)

    def count(self, group: int, planes: np.ndarray) -> dict[tuple[int, int], np.ndarray]:
        """Fine histograms of these planes (one group) for the group's wanted coarse bins."""
        bins = self.wanted.get(group)
        if not bins:
            return {}
        values = planes
        if values.dtype.kind == "f":
            values = values[np.isfinite(values)]
        keys = sortable_keys(np.ascontiguousarray(values)).ravel()
        high = keys >> np.uint32(16)
        out = {}
        for coarse in bins:
            low = (keys[high == coarse] & np.uint32(0xFFFF)).astype(np.int64)
            out[(group, coarse)] = np.bincount(low, minlength=65536)
        return out

    @staticmethod
    def merge(into: dict, part: dict) -> dict:
        """Adds fine histograms `part` into `into`."""
        for key, hist in part.items():
            into[key] = into[key] + hist if key in into else hist
        return into
