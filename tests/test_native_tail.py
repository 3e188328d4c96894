"""The device thread's native PNG tail (imgops.engine.native_batch, csrc/standalone/device_batch.h):
a batch's PNG filters, device deflates and copies queued in one native call, through the loaded
driver's own functions.

On the stand-in libcuda (tests/fake_cuda, its kernels are the CPU references) in CI, and on a
GPU (marked gpu_driver): every image's PNG file must be the CPU encoder's, byte for byte; a failed
driver call names itself and hands back the memory it still owns; and the torch-free engine
writes the CPU path's bytes with the native tail as with the per-image Python one.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from driver_backends import FATBIN_MAGIC, Backend  # (the backend fixtures come with conftest)

from imgops.engine import cuda_driver as cd
from imgops.engine import native_batch
from imgops.engine.native_batch import COLOUR_FIELDS, IMAGE_FIELDS, NativeCalls, native_calls_for

kernels_module = pytest.importorskip("imgops._cli_kernels")
if not hasattr(kernels_module, "device_gray"):  # an older build of the module
    pytest.skip("imgops._cli_kernels has no native device calls", allow_module_level=True)

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
JPEGS = sorted(SAMPLES.glob("*.jpg"))


def _stage(backend: Backend) -> SimpleNamespace:
    """What NativeCalls takes from a DriverStage."""
    return SimpleNamespace(
        device=backend.device, kernels=backend.kernels, stream=backend.stream, native_calls=None
    )


def _image(rng: np.random.Generator, height: int, width: int, channels: int) -> np.ndarray:
    """Photo-like rows (a smooth ramp and noise) with flat patches: every filter and token kind."""
    y, x = np.mgrid[0:height, 0 : width * channels]
    smooth = (x * 3 + y * 5 + rng.integers(0, 12, (height, width * channels))) % 256
    image = smooth.astype(np.uint8)
    image[: height // 3, : width * channels // 2] = rng.integers(0, 256)
    return image


def _cpu_png(image: np.ndarray, width: int, channels: int, code: int) -> bytes:
    """The CPU encoder's PNG file of the rows (filter `code`, imgops' row deflate)."""
    height = image.shape[0]
    return bytes(
        kernels_module.png_encode(image.tobytes(), width, height, channels, 1, image.shape[1], code)
    )


def _run_tail(backend, shapes, code, sides, chunk, rng):
    """Uploads pitched images, queues their tail in chunks and returns (files, expected)."""
    module = kernels_module
    stage = _stage(backend)
    tail = NativeCalls(stage, module)
    streams = [backend.stream, *[backend.device.stream() for _ in range(sides)]]
    uploads, pinned, expected, fields = [], [], [], []
    try:
        for height, width, channels in shapes:
            image = _image(rng, height, width, channels)
            pad = int(rng.integers(0, 40))
            padded = np.zeros((height, width * channels + pad), np.uint8)
            padded[:, : width * channels] = image
            src = backend.upload(padded)
            uploads.append(src)
            out_bytes = module.png_deflate_layout(width * channels + 1, height)[2]
            room = module.png_file_room(out_bytes)
            buffer = backend.device.pinned(room + 8)
            buffer.array()[:] = 0xCD  # poisoned: what the copies miss shows
            pinned.append((buffer, room, out_bytes))
            fields.append((src, padded.shape[1], width * channels, height, channels, buffer.ptr))
            expected.append(_cpu_png(image, width, channels, code))
        images = np.array(fields, dtype=np.int64).reshape(-1, IMAGE_FIELDS)
        for start in range(0, len(shapes), chunk):
            last = start + chunk >= len(shapes)
            tail.png_tail(images[start : start + chunk], code, streams, first=start, join=last)
        backend.stream.synchronize()
        files = []
        for (buffer, room, out_bytes), shape in zip(pinned, shapes, strict=True):
            height, width, channels = shape
            host = buffer.array()
            size = int(host[room : room + 8].view(np.uint64)[0])
            assert 6 <= size <= out_bytes
            n = module.png_finish_zlib(host, size, width, height, channels, 1)
            files.append(host[:n].tobytes())
        return files, expected
    finally:
        for stream in streams[1:]:
            stream.synchronize()
            stream.close()
        backend.free(*uploads)
        for buffer, _, _ in pinned:
            buffer.close()
        tail.close()


SHAPES = [(1, 1, 1), (7, 33, 1), (64, 200, 1), (300, 1000, 1), (5, 17, 3), (120, 640, 3)]


@pytest.mark.parametrize("code", [-1, 0, 3, 4])
@pytest.mark.parametrize(("sides", "chunk"), [(0, 8), (1, 2), (4, 3), (4, 64)])
def test_the_native_tail_writes_the_cpu_encoders_files(backend, code, sides, chunk):
    rng = np.random.default_rng()
    shapes = [SHAPES[int(i)] for i in rng.permutation(len(SHAPES))]
    files, expected = _run_tail(backend, shapes, code, sides, chunk, rng)
    for got, want, shape in zip(files, expected, shapes, strict=True):
        assert got == want, shape


def test_the_native_tail_on_a_photo_of_many_blocks(backend):
    """A real photo's gray rows: more than 8 deflate blocks, so several Huffman tables."""
    cv2 = pytest.importorskip("cv2")
    gray = cv2.imread(str(JPEGS[0]), cv2.IMREAD_GRAYSCALE)
    height, width = gray.shape
    module = kernels_module
    stage = _stage(backend)
    tail = NativeCalls(stage, module)
    src = backend.upload(gray)
    out_bytes = module.png_deflate_layout(width + 1, height)[2]
    room = module.png_file_room(out_bytes)
    try:
        with backend.device.pinned(room + 8) as buffer:
            images = np.array([[src, width, width, height, 1, buffer.ptr]], np.int64)
            tail.png_tail(images, 4, [backend.stream], first=0, join=True)
            backend.stream.synchronize()
            host = buffer.array()
            size = int(host[room : room + 8].view(np.uint64)[0])
            n = module.png_finish_zlib(host, size, width, height, 1, 1)
            assert host[:n].tobytes() == _cpu_png(gray, width, 1, 4)
    finally:
        backend.free(src)
        tail.close()


