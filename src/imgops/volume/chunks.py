"""Chunk planning for the volume engine: how many planes per chunk, with an optional Z halo.

A volume is seen as N planes (Y, X) in file order. A chunk is a run of whole planes; a plan picks
K planes per chunk so that `slots` input+output buffers (input with its halo) fit the memory
budget. `spans` restrict the planes visited (e.g. `bin` drops trailing partial Z blocks), and
`align` keeps every chunk a multiple of a unit (e.g. fz * planes-per-z for Z binning).
No torch here: plans are plain arithmetic, testable on their own.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["DEFAULT_CHUNK_MB", "DEFAULT_SLOTS", "ChunkPlan", "itemsize", "plan_chunks"]

DEFAULT_CHUNK_MB = 256
DEFAULT_SLOTS = 2
_ITEMSIZE = {
    "uint8": 1,
    "uint16": 2,
    "int16": 2,
    "float16": 2,
    "uint32": 4,
    "int32": 4,
    "float32": 4,
    "float64": 8,
}


def itemsize(dtype: str) -> int:
    """Bytes per sample of a dtype name."""
    return _ITEMSIZE[dtype]


@dataclass(frozen=True)
class ChunkPlan:
    """How N planes are cut: K planes per chunk, `slots` chunks of buffers in flight."""

    depth: int
    slices_per_chunk: int
    slots: int
    in_slice_bytes: int
    out_slice_bytes: int
    pinned: bool = False  # CUDA: pinned host buffers, which torch rounds up to powers of two
    halo: int = 0  # planes read on each side of a chunk (clipped at the volume's ends)
    align: int = 1  # slices_per_chunk is a multiple of this
    spans: tuple[tuple[int, int], ...] | None = None  # plane ranges visited (default: all)

    @property
    def visited(self) -> tuple[tuple[int, int], ...]:
        """The plane ranges the plan covers."""
        return self.spans if self.spans is not None else ((0, self.depth),)

    @property
    def chunk_count(self) -> int:
        """Number of chunks (the last of each span may be shorter)."""
        return sum(math.ceil((b - a) / self.slices_per_chunk) for a, b in self.visited if b > a)

    @property
    def read_slices(self) -> int:
        """Planes an input buffer holds: K plus the halo on both sides."""
        return self.slices_per_chunk + 2 * self.halo

    @property
    def buffer_bytes(self) -> int:
        """Bytes of host buffers in flight at most (on CUDA the device holds as much)."""
        return self.slots * _slot_bytes(
            self.read_slices * self.in_slice_bytes,
            self.slices_per_chunk * self.out_slice_bytes,
            self.pinned,
        )

    def halved(self) -> ChunkPlan:
        """The same plan with half the planes per chunk (at least one unit of `align`)."""
        units = max(1, self.slices_per_chunk // self.align // 2)
        return dataclasses.replace(self, slices_per_chunk=units * self.align)

    def chunks(self) -> Iterator[tuple[int, int]]:
        """(start, stop) plane ranges, in order."""
        for first, last in self.visited:
            for start in range(first, last, self.slices_per_chunk):
                yield start, min(start + self.slices_per_chunk, last)

    def read_range(self, start: int, stop: int) -> tuple[int, int]:
        """The planes read for chunk start..stop: the chunk and its halo, clipped to the volume."""
        return max(0, start - self.halo), min(self.depth, stop + self.halo)


def _slot_bytes(in_bytes: int, out_bytes: int, pinned: bool) -> int:
    if not pinned:
        return in_bytes + out_bytes
    return sum((1 << (n - 1).bit_length()) if n > 0 else 0 for n in (in_bytes, out_bytes))


def host_bytes(nbytes: int, pinned: bool) -> int:
    """Host memory a buffer takes: torch's pinned allocator rounds up to a power of two."""
    return _slot_bytes(nbytes, 0, pinned) if pinned else nbytes


def plan_chunks(
    shape: tuple[int, int, int],
    in_dtype: str,
    out_dtype: str = "float32",
    chunk_mb: float = DEFAULT_CHUNK_MB,
    slots: int = DEFAULT_SLOTS,
    *,
    pinned: bool = False,
    halo: int = 0,
    align: int = 1,
    out_ratio: float = 1.0,
    spans: tuple[tuple[int, int], ...] | None = None,
) -> ChunkPlan:
    """The largest K (a multiple of `align`) whose `slots` buffers fit `chunk_mb` MiB.

    Input buffers hold K + 2 * halo planes of `in_dtype`, output buffers K planes of `out_dtype`
    scaled by `out_ratio` (e.g. 1/4 for 2x2 binning). At least one unit of `align` planes.
    `pinned=True` (the CUDA path) counts buffers as torch's pinned allocator sizes them.

    Example:
        >>> plan_chunks((100, 512, 512), "uint16", "float32", chunk_mb=12).slices_per_chunk
        4
    """
    if not chunk_mb > 0:
        raise ValueError(f"chunk_mb must be positive, got {chunk_mb}")
    if halo < 0 or align < 1:
        raise ValueError(f"halo must be >= 0 and align >= 1, got {halo}, {align}")
    depth, height, width = shape
    in_bytes = height * width * _ITEMSIZE[in_dtype]
    out_bytes = math.ceil(height * width * _ITEMSIZE[out_dtype] * out_ratio)
    budget = int(chunk_mb * 2**20)
    longest = max((b - a for a, b in spans), default=0) if spans is not None else depth
    k = (budget // max(1, slots) - 2 * halo * in_bytes) // max(1, in_bytes + out_bytes)
    k = max(1, min(k, max(longest, 1)))
    k = max(align, k // align * align)

    def fits(k: int) -> bool:
        return slots * _slot_bytes((k + 2 * halo) * in_bytes, k * out_bytes, pinned) <= budget

    while k > align and not fits(k):
        k -= align
    return ChunkPlan(depth, k, slots, in_bytes, out_bytes, pinned, halo, align, spans)
