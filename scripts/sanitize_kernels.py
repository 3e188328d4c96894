"""A small CUDA run of every imgops kernel for compute-sanitizer (memcheck, racecheck).

Covers 1-pixel images, odd widths, unaligned views (a crop starting at an odd byte), every dtype,
both channel orders, and checks each result against the CPU kernels so a silent error shows.
    $ compute-sanitizer --tool memcheck python scripts/sanitize_kernels.py
"""

from __future__ import annotations

import sys

import torch

import imgops


def check(name: str, gpu: torch.Tensor, cpu: torch.Tensor) -> int:
    """1 (and a message) when the CUDA result differs from the CPU one."""
    if torch.equal(gpu.cpu(), cpu):
        return 0
    print(f"MISMATCH {name}")
    return 1


def main() -> int:
    """Runs the cases; returns the number of mismatches."""
    torch.manual_seed(0)
    bad = 0
    for dtype in (
        torch.uint8,
        torch.uint16,
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.float64,
    ):
        for shape in ((1, 1, 3), (1, 7, 3), (3, 17, 3), (2, 65, 33, 3), (1000, 33, 3)):
            base = torch.randint(0, 255, (int(torch.tensor(shape).prod()) + 5,), dtype=torch.int32)
            base = base.to(dtype)
            for start in (0, 1, 3):
                cpu = base[start : start + int(torch.tensor(shape).prod())].reshape(shape)
                for order in ("rgb", "bgr"):
                    gpu = imgops.rgb_to_gray(cpu.cuda(), order)
                    bad += check(
                        f"gray {dtype} {shape} +{start} {order}",
                        gpu,
                        imgops.rgb_to_gray(cpu, order),
                    )
                    view = base.cuda()[start : start + cpu.numel()].reshape(shape)
                    bad += check(
                        f"gray-view {dtype} {shape} +{start}",
                        imgops.rgb_to_gray(view, order),
                        imgops.rgb_to_gray(cpu, order),
                    )
    for in_dtype in (torch.uint8, torch.uint16, torch.int16, torch.float32, torch.float64):
        for out_dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
            for n in (1, 7, 8, 9, 4097):
                base = torch.randint(-100, 255, (n + 3,), dtype=torch.int32).abs().to(in_dtype)
                for start in (0, 1):
                    cpu = base[start : start + n]
                    gpu_view = base.cuda()[start : start + n]
                    for clip in (False, True):
                        want = imgops.normalize_volume(cpu, 200, 3, dtype=out_dtype, clip=clip)
                        got = imgops.normalize_volume(gpu_view, 200, 3, dtype=out_dtype, clip=clip)
                        bad += check(f"normvol {in_dtype}->{out_dtype} n={n} +{start}", got, want)
    for dtype in (torch.uint8, torch.uint16, torch.int16):
        for n in (1, 1000, 70_000, 300_001):
            info = torch.iinfo(dtype)
            values = torch.randint(info.min, info.max + 1, (n,), dtype=torch.int32).to(dtype)
            bad += check(
                f"histogram {dtype} n={n}",
                imgops.value_histogram(values.cuda()),
                imgops.value_histogram(values),
            )
    torch.cuda.synchronize()
    print(f"sanitize_kernels: {bad} mismatches")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
