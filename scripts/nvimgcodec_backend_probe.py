"""Probe: nvImageCodec's start and batched throughput per backend kind (GPU host).

    python scripts/nvimgcodec_backend_probe.py KINDS PHOTO_DIR

KINDS: one of hardware, gpu, hardware+gpu (what the engine asks for), hybrid; or cpu (the CPU
backend into host memory, no CUDA: a dry run of the script without a GPU). In this process:
the CUDA context and a stream (imgops.engine.cuda_driver), then imgops' C API decoder
(imgops.io.nvimgcodec_c.CDecoder) asked for those backend kinds only; its creation, the first
and second decode of the warm-up JPEG, one photo, then up to 256 JPEGs of PHOTO_DIR in calls
of 64, twice. Run each KINDS in a fresh process (the first decode's cost is per process).
Results of 2026-12-06 (H200): docs/BENCHMARKS.md.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from imgops.engine import cuda_driver  # noqa: E402
from imgops.io import nvimgcodec_c as nc  # noqa: E402

KINDS = {
    "hardware": [nc._HW_GPU_ONLY],
    "gpu": [nc._GPU_ONLY],
    "hardware+gpu": [nc._HW_GPU_ONLY, nc._GPU_ONLY],
    "hybrid": [nc._HYBRID_CPU_GPU],
    "cpu": [nc._CPU_ONLY],
}


def since(start: float) -> str:
    return f"{1000 * (time.perf_counter() - start):8.1f} ms"


def main() -> None:
    if len(sys.argv) != 3 or sys.argv[1] not in KINDS:
        sys.exit(f"usage: {sys.argv[0]} {{{','.join(KINDS)}}} PHOTO_DIR")
    kinds, folder = KINDS[sys.argv[1]], Path(sys.argv[2])
    real = nc._execution_params
    nc._execution_params = lambda asked, device, threads: real(  # only those kinds
        kinds if asked != [nc._CPU_ONLY] else asked, device, threads
    )
    on_cpu = kinds == [nc._CPU_ONLY]
    stream = None
    if not on_cpu:
        start = time.perf_counter()
        device = cuda_driver.Device(0)
        stream = device.stream()
        print(f"context and stream      {since(start)}", flush=True)
    start = time.perf_counter()
    try:
        decoder = nc.CDecoder(0, cpu_backend=on_cpu, threads=2 if on_cpu else 0)
    except nc.GpuDecoderUnavailable as error:
        print(f"decoder create failed: {error}", flush=True)
        return
    print(f"decoder create          {since(start)}", flush=True)
    if stream is not None:
        decoder.use_memory(lambda n: device.alloc(n, stream), lambda p: device.free(p, stream))

    def decode(datas: list[bytes]) -> tuple[int, dict[str, int]]:
        candidates = [decoder.accept(d, 1 << 30) for d in datas]
        handle = stream.handle if stream is not None else 0
        outs = decoder.decode([c for c in candidates if c is not None], handle)
        if stream is not None:
            stream.synchronize()
        failures: dict[str, int] = {}
        for out, why in zip(outs, decoder.last_failures, strict=True):
            if out is None:
                failures[str(why)] = failures.get(str(why), 0) + 1
            decoder.release(out)
        return sum(out is not None for out in outs), failures

    for label in ("first decode", "second decode"):
        start = time.perf_counter()
        done, failures = decode([nc.warm_up_jpeg()])
        print(f"{label:23s} {since(start)}  decoded {done} {failures or ''}", flush=True)
    photos = [p.read_bytes() for p in sorted(folder.glob("*.jpg"))[:256]]
    start = time.perf_counter()
    decode(photos[:1])
    print(f"one photo               {since(start)}", flush=True)
    for round_ in (1, 2):
        start, done, failures = time.perf_counter(), 0, {}
        for first in range(0, len(photos), 64):
            ok, why = decode(photos[first : first + 64])
            done += ok
            failures.update(why)
        took = time.perf_counter() - start
        print(f"round {round_}: {done} decoded in {took:.3f} s, {done / took:.0f} files/s "
              f"{failures or ''}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
