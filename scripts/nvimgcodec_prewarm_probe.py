"""Probe: does creating an nvImageCodec instance through its C API (ctypes: the GIL released)
make the later `import nvidia.nvimgcodec` cheap? Prints each step's time and how many ticks a
pure-Python thread made meanwhile (a thread starved of the GIL makes none).

    python scripts/nvimgcodec_prewarm_probe.py [--context] [--instances N]
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from imgops.io import nvimgcodec_c  # noqa: E402  (its structures; it imports no nvImageCodec)

ticks = 0
stop = False


def ticker() -> None:
    global ticks
    while not stop:
        ticks += 1
        time.sleep(0.001)


def step(what: str, fn):
    global ticks
    ticks = 0
    t = time.perf_counter()
    out = fn()
    ms = 1000 * (time.perf_counter() - t)
    print(f"{what:44s} {ms:8.1f} ms   python ticks meanwhile {ticks}", flush=True)
    return out


def main() -> None:
    threading.Thread(target=ticker, daemon=True).start()
    root = nvimgcodec_c.package_dir()
    if "--context" in sys.argv:
        cuda = ctypes.CDLL("libcuda.so.1")
        ctx = ctypes.c_void_p()

        def context() -> None:
            cuda.cuInit(0)
            cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0)

        step("cuInit + primary context", context)
    path = os.path.join(root, "libnvimgcodec.so.0")
    lib = step("dlopen libnvimgcodec", lambda: ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL))
    count = int(sys.argv[sys.argv.index("--instances") + 1]) if "--instances" in sys.argv else 2
    extensions = os.path.join(root, "extensions").encode()
    instances = []
    for i in range(count):
        info = nvimgcodec_c._new(
            nvimgcodec_c._InstanceCreateInfo,
            nvimgcodec_c._INSTANCE_CREATE_INFO,
            load_builtin_modules=1,
            load_extension_modules=1,
            extension_modules_path=extensions,
        )
        handle = ctypes.c_void_p()
        create = functools.partial(
            lib.nvimgcodecInstanceCreate, ctypes.byref(handle), ctypes.byref(info)
        )
        status = step(f"C API instance {i + 1} (ctypes)", create)
        print("   status", status, "handle", bool(handle.value), flush=True)
        instances.append(handle)
    step("import nvidia.nvimgcodec", lambda: __import__("nvidia.nvimgcodec"))
    global stop
    stop = True


if __name__ == "__main__":
    main()
