"""The interpreter's thread switch interval while the command line runs a batch.

A batch runs 30-odd Python threads (prep, decode, device, encode) that mostly wait in C
(file I/O, codecs, CUDA calls) and need the GIL back for a few microseconds after each wait.
With CPython's default interval (5 ms) a thread returning from C waits up to that long for a
thread that holds the GIL to let go. On H100 hosts (16 cores), set through a wrapper, a 1 ms
interval cut 3200 photos on CUDA from 4.88 s to 4.16-4.62 s (two runs); in code, together
with the pool and write changes of the same commit, 800 photos went from 3.35-3.62 s to
2.79-2.87 s while 3200 did not change; the CPU path did not change either way
(docs/BENCHMARKS.md). Only the command line sets it (a process of its own): library callers
keep theirs.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

#: The interval during a batch, in seconds; IMGOPS_SWITCH_INTERVAL overrides it (comparisons).
BATCH_SWITCH_INTERVAL = 0.001


def _wanted() -> float:
    raw = os.environ.get("IMGOPS_SWITCH_INTERVAL", "").strip()
    try:
        value = float(raw) if raw else BATCH_SWITCH_INTERVAL
    except ValueError:
        return BATCH_SWITCH_INTERVAL
    return value if value > 0 else BATCH_SWITCH_INTERVAL


@contextlib.contextmanager
def batch_switch_interval() -> Iterator[float]:
    """Sets sys.setswitchinterval to the batch interval inside the block, then restores it;
    yields the interval in force."""
    previous = sys.getswitchinterval()
    wanted = _wanted()
    sys.setswitchinterval(wanted)
    try:
        yield wanted
    finally:
        sys.setswitchinterval(previous)
