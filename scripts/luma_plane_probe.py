"""Probe: nvImageCodec asked for a colour JPEG's luma plane only (P_Y, GRAY), against libjpeg's.

    python scripts/luma_plane_probe.py KINDS PHOTO_DIR [FILES]

`imgops gray --luma stored` decodes a YCbCr JPEG's stored Y plane on the CPU (libjpeg's
grayscale output). Whether the GPU can do the same, and give the same plane, decides whether
that option can run on the GPU path. This asks imgops' C API decoder
(imgops.io.nvimgcodec_c.CDecoder) for the backend KINDS (as scripts/nvimgcodec_backend_probe.py:
hardware, gpu, hardware+gpu, hybrid, or cpu for a dry run without a GPU) to decode up to FILES
(default 128) colour JPEGs of PHOTO_DIR in calls of 64, twice as colour (I_RGB) and twice as
the luma plane alone (P_Y, the gray request imgops already makes for gray JPEGs), and prints:
  * the files/s of each (the second round);
  * per file, the luma-only output against OpenCV's IMREAD_GRAYSCALE (libjpeg's Y plane): the
    share of equal pixels and the max difference, and the same against the exact BT.601 luma
    of the backend's own colour decode (is it the Y plane, or a luma computed from RGB?).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from nvimgcodec_backend_probe import KINDS  # noqa: E402  (this script's folder)

from imgops.engine import cuda_driver  # noqa: E402
from imgops.io import nvimgcodec_c as nc  # noqa: E402

BATCH = 64


def exact_luma(rgb: np.ndarray) -> np.ndarray:
    """(299 R + 587 G + 114 B + 500) // 1000 of RGB pixels."""
    wide = rgb.astype(np.int64)
    return (299 * wide[..., 0] + 587 * wide[..., 1] + 114 * wide[..., 2] + 500) // 1000


class Probe:
    """The decoder on the asked backends, with a stream and host copies on a GPU."""

    def __init__(self, kinds: list[int]) -> None:
        real = nc._execution_params
        nc._execution_params = lambda asked, device, threads: real(  # only those kinds
            kinds if asked != [nc._CPU_ONLY] else asked, device, threads
        )
        self.on_cpu = kinds == [nc._CPU_ONLY]
        self.device = self.stream = None
        if not self.on_cpu:
            self.device = cuda_driver.Device(0)
            self.stream = self.device.stream()
        self.decoder = nc.CDecoder(0, cpu_backend=self.on_cpu, threads=2 if self.on_cpu else 0)
        if self.device is not None:
            device, stream = self.device, self.stream
            self.decoder.use_memory(
                lambda n: device.alloc(n, stream), lambda p: device.free(p, stream)
            )

    def decode(self, datas: list[bytes], luma_only: bool) -> list[object]:
        """One call per BATCH files; luma_only asks for the Y plane of colour JPEGs."""
        outs: list[object] = []
        for first in range(0, len(datas), BATCH):
            candidates = [self.decoder.accept(d, 1 << 30) for d in datas[first : first + BATCH]]
            for candidate in candidates:
                assert candidate is not None and not candidate.gray
                candidate.gray = luma_only
            handle = self.stream.handle if self.stream is not None else 0
            batch = self.decoder.decode(candidates, handle)
            if self.stream is not None:
                self.stream.synchronize()
            for out, why in zip(batch, self.decoder.last_failures, strict=True):
                outs.append(out if out is not None else why)
        return outs

    def host(self, out: object) -> np.ndarray:
        """A decoded image as a host (H, W, C) array; its device memory is released."""
        if isinstance(out, np.ndarray):
            return out
        nbytes = out.pitch * out.height
        with self.device.pinned(nbytes) as staging:
            self.device.copy_to_host(staging.ptr, out.ptr, nbytes, self.stream)
            self.stream.synchronize()
            rows = staging.array()[:nbytes].reshape(out.height, out.pitch).copy()
        self.decoder.release(out)
        return rows[:, : out.width * out.channels].reshape(out.height, out.width, out.channels)

    def release(self, outs: list[object]) -> None:
        for out in outs:
            if not isinstance(out, (str, np.ndarray)) and out is not None:
                self.decoder.release(out)


def main() -> None:
    if len(sys.argv) not in (3, 4) or sys.argv[1] not in KINDS:
        sys.exit(f"usage: {sys.argv[0]} {{{','.join(KINDS)}}} PHOTO_DIR [FILES]")
    count = int(sys.argv[3]) if len(sys.argv) == 4 else 128
    probe = Probe(KINDS[sys.argv[1]])
    paths = []
    for path in sorted(Path(sys.argv[2]).glob("*.jpg")):
        candidate = probe.decoder.accept(path.read_bytes(), 1 << 30)
        if candidate is not None and not candidate.gray:
            paths.append(path)
        if len(paths) == count:
            break
    datas = [p.read_bytes() for p in paths]
    print(f"{len(datas)} colour JPEGs of {sys.argv[2]}, backends {sys.argv[1]}", flush=True)
    for luma_only in (False, True):
        label = "luma plane (P_Y)" if luma_only else "colour (I_RGB)"
        for round_ in (1, 2):
            start = time.perf_counter()
            outs = probe.decode(datas, luma_only)
            took = time.perf_counter() - start
            failed = [o for o in outs if isinstance(o, str)]
            probe.release(outs)
            why = f", {len(failed)} failed: {failed[0]}" if failed else ""
            print(f"{label:17s} round {round_}: {len(datas) / took:7.0f} files/s{why}", flush=True)
    equal_plane, worst_plane, equal_exact, worst_exact, shapes = [], 0, [], 0, 0
    for path, data in zip(paths, datas, strict=True):
        (plane,) = probe.decode([data], True)
        (colour,) = probe.decode([data], False)
        if isinstance(plane, str) or isinstance(colour, str):
            print(f"{path.name}: failed ({plane if isinstance(plane, str) else colour})")
            continue
        plane = probe.host(plane)[..., 0].astype(np.int64)
        rgb = probe.host(colour)
        libjpeg = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_GRAYSCALE)
        if plane.shape != libjpeg.shape:
            shapes += 1
            continue
        diff = np.abs(plane - libjpeg)
        equal_plane.append(float((diff == 0).mean()))
        worst_plane = max(worst_plane, int(diff.max()))
        diff = np.abs(plane - exact_luma(rgb))
        equal_exact.append(float((diff == 0).mean()))
        worst_exact = max(worst_exact, int(diff.max()))
    if equal_plane:
        print(
            f"luma plane vs libjpeg's Y plane (OpenCV IMREAD_GRAYSCALE): equal pixels "
            f"{100 * min(equal_plane):.3f}-{100 * max(equal_plane):.3f} % a file "
            f"(median {100 * statistics.median(equal_plane):.3f} %), max diff {worst_plane}"
        )
        print(
            f"luma plane vs exact luma of the same backend's colour decode: equal pixels "
            f"{100 * min(equal_exact):.3f}-{100 * max(equal_exact):.3f} % a file "
            f"(median {100 * statistics.median(equal_exact):.3f} %), max diff {worst_exact}"
        )
    if shapes:
        print(f"{shapes} files with another shape than libjpeg's plane")


if __name__ == "__main__":
    main()