def test_the_native_tail_launches_what_the_python_tail_launches(fake):
    """Per image: the filter and the five deflate kernels, with the Python tail's grids."""
    rng = np.random.default_rng()
    before = fake.counter("fake_launches")
    shapes = [(300, 1000, 1), (2, 3, 1)]
    files, expected = _run_tail(fake, shapes, -1, 2, 8, rng)
    assert files == expected
    assert fake.counter("fake_launches") - before == 6 * len(shapes)
    # the last launch: the second image's write kernel, one block, 512 threads
    assert fake.launch_shape() == ([1, 1, 1], [512, 1, 1])


def test_a_failed_driver_call_names_itself_and_hands_back_its_memory(fake):
    """A side stream the driver refuses (the stand-in checks handles): the call that failed
    is named, and the rows and workspace already allocated come back to be freed."""
    module = kernels_module
    tail = NativeCalls(_stage(fake), module)
    src = fake.upload(np.zeros((4, 8), np.uint8))
    live = ctypes.c_int.in_dll(fake.lib, "fake_live_allocations").value
    bogus = SimpleNamespace(handle=tail._event._handle)  # an event, not a stream
    try:
        with fake.device.pinned(4096) as buffer:
            images = np.array([[src, 8, 8, 4, 1, buffer.ptr]], np.int64)
            with pytest.raises(cd.CudaError, match=r"cuStreamWaitEvent") as raised:
                tail.png_tail(images, 0, [fake.stream, bogus], first=0, join=True)
        owned = raised.value.owned
        assert len(owned) == 2
        assert ctypes.c_int.in_dll(fake.lib, "fake_live_allocations").value == live + 2
        fake.free(*owned)
        assert ctypes.c_int.in_dll(fake.lib, "fake_live_allocations").value == live
    finally:
        fake.free(src)
        tail.close()


@pytest.mark.parametrize(
    ("field", "value"),
    [(0, 0), (1, 3), (2, -1), (3, 0), (4, 0), (4, 9), (5, 0)],
)
def test_the_native_tail_refuses_a_bad_image(fake, field, value):
    """A null pointer, a pitch under the row, no rows, a bpp outside 1..8: ValueError, and
    nothing is queued."""
    tail = NativeCalls(_stage(fake), kernels_module)
    before = fake.counter("fake_launches")
    images = np.array([[0x1000, 8, 8, 4, 1, 0x2000]], np.int64)
    images[0, field] = value
    try:
        with pytest.raises(ValueError, match="not a valid 8-bit image"):
            tail.png_tail(images, 0, [fake.stream], first=0, join=True)
        assert fake.counter("fake_launches") == before
    finally:
        tail.close()


