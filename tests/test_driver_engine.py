"""The torch-free CUDA engine (imgops.engine.driver) without a GPU.

The CUDA driver is replaced by a stand-in that keeps "device" memory in host memory (real
addresses, so the engine's pointer arithmetic, pitches and copies are exercised as they are on
the GPU) and runs the kernels' reference functions: the exact luma formula and the CPU PNG
filter. The GPU decoder is replaced by OpenCV decoding into padded (pitched) buffers. What this
checks is the engine: batches, the op as a parameter, pitches, pinned buffers, the stream-ordered
frees, the CPU path for what the GPU does not decode, out-of-memory fallbacks, and that every
file comes out with the CPU path's exact bytes. The kernels themselves are tested on the GPU
(tests/test_cuda_driver.py, marked cuda).
"""

from __future__ import annotations

import ctypes
import itertools
import threading
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

from imgops.engine import GRAY, Job, PipelineSettings, cuda_driver, run_batch
from imgops.engine.device import Plan
from imgops.engine.driver import DeviceImage, DriverEngine, device_image
from imgops.engine.files import FatalError
from imgops.io.png import filter_code_for

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
PICTURES = sorted(p for p in SAMPLES.iterdir() if p.suffix in (".jpg", ".png"))
JPEGS = [p for p in PICTURES if p.suffix == ".jpg"]


def _host(ptr: int, nbytes: int) -> np.ndarray:
    """nbytes of host memory at ptr as a flat uint8 array (no copy)."""
    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(ptr))


_ticks = itertools.count()  # the order of the stand-in's stream operations


class FakeStream:
    """A stream that remembers how far it has waited for each other stream (through events),
    so that the fakes can fail a use of memory its stream is not ordered after."""

    handle = 12345

    def __init__(self) -> None:
        self.closed = False
        self.waited: dict[int, int] = {}  # id(other stream) -> the tick of its event

    def synchronize(self) -> None:
        pass

    def wait(self, event: FakeEvent) -> None:
        assert not event.closed  # waited for while it exists
        source, tick = event.recorded
        self.waited[source] = max(self.waited.get(source, -1), tick)

    def close(self) -> None:
        self.closed = True


class FakeEvent:
    def __init__(self, stream: FakeStream | None = None) -> None:
        self.closed = False
        self.recorded = (id(stream), next(_ticks))

    def close(self) -> None:
        self.closed = True

    def synchronize(self) -> None:
        pass

    def done(self) -> bool:
        return True


class FakePinned:
    def __init__(self, nbytes: int) -> None:
        self._array = np.full(nbytes, 0xCD, np.uint8)  # poisoned: unwritten bytes show
        self.ptr, self.nbytes = self._array.ctypes.data, nbytes
        self.closed = False

    def array(self) -> np.ndarray:
        return self._array

    def close(self) -> None:
        self.closed = True


class FakeDevice:
    """Device memory in host memory; `fail_alloc_at` makes the Nth alloc run out of memory."""

    instances: list[FakeDevice] = []
    fail_alloc_at: int | None = None

    def __init__(self, index: int = 0) -> None:
        self.blocks: dict[int, np.ndarray] = {}
        self.origin: dict[int, tuple[int, int]] = {}  # block -> (id(its stream), tick)
        self.internal_dependencies = True
        self.allocs = 0
        self.pinned_buffers: list[FakePinned] = []
        self.closed = False
        FakeDevice.instances.append(self)

    def close(self) -> None:
        self.closed = True

    def make_current(self) -> None:
        pass

    def mem_info(self) -> tuple[int, int]:
        return 1 << 30, 2 << 30

    def stream(self) -> FakeStream:
        return FakeStream()

    def event(self, stream: FakeStream, *, blocking: bool = True) -> FakeEvent:
        return FakeEvent(stream)

    def pool_internal_dependencies(self, allowed: bool) -> None:
        self.internal_dependencies = allowed

    def alloc(self, nbytes: int, stream: FakeStream) -> int:
        self.allocs += 1
        if FakeDevice.fail_alloc_at is not None and self.allocs == FakeDevice.fail_alloc_at:
            raise cuda_driver.CudaError(2, "cuMemAllocAsync")
        block = np.full(nbytes, 0xEE, np.uint8)
        self.blocks[block.ctypes.data] = block
        self.origin[block.ctypes.data] = (id(stream), next(_ticks))
        return block.ctypes.data

    def check_ordered(self, ptr: int, stream: FakeStream) -> None:
        """Fails where `stream` uses a block allocated (and so written: the decoder's output)
        on another stream without having waited for that stream past the allocation."""
        for start, block in self.blocks.items():
            if start <= ptr < start + max(1, block.size):
                source, tick = self.origin[start]
                if source != id(stream):
                    assert stream.waited.get(source, -1) > tick, "not ordered after its stream"
                return

    def free(self, ptr: int, stream: FakeStream) -> None:
        self.check_ordered(ptr, stream)
        del self.blocks[ptr]  # a double free or a foreign pointer fails the test
        del self.origin[ptr]

    def pinned(self, nbytes: int) -> FakePinned:
        buffer = FakePinned(nbytes)
        self.pinned_buffers.append(buffer)
        return buffer

    def copy_to_host(self, dst: int, src: int, nbytes: int, stream: FakeStream) -> None:
        ctypes.memmove(dst, src, nbytes)


