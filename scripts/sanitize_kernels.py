"""A small CUDA run of every imgops kernel for compute-sanitizer (memcheck, racecheck).

Runs every op of imgops.registry on its samples (1-pixel images, odd widths, unaligned views, every
dtype and argument) and checks each result against the CPU kernels so a silent error shows.
`--big` runs each kernel once over a tensor of more than 2^31 elements instead (64-bit indexing;
about 16 GB of GPU memory), checking its first, middle and last pixels against the CPU.
    $ compute-sanitizer --tool memcheck python scripts/sanitize_kernels.py [--big]
"""

from __future__ import annotations

import sys

import torch

import imgops
from imgops import registry


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
    del values, counts
    # bin: > 2^31 input elements, each output block read across the 2^31 boundary
    z, y, x = 4, (1 << 29) // 1000 + 3, 1001
    volume = torch.randint(0, 256, (z, y, x), dtype=torch.uint8, device="cuda")
    binned = imgops.bin(volume, (1, 2, 1))
    for plane in (0, z - 1):
        for row in (0, binned.shape[1] - 64):
            src = volume[plane, 2 * row : 2 * row + 128].cpu()
            bad += check(
                f"bin >2^31 plane {plane} row {row}",
                binned[plane, row : row + 64],
                imgops.bin(src, (2, 1)),
            )
    del volume, binned
    # png_filter: > 2^31 output bytes (and input bytes for uint16)
    height, width = (1 << 31) // 4000 + 7, 2000
    image = torch.randint(0, 65536, (height, width), dtype=torch.int32, device="cuda")
    image = image.to(torch.uint16)
    filtered = imgops.png_filter(image, -1)
    for row in (0, height // 2, height - 64):
        above = max(row - 1, 0)
        want = imgops.png_filter(image[above : row + 64].cpu(), -1)[row - above :]
        bad += check(f"png_filter >2^31 row {row}", filtered[row : row + 64], want)
    torch.cuda.synchronize()
    print(f"sanitize_kernels --big: {bad} mismatches")
    return 1 if bad else 0


def _gray_rows(rows: torch.Tensor) -> torch.Tensor:
    return imgops.rgb_to_gray(rows[None])[0]


def main() -> int:
    """Every op of imgops.registry on each of its samples and dtypes, CUDA against the CPU (the
    samples hold 1-pixel inputs, odd sizes and unaligned views); returns 1 on any mismatch."""
    if "--big" in sys.argv[1:]:
        return main_big()
    bad = 0
    for info in registry.OPS:
        for dtype in info.dtypes:
            for sample in info.samples(dtype):
                want = info(sample)
                got = info(sample.to("cuda"))
                bad += check(f"{info.name} {dtype} {sample.label}", got, want)
    torch.cuda.synchronize()
    print(f"sanitize_kernels: {bad} mismatches")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
