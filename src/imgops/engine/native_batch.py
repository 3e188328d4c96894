"""The device thread's driver calls for many images in one native call each, instead of a dozen
ctypes calls per image from Python: imgops._cli_kernels.device_gray (the gray op's outputs and
luma kernels), device_png_tail (each image's PNG row filter, device deflate and copies into
its pinned buffer) and device_free (the batch's memory given back), in
csrc/standalone/device_batch.h. They queue exactly what GRAY.driver and imgops.engine.driver
queue one call at a time, with the GIL released.

Why: on an H100 host the device thread was the bound of a warm 800-photo command (0.85 ms a
photo, 720 ms of an 844 ms wall; docs/BENCHMARKS.md, 2026-12-07 sixth session). Each image cost
a dozen Python-level driver calls, each building ctypes arguments, beside 8 prep and 16 encode
threads that want the GIL: every forced switch puts the device thread back in the GIL's queue.

IMGOPS_DEVICE_NATIVE picks what runs natively: "all", "tail" (the PNG tail only), "op" (the op
only) or "none" (every call from Python). The default is DEVICE_NATIVE_DEFAULT. A _cli_kernels
built before these functions existed runs everything from Python.
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
#: Fields per image of device_gray's `images` (device_batch.h's ColourImage).
COLOUR_FIELDS = 5
_CHOICES = {"all": ("op", "tail"), "tail": ("tail",), "op": ("op",), "none": ()}
#: What runs natively without IMGOPS_DEVICE_NATIVE. "none" until the native calls have run on
#: a GPU: they pass the stand-in driver's tests (the same launches, grids and bytes as the
#: Python calls) but the session that wrote them (2026-12-07, seventh) got no GPU machine.
#: scripts/gpu-check.d/native_tail.sh runs their GPU tests, checks that the 800 photos come
#: out byte-identical either way, and times both on a warm server; then make it "all".
DEVICE_NATIVE_DEFAULT = "none"


def native_wanted(part: str) -> bool:
    """Whether `part` ("op" or "tail") of the device thread's work runs natively
    (IMGOPS_DEVICE_NATIVE; unset or an unknown value: DEVICE_NATIVE_DEFAULT)."""
    value = os.environ.get("IMGOPS_DEVICE_NATIVE", DEVICE_NATIVE_DEFAULT).strip().lower()
    return part in _CHOICES.get(value, _CHOICES[DEVICE_NATIVE_DEFAULT])


def _failed(code: int, call: str, owned: list[int]) -> cuda_driver.CudaError:
    """The CudaError of a native call that stopped; `owned` (the device memory it allocated
    and did not queue for freeing) travels with it: free it once the streams are idle."""
    error = cuda_driver.CudaError(code, call)
    error.owned = owned  # type: ignore[attr-defined]
    return error


class NativeCalls:
    """device_gray and device_png_tail bound to one stage: the driver's function addresses,
    the kernels' handles and an event of the stage's device, made once (the stage closes
    it)."""

    def __init__(self, stage: Any, module: Any) -> None:
        self._module = module
        addresses = [cuda_driver.function_address(name) for name in _FUNCTIONS]
        handles = stage.kernels.native_handles()
        self._table = np.array([*addresses, *handles, stage.device.multiprocessors], dtype=np.int64)
        self._event = stage.device.event(stage.stream, blocking=False)

    def gray(self, images: np.ndarray, stream: Any) -> list[int]:
        """Queues on `stream` the gray output and luma kernel of each colour image (int64,
        COLOUR_FIELDS per image: src, pitch, width, height, bgr) and returns the outputs
        (packed, width bytes a row). CudaError names the call that failed; its `owned` holds
        the outputs allocated before it."""
        code, call, owned = self._module.device_gray(
            self._table, np.ascontiguousarray(images, dtype=np.int64), stream.handle
        )
        if code:
            raise _failed(code, call, owned)
        return owned

    def png_tail(
        self,
        images: np.ndarray,
        filter: int,
        streams: list[Any],
        *,
        first: int,
        join: bool,
    ) -> None:
        """Queues the PNG tail of `images` (int64, IMAGE_FIELDS per image: src, pitch, row
        bytes, height >= 1, bpp, pinned address); streams[0] is the stage's stream, the rest
        the side streams (image i deflates on side stream (first + i) % sides; with `join`
        the stage's stream then waits for all of them). CudaError names the call that
        failed; its `owned` holds the device memory not queued for freeing."""
        handles = np.array([s.handle for s in streams], dtype=np.int64)
        code, call, owned = self._module.device_png_tail(
            self._table, np.ascontiguousarray(images, dtype=np.int64), filter, handles,
            self._event._handle, first, join,
        )  # fmt: skip
        if code:
            raise _failed(code, call, owned)

    def free(self, ptrs: list[int], stream: Any) -> None:
        """Queues the freeing of each device pointer on `stream`, in order, in one call.
        CudaError names the call that failed; its `owned` holds the pointers not freed."""
        if not ptrs:
            return
        code, call, owned = self._module.device_free(
            self._table, np.array(ptrs, dtype=np.uint64).view(np.int64), stream.handle
        )
        if code:
            raise _failed(code, call, owned)

    def close(self) -> None:
        """Destroys the event (idempotent)."""
        self._event.close()


def native_calls_for(stage: Any, part: str) -> NativeCalls | None:
    """The stage's NativeCalls (made once, kept with the stage) where `part` ("op" or
    "tail") runs natively (native_wanted) and imgops._cli_kernels has the native calls; else
    None (the work is queued from Python)."""
    from ..native import cli_kernels

    if not native_wanted(part):
        return None
    module = cli_kernels()
    if module is None or not hasattr(module, "device_free"):  # (the newest of the three)
        return None
    calls = getattr(stage, "native_calls", None)
    if calls is None:
        calls = stage.native_calls = NativeCalls(stage, module)
    return calls
