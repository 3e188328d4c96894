"""The volume engine: chunk planning (`chunks`), statistics in numpy (`stats`), streaming
through the device (`stream`) and the normalisation built on them (`normalize`).

The engine sees a volume as N planes (Y, X) in file order and runs any per-chunk op `fn`
(with an optional Z halo) either as a map (pages written in order) or as a reduction (with a
merge). Out-of-memory halving lives in `stream.run_with_smaller_chunks`.
"""

from __future__ import annotations

from .chunks import DEFAULT_CHUNK_MB, ChunkPlan, plan_chunks
from .normalize import normalize_fn, normalize_stream, scan_groups, scan_volume
from .stats import GroupStats, VolumeStats, percentile_from_histogram
from .stream import (
    Span,
    StreamAborted,
    StreamStats,
    map_volume,
    reduce_volume,
    run_with_smaller_chunks,
)

DataStats = VolumeStats  # the name before the engine split

__all__ = [
    "DEFAULT_CHUNK_MB",
    "ChunkPlan",
    "DataStats",
    "GroupStats",
    "Span",
    "StreamAborted",
    "StreamStats",
    "VolumeStats",
    "map_volume",
    "normalize_fn",
    "normalize_stream",
    "percentile_from_histogram",
    "plan_chunks",
    "reduce_volume",
    "run_with_smaller_chunks",
    "scan_groups",
    "scan_volume",
]
