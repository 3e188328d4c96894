"""One entry per op, in the style of PyTorch's OpInfo: the tests, `imgops bench` and
scripts/sanitize_kernels.py loop over OPS instead of each listing the ops again.

Each OpInfo names the op (its function is looked up in imgops.ops at call time), an independent
reference with the same signature, the dtypes and devices it supports, small sample inputs
covering the edge cases (1 pixel, odd sizes, unaligned views) and the benchmark workloads.
Adding an op: one OpInfo here (see CONTRIBUTING.md, "Adding an op").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from . import ops, reference

INTEGER_IMAGE = (torch.uint8, torch.uint16)
VOLUME = (torch.uint8, torch.uint16, torch.int16, torch.float32, torch.float64)


@dataclass(frozen=True)
class Sample:
    """One call: the input tensor, then the other arguments."""

    input: torch.Tensor
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    label: str = ""

    def to(self, device: str | torch.device) -> Sample:
        return Sample(self.input.to(device), self.args, self.kwargs, self.label)


@dataclass(frozen=True)
class BenchCase:
    """One timed workload: a fresh random input of shape and dtype, the op's other arguments."""

    op: str
    label: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class OpInfo:
    """What the tests, the benchmark and the sanitizer need to know about one op."""

    name: str
    reference: Callable[..., torch.Tensor]  # same signature as the op; on CPU tensors
    dtypes: tuple[torch.dtype, ...]
    samples: Callable[[torch.dtype], Iterator[Sample]]
    bench: Callable[[str, bool], list[BenchCase]]  # (device type, quick) -> workloads
    devices: tuple[str, ...] = ("cpu", "cuda")
    baseline: Callable[..., torch.Tensor] | None = None  # a pure-torch version to time against
    exact: bool = True  # the op equals its reference bit for bit

    @property
    def fn(self) -> Callable[..., torch.Tensor]:
        """imgops.ops.<name>, looked up at call time (tests may patch it)."""
        return getattr(ops, self.name)

    def __call__(self, sample: Sample) -> torch.Tensor:
        return self.fn(sample.input, *sample.args, **sample.kwargs)

    def expected(self, sample: Sample) -> torch.Tensor:
        """The reference's result for a sample, on the CPU."""
        return self.reference(sample.input.cpu(), *sample.args, **sample.kwargs)


def random_tensor(shape, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Values over the dtype's whole range (floats: [-1000, 5000)), seeded, on the CPU."""
    generator = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return (torch.rand(shape, dtype=torch.float64, generator=generator) * 6000 - 1000).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max + 1, shape, dtype=torch.int64, generator=generator).to(
        dtype
    )


def _views(shapes, dtype: torch.dtype, seed: int) -> Iterator[tuple[str, torch.Tensor]]:
    """Each shape contiguous and as a view starting one element in (unaligned data)."""
    for i, shape in enumerate(shapes):
        n = math.prod(shape)
        base = random_tensor((n + 1,), dtype, seed + i)
        yield f"{shape}", base[:n].reshape(shape)
        yield f"{shape} +1", base[1:].reshape(shape)


# ------------------------------------------------------------------------------- rgb_to_gray
def _gray_samples(dtype: torch.dtype) -> Iterator[Sample]:
    shapes = [(1, 1, 3), (1, 7, 3), (3, 17, 3), (2, 65, 33, 3), (100, 33, 3)]
    for label, image in _views(shapes, dtype, seed=1):
        for order in ("rgb", "bgr"):
            yield Sample(image, (order,), label=f"{label} {order}")


def _gray_bench(device: str, quick: bool) -> list[BenchCase]:
    u8, u16 = torch.uint8, torch.uint16
    if quick:
        sizes = [("256x256 RGB", (256, 256, 3)), ("batch 16x64x64 RGB", (16, 64, 64, 3))]
    elif device == "cuda":
        sizes = [("8192x8192 RGB", (8192, 8192, 3)), ("batch 2048x256x256", (2048, 256, 256, 3))]
    else:
        sizes = [("3840x2160 RGB", (2160, 3840, 3)), ("batch 64x256x256 RGB", (64, 256, 256, 3))]
    cases = [BenchCase("rgb_to_gray", f"{label} uint8", shape, u8) for label, shape in sizes]
    label, shape = sizes[0]
    return [*cases, BenchCase("rgb_to_gray", f"{label} uint16", shape, u16)]