def test_the_native_calls_refuse_a_short_table():
    with pytest.raises(ValueError, match="15-entry table"):
        kernels_module.device_png_tail(
            np.zeros(14, np.int64), np.zeros((0, 6), np.int64), 0, np.ones(1, np.int64), 1, 0, 1
        )
    with pytest.raises(ValueError, match="multiple of 6"):
        kernels_module.device_png_tail(
            np.zeros(15, np.int64), np.zeros(5, np.int64), 0, np.ones(1, np.int64), 1, 0, 1
        )
    with pytest.raises(ValueError, match="15-entry table"):
        kernels_module.device_gray(np.zeros(14, np.int64), np.zeros((0, 5), np.int64), 1)
    with pytest.raises(ValueError, match="misses a driver function"):
        kernels_module.device_gray(np.zeros(15, np.int64), np.zeros((0, 5), np.int64), 1)


DEFAULT = native_batch.DEVICE_NATIVE_DEFAULT == "all"


@pytest.mark.parametrize(
    ("value", "op", "tail"),
    [("all", True, True), ("tail", False, True), ("op", True, False), ("none", False, False),
     ("bogus", DEFAULT, DEFAULT), (None, DEFAULT, DEFAULT)],
)  # fmt: skip
def test_the_native_calls_are_made_once_per_stage_and_can_be_switched_off(
    fake, monkeypatch, value, op, tail
):
    if value is None:
        monkeypatch.delenv("IMGOPS_DEVICE_NATIVE", raising=False)
    else:
        monkeypatch.setenv("IMGOPS_DEVICE_NATIVE", value)
    stage = _stage(fake)
    try:
        got = native_calls_for(stage, "op"), native_calls_for(stage, "tail")
        assert (got[0] is not None, got[1] is not None) == (op, tail)
        made = [calls for calls in got if calls is not None]
        assert all(calls is stage.native_calls for calls in made)
    finally:
        if stage.native_calls is not None:
            stage.native_calls.close()


def test_without_the_native_functions_everything_runs_from_python(fake, monkeypatch):
    from imgops import native

    monkeypatch.setenv("IMGOPS_DEVICE_NATIVE", "all")
    monkeypatch.setattr(native, "cli_kernels", lambda: SimpleNamespace())
    assert native_batch.native_calls_for(_stage(fake), "op") is None
    assert native_batch.native_calls_for(_stage(fake), "tail") is None


# --- the gray op's batch form -------------------------------------------------------------------


