"""Probe: does a second decode thread (its own nvImageCodec decoder and stream) raise the GPU
decode rate? (GPU host; --cpu: a dry run on nvImageCodec's CPU backend.)

    python scripts/decode_threads_probe.py PHOTO_DIR [--cpu]

nvimgcodecDecoderDecode returns only when its batch is decoded (scripts/decode_split_probe.py
on an H100 host, 2026-12-07: the call took 0.42 ms a file, waiting for its future 0.002 ms), so
two calls in flight from one thread overlap nothing. Two threads with a decoder each might: one
thread's host-side work (parsing, the hardware set-up) while the other's batch is on the
engines. Up to 800 colour JPEGs of PHOTO_DIR in batches of 64, dealt round robin to 1, 2 and 3
threads, three rounds; files/s of the whole (decodes, stream syncs, frees).
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from imgops.io import nvimgcodec_c as nc  # noqa: E402

BATCH = 64


class _Worker:
    """One decode thread's decoder, stream and memory."""

    def __init__(self, cpu: bool) -> None:
        self.decoder = nc.CDecoder(0, cpu_backend=cpu, threads=0 if not cpu else 2)
        if cpu:
            import numpy as np

            blocks: dict[int, object] = {}

            def allocate(nbytes: int) -> int:
                block = np.empty(nbytes, np.uint8)
                blocks[block.ctypes.data] = block
                return block.ctypes.data

            self.stream_handle = 0
            self.sync = lambda: None
            self.decoder.use_memory(allocate, lambda ptr: blocks.pop(ptr))
        else:
            from imgops.engine import cuda_driver

            device = cuda_driver.Device(0)
            stream = device.stream()
            self.stream_handle = stream.handle
            self.sync = stream.synchronize
            self.decoder.use_memory(
                lambda n: device.alloc(n, stream), lambda p: device.free(p, stream)
            )
        self.decoder.warm_up(self.stream_handle)

    def run(self, batches: list[list[bytes]]) -> None:
        for batch in batches:
            found = [self.decoder.accept(data, 1 << 30) for data in batch]
            images = self.decoder.decode([c for c in found if c is not None], self.stream_handle)
            self.sync()
            for image in images:
                self.decoder.release(image)


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--cpu"]
    if len(args) != 1:
        sys.exit(f"usage: {sys.argv[0]} PHOTO_DIR [--cpu]")
    cpu = "--cpu" in sys.argv
    datas = [p.read_bytes() for p in sorted(Path(args[0]).glob("*.jpg"))[:800]]
    decoder = nc.CDecoder(0, cpu_backend=cpu, threads=2 if cpu else 0)
    colour = [d for d in datas if (c := decoder.accept(d, 1 << 30)) is not None and not c.gray]
    del decoder
    batches = [colour[i : i + BATCH] for i in range(0, len(colour), BATCH)]
    workers = [_Worker(cpu) for _ in range(3)]
    for round_ in (1, 2, 3):
        for count in (1, 2, 3):
            dealt = [batches[k::count] for k in range(count)]
            threads = [
                threading.Thread(target=workers[k].run, args=(dealt[k],)) for k in range(count)
            ]
            start = time.perf_counter()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            wall = time.perf_counter() - start
            print(f"round {round_}, {count} decode thread(s): {len(colour) / wall:.0f} files/s "
                  f"({len(colour)} files, {wall:.3f} s)", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
