"""The per-image op the engine runs: `ImageOp`, and `GRAY`, the first one.

An op is two functions with the same meaning, so the engine can pick the device without the
op knowing about batches, threads or codecs:

* `cpu(pixels, channel_order) -> array`: one image as numpy, (H, W) gray or (H, W, 3); never
  imports torch (the CPU path of the command line starts in milliseconds). None where the op
  has no numpy form; the engine then runs `torch` on torch's CPU device.
* `torch(batch, channel_order) -> tensor`: a batch of images of one shape as one tensor,
  (N, H, W) gray or (N, H, W, 3), on any device; returns (N, H, W) or (N, H, W, 3).
* `driver(stage, image, channel_order) -> DeviceImage` (optional): one 8-bit image decoded into
  device memory, through imgops' fatbin kernels and the CUDA driver API: the CUDA engine that
  never imports torch (imgops.engine.driver). Ops without it run on the torch engine on CUDA.
* `driver_batch(stage, images, channel_orders) -> list[DeviceImage] | None` (optional): the same
  for a whole batch in one native call (imgops.engine.native_batch); None where it cannot (the
  engine then calls `driver` per image). A CudaError it raises carries `owned`: the outputs it
  allocated before it stopped.

`channel_order` is "bgr" (OpenCV's decode), "rgb" (nvImageCodec's) or None for gray input.
A colour result keeps the input's channel order. Both functions must give the same bits:
with `--decoder cpu` every device writes identical files.

Adding an op: define its two functions and an `ImageOp`; `run_batch(jobs, MY_OP, settings)`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..native import cli_kernels

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class ImageOp:
    """One per-image operation: a name, its numpy and torch functions, its output suffix."""

    name: str
    cpu: Callable[[np.ndarray, str | None], np.ndarray] | None
    torch: Callable[[Any, str | None], Any]
    #: Appended to the input's stem for default output names ("photo" -> "photo_gray.png").
    suffix: str
    #: `driver(stage, image, channel_order) -> DeviceImage`: one decoded 8-bit image in device
    #: memory through imgops' own kernels (imgops.engine.driver: the CUDA path without torch),
    #: queued on `stage.stream`. None: CUDA batches of this op run on the torch engine.
    driver: Callable[[Any, Any, str | None], Any] | None = None
    #: `driver_batch(stage, images, channel_orders) -> list[DeviceImage] | None`: `driver` for
    #: a whole batch at once (None: not here, the engine calls `driver` per image).
    driver_batch: Callable[[Any, list[Any], list[str | None]], list[Any] | None] | None = None


def gray_numpy(pixels: np.ndarray, channel_order: str | None) -> np.ndarray:
    """Exact BT.601 luma of one image, (299R + 587G + 114B + 500) // 1000; gray passes through.

    Uses imgops._cli_kernels (the torch op's SIMD loops, GIL released) where it was built,
    else the formula in numpy (the same bits, slower).
    """
    import numpy as np

    if pixels.ndim == 2:
        return pixels
    pixels = np.ascontiguousarray(pixels)
    bgr = channel_order == "bgr"
    module = cli_kernels()
    if module is not None:
        out = np.empty(pixels.shape[:2], dtype=pixels.dtype)
        module.rgb_to_gray(pixels, out, pixels.itemsize, bgr)
        return out
    wide = pixels.astype(np.int64)
    red, blue = (wide[..., 2], wide[..., 0]) if bgr else (wide[..., 0], wide[..., 2])
    luma = (299 * red + 587 * wide[..., 1] + 114 * blue + 500) // 1000
    return luma.astype(pixels.dtype)


def gray_torch(batch: Any, channel_order: str | None) -> Any:
    """Exact BT.601 luma of a batch (N, H, W, 3) in one launch of the imgops op; gray passes."""
    if batch.dim() == 3:
        return batch
    import torch

    from .. import _extension

    _extension.load()  # registers torch.ops.imgops
    return torch.ops.imgops.rgb_to_gray.default(batch, channel_order or "rgb")


def gray_driver(stage: Any, image: Any, channel_order: str | None) -> Any:
    """Exact BT.601 luma of one device image (imgops.engine.driver.DeviceImage) with the
    fatbin's gray kernel, queued on the stage's stream; gray input passes through."""
    if image.channels == 1:
        return image
    out = stage.new_image(image.height, image.width, 1)
    stage.kernels.gray_u8(
        image.ptr, image.pitch, out.ptr, out.pitch, image.width, image.height,
        channel_order == "bgr", stage.stream,
    )  # fmt: skip
    return out


def gray_driver_batch(stage: Any, images: list[Any], channel_orders: list[str | None]) -> Any:
    """gray_driver for a batch: the outputs and luma kernels of every colour image queued by
    one native call (imgops.engine.native_batch: device_gray, the GIL released); gray images
    pass through. None where the native calls are off or not built."""
    import numpy as np

    from .driver_stage import DeviceImage
    from .native_batch import COLOUR_FIELDS, native_calls_for

    calls = native_calls_for(stage, "op")
    if calls is None:
        return None
    colour = [i for i, image in enumerate(images) if image.channels != 1]
    outs = list(images)
    if not colour:
        return outs
    fields = np.empty((len(colour), COLOUR_FIELDS), dtype=np.int64)
    for row, i in enumerate(colour):
        image = images[i]
        fields[row] = (image.ptr, image.pitch, image.width, image.height,
                       channel_orders[i] == "bgr")  # fmt: skip
    for i, ptr in zip(colour, calls.gray(fields, stage.stream), strict=True):
        image = images[i]
        outs[i] = DeviceImage(ptr, image.width, image.height, 1, image.width, owned=True)
    return outs


GRAY = ImageOp(
    name="gray",
    cpu=gray_numpy,
    torch=gray_torch,
    suffix="_gray",
    driver=gray_driver,
    driver_batch=gray_driver_batch,
)