class FakeKernels:
    """The kernels' definitions: the exact BT.601 formula and the CPU PNG filter."""

    def __init__(self, device: FakeDevice, path: Path | None = None) -> None:
        self.launches = 0
        self.device = device

    def gray_u8(self, src, src_pitch, dst, dst_pitch, width, height, bgr, stream) -> None:
        self.launches += 1
        self.device.check_ordered(src, stream)
        flat = _host(src, src_pitch * (height - 1) + 3 * width)
        rgb = np.lib.stride_tricks.as_strided(flat, (height, width, 3), (src_pitch, 3, 1))
        wide = rgb.astype(np.int64)
        red, blue = (wide[..., 2], wide[..., 0]) if bgr else (wide[..., 0], wide[..., 2])
        luma = ((299 * red + 587 * wide[..., 1] + 114 * blue + 500) // 1000).astype(np.uint8)
        out = _host(dst, dst_pitch * (height - 1) + width)
        np.lib.stride_tricks.as_strided(out, (height, width), (dst_pitch, 1))[...] = luma

    def png_filter_u8(self, src, src_pitch, row_bytes, height, bpp, filter, dst, stream) -> None:
        from imgops.native import cli_kernels

        self.launches += 1
        flat = _host(src, src_pitch * (height - 1) + row_bytes)
        image = np.ascontiguousarray(
            np.lib.stride_tricks.as_strided(flat, (height, row_bytes), (src_pitch, 1))
        )
        rows = _host(dst, height * (row_bytes + 1)).reshape(height, row_bytes + 1)
        rows[...] = _cpu_filter(cli_kernels(), image, bpp, filter)

    def png_deflate(self, rows, row, height, workspace, layout, stream) -> None:
        """The deflate kernels' stages run on the CPU (png_deflate_emulated.h): the stream and
        its length land in the workspace, the rest of it is left as the GPU leaves it."""
        from imgops.native import cli_kernels

        self.launches += 5
        kernels = cli_kernels()
        data = _host(rows, row * height).tobytes()
        png = kernels.png_encode_filtered_emulated(data, row - 1, height, 1, 1)
        head = kernels.PNG_HEAD_BYTES
        stream_bytes = png[head : head + int.from_bytes(png[head - 8 : head - 4], "big")]
        assert len(stream_bytes) <= layout.out_bytes
        _host(workspace, layout.total)[...] = 0
        data = np.frombuffer(stream_bytes, np.uint8)
        _host(workspace + layout.out, data.size)[...] = data
        _host(workspace + layout.size, 8)[...] = np.array([data.size], np.uint64).view(np.uint8)


def _cpu_filter(module, image: np.ndarray, bpp: int, code: int) -> np.ndarray:
    """PNG-filtered rows of an (H, row_bytes) uint8 image with the CPU filter."""
    import torch

    from imgops import _extension

    _extension.load()
    pixels = image if bpp == 1 else image.reshape(image.shape[0], -1, bpp)
    return torch.ops.imgops.png_filter(torch.from_numpy(pixels), code).numpy()


class FakeCandidate:
    def __init__(self, data: bytes, gray: bool, width: int, height: int) -> None:
        self.data, self.gray, self.width, self.height = data, gray, width, height

    @property
    def nbytes(self) -> int:
        return self.width * self.height * (1 if self.gray else 3)


class FakeDecoder:
    """Decodes JPEGs with OpenCV into pitched buffers (rows padded), RGB or (H, W, 1) gray;
    files whose bytes are in `fail` fail as nvImageCodec reports it (None, and a reason)."""

    def __init__(self, fail: tuple[bytes, ...] = ()) -> None:
        self.fail = fail
        self.batches = 0
        self.last_failures: list[str | None] = []

    def warm_up(self, cuda_stream: int = 0) -> None:
        pass

    def accept(self, data: bytes, max_pixels: int):
        if not data.startswith(b"\xff\xd8\xff"):
            return None
        image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
        if image is None:
            return None
        gray = image.ndim == 2
        return FakeCandidate(data, gray, image.shape[1], image.shape[0])

    def decode(self, batch, cuda_stream: int = 0):
        from imgops.io.images import decode_image

        assert cuda_stream == FakeStream.handle  # decodes go on the engine's stream
        self.batches += 1
        out = []
        self.last_failures = [
            "saturated (0x2)" if candidate.data in self.fail else None for candidate in batch
        ]
        for candidate in batch:
            if candidate.data in self.fail:
                out.append(None)
                continue
            pixels = decode_image(candidate.data).pixels  # OpenCV's pixels, EXIF applied
            # nvImageCodec gives RGB, and gray as (H, W, 1)
            pixels = pixels[..., ::-1] if pixels.ndim == 3 else pixels[..., None]
            height, width, channels = pixels.shape
            padded = np.full((height, width * channels + 61), 0x77, np.uint8)
            view = padded[:, : width * channels].reshape(height, width, channels)
            view[...] = pixels
            out.append(view)
        return out


@pytest.fixture(autouse=True)
def python_png_tail(monkeypatch):
    """The op and the PNG tail per image from Python, through the stand-ins here (which check
    the stream order of every use); the native calls run over the stand-in libcuda in
    tests/test_native_tail.py."""
    monkeypatch.setenv("IMGOPS_DEVICE_NATIVE", "none")


@pytest.fixture
def fake_driver(monkeypatch):
    FakeDevice.instances.clear()
    FakeDevice.fail_alloc_at = None
    monkeypatch.setattr(cuda_driver, "Device", FakeDevice)
    monkeypatch.setattr(cuda_driver, "Kernels", FakeKernels)
    yield
    FakeDevice.fail_alloc_at = None


def _engine(settings: PipelineSettings, decoder: FakeDecoder, jpeg_factory=None) -> DriverEngine:
    return DriverEngine(GRAY, settings, "cuda", 2, lambda: decoder, jpeg_factory, index=0)


def _run(engine: DriverEngine, paths, out: Path, fmt: str = "png") -> dict[str, object]:
    out.mkdir(parents=True, exist_ok=True)
    jobs = [Job(p, out / f"{i:02d}-{p.name}.{fmt}", p.name) for i, p in enumerate(paths)]
    results: list = []
    engine.run(iter(jobs), results.append)
    return {r.job.target.name: r for r in results}


def _cpu_bytes(paths, out: Path, fmt: str = "png", **options) -> dict[str, bytes]:
    out.mkdir(parents=True, exist_ok=True)
    jobs = [Job(p, out / f"{i:02d}-{p.name}.{fmt}", p.name) for i, p in enumerate(paths)]
    run_batch(jobs, GRAY, PipelineSettings(device="cpu", jobs=2, fmt=fmt, **options))
    return {j.target.name: j.target.read_bytes() for j in jobs}


def _difference(got: bytes, expected: bytes) -> str:
    """Why two PNG files differ: their sizes, and whether they decode to the same pixels (a
    different deflate of the same image) or not (where, and by how much)."""
    decoded = [
        cv2.imdecode(np.frombuffer(d, np.uint8), cv2.IMREAD_UNCHANGED) for d in (got, expected)
    ]
    sizes = f"{len(got)} bytes against {len(expected)}"
    if decoded[0] is None or decoded[1] is None or decoded[0].shape != decoded[1].shape:
        shapes = [None if d is None else d.shape for d in decoded]
        return f"{sizes}; decoded shapes {shapes}"
    delta = np.abs(decoded[0].astype(np.int64) - decoded[1])
    if not delta.any():
        return f"{sizes}; the same pixels (another deflate of the same image)"
    rows = np.nonzero(delta.reshape(delta.shape[0], -1).any(axis=1))[0]
    return f"{sizes}; pixels differ by up to {delta.max()} in rows {rows.min()}-{rows.max()}"


def _assert_same_file(path: Path, expected: bytes, what: object) -> None:
    """`path` holds `expected`; if not, the message says how the two differ."""
    got = path.read_bytes()
    if got != expected:
        pytest.fail(f"{what}: {_difference(got, expected)}")


def _assert_written_as_on_the_cpu(results, paths, tmp_path: Path) -> None:
    """Every file written, each with the bytes of the CPU path (and its size reported)."""
    expected = _cpu_bytes(paths, tmp_path / "cpu")
    assert all(r.status == "written" for r in results.values())
    for name, data in expected.items():
        _assert_same_file(tmp_path / "dev" / name, data, name)
        assert results[name].bytes_written == len(data), name


def _slow_stage(monkeypatch, release) -> None:
    """The stand-in driver, whose device starts only once `release` is set."""

    class SlowDevice(FakeDevice):
        def __init__(self, index: int = 0) -> None:
            release.wait(20)
            super().__init__(index)

    monkeypatch.setattr(cuda_driver, "Device", SlowDevice)
    monkeypatch.setattr(cuda_driver, "Kernels", FakeKernels)


def _wait_for_stage(engine: DriverEngine) -> None:
    engine.stage.future.result(timeout=20)


@pytest.mark.parametrize("level", [1, 2, 6])
def test_driver_engine_writes_the_cpu_paths_bytes(tmp_path: Path, fake_driver, level):
    """Every picture (JPEGs through the 'GPU', PNGs through the CPU path) comes out with the
    bytes of --device cpu, at each PNG level (fixed and adaptive filters)."""
    paths = PICTURES * 2
    decoder = FakeDecoder()
    settings = PipelineSettings(device="cuda", jobs=2, batch_size=3, png_level=level)
    engine = _engine(settings, decoder)
    _wait_for_stage(engine)  # no files on the CPU path because of start-up
    results = _run(engine, paths, tmp_path / "dev")
    expected = _cpu_bytes(paths, tmp_path / "cpu", png_level=level)
    assert all(r.status == "written" for r in results.values()), results
    for name, data in expected.items():
        _assert_same_file(tmp_path / "dev" / name, data, name)
    decoders = {name: r.decoder for name, r in results.items()}
    assert {decoders[n] for n in decoders if n.endswith(".jpg.png")} == {"nvimgcodec"}
    assert {decoders[n] for n in decoders if not n.endswith(".jpg.png")} <= {"opencv"}
    assert decoder.batches >= 2
    jpegs = sum(name.endswith(".jpg.png") for name in decoders)
    assert sum(engine.decode_batches) == jpegs and max(engine.decode_batches) <= 3
    device = FakeDevice.instances[-1]
    assert device.blocks == {}  # every device buffer freed
    assert all(b.closed for b in device.pinned_buffers)  # pinned memory handed back
    assert device.closed and engine.stage.stream.closed and engine.stage.decoder is None


def test_a_file_the_gpu_fails_to_decode_takes_the_cpu_path_and_says_why(
    tmp_path: Path, fake_driver
):
    """A file nvImageCodec fails on is converted on the CPU (the same bytes); its result and
    the run's summary name nvImageCodec's reason."""
    from imgops.engine.types import Summary

    failing = JPEGS[0]
    decoder = FakeDecoder(fail=(failing.read_bytes(),))
    engine = _engine(PipelineSettings(device="cuda", jobs=2, batch_size=3), decoder)
    _wait_for_stage(engine)
    results = _run(engine, JPEGS, tmp_path / "dev")
    _assert_written_as_on_the_cpu(results, JPEGS, tmp_path)
    why = "nvImageCodec could not decode it: saturated (0x2)"
    fallbacks = {name: r.fallback for name, r in results.items() if r.fallback}
    assert fallbacks == {f"00-{failing.name}.png": why}
    assert results[f"00-{failing.name}.png"].decoder == "opencv"
    summary = Summary()
    for result in results.values():
        summary.add(result)
    assert summary.as_dict()["fallbacks"] == {why: 1}


@pytest.mark.parametrize(("gpu_deflate", "streams"), [("default", "4"), ("1", "1"), ("0", "4")])
def test_the_device_deflate_is_used_and_changes_no_byte(
    tmp_path: Path, fake_driver, monkeypatch, gpu_deflate, streams
):
    """At the default level the stream is deflated on the device (on side streams, or on the
    stage's own with IMGOPS_DEFLATE_STREAMS=1) and framed in place on the host;
    with IMGOPS_GPU_DEFLATE=0 the filtered rows come back instead; the files are the same."""
    if gpu_deflate == "default":
        monkeypatch.delenv("IMGOPS_GPU_DEFLATE", raising=False)
    else:
        monkeypatch.setenv("IMGOPS_GPU_DEFLATE", gpu_deflate)
    monkeypatch.setenv("IMGOPS_DEFLATE_STREAMS", streams)
    waits: list[FakeStream] = []  # (those for a decode: below)
    decode_waits: list[FakeStream] = []
    wait = FakeStream.wait

    def counted_wait(self, event):
        decoded = event.recorded[0] == id(engine.stage.decode_stream)
        (decode_waits if decoded else waits).append(self)
        wait(self, event)

    monkeypatch.setattr(FakeStream, "wait", counted_wait)
    deflated: list[int] = []
    original = FakeKernels.png_deflate

    def counting(self, rows, row, height, *args):
        deflated.append(height)
        original(self, rows, row, height, *args)

    monkeypatch.setattr(FakeKernels, "png_deflate", counting)
    settings = PipelineSettings(device="cuda", jobs=2, batch_size=2)
    engine = _engine(settings, FakeDecoder())
    _wait_for_stage(engine)
    results = _run(engine, JPEGS * 2, tmp_path / "dev")
    _assert_written_as_on_the_cpu(results, JPEGS * 2, tmp_path)
    heights = sorted(r.shape[0] for r in results.values())
    assert sorted(deflated) == (heights if gpu_deflate != "0" else [])
    main = engine.stage.stream
    if gpu_deflate != "0" and streams == "4":  # each deflate waits for its rows, main for all
        assert sum(stream is not main for stream in waits) == len(deflated)
        assert any(stream is main for stream in waits)
    else:
        assert waits == []
    # the stage's stream waits for each decode (the decodes run on a stream of their own)
    assert decode_waits == [main] * len(engine.decode_batches)
    assert engine.stage.decode_stream is not main
    assert FakeDevice.instances[-1].blocks == {}  # every device buffer freed


@pytest.mark.parametrize("how", ["default", "off", "older module"])
def test_a_device_deflated_file_is_framed_and_written_in_one_native_call(
    tmp_path: Path, fake_driver, monkeypatch, how
):
    """Each file the device deflated is framed and written by one png_finish_zlib_to_file
    call; with IMGOPS_FINISH_TO_FILE=0, or a compiled module without that call, by
    png_finish_zlib then the write. The bytes, sizes and stats are the same either way."""
    from imgops.native import cli_kernels

    kernels = cli_kernels()
    calls = {"png_finish_zlib_to_file": 0, "png_finish_zlib": 0}
    for name in calls:
        original = getattr(kernels, name)

        def counted(*args, _name=name, _original=original):
            calls[_name] += 1
            return _original(*args)

        monkeypatch.setattr(kernels, name, counted)
    if how == "off":
        monkeypatch.setenv("IMGOPS_FINISH_TO_FILE", "0")
    else:
        monkeypatch.delenv("IMGOPS_FINISH_TO_FILE", raising=False)
    if how == "older module":
        monkeypatch.delattr(kernels, "png_finish_zlib_to_file")
    monkeypatch.delenv("IMGOPS_GPU_DEFLATE", raising=False)
    engine = _engine(PipelineSettings(device="cuda", jobs=2, batch_size=2), FakeDecoder())
    _wait_for_stage(engine)
    results = _run(engine, JPEGS * 2, tmp_path / "dev")
    _assert_written_as_on_the_cpu(results, JPEGS * 2, tmp_path)
    assert all(r.seconds["encode"] >= 0 and r.seconds["write"] >= 0 for r in results.values())
    fused = how == "default"
    assert calls == {
        "png_finish_zlib_to_file": len(results) if fused else 0,
        "png_finish_zlib": 0 if fused else len(results),
    }
    assert not [p for p in (tmp_path / "dev").iterdir() if not p.name.endswith(".png")]


def test_without_host_while_starting_every_jpeg_waits_for_the_gpu(tmp_path: Path, monkeypatch):
    """host_while_starting=False: files wait for the stage instead of taking the CPU path."""
    import threading

    release = threading.Event()

    _slow_stage(monkeypatch, release)
    settings = PipelineSettings(device="cuda", jobs=2, batch_size=2, host_while_starting=False)
    engine = _engine(settings, FakeDecoder())
    threading.Timer(0.5, release.set).start()
    results = _run(engine, JPEGS * 2, tmp_path / "dev")
    assert {r.decoder for r in results.values()} == {"nvimgcodec"}


def test_driver_engine_other_formats_come_back_as_pixels(tmp_path: Path, fake_driver):
    """TIFF output: the pixels come back (pitched gray-JPEG inputs included) and match."""
    paths = JPEGS * 2
    engine = _engine(
        PipelineSettings(device="cuda", jobs=2, batch_size=2, fmt="tif"), FakeDecoder()
    )
    _wait_for_stage(engine)
    results = _run(engine, paths, tmp_path / "dev", fmt="tif")
    assert all(r.status == "written" for r in results.values())
    expected = _cpu_bytes(paths, tmp_path / "cpu", fmt="tif")
    for name, _data in expected.items():
        got = cv2.imread(str(tmp_path / "dev" / name), cv2.IMREAD_UNCHANGED)
        want = cv2.imread(str(tmp_path / "cpu" / name), cv2.IMREAD_UNCHANGED)
        assert np.array_equal(got, want), name


def test_out_of_device_memory_converts_the_batch_on_the_cpu(tmp_path: Path, fake_driver):
    FakeDevice.fail_alloc_at = 2
    paths = JPEGS * 3
    engine = _engine(PipelineSettings(device="cuda", jobs=2, batch_size=3), FakeDecoder())
    _wait_for_stage(engine)
    results = _run(engine, paths, tmp_path / "dev")
    _assert_written_as_on_the_cpu(results, paths, tmp_path)
    notes = [r.note for r in results.values() if r.note]
    assert any("out of GPU memory" in n for n in notes)
    assert FakeDevice.instances[-1].blocks == {}


@pytest.mark.parametrize("fail_at", range(2, 10))
def test_out_of_device_memory_anywhere_in_a_batch_gives_its_pinned_buffers_back(
    tmp_path: Path, fake_driver, fail_at: int
):
    """Whichever allocation of the batch runs out (the op's output, a filtered-rows buffer of
    a later image), the pinned buffers the batch took are back in the pool afterwards and
    every file is written, the same bytes as on the CPU."""
    FakeDevice.fail_alloc_at = fail_at
    paths = JPEGS * 2
    engine = _engine(PipelineSettings(device="cuda", jobs=2, batch_size=4), FakeDecoder())
    _wait_for_stage(engine)
    results = _run(engine, paths, tmp_path / "dev")
    _assert_written_as_on_the_cpu(results, paths, tmp_path)
    assert engine.pool is None or engine.pool._out == 0
    assert FakeDevice.instances[-1].blocks == {}


def test_files_take_the_cpu_path_until_the_stage_is_ready(tmp_path: Path, monkeypatch):
    """A stage that cannot start (no GPU) is fatal only for device work: files that arrive
    while it starts take the CPU path; once it failed, the batch stops with its error."""
    import threading

    release = threading.Event()

    _slow_stage(monkeypatch, release)
    paths = JPEGS * 4
    engine = _engine(PipelineSettings(device="cuda", jobs=2, batch_size=2), FakeDecoder())
    out = tmp_path / "dev"
    out.mkdir()
    jobs = [Job(p, out / f"{i:02d}.png", p.name) for i, p in enumerate(paths)]
    results: list = []

    def on_result(result) -> None:
        results.append(result)
        if len(results) == 3:
            release.set()

    engine.run(iter(jobs), on_result)
    assert [r.status for r in results] == ["written"] * len(paths)
    decoders = [r.decoder for r in results]
    assert decoders[:3] == ["opencv"] * 3 and "nvimgcodec" in decoders[3:]


def test_a_decoder_that_cannot_start_leaves_every_file_to_the_cpu(tmp_path: Path, fake_driver):
    from imgops.io.gpu_decode import GpuDecoderUnavailable

    def no_decoder():
        raise GpuDecoderUnavailable("nvImageCodec cannot decode on GPU 0: test")

    settings = PipelineSettings(device="cuda", jobs=2, batch_size=2)
    engine = DriverEngine(GRAY, settings, "cuda", 2, no_decoder, None, index=0)
    _wait_for_stage(engine)
    assert "test" in engine.stage.decoder_problem
    results = _run(engine, JPEGS, tmp_path / "dev")
    assert {r.decoder for r in results.values()} == {"opencv"}
    expected = _cpu_bytes(JPEGS, tmp_path / "cpu")
    for name, data in expected.items():
        assert (tmp_path / "dev" / name).read_bytes() == data


@pytest.mark.parametrize("mode", ["parallel", "serial"])
def test_the_decoder_is_made_beside_the_context_or_after_it(monkeypatch, mode):
    """IMGOPS_STAGE_START=parallel makes nvImageCodec's decoder in a thread of its own while
    the stage's thread makes the context; serial, after it. Either way the stage ends with
    both, and a decoder that cannot start leaves the CPU to decode (said in decoder_problem)."""
    import threading

    from imgops.engine.driver_stage import DriverStage
    from imgops.io.gpu_decode import GpuDecoderUnavailable

    monkeypatch.setenv("IMGOPS_STAGE_START", mode)
    release = threading.Event()
    _slow_stage(monkeypatch, release)
    made = threading.Event()
    decoder = FakeDecoder()

    def factory():
        made.set()
        return decoder

    stage = DriverStage(0, factory)
    assert made.wait(0.5) == (mode == "parallel")  # the context is still held back
    release.set()
    assert stage.future.result(timeout=20) is stage and stage.decoder is decoder
    stage.close()

    def refused():
        raise GpuDecoderUnavailable("no decoder here")

    stage = DriverStage(0, refused)
    assert stage.future.result(timeout=20).decoder is None
    assert stage.decoder_problem == "no decoder here"
    stage.close()

    def broken():
        raise RuntimeError("broken factory")

    stage = DriverStage(0, broken)
    with pytest.raises(RuntimeError, match="broken factory"):
        stage.future.result(timeout=20)


def test_device_image_reads_pitch_and_channels():
    rgb = np.zeros((4, 10), np.uint8)[:, :9].reshape(4, 3, 3)
    image = device_image(rgb)
    assert (image.width, image.height, image.channels, image.pitch) == (3, 4, 3, 10)
    gray = np.zeros((5, 7, 1), np.uint8)
    assert device_image(gray).shape == (5, 7)
    with pytest.raises(ValueError):
        device_image(np.zeros((2, 2, 3), np.uint16))
    assert DeviceImage(0, 5, 2, 3, 16).row_bytes == 15


def test_filter_code_matches_the_cpu_encoder():
    assert filter_code_for(2) == 4 and filter_code_for(6) == -1


def test_device_auto_picks_the_driver_engine_only_where_it_can_run(monkeypatch):
    from imgops.engine import device as device_choice

    monkeypatch.setattr(device_choice, "driver_engine_usable", lambda op: op is GRAY)
    monkeypatch.setattr(device_choice, "cuda_device_count", lambda: 1)
    monkeypatch.setattr(device_choice.gpu_decode, "installed", lambda: True)
    many = PipelineSettings(expected_files=device_choice.CUDA_MIN_FILES_DRIVER)
    assert device_choice.choose(many, GRAY) == Plan(
        "cuda", "gpu", f"auto: {many.expected_files} files >= "
        f"{device_choice.CUDA_MIN_FILES_DRIVER}, the torch-free CUDA engine"
    )  # fmt: skip
    few = PipelineSettings(expected_files=device_choice.CUDA_MIN_FILES_DRIVER - 1)
    assert device_choice.choose(few, GRAY).device == "cpu"
    monkeypatch.setattr(device_choice.gpu_decode, "installed", lambda: False)
    assert device_choice.choose(many, GRAY).device == "cpu"
    monkeypatch.setattr(device_choice, "cuda_device_count", lambda: 0)
    assert device_choice.choose(many, GRAY).device == "cpu"


class FakeJpegEncoder:
    """Encodes the device arrays (host memory here) with OpenCV; `refuse` returns None for all."""

    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.seen: list[tuple[int, ...]] = []

    def encode_arrays(self, arrays, cuda_stream: int = 0):
        assert cuda_stream == FakeStream.handle
        out = []
        for array in arrays:
            face = array.__cuda_array_interface__
            shape, strides = tuple(face["shape"]), tuple(face["strides"])
            self.seen.append(shape)
            flat = _host(face["data"][0], strides[0] * (shape[0] - 1) + shape[1] * shape[2])
            pixels = np.lib.stride_tricks.as_strided(flat, shape, strides)
            ok, data = cv2.imencode(".jpg", np.ascontiguousarray(pixels[..., 0]))
            out.append(None if self.refuse else data.tobytes())
        return out


@pytest.mark.parametrize("refuse", [False, True])
def test_jpeg_output_goes_through_the_gpu_encoder(tmp_path: Path, fake_driver, refuse):
    """-f jpg: the gray device images go to the JPEG encoder as pitched CUDA arrays (gray as
    (H, W, 1)); images it does not encode are encoded by OpenCV, with a note."""
    encoder = FakeJpegEncoder(refuse)
    settings = PipelineSettings(device="cuda", jobs=2, batch_size=2, fmt="jpg")
    engine = _engine(settings, FakeDecoder(), jpeg_factory=lambda: encoder)
    _wait_for_stage(engine)
    results = _run(engine, JPEGS * 2, tmp_path / "dev", fmt="jpg")
    assert all(r.status == "written" for r in results.values())
    assert encoder.seen and all(len(s) == 3 and s[2] == 1 for s in encoder.seen)
    expected = _cpu_bytes(JPEGS * 2, tmp_path / "cpu", fmt="jpg")
    for name in expected:
        got = cv2.imread(str(tmp_path / "dev" / name), cv2.IMREAD_UNCHANGED)
        want = cv2.imread(str(tmp_path / "cpu" / name), cv2.IMREAD_UNCHANGED)
        assert got.shape == want.shape[:2] or got.shape == want.shape, name
        if refuse:  # OpenCV encoded the same gray pixels: the CPU path's file exactly
            assert (tmp_path / "dev" / name).read_bytes() == expected[name], name
    notes = [r.note or "" for r in results.values()]
    assert all(("OpenCV instead" in n) == refuse for n in notes), notes
    assert FakeDevice.instances[-1].blocks == {}


def test_a_prestarted_stage_is_adopted_and_kept_to_the_end_of_the_process(
    tmp_path: Path, fake_driver, monkeypatch
):
    """The command line starts the stage before it plans (driver_stage.prestart): the engine
    takes that stage (once), writes the CPU path's bytes, and keeps the stage at the end instead
    of releasing it (the process exits next; the release would hold the GIL)."""
    from imgops.engine import driver_stage

    decoder = FakeDecoder()
    monkeypatch.setattr(driver_stage, "make_decoder", lambda index, threads: decoder)
    monkeypatch.setattr(driver_stage, "_kept", [])
    stage = driver_stage.prestart(0, 2)
    assert driver_stage.prestart(0, 2) is stage  # one stage per GPU
    stage.future.result(timeout=20)
    engine = _engine(PipelineSettings(device="cuda", jobs=2, batch_size=3), FakeDecoder())
    assert engine.stage is stage and driver_stage.take_prestarted(0) is None
    results = _run(engine, JPEGS, tmp_path / "dev")
    expected = _cpu_bytes(JPEGS, tmp_path / "cpu")
    for name, data in expected.items():
        assert (tmp_path / "dev" / name).read_bytes() == data, name
    assert {r.decoder for r in results.values()} == {"nvimgcodec"} and decoder.batches >= 1
    device = FakeDevice.instances[-1]
    assert device.blocks == {}  # the batches' buffers are freed all the same
    assert not device.closed and stage.decoder is decoder and driver_stage._kept == [stage]
    # without a prestarted stage the engine makes (and releases) its own
    other = _engine(PipelineSettings(device="cuda", jobs=2), FakeDecoder())
    assert other.stage is not stage and other.stage.release


def test_the_command_line_prestarts_only_where_the_driver_engine_will_run(monkeypatch):
    from imgops.commands import gray as gray_command
    from imgops.engine import device as device_choice
    from imgops.engine import driver_stage

    started: list[tuple[int, int]] = []
    monkeypatch.setattr(
        driver_stage, "prestart", lambda index, threads: started.append((index, threads))
    )
    monkeypatch.setattr(device_choice, "driver_engine_usable", lambda op: op is GRAY)
    monkeypatch.setattr(device_choice, "cuda_device_count", lambda: pytest.fail("cuInit"))
    monkeypatch.setattr(device_choice.gpu_decode, "installed", lambda: True)
    gray_command._prestart_cuda(PipelineSettings(device="cuda:1", jobs=3))
    assert started == [(1, 3)]
    many = device_choice.CUDA_MIN_FILES_DRIVER
    for settings in (
        PipelineSettings(device="cpu", jobs=3),
        PipelineSettings(device="cuda", decoder="cpu", jobs=3),  # the torch engine
        PipelineSettings(device="auto", jobs=3, expected_files=many - 1),  # the CPU path
    ):
        gray_command._prestart_cuda(settings)
    assert started == [(1, 3)]
    gray_command._prestart_cuda(PipelineSettings(device="auto", jobs=3, expected_files=many))
    assert started == [(1, 3), (0, 3)]
    # where the GPU exists, choose() agrees with the answer given without the driver
    monkeypatch.setattr(device_choice, "cuda_device_count", lambda: 2)
    for settings in (
        PipelineSettings(device="cuda:1", jobs=3),
        PipelineSettings(device="auto", jobs=3, expected_files=many),
        PipelineSettings(device="auto", jobs=3, expected_files=many - 1),
        PipelineSettings(device="cuda", decoder="cpu", jobs=3),
    ):
        index = device_choice.driver_gpu_if_present(settings, GRAY)
        plan = device_choice.choose(settings, GRAY)
        driver = plan.device.startswith("cuda") and plan.decoder == "gpu"
        assert (index is not None) == driver and (index is None or index == plan.index)
    monkeypatch.setattr(device_choice.gpu_decode, "installed", lambda: False)
    gray_command._prestart_cuda(PipelineSettings(device="cuda", jobs=3))
    assert len(started) == 2


@pytest.mark.parametrize("kept", [False, True])
def test_the_command_line_leaves_with_its_code_and_flushed_output(kept: bool):
    """After a batch whose CUDA stage was kept, the CLI leaves through os._exit: the exit code
    and everything written to stdout and stderr (buffered, unterminated) still come out."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from imgops import cli\n"
        "from imgops.engine import driver_stage\n"
        f"if {kept}: driver_stage._kept.append(object())\n"
        "sys.stdout.write('data on stdout'); sys.stderr.write('a line on stderr')\n"
        "cli._leave(3)\n"
        "print('not reached')\n"
    )
    src = str(Path(__file__).resolve().parent.parent / "src")
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
        env={**__import__("os").environ, "PYTHONPATH": src},
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert done.stdout == "data on stdout" and done.stderr.endswith("a line on stderr")


@pytest.mark.skipif(
    __import__("imgops.io.nvimgcodec_c").io.nvimgcodec_c.package_dir() is None,
    reason="nvImageCodec not installed",
)
def test_the_c_api_decoder_decodes_into_the_stages_memory(tmp_path: Path, fake_driver):
    """nvImageCodec through its C API (its CPU backend here) decodes into memory the stage
    allocates in stream order, on a decode stream of its own (the stage's stream waits for each
    decode, and the stand-in fails a kernel or free not ordered after it); the engine frees
    every such buffer and writes the CPU bytes."""
    from imgops.io.nvimgcodec_c import CDecoder

    paths = PICTURES * 2
    settings = PipelineSettings(device="cuda", jobs=2, batch_size=3)
    engine = DriverEngine(
        GRAY, settings, "cuda", 2, lambda: CDecoder(cpu_backend=True, threads=2), index=0
    )
    _wait_for_stage(engine)
    results = _run(engine, paths, tmp_path / "dev")
    _assert_written_as_on_the_cpu(results, paths, tmp_path)
    decoders = {r.decoder for name, r in results.items() if name.endswith(".jpg.png")}
    assert decoders == {"nvimgcodec"}
    device = FakeDevice.instances[-1]
    assert device.blocks == {}  # the decoded images' memory too, freed in stream order
    assert device.closed and engine.stage.decoder is None
    assert engine.stage.decode_stream is not engine.stage.stream
    assert not device.internal_dependencies
    assert engine.stage.decode_stream.closed


@pytest.mark.skipif(
    __import__("imgops.io.nvimgcodec_c").io.nvimgcodec_c.package_dir() is None,
    reason="nvImageCodec not installed",
)
@pytest.mark.parametrize("how", ["op fails", "cancelled"])
def test_a_batch_that_stops_gives_back_every_device_buffer(tmp_path: Path, fake_driver, how):
    """A batch stopped by a failing op (a bug, a device error) or by a cancel while images
    wait decoded in device memory: the failed batch's images and rows and the batches decoded
    but never run all go back, and the pinned buffers of queued encodes (a warm `imgops serve`
    stage outlives the command). Was: only what a finished batch frees."""
    import dataclasses

    from imgops.io.nvimgcodec_c import CDecoder

    calls = 0

    def failing(stage, image, order):
        nonlocal calls
        calls += 1
        if how == "op fails" and calls == 4:
            raise RuntimeError("the kernel failed")
        return GRAY.driver(stage, image, order)

    op = dataclasses.replace(GRAY, driver=failing)
    settings = PipelineSettings(device="cuda", jobs=2, batch_size=2)
    engine = DriverEngine(
        op, settings, "cuda", 2, lambda: CDecoder(cpu_backend=True, threads=2), index=0
    )
    _wait_for_stage(engine)
    paths = JPEGS * 6
    (tmp_path / "dev").mkdir()
    jobs = [Job(p, tmp_path / "dev" / f"{i:02d}.png", p.name) for i, p in enumerate(paths)]
    results: list = []

    def on_result(result) -> None:
        results.append(result)
        if how == "cancelled" and len(results) == 2:
            time.sleep(0.3)  # the decode thread fills the queue meanwhile
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt if how == "cancelled" else FatalError, match=""):
        engine.run(iter(jobs), on_result)
    assert len(results) < len(jobs)
    device = FakeDevice.instances[-1]
    assert device.allocs > 2 * len(results)  # images were decoded that never ran
    assert device.blocks == {}
    assert all(b.closed for b in device.pinned_buffers)


def test_a_failed_or_unused_prestarted_stage_is_never_adopted(
    tmp_path: Path, fake_driver, monkeypatch
):
    """A prestarted stage that failed (no GPU) or that no engine took (the batch stopped before
    its engine) is not adopted by a later batch of the same process."""
    from imgops.engine import driver_stage

    monkeypatch.setattr(driver_stage, "make_decoder", lambda index, threads: FakeDecoder())

    def no_gpu(index: int = 0):
        raise cuda_driver.CudaError(100, "cuInit")

    monkeypatch.setattr(cuda_driver, "Device", no_gpu)
    failed = driver_stage.prestart(0, 2)
    with pytest.raises(cuda_driver.CudaError):
        failed.future.result(timeout=20)
    monkeypatch.setattr(cuda_driver, "Device", FakeDevice)
    engine = _engine(PipelineSettings(device="cuda", jobs=2), FakeDecoder())
    assert engine.stage is not failed
    _wait_for_stage(engine)
    results = _run(engine, JPEGS, tmp_path / "dev")
    assert {r.status for r in results.values()} == {"written"}
    driver_stage.prestart(0, 2)
    driver_stage.discard_prestarted()
    assert driver_stage.take_prestarted(0) is None


def test_a_warm_stage_serves_batch_after_batch_with_its_pinned_buffers(
    tmp_path: Path, fake_driver, monkeypatch
):
    """In a process that keeps stages warm (imgops serve): each batch adopts the stage
    prestart() made, with the decoder and the pinned buffers of the batches before it, writes
    the CPU path's bytes, and gives the stage back at its end; nothing is kept for an exit,
    and a discard (the end of a command) leaves it; `--device auto` then picks the warm GPU
    for a batch of any size."""
    from imgops.engine import device as device_choice
    from imgops.engine import driver_stage

    decoder = FakeDecoder()
    monkeypatch.setattr(driver_stage, "make_decoder", lambda index, threads: decoder)
    monkeypatch.setattr(driver_stage, "_kept", [])
    monkeypatch.setattr(driver_stage, "_prestarted", {})
    monkeypatch.setattr(driver_stage, "_warm", False)
    monkeypatch.setattr(device_choice, "driver_engine_usable", lambda op: op is GRAY)
    assert device_choice.warm_gpu() is None
    driver_stage.keep_warm()
    stage = driver_stage.prestart(0, 2)
    stage.future.result(timeout=20)
    assert device_choice.warm_gpu() == 0
    plan = device_choice.choose(PipelineSettings(device="auto", jobs=2, expected_files=1), GRAY)
    assert (plan.device, plan.decoder) == ("cuda", "gpu") and "warm" in plan.why
    expected = _cpu_bytes(JPEGS, tmp_path / "cpu")
    pools = []
    for round_ in range(3):
        engine = _engine(PipelineSettings(device="cuda", jobs=2, batch_size=3), FakeDecoder())
        assert engine.stage is stage
        assert driver_stage.warm_stages() == {}  # taken while the batch runs
        results = _run(engine, JPEGS, tmp_path / f"dev{round_}")
        assert {r.decoder for r in results.values()} == {"nvimgcodec"}
        for name, data in expected.items():
            assert (tmp_path / f"dev{round_}" / name).read_bytes() == data, (round_, name)
        pools.append(stage.pinned_pool)
        driver_stage.discard_prestarted()  # what each command does at its end
        assert driver_stage.warm_stages() == {0: stage}
    # --decoder gpu adopts the warm stage and its decoder too (instead of making its own)
    settings = PipelineSettings(device="cuda", jobs=2, batch_size=3, decoder="gpu")
    engine = _engine(settings, FakeDecoder())
    assert engine.stage is stage
    results = _run(engine, JPEGS, tmp_path / "gpu")
    assert {r.decoder for r in results.values()} == {"nvimgcodec"}
    for name, data in expected.items():
        assert (tmp_path / "gpu" / name).read_bytes() == data, name
    assert engine.decoder is None and driver_stage.warm_stages() == {0: stage}
    assert stage.decoder is decoder
    device = FakeDevice.instances[-1]
    assert len(FakeDevice.instances) == 1 and not device.closed and device.blocks == {}
    assert pools[0] is not None and pools == [pools[0]] * 3  # pinned once, reused
    assert not any(buffer.closed for buffer in device.pinned_buffers)
    assert driver_stage._kept == [] and not driver_stage.holds_kept_stage()
    assert decoder.batches >= 3


def test_a_warm_stage_whose_stream_fails_is_not_reused(tmp_path: Path, fake_driver, monkeypatch):
    """A stage whose stream cannot drain (a failed context) reports it and is never handed to
    a later batch."""
    from imgops.engine import driver_stage

    monkeypatch.setattr(driver_stage, "make_decoder", lambda index, threads: FakeDecoder())
    monkeypatch.setattr(driver_stage, "_kept", [])
    monkeypatch.setattr(driver_stage, "_prestarted", {})
    monkeypatch.setattr(driver_stage, "_warm", True)
    stage = driver_stage.prestart(0, 2)
    stage.future.result(timeout=20)
    assert driver_stage.take_prestarted(0) is stage

    def fail() -> None:
        raise cuda_driver.CudaError(700, "cuStreamSynchronize")

    monkeypatch.setattr(stage.stream, "synchronize", fail)
    with pytest.raises(cuda_driver.CudaError):
        stage.close()
    assert driver_stage.warm_stages() == {} and driver_stage._kept == [stage]


def test_gray_on_a_missing_gpu_leaves_no_prestarted_stage(tmp_path: Path, monkeypatch):
    from click.testing import CliRunner

    from imgops.cli import cli
    from imgops.engine import device as device_choice
    from imgops.engine import driver_stage

    monkeypatch.setattr(device_choice, "driver_engine_usable", lambda op: op is GRAY)
    monkeypatch.setattr(device_choice.gpu_decode, "installed", lambda: True)
    monkeypatch.setattr(device_choice, "cuda_device_count", lambda: 0)
    made: list[object] = []
    real_prestart = driver_stage.prestart
    monkeypatch.setattr(
        driver_stage, "prestart", lambda index, threads: made.append(real_prestart(index, threads))
    )
    source = tmp_path / "in.jpg"
    source.write_bytes(JPEGS[0].read_bytes())
    done = CliRunner().invoke(cli, ["gray", str(source), "-o", str(tmp_path / "out.png"),
                                    "--device", "cuda", "-q"])  # fmt: skip
    assert done.exit_code == 1 and "no CUDA GPU" in done.output, done.output
    assert len(made) == 1 and driver_stage._prestarted == {}
    assert not (tmp_path / "out.png").exists()


def test_the_next_batch_decodes_while_the_device_runs_the_last(
    tmp_path: Path, fake_driver, monkeypatch
):
    """nvImageCodec's call blocks until its batch is decoded: a decode thread decodes batch k+1
    while the device thread queues batch k, never more than one batch ahead."""
    import threading
    import time

    decodes: list[tuple[str, float, float]] = []
    runs: list[tuple[float, float]] = []

    class SlowDecoder(FakeDecoder):
        def decode(self, batch, cuda_stream: int = 0):
            start = time.perf_counter()
            time.sleep(0.05)
            out = super().decode(batch, cuda_stream)
            decodes.append((threading.current_thread().name, start, time.perf_counter()))
            return out

    original = DriverEngine._run_batch

    def slow_run(self, stage, batch, images):
        start = time.perf_counter()
        time.sleep(0.05)
        outcome = original(self, stage, batch, images)
        runs.append((start, time.perf_counter()))
        return outcome

    monkeypatch.setattr(DriverEngine, "_run_batch", slow_run)
    settings = PipelineSettings(device="cuda", jobs=2, batch_size=1)
    engine = _engine(settings, SlowDecoder())
    _wait_for_stage(engine)
    paths = [p for p in JPEGS if p.stat().st_size < 300_000][:2] * 4
    results = _run(engine, paths, tmp_path / "dev")
    assert all(r.status == "written" for r in results.values())
    assert len(decodes) == len(runs) == len(paths)
    assert {name for name, _, _ in decodes} == {"imgops-decode"}
    overlapped = sum(decodes[k + 1][1] < runs[k][1] for k in range(len(runs) - 1))
    assert overlapped >= len(runs) // 2, (decodes, runs)
    for k in range(len(runs) - 2):  # batch k+2 decodes only once the device took batch k+1
        assert decodes[k + 2][1] >= runs[k][1] - 1e-3


@pytest.mark.parametrize(("value", "limit"), [(None, 3 << 20), ("1", 1 << 20), ("x", 3 << 20)])
def test_the_pinned_pool_limit_can_be_overridden_for_comparisons(
    tmp_path: Path, fake_driver, monkeypatch, value, limit
):
    """IMGOPS_PINNED_MIB sets the pool's limit (a bad value: the settings' pinned_bytes); the
    outputs stay the CPU path's bytes however small the pool, even smaller than one batch."""
    if value is None:
        monkeypatch.delenv("IMGOPS_PINNED_MIB", raising=False)
    else:
        monkeypatch.setenv("IMGOPS_PINNED_MIB", value)
    paths = JPEGS * 2
    settings = PipelineSettings(device="cuda", jobs=2, batch_size=3, pinned_bytes=3 << 20)
    engine = _engine(settings, FakeDecoder())
    _wait_for_stage(engine)
    done: list = []  # (a pool smaller than a batch once waited for the batch's own buffers)
    batch = threading.Thread(target=lambda: done.append(_run(engine, paths, tmp_path / "dev")))
    batch.daemon = True
    batch.start()
    batch.join(60)
    assert done, "the batch did not finish"
    _assert_written_as_on_the_cpu(done[0], paths, tmp_path)
    assert engine.pool is not None and engine.pool.limit == limit
    assert engine.pool.allocated >= 1 and engine.pool.allocate_seconds >= 0.0


