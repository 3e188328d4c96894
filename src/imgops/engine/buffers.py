"""Bounded memory for the device engine: a byte budget and a pool of reused (pinned) buffers."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


class ByteBudget:
    """Bytes that may be held at once; `take` blocks until they fit (thread-safe).

    A request larger than the whole budget is let through when nothing else is held, so one
    huge image slows the batch down but never deadlocks it.
    """

    def __init__(self, limit: int) -> None:
        self.limit = max(0, limit)
        self._held = 0
        self._cond = threading.Condition()
        self.peak = 0

    def take(self, nbytes: int, stop: threading.Event | None = None) -> bool:
        """Reserves `nbytes`, waiting while they do not fit; False if `stop` was set."""
        with self._cond:
            while self._held and self._held + nbytes > self.limit:
                if stop is not None and stop.is_set():
                    return False
                self._cond.wait(0.1)
            self._held += nbytes
            self.peak = max(self.peak, self._held)
            return True

    def give(self, nbytes: int) -> None:
        """Returns bytes reserved by take."""
        with self._cond:
            self._held -= nbytes
            self._cond.notify_all()


#: Buffers are allocated in whole multiples of this: outputs of nearby sizes (photos of one
#: camera, two resolutions) then reuse each other's pinned pages instead of reallocating.
GRANULE = 1 << 20


def _granule_up(nbytes: int, granule: int) -> int:
    return max(granule, -(-nbytes // granule) * granule)


class BufferPool:
    """Reused uint8 host buffers (pinned where `pin`), about `limit` bytes in all.

    `acquire(n)` hands out a free buffer of at least n bytes (the smallest that fits), allocates
    one while the pool is under its limit, or waits for a release. Steady state allocates
    nothing: device-to-host copies land in the same pinned pages batch after batch. A request
    over the limit is served when no buffer is out, or none but the caller's own (slow, never
    a deadlock).
    """

    def __init__(
        self,
        limit: int,
        *,
        pin: bool,
        granule: int = GRANULE,
        allocate: Callable[[int], Any] | None = None,
        dispose: Callable[[Any], None] | None = None,
    ) -> None:
        self.limit = max(0, limit)
        self._pin = pin
        #: `allocate(nbytes)` makes a buffer with an `nbytes` attribute (default: a flat uint8
        #: torch tensor, pinned where `pin`); `dispose(buffer)` frees one the pool drops.
        self._allocate = allocate or self._torch_buffer
        self._dispose = dispose
        self._granule = max(1, granule)
        self._free: list[Any] = []
        self._cond = threading.Condition()
        self._held = 0  # bytes of every buffer, free or out
        self._out = 0
        self.allocated = 0
        #: Seconds spent in `allocate` (pinning, where `pin`): part of what acquire's callers
        #: wait; the steady state should add nothing to it.
        self.allocate_seconds = 0.0
        self.peak_bytes = 0

    def _torch_buffer(self, nbytes: int) -> Any:
        import torch

        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=self._pin)

    def acquire(self, nbytes: int, held: int = 0) -> Any:
        """A buffer of at least `nbytes` bytes (blocks when the pool is full).

        `held`: how many of the buffers out are the caller's own, not yet passed on (a batch
        collecting its buffers): the pool never waits for those alone to come back, which would
        be forever; it allocates past its limit instead (a batch larger than the pool is slow,
        never a deadlock); the pool then holds more than its limit until requests that find no
        room drop free buffers.

        New buffers are allocated, and dropped ones freed, outside the pool's lock: pinning
        takes milliseconds, and the encode threads giving buffers back must not wait for it
        (on the H100 host the device thread spent half its time waiting for this lock)."""
        dropped: list[Any] = []
        try:
            with self._cond:
                while True:
                    fits = [i for i, b in enumerate(self._free) if b.nbytes >= nbytes]
                    if fits:  # (indices: `list.remove` would compare tensors by value)
                        best = min(fits, key=lambda i: self._free[i].nbytes)
                        self._out += 1
                        return self._free.pop(best)
                    size = _granule_up(nbytes, self._granule)
                    alone = self._out <= held and not self._free  # nobody else can release
                    if self._held + size <= self.limit or alone:
                        self._held += size  # reserved; allocated below, unlocked
                        self.peak_bytes = max(self.peak_bytes, self._held)
                        self._out += 1
                        break
                    if self._free:  # none fits and no room: drop the smallest free one
                        smallest = min(range(len(self._free)), key=lambda i: self._free[i].nbytes)
                        dropped.append(self._free.pop(smallest))
                        self._held -= dropped[-1].nbytes
                        continue
                    self._cond.wait(0.1)
        finally:
            self._dispose_all(dropped)
        started = time.perf_counter()
        try:
            buffer = self._allocate(size)
        except BaseException:
            with self._cond:
                self._held -= size
                self._out -= 1
                self._cond.notify_all()
            raise
        with self._cond:
            self.allocated += 1
            self.allocate_seconds += time.perf_counter() - started
        return buffer

    def _dispose_all(self, buffers: list[Any]) -> None:
        if self._dispose is not None:
            for buffer in buffers:
                self._dispose(buffer)

    def release(self, buffer: Any) -> None:
        """Gives a buffer back for reuse."""
        with self._cond:
            self._free.append(buffer)
            self._out -= 1
            self._cond.notify_all()

    def close(self) -> None:
        """Frees every free buffer through `dispose` (buffers still out are the caller's)."""
        with self._cond:
            free, self._free = self._free, []
            for buffer in free:
                self._held -= buffer.nbytes
                if self._dispose is not None:
                    self._dispose(buffer)
