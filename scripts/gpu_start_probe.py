"""Probe: what the GPU decode's start costs, piece by piece, in a fresh process per variant.

    python scripts/gpu_start_probe.py            # every variant, one subprocess each
    python scripts/gpu_start_probe.py VARIANT    # one variant in this process

Variants: nvimgcodec instances with every extension (what the engine creates), with only the
nvJPEG extension, with nvJPEG and libjpeg-turbo; nvJPEG's own handle (nvjpegCreateEx) with the
hardware, GPU-hybrid and default backends, each after the CUDA context is current.
"""

from __future__ import annotations

import ctypes
import glob
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

VARIANTS = (
    "instance-all",
    "instance-nvjpeg",
    "instance-nvjpeg-turbo",
    "nvjpeg-hardware",
    "nvjpeg-gpu-hybrid",
    "nvjpeg-default",
)


def timed(what: str, fn):
    start = time.perf_counter()
    out = fn()
    print(f"  {what:40s} {1000 * (time.perf_counter() - start):8.1f} ms", flush=True)
    return out


def context() -> None:
    cuda = ctypes.CDLL("libcuda.so.1")
    ctx, dev = ctypes.c_void_p(), ctypes.c_int()
    assert cuda.cuInit(0) == 0
    assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    assert cuda.cuCtxSetCurrent(ctx) == 0


def instance(only: tuple[str, ...] | None) -> None:
    from imgops.io import nvimgcodec_c as c

    lib = timed("load libnvimgcodec", c.library)
    root = c.package_dir()
    if only is not None:
        fake = tempfile.mkdtemp()
        os.mkdir(os.path.join(fake, "extensions"))
        for name in only:
            for path in glob.glob(os.path.join(root, "extensions", f"lib{name}_ext.so*")):
                os.symlink(path, os.path.join(fake, "extensions", os.path.basename(path)))
        c.package_dir = lambda: fake  # type: ignore[assignment]
    timed("cuInit + primary context", context)
    decoder = timed("instance + decoder (CDecoder)", c.CDecoder)
    timed("warm-up decode", decoder.warm_up)
    del lib


def nvjpeg(backend: int) -> None:
    def found(pattern: str) -> list[str]:
        return [
            p
            for f in sys.path
            for p in glob.glob(os.path.join(f, "nvidia", "cu13", "lib", pattern))
        ]

    for path in found("libcudart.so*")[:1]:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    paths = found("libnvjpeg.so*")
    lib = timed("load libnvjpeg", lambda: ctypes.CDLL(paths[0]))
    timed("cuInit + primary context", context)
    handle = ctypes.c_void_p()

    def create() -> None:
        status = lib.nvjpegCreateEx(backend, None, None, 0, ctypes.byref(handle))
        print(f"    nvjpegCreateEx status {status}")

    timed(f"nvjpegCreateEx(backend={backend})", create)
    second = ctypes.c_void_p()
    timed(
        "a second nvjpegCreateEx",
        lambda: lib.nvjpegCreateEx(backend, None, None, 0, ctypes.byref(second)),
    )
    state = ctypes.c_void_p()
    timed("nvjpegJpegStateCreate", lambda: lib.nvjpegJpegStateCreate(handle, ctypes.byref(state)))
    timed(
        "nvjpegDecodeBatchedInitialize(64, RGBI)",
        lambda: print("    status", lib.nvjpegDecodeBatchedInitialize(handle, state, 64, 1, 5)),
    )


def run(variant: str) -> None:
    print(variant, flush=True)
    t = time.perf_counter()
    if variant == "instance-all":
        instance(None)
    elif variant == "instance-nvjpeg":
        instance(("nvjpeg",))
    elif variant == "instance-nvjpeg-turbo":
        instance(("nvjpeg", "jpeg_turbo"))
    else:
        nvjpeg({"nvjpeg-hardware": 3, "nvjpeg-gpu-hybrid": 2, "nvjpeg-default": 0}[variant])
    print(f"  {'total':40s} {1000 * (time.perf_counter() - t):8.1f} ms", flush=True)


def main() -> None:
    if len(sys.argv) > 1:
        run(sys.argv[1])
        return
    for variant in VARIANTS:
        subprocess.run([sys.executable, __file__, variant], timeout=120, check=False)


if __name__ == "__main__":
    main()