def _luma(rgb: np.ndarray, bgr: bool) -> np.ndarray:
    wide = rgb.astype(np.int64)
    red, blue = (wide[..., 2], wide[..., 0]) if bgr else (wide[..., 0], wide[..., 2])
    return ((299 * red + 587 * wide[..., 1] + 114 * blue + 500) // 1000).astype(np.uint8)


GRAY_SHAPES = [(1, 1), (3, 31), (17, 257), (300, 1000), (2, 70000)]


@pytest.mark.parametrize("bgr", [False, True])
def test_device_gray_gives_the_exact_luma(backend, bgr):
    rng = np.random.default_rng()
    calls = NativeCalls(_stage(backend), kernels_module)
    uploads, outs, expected, fields = [], [], [], []
    try:
        for height, width in GRAY_SHAPES:
            pad = int(rng.integers(0, 50))
            padded = rng.integers(0, 256, (height, 3 * width + pad), dtype=np.uint8)
            uploads.append(backend.upload(padded))
            rgb = padded[:, : 3 * width].reshape(height, width, 3)
            expected.append(_luma(rgb, bgr))
            fields.append((uploads[-1], padded.shape[1], width, height, int(bgr)))
        outs = calls.gray(np.array(fields, np.int64).reshape(-1, COLOUR_FIELDS), backend.stream)
        assert len(outs) == len(GRAY_SHAPES) and len(set(outs)) == len(outs)
        for ptr, want in zip(outs, expected, strict=True):
            got = backend.download(ptr, want.size).reshape(want.shape)
            np.testing.assert_array_equal(got, want)
    finally:
        backend.free(*uploads, *outs)
        calls.close()


def test_device_gray_launches_as_the_python_op_does(fake):
    """The grid of kernels.gray_u8; an empty image gets a 1-byte output and no launch."""
    calls = NativeCalls(_stage(fake), kernels_module)
    src = fake.upload(np.zeros((5, 3 * 700), np.uint8))
    before = fake.counter("fake_launches")
    outs = calls.gray(np.array([[src, 2100, 700, 5, 0], [src, 0, 0, 0, 0]], np.int64), fake.stream)
    try:
        assert fake.counter("fake_launches") - before == 1 and len(outs) == 2
        assert fake.launch_shape() == ([3, 5, 1], [256, 1, 1])
        fake.kernels.gray_u8(src, 2100, outs[0], 700, 700, 5, False, fake.stream)
        assert fake.launch_shape() == ([3, 5, 1], [256, 1, 1])
    finally:
        fake.free(src, *outs)
        calls.close()


@pytest.mark.parametrize("field", [(1, 5), (2, -1), (3, -1), (0, 0)])
def test_device_gray_refuses_a_bad_image(fake, field):
    calls = NativeCalls(_stage(fake), kernels_module)
    images = np.array([[0x1000, 30, 10, 4, 0]], np.int64)
    images[0, field[0]] = field[1]
    try:
        with pytest.raises(ValueError, match="not a valid colour image"):
            calls.gray(images, fake.stream)
    finally:
        calls.close()


def test_a_failed_gray_call_hands_back_the_outputs_it_made(fake):
    """A stream the driver refuses (the stand-in checks handles): the call that failed is
    named and nothing is left allocated; on the stage's stream the same images give one
    output each."""
    calls = NativeCalls(_stage(fake), kernels_module)
    src = fake.upload(np.zeros((2, 6), np.uint8))
    live = ctypes.c_int.in_dll(fake.lib, "fake_live_allocations").value
    try:
        images = np.array([[src, 6, 2, 2, 0], [src, 6, 2, 2, 0]], np.int64)
        bogus = SimpleNamespace(handle=calls._event._handle)  # an event, not a stream
        with pytest.raises(cd.CudaError, match="cuMemAllocAsync") as raised:
            calls.gray(images, bogus)
        assert raised.value.owned == []
        outs = calls.gray(images, fake.stream)
        assert ctypes.c_int.in_dll(fake.lib, "fake_live_allocations").value == live + 2
        fake.free(*outs)
    finally:
        fake.free(src)
        calls.close()


def test_device_free_gives_back_every_pointer(backend):
    """One call frees a batch's memory in order (0 entries skipped); on the stand-in nothing
    is left allocated."""
    calls = NativeCalls(_stage(backend), kernels_module)
    live = backend.counter("fake_live_allocations") if backend.lib is not None else None
    ptrs = [backend.upload(np.full(n, 7, np.uint8)) for n in (1, 4096, 1 << 20)]
    try:
        calls.free([ptrs[0], 0, ptrs[1], ptrs[2]], backend.stream)
        calls.free([], backend.stream)
        backend.stream.synchronize()
        if live is not None:
            assert backend.counter("fake_live_allocations") == live
    finally:
        calls.close()


def test_a_failed_free_hands_back_what_it_did_not_free(fake):
    """A stream the driver refuses: the call is named and every pointer comes back, the
    failed one first; they can then be freed."""
    calls = NativeCalls(_stage(fake), kernels_module)
    live = fake.counter("fake_live_allocations")
    ptrs = [fake.upload(np.zeros(16, np.uint8)) for _ in range(3)]
    try:
        bogus = SimpleNamespace(handle=calls._event._handle)  # an event, not a stream
        with pytest.raises(cd.CudaError, match="cuMemFreeAsync") as raised:
            calls.free(ptrs, bogus)
        assert raised.value.owned == ptrs
        assert fake.counter("fake_live_allocations") == live + 3
        calls.free(raised.value.owned, fake.stream)
        assert fake.counter("fake_live_allocations") == live
    finally:
        calls.close()


def test_device_free_refuses_a_short_table_and_a_ragged_list():
    with pytest.raises(ValueError, match="15-entry table"):
        kernels_module.device_free(np.zeros(14, np.int64), np.zeros(1, np.int64), 1)
    with pytest.raises(ValueError, match="multiple of 1"):
        kernels_module.device_free(np.ones(15, np.int64), b"\0" * 12, 1)


# --- the whole engine over the stand-in libcuda -----------------------------------------------


class HostDecoder:
    """Decodes JPEGs with OpenCV into pitched host buffers, RGB or (H, W, 1) gray, as
    nvImageCodec hands them over (the stand-in driver's "device" memory is host memory)."""

    def warm_up(self, cuda_stream: int = 0) -> None:
        pass

    def accept(self, data: bytes, max_pixels: int):
        import cv2

        if not data.startswith(b"\xff\xd8\xff"):
            return None
        image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
        channels = 1 if image.ndim == 2 else 3
        return SimpleNamespace(
            data=data, gray=channels == 1, width=image.shape[1], height=image.shape[0],
            nbytes=image.shape[0] * image.shape[1] * channels,
        )  # fmt: skip

    def decode(self, batch, cuda_stream: int = 0):
        from imgops.io.images import decode_image

        out = []
        for candidate in batch:
            pixels = decode_image(candidate.data).pixels
            pixels = pixels[..., ::-1] if pixels.ndim == 3 else pixels[..., None]
            height, width, channels = pixels.shape
            padded = np.full((height, width * channels + 29), 0x55, np.uint8)
            view = padded[:, : width * channels].reshape(height, width, channels)
            view[...] = pixels
            out.append(view)
        self.last_failures = [None] * len(batch)
        return out


@pytest.mark.parametrize("native", ["all", "tail", "op", "none"])
def test_the_engine_writes_the_cpu_paths_bytes_over_the_stand_in_driver(
    tmp_path, fake_library, monkeypatch, native
):
    """DriverEngine on the real ctypes driver layer over the stand-in libcuda: the same files
    as the CPU path, with the native calls and with the per-image Python ones."""
    from imgops.engine import GRAY, Job, PipelineSettings, run_batch
    from imgops.engine.driver import DriverEngine

    monkeypatch.setattr(cd, "_LIBRARY_NAMES", (str(fake_library),))
    monkeypatch.setattr(cd, "_lib", None)
    fatbin = tmp_path / cd.KERNELS_NAME
    fatbin.write_bytes(FATBIN_MAGIC + bytes(60))
    monkeypatch.setattr(cd, "kernels_path", lambda: fatbin)
    monkeypatch.setenv("IMGOPS_DEVICE_NATIVE", native)
    monkeypatch.setenv("IMGOPS_GPU_DEFLATE", "1")
    paths = JPEGS * 3
    settings = PipelineSettings(device="cuda", jobs=2, batch_size=5, png_level=2)
    decoder = HostDecoder()
    engine = DriverEngine(GRAY, settings, "cuda", 2, lambda: decoder, None, index=0)
    engine.stage.future.result(timeout=30)
    (tmp_path / "dev").mkdir()
    jobs = [Job(p, tmp_path / "dev" / f"{i:02d}.png", p.name) for i, p in enumerate(paths)]
    results: list = []
    engine.run(iter(jobs), results.append)
    assert all(r.status == "written" for r in results), [r.note for r in results]
    assert {r.decoder for r in results} == {"nvimgcodec"}
    (tmp_path / "cpu").mkdir()
    cpu_jobs = [Job(p, tmp_path / "cpu" / f"{i:02d}.png", p.name) for i, p in enumerate(paths)]
    run_batch(cpu_jobs, GRAY, PipelineSettings(device="cpu", jobs=2, png_level=2))
    for job, cpu_job in zip(jobs, cpu_jobs, strict=True):
        assert job.target.read_bytes() == cpu_job.target.read_bytes(), job.source.name
    assert (engine.tail is not None) == (native in ("all", "tail"))
    launches = ctypes.c_int.in_dll(ctypes.CDLL(str(fake_library)), "fake_launches").value
    assert launches > 0
    assert ctypes.c_int.in_dll(ctypes.CDLL(str(fake_library)), "fake_live_allocations").value == 0
