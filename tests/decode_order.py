"""Whether nvImageCodec's GPU decode can write memory that work already queued on a stream
still reads: the hazard behind the wrong pixels decodes on the stage's stream gave
(docs/GPU.md, "The decode stream"), probed on purpose.

The probe holds the stage's stream with a host function (the stream runs nothing queued
after it until the probe lets it go), queues on it copies that read "victim" buffers, frees
the victims there (stream-ordered: the pool may hand their memory to the next allocation on
that stream at once), then decodes a batch of JPEGs into the stage's memory on the given
stream and only then lets the stage's stream go. A decode that honours stream order writes
nothing before the copies have run; one that writes when it is called overwrites the
victims the copies have not read yet.

Used by tests/test_decode_stream_order.py (the engine's own decode stream must keep every
victim intact) and run as a script on the GPU machine to compare both streams:
    python tests/decode_order.py [ROUNDS [JPEG]]
"""

from __future__ import annotations

import ctypes
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

SAMPLE = Path(__file__).resolve().parent.parent / "samples" / "rocket_baseline_rgb.jpg"
FILL = 0xA5
_HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


@dataclass
class ProbeResult:
    """One probe: decoded (images the decoder wrote), reused (those whose memory was a
    victim's), corrupted (victims the copies read back changed), call_seconds (the decode
    call's wall time; a call that waited for the held stream takes the hold's timeout)."""

    decoded: int
    reused: int
    corrupted: int
    call_seconds: float


class StreamHold:
    """Holds a stream: work queued on it after this runs only once release() is called (or
    `timeout` seconds passed: a decode call that waits for the stream cannot hang the probe)."""

    def __init__(self, device, stream, timeout: float = 5.0) -> None:
        from imgops.engine import cuda_driver

        self._gate = threading.Event()
        self._timeout = timeout
        self.timed_out = False
        self._callback = _HOST_FN(self._wait)  # kept alive until the stream has run it
        launch = cuda_driver._driver().cuLaunchHostFunc
        launch.argtypes = [ctypes.c_void_p, _HOST_FN, ctypes.c_void_p]
        launch.restype = ctypes.c_int
        device.make_current()
        cuda_driver._check(
            launch(ctypes.c_void_p(stream.handle), self._callback, None), "cuLaunchHostFunc"
        )

    def _wait(self, _data) -> None:
        if not self._gate.wait(self._timeout):
            self.timed_out = True

    def release(self) -> None:
        """Lets the stream run on."""
        self._gate.set()


def probe(stage, decode_stream, count: int = 8, sample: Path = SAMPLE) -> ProbeResult:
    """One probe on a started DriverStage with a GPU decoder: `count` victims and `count`
    decodes of `sample` on `decode_stream` (stage.decode_stream, or stage.stream), into memory
    allocated on that stream (as the engine does)."""
    device, stream, decoder = stage.device, stage.stream, stage.decoder
    decoder.use_memory(
        lambda nbytes: device.alloc(nbytes, decode_stream),
        lambda pointer: device.free(pointer, decode_stream),
    )
    try:
        return _probe(device, stream, decoder, decode_stream, count, sample)
    finally:
        stage.bind(decoder)  # the stage's own binding again


def _probe(device, stream, decoder, decode_stream, count: int, sample: Path) -> ProbeResult:
    data = sample.read_bytes()
    candidates = [decoder.accept(data, 1 << 28) for _ in range(count)]
    assert all(c is not None for c in candidates), "the decoder refused the sample"
    channels = 1 if candidates[0].gray else 3
    nbytes = candidates[0].width * candidates[0].height * channels  # an output's size
    victims = [device.alloc(nbytes, stream) for _ in range(count)]
    for victim in victims:
        device.memset(victim, FILL, nbytes, stream)
    read_back = [device.pinned(nbytes) for _ in range(count)]
    stream.synchronize()  # the victims hold FILL
    hold = StreamHold(device, stream)
    try:
        for victim, buffer in zip(victims, read_back, strict=True):
            device.copy_to_host(buffer.ptr, victim, nbytes, stream)  # queued: reads later
            device.free(victim, stream)  # stream-ordered: its memory may be handed out now
        start = time.perf_counter()
        images = decoder.decode(candidates, decode_stream.handle)
        call_seconds = time.perf_counter() - start
    finally:
        hold.release()
    stream.synchronize()
    decode_stream.synchronize()
    decoded = [image for image in images if image is not None]
    reused = sum(image.ptr in victims for image in decoded)
    corrupted = sum(bool((buffer.array() != FILL).any()) for buffer in read_back)
    for image in decoded:
        decoder.release(image)
    for buffer in read_back:
        buffer.close()
    decode_stream.synchronize()
    return ProbeResult(len(decoded), reused, corrupted, call_seconds)


def start_stage():
    """A started DriverStage on GPU 0 with the engine's GPU decoder (as `imgops gray` makes
    it), or the reason there is none."""
    from imgops.engine import cuda_driver
    from imgops.engine.driver_stage import DriverStage, make_decoder
    from imgops.io import nvimgcodec_c

    if nvimgcodec_c.package_dir() is None:
        return None, "nvImageCodec not installed"
    if not cuda_driver.driver_available() or cuda_driver.kernels_path() is None:
        return None, "no GPU, or no device kernels in this build"
    stage = DriverStage(0, lambda: make_decoder(0, 4))
    stage.future.result(120)
    if stage.decoder is None or not hasattr(stage.decoder, "use_memory"):
        stage.close()
        return None, f"no C API GPU decoder: {stage.decoder_problem or type(stage.decoder)}"
    return stage, None


def main(rounds: int, sample: Path) -> int:
    """Probes both streams `rounds` times each with `sample` and prints one line a probe."""
    stage, why = start_stage()
    if stage is None:
        print(f"decode-order: skipped: {why}")
        return 0
    try:
        print(
            f"decode-order: backend {getattr(stage.decoder, 'backend', '?')}, sample {sample.name}"
        )
        totals = {}
        for name, decode_stream in (("own", stage.decode_stream), ("stage", stage.stream)):
            for _ in range(rounds):
                result = probe(stage, decode_stream, sample=sample)
                print(f"decode-order: {name:5s} {result}")
                corrupted, reused = totals.get(name, (0, 0))
                totals[name] = (corrupted + result.corrupted, reused + result.reused)
        for name, (corrupted, reused) in totals.items():
            print(f"decode-order: {name}: {corrupted} corrupted, {reused} reused, {rounds} rounds")
    finally:
        stage.close()
    return 0


if __name__ == "__main__":
    arguments = sys.argv[1:]
    sys.exit(
        main(
            int(arguments[0]) if arguments else 5,
            Path(arguments[1]) if len(arguments) > 1 else SAMPLE,
        )
    )