@pytest.mark.skipif(
    __import__("imgops.io.nvimgcodec_c").io.nvimgcodec_c.package_dir() is None,
    reason="nvImageCodec not installed",
)
@pytest.mark.parametrize("value", [None, "c", "nonsense"])
def test_jpeg_output_with_the_c_api_decoder_uses_the_c_api_encoder_on_its_instance(
    tmp_path: Path, fake_driver, monkeypatch, value
):
    """-f jpg (by default, or IMGOPS_JPEG_ENCODER_API=c) where the stage's decoder is the C
    API's: the
    JPEG encoder is made on that decoder's instance through the C API (the Python module's
    factory is never called), its files decode to the gray pixels within JPEG's error, and the
    instance is given back."""
    from imgops.io.nvimgcodec_c import CDecoder
    from imgops.io.nvimgcodec_encode_c import CEncoder

    if value is None:
        monkeypatch.delenv("IMGOPS_JPEG_ENCODER_API", raising=False)
    else:
        monkeypatch.setenv("IMGOPS_JPEG_ENCODER_API", value)

    def python_module_encoder():
        raise AssertionError("the Python module's encoder was asked for")

    decoder = CDecoder(cpu_backend=True, threads=2)
    settings = PipelineSettings(device="cuda", jobs=2, batch_size=3, fmt="jpg", jpeg_quality=92)
    engine = DriverEngine(
        GRAY, settings, "cuda", 2, lambda: decoder, python_module_encoder, index=0
    )
    _wait_for_stage(engine)
    results = _run(engine, JPEGS * 2, tmp_path / "dev", fmt="jpg")
    assert all(r.status == "written" and not r.note for r in results.values()), results
    assert isinstance(engine._jpeg, CEncoder) and engine._jpeg.quality == 92
    for i, path in enumerate(JPEGS * 2):
        got = cv2.imread(str(tmp_path / "dev" / f"{i:02d}-{path.name}.jpg"), cv2.IMREAD_UNCHANGED)
        want = cv2.cvtColor(cv2.imread(str(path)), cv2.COLOR_BGR2GRAY)
        assert got.shape == want.shape
        assert np.abs(got.astype(int) - want).mean() < 3, path.name
    assert decoder._instance_users == 1  # the encoder gave its share back at the end
    decoder.close()  # (the stage only drops it)
    assert decoder._instance_users == 0 and not decoder._instance
    assert FakeDevice.instances[-1].blocks == {}


