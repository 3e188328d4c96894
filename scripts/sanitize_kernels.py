"""A small CUDA run of every imgops kernel for compute-sanitizer (memcheck, racecheck).

Covers 1-pixel images, odd widths, unaligned views (a crop starting at an odd byte), every dtype,
both channel orders, and checks each result against the CPU kernels so a silent error shows.
`--big` runs each kernel once over a tensor of more than 2^31 elements instead (64-bit indexing;
about 16 GB of GPU memory), checking its first, middle and last pixels against the CPU.
    $ compute-sanitizer --tool memcheck python scripts/sanitize_kernels.py [--big]
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


def check_slices(name: str, gpu_in: torch.Tensor, gpu_out: torch.Tensor, op) -> int:
    """Compares op on the CPU with gpu_out over the first, a middle and the last 2^16 rows."""
    n = gpu_in.shape[0]
    bad = 0
    for start in (0, n // 2 - 12345, n - (1 << 16)):
        rows = slice(start, start + (1 << 16))
        bad += check(f"{name} rows {start}..", gpu_out[rows], op(gpu_in[rows].cpu()))
    return bad


def main_big() -> int:
    """Every kernel once over more than 2^31 elements; returns the number of mismatches."""
    torch.manual_seed(0)
    bad = 0
    pixels = (1 << 31) // 3 + 4099  # 3 * pixels > 2^31 input elements
    image = torch.randint(0, 256, (pixels, 3), dtype=torch.uint8, device="cuda")
    bad += check_slices("gray u8 >2^31", image, imgops.rgb_to_gray(image[None])[0], _gray_rows)
    del image
    n = (1 << 31) + 4099
    values = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda")
    out = imgops.normalize_volume(values, max=255, min=0, dtype=torch.float16)
    bad += check_slices(
        "normvol u8->f16 >2^31",
        values,
        out,
        lambda x: imgops.normalize_volume(x, max=255, min=0, dtype=torch.float16),
    )
    del out
    counts = imgops.value_histogram(values).cpu()
    expected = torch.bincount(values.view(-1)[: 1 << 30].cpu(), minlength=256)
    for start in range(1 << 30, n, 1 << 30):
        expected += torch.bincount(values[start : start + (1 << 30)].cpu(), minlength=256)
    bad += check("histogram u8 >2^31", counts, expected)
    torch.cuda.synchronize()
    print(f"sanitize_kernels --big: {bad} mismatches")
    return 1 if bad else 0


def _gray_rows(rows: torch.Tensor) -> torch.Tensor:
    return imgops.rgb_to_gray(rows[None])[0]


def main() -> int:
    """Runs the cases; returns the number of mismatches."""
    if "--big" in sys.argv[1:]:
        return main_big()
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
                        want = imgops.normalize_volume(
                            cpu, max=200, min=3, dtype=out_dtype, clip=clip
                        )
                        got = imgops.normalize_volume(
                            gpu_view, max=200, min=3, dtype=out_dtype, clip=clip
                        )
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
