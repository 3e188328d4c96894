"""Probe: where the engine's nvImageCodec decode call spends its time (GPU host).

    python scripts/decode_split_probe.py PHOTO_DIR

In one process: the CUDA context and a stream, imgops' C API decoder (warmed up), then up to
800 colour JPEGs of PHOTO_DIR in batches of 64 and 128, three rounds. Per file: accept (code
stream and image info: the engine's prep threads), prepare (outputs, image handles and the
nvimgcodecDecoderDecode call), wait (the future), sync (the stream) and destroy; then the same
batches of 64 (accepted beforehand) one call at a time against two calls in flight (the next
submitted before the last is waited for).
Run 2026-12-07 on an H100 host: the decode call took 0.42 ms a file and its future 0.002 ms
(the call is synchronous), and two in flight were as fast as one (2,226-2,233 files/s): the
engine's IMGOPS_DECODE_IN_FLIGHT=2 was removed.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from imgops.engine import cuda_driver  # noqa: E402
from imgops.io import nvimgcodec_c as nc  # noqa: E402

STEPS = ("accept", "prepare", "wait", "sync", "destroy")


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} PHOTO_DIR")
    datas = [p.read_bytes() for p in sorted(Path(sys.argv[1]).glob("*.jpg"))[:800]]
    device = cuda_driver.Device(0)
    stream = device.stream()
    decoder = nc.CDecoder(0)
    decoder.use_memory(lambda n: device.alloc(n, stream), lambda p: device.free(p, stream))
    decoder.warm_up(stream.handle)

    def colour(batch: list[bytes]) -> list[nc.Candidate]:
        found = [decoder.accept(d, 1 << 30) for d in batch]
        return [c for c in found if c is not None and not c.gray]

    for round_ in (1, 2, 3):
        for size in (64, 128):
            spent = dict.fromkeys(STEPS, 0.0)
            start = time.perf_counter()
            for first in range(0, len(datas), size):
                mark = time.perf_counter()
                candidates = colour(datas[first : first + size])
                spent["accept"] += time.perf_counter() - mark
                mark = time.perf_counter()
                part = decoder._start_alike(candidates, stream.handle)  # prepare + submit
                spent["prepare"] += time.perf_counter() - mark
                mark = time.perf_counter()
                images, _ = decoder._finish_alike(part)
                spent["wait"] += time.perf_counter() - mark
                mark = time.perf_counter()
                stream.synchronize()
                spent["sync"] += time.perf_counter() - mark
                mark = time.perf_counter()
                for image in images:
                    decoder.release(image)
                spent["destroy"] += time.perf_counter() - mark
            wall = time.perf_counter() - start
            per_file = ", ".join(f"{k} {1000 * v / len(datas):.3f}" for k, v in spent.items() if v)
            print(f"round {round_}, batches of {size}: {len(datas) / wall:.0f} files/s "
                  f"({per_file} ms a file; prepare includes the submit)", flush=True)  # fmt: skip
        candidates = colour(datas)
        for in_flight in (1, 2):
            start = time.perf_counter()
            pending: list[nc.PendingDecode] = []
            for first in range(0, len(candidates), 64):
                pending.append(decoder.submit(candidates[first : first + 64], stream.handle))
                while len(pending) >= in_flight:
                    for image in pending.pop(0).result():
                        decoder.release(image)
            for waiting in pending:
                for image in waiting.result():
                    decoder.release(image)
            stream.synchronize()
            wall = time.perf_counter() - start
            print(f"round {round_}, {in_flight} in flight (accept excluded): "
                  f"{len(candidates) / wall:.0f} files/s", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