# -------------------------------------------------------------------------- normalize_volume
def _normalize_samples(dtype: torch.dtype) -> Iterator[Sample]:
    for label, volume in _views([(1,), (7,), (9,), (4097,), (3, 5, 7)], dtype, seed=2):
        for out in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
            for clip in (False, True):
                kwargs = {"max": 4000.0, "min": 3.0, "dtype": out, "clip": clip}
                yield Sample(volume, (), kwargs, f"{label} -> {out} clip={clip}")


def _normalize_bench(device: str, quick: bool) -> list[BenchCase]:
    shape = (4, 128, 128) if quick else ((256, 1024, 1024) if device == "cuda" else (32, 512, 512))
    label = "x".join(map(str, shape)) + " uint16 -> float32"
    return [BenchCase("normalize_volume", label, shape, torch.uint16, (), {"max": 4095.0})]


def _normalize_reference(volume, *, max, min=0.0, dtype=None, clip=False):
    dtype = dtype or torch.float32
    return reference.normalize_volume_reference(volume, max, min, dtype=dtype, clip=clip)


# --------------------------------------------------------------------------- value_histogram
def _histogram_samples(dtype: torch.dtype) -> Iterator[Sample]:
    for label, values in _views([(1,), (1000,), (70_000,), (3, 100_001)], dtype, seed=3):
        yield Sample(values, label=label)


def _histogram_bench(device: str, quick: bool) -> list[BenchCase]:
    shape = (4, 128, 128) if quick else ((256, 1024, 1024) if device == "cuda" else (32, 512, 512))
    return [
        BenchCase("value_histogram", "x".join(map(str, shape)) + " uint16", shape, torch.uint16)
    ]


# -------------------------------------------------------------------------------- png_filter
def _png_samples(dtype: torch.dtype) -> Iterator[Sample]:
    shapes = [(1, 1), (3, 5), (7, 63, 1), (5, 16, 4), (9, 33, 3), (17, 100, 2), (40, 257, 3)]
    for label, image in _views(shapes, dtype, seed=4):
        for code in (-1, 0, 1, 2, 3, 4):
            yield Sample(image, (code,), label=f"{label} filter {code}")


def _png_reference(image: torch.Tensor, filter: int) -> torch.Tensor:
    return torch.from_numpy(reference.png_filter_reference(image.numpy(), filter))


def _png_bench(device: str, quick: bool) -> list[BenchCase]:
    shape = (256, 256) if quick else (2160, 3840)
    label = "x".join(map(str, shape[::-1])) + " gray uint8 adaptive"
    return [BenchCase("png_filter", label, shape, torch.uint8, (-1,))]


# ------------------------------------------------------------------------------------- bin
def _bin_samples(dtype: torch.dtype) -> Iterator[Sample]:
    shapes = [(1, 1, 1), (3, 5, 7), (2, 9, 17, 10), (25, 41, 33)]
    for label, x in _views(shapes, dtype, seed=5):
        for factors in ((1, 2, 2), (2, 3, 3), (3,), (1, 1, 1)):
            yield Sample(x, (factors,), label=f"{label} factors {factors}")


def _bin_reference(x: torch.Tensor, factors) -> torch.Tensor:
    return torch.from_numpy(reference.bin_reference(x.numpy(), tuple(factors)))


def _bin_bench(device: str, quick: bool) -> list[BenchCase]:
    shape = (4, 128, 128) if quick else ((256, 1024, 1024) if device == "cuda" else (32, 512, 512))
    label = "x".join(map(str, shape)) + " uint16 by (1, 2, 2)"
    return [BenchCase("bin", label, shape, torch.uint16, ((1, 2, 2),))]


OPS: tuple[OpInfo, ...] = (
    OpInfo(
        "rgb_to_gray",
        reference.rgb_to_gray_reference,
        (*INTEGER_IMAGE, torch.float32, torch.float16, torch.bfloat16, torch.float64),
        _gray_samples,
        _gray_bench,
        baseline=reference.rgb_to_gray_reference,
    ),
    OpInfo(
        "normalize_volume",
        _normalize_reference,
        VOLUME,
        _normalize_samples,
        _normalize_bench,
        baseline=_normalize_reference,
    ),
    OpInfo(
        "value_histogram",
        reference.value_histogram_reference,
        (*INTEGER_IMAGE, torch.int16),
        _histogram_samples,
        _histogram_bench,
        baseline=reference.value_histogram_reference,
    ),
    OpInfo("png_filter", _png_reference, INTEGER_IMAGE, _png_samples, _png_bench),
    OpInfo("bin", _bin_reference, VOLUME, _bin_samples, _bin_bench, exact=False),
)

BY_NAME = {info.name: info for info in OPS}
