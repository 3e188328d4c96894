"""The device thread's PNG tail in a few native calls per batch instead of ~15 driver calls per
image from Python: imgops._cli_kernels.device_png_tail (csrc/standalone/device_batch.h) queues
each image's PNG row filter, device deflate and copies into its pinned buffer with the GIL
released, exactly as imgops.engine.driver queued them one ctypes call at a time.

Why: on an H100 host the device thread was the bound of a warm 800-photo command (0.85 ms a
photo, 720 ms of an 844 ms wall; docs/BENCHMARKS.md, 2026-12-07 sixth session). Each image cost
a dozen Python-level driver calls, each building ctypes arguments, beside 8 prep and 16 encode
threads that want the GIL: every forced switch puts the device thread back in the GIL's queue.

IMGOPS_DEVICE_TAIL=python keeps the per-image Python calls (comparisons); a _cli_kernels
built before device_png_tail existed does too.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from . import cuda_driver

#: The driver functions device_batch.h calls, in its table's order.
_FUNCTIONS = (
    "cuMemAllocAsync",
    "cuMemFreeAsync",
    "cuLaunchKernel",
    "cuMemsetD8Async",
    "cuMemcpyDtoHAsync_v2",
    "cuEventRecord",
    "cuStreamWaitEvent",
)
#: Fields per image of device_png_tail's `images` (device_batch.h's Image).
IMAGE_FIELDS = 6


def native_tail_wanted() -> bool:
    """Whether the PNG tail is queued natively (default) or per image from Python
    (IMGOPS_DEVICE_TAIL=python)."""
    return os.environ.get("IMGOPS_DEVICE_TAIL", "native").strip().lower() != "python"


class PngTail:
    """device_png_tail bound to one stage: the driver's function addresses, the kernels'
    handles and an event of the stage's device, made once (the stage closes it)."""

    def __init__(self, stage: Any, module: Any) -> None:
        self._module = module
        addresses = [cuda_driver.function_address(name) for name in _FUNCTIONS]
        handles = stage.kernels.png_tail_handles()
        self._table = np.array([*addresses, *handles, stage.device.multiprocessors], dtype=np.int64)
        self._event = stage.device.event(stage.stream, blocking=False)

    def queue(
        self,
        images: np.ndarray,
        filter: int,
        streams: list[Any],
        *,
        first: int,
        join: bool,
    ) -> None:
        """Queues the tail of `images` (int64, IMAGE_FIELDS per image: src, pitch, row bytes,
        height >= 1, bpp, pinned address); streams[0] is the stage's stream, the rest the side
        streams. CudaError names the call that failed; its `owned` holds the device memory the
        call allocated and did not queue for freeing (free it once the streams are idle)."""
        handles = np.array([s.handle for s in streams], dtype=np.int64)
        code, call, owned = self._module.device_png_tail(
            self._table, np.ascontiguousarray(images, dtype=np.int64), filter, handles,
            self._event._handle, first, join,
        )  # fmt: skip
        if code:
            error = cuda_driver.CudaError(code, call)
            error.owned = owned  # type: ignore[attr-defined]
            raise error

    def close(self) -> None:
        """Destroys the event (idempotent)."""
        self._event.close()


def png_tail_for(stage: Any, module: Any) -> PngTail | None:
    """The stage's PngTail (made once, kept with the stage), or None where the PNG tail runs
    per image from Python: IMGOPS_DEVICE_TAIL=python, or a module without device_png_tail."""
    if not native_tail_wanted() or not hasattr(module, "device_png_tail"):
        return None
    tail = getattr(stage, "png_tail", None)
    if tail is None:
        tail = stage.png_tail = PngTail(stage, module)
    return tail