@pytest.mark.skipif(
    __import__("imgops.io.nvimgcodec_c").io.nvimgcodec_c.package_dir() is None,
    reason="nvImageCodec not installed",
)
def test_jpeg_output_uses_the_python_module_encoder_when_asked(
    tmp_path: Path, fake_driver, monkeypatch
):
    """With IMGOPS_JPEG_ENCODER_API=python the engine asks the factory (the Python module's
    encoder) even where the stage's decoder is the C API's."""
    from imgops.io.nvimgcodec_c import CDecoder

    monkeypatch.setenv("IMGOPS_JPEG_ENCODER_API", "python")
    encoder = FakeJpegEncoder(False)
    decoder = CDecoder(cpu_backend=True, threads=2)
    settings = PipelineSettings(device="cuda", jobs=2, batch_size=3, fmt="jpg")
    engine = DriverEngine(GRAY, settings, "cuda", 2, lambda: decoder, lambda: encoder, index=0)
    _wait_for_stage(engine)
    results = _run(engine, JPEGS, tmp_path / "dev", fmt="jpg")
    assert all(r.status == "written" for r in results.values())
    assert engine._jpeg is encoder and encoder.seen


def test_the_decodes_get_a_stream_of_their_own_and_the_pool_no_cross_stream_waits(fake_driver):
    """nvImageCodec always decodes on a stream of the stage's own, and the pool never makes one
    stream wait for another's frees (nvJPEG's hardware decode does not honour such a wait:
    DriverStage._start); both streams are closed with the stage."""
    from imgops.engine.driver_stage import DriverStage

    stage = DriverStage(0).get()
    try:
        assert stage.decode_stream is not stage.stream
        assert stage.device.internal_dependencies is False
    finally:
        stage.close()
    assert stage.stream.closed and stage.decode_stream.closed
