"""glibc's malloc told to keep freed memory while the command line runs a batch.

Each file of a batch allocates a few large buffers (its encoded bytes, the decoded image:
25 MB for a 4K colour photo, the gray image) and frees them a few milliseconds later. With
glibc's defaults the larger ones come from mmap and go back with munmap (the GIL held while
numpy frees them), or from the top of a thread's heap, which is trimmed back to the kernel;
either way the next file faults the pages in again and the kernel zeroes them, and on a host
with many threads the faults contend on the process's memory map. An mmap threshold of 32 MiB
(the top of glibc's own dynamic one) and a trim threshold above any file keep those pages in
the process for the next file. Here (2 cores, 100 photos, 3 rounds, environment variables)
decode took 1.76-1.82 s of thread time instead of 1.97-2.10 s and the walls went 1.73-1.79 ->
1.65-1.70 s, peak RSS +15 MB; either setting alone did not help (the trim threshold alone was
30 % slower: setting it turns glibc's dynamic mmap threshold off). Memory stays bounded by what
the threads have in flight at once; it is not given back until the process ends, or, in a
process that stays up (`imgops serve`), until imgops.volume.stream.release_free_heap() once it
is idle after a command. Only the command line sets it (a process of its own); library callers
keep their allocator as it is.
"""

from __future__ import annotations

import ctypes
import os
import platform

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
#: Allocations at least this large still come from mmap (the top of glibc's dynamic range).
BATCH_MMAP_THRESHOLD = 32 << 20
#: Free memory at the top of a heap is given back above this (never, for photos).
BATCH_TRIM_THRESHOLD = 512 << 20


def _mallopt() -> object | None:
    """glibc's mallopt, or None on another C library (musl, macOS, Windows)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        function = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    function.argtypes, function.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return function


def retain_freed_memory() -> bool:
    """Sets the batch's malloc thresholds for the rest of the process (glibc only;
    IMGOPS_MALLOC=default leaves them alone); True where both were taken."""
    if os.environ.get("IMGOPS_MALLOC", "").strip().lower() == "default":
        return False
    mallopt = _mallopt()
    if mallopt is None:
        return False
    mmap_taken = mallopt(M_MMAP_THRESHOLD, BATCH_MMAP_THRESHOLD) == 1  # type: ignore[operator]
    trim_taken = mallopt(M_TRIM_THRESHOLD, BATCH_TRIM_THRESHOLD) == 1  # type: ignore[operator]
    return mmap_taken and trim_taken
