"""Where the device engine's threads spend their time: seconds per named phase, thread-safe.

The per-file stage times (read, decode, encode, ...) say what each file cost; they cannot show
a thread that waits. These totals can: a device thread mostly in "device.wait_items" is starved
by the prep threads, encode threads mostly in "encode.wait_device" wait for the GPU, and so on.
`imgops gray --stats-json` writes them as "engine_seconds".
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class Phases:
    """Accumulated seconds per phase name ("thread.phase"), from any thread."""

    def __init__(self) -> None:
        self._seconds: dict[str, float] = {}
        self._lock = threading.Lock()

    def add(self, name: str, seconds: float) -> None:
        """Adds `seconds` to phase `name`."""
        with self._lock:
            self._seconds[name] = self._seconds.get(name, 0.0) + seconds

    @contextmanager
    def timed(self, name: str) -> Iterator[None]:
        """Times the body of a `with` block into phase `name`."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)

    def snapshot(self) -> dict[str, float]:
        """The totals so far, sorted by name."""
        with self._lock:
            return dict(sorted(self._seconds.items()))
