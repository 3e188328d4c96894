"""Quick CUDA kernel timing for scripts/gpu-check.sh: GB/s of each op next to a device copy.

CUDA events, warm-up, the median of many runs, rotating input buffers larger than L2 together.
`imgops bench` is the full tool; this is the minimal check that runs even if the CLI is broken.
    $ python scripts/kernel_timing.py
"""

from __future__ import annotations

import statistics
import sys

import torch

import imgops
from imgops.reference import normalize_volume_reference, rgb_to_gray_reference


def time_ms(fn, inputs, reps: int = 30) -> float:
    """Median milliseconds of fn(x) over reps runs, cycling through inputs."""
    for x in inputs[:2]:
        fn(x)
    torch.cuda.synchronize()
    times = []
    for i in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(inputs[i % len(inputs)])
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def report(name: str, ms: float, nbytes: int, copy_gbs: float | None) -> float:
    gbs = nbytes / ms / 1e6
    share = f"{100 * gbs / copy_gbs:5.1f}% of copy" if copy_gbs else ""
    print(f"{name:48s} {ms:8.3f} ms {gbs:8.1f} GB/s {share}")
    return gbs


def main() -> int:
    """Times copy, gray and normvol at the issue's sizes; prints one line each."""
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    big = [
        torch.randint(0, 256, (8192, 8192, 3), dtype=torch.uint8, device="cuda") for _ in range(3)
    ]
    vol = [
        torch.randint(0, 4096, (256, 1024, 1024), dtype=torch.int16, device="cuda").to(torch.uint16)
        for _ in range(2)
    ]
    batch = [
        torch.randint(0, 256, (2048, 256, 256, 3), dtype=torch.uint8, device="cuda")
        for _ in range(2)
    ]
    out_copy = torch.empty_like(big[0])
    copy_ms = time_ms(lambda x: out_copy.copy_(x), big)
    copy_gbs = report("device-to-device copy 8192x8192x3 u8", copy_ms, 2 * big[0].numel(), None)
    gray_bytes = big[0].numel() + big[0].numel() // 3
    report(
        "rgb_to_gray u8 8192x8192 (imgops)", time_ms(imgops.rgb_to_gray, big), gray_bytes, copy_gbs
    )
    report(
        "rgb_to_gray u8 8192x8192 (torch eager ref)",
        time_ms(rgb_to_gray_reference, big),
        gray_bytes,
        copy_gbs,
    )
    compiled = torch.compile(rgb_to_gray_reference)
    report(
        "rgb_to_gray u8 8192x8192 (torch.compile ref)", time_ms(compiled, big), gray_bytes, copy_gbs
    )
    batch_bytes = batch[0].numel() + batch[0].numel() // 3
    report(
        "rgb_to_gray u8 2048x256x256 batch (imgops)",
        time_ms(imgops.rgb_to_gray, batch),
        batch_bytes,
        copy_gbs,
    )
    vol_bytes = vol[0].numel() * (2 + 4)
    norm = lambda x: imgops.normalize_volume(x, 4095.0)  # noqa: E731
    report(
        "normalize_volume u16->f32 256x1024x1024 (imgops)", time_ms(norm, vol), vol_bytes, copy_gbs
    )
    ref = lambda x: normalize_volume_reference(x, 4095.0)  # noqa: E731
    report("normalize_volume u16->f32 (torch eager ref)", time_ms(ref, vol), vol_bytes, copy_gbs)
    compiled_norm = torch.compile(ref)
    report(
        "normalize_volume u16->f32 (torch.compile ref)",
        time_ms(compiled_norm, vol),
        vol_bytes,
        copy_gbs,
    )
    u16_rgb = [
        torch.randint(0, 65536, (4096, 4096, 3), dtype=torch.int32, device="cuda").to(torch.uint16)
        for _ in range(3)
    ]
    report(
        "rgb_to_gray u16 4096x4096 (imgops)",
        time_ms(imgops.rgb_to_gray, u16_rgb),
        u16_rgb[0].numel() * 8 // 3,
        copy_gbs,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
