"""imgops.engine.cuda_driver: the CUDA driver API through ctypes and the packaged device kernels.

Three kinds of test:
* plain ones (errors, DeviceArray, the build's fatbin flags, the package's kernels file);
* `backend` tests, run twice: on "fake", a stand-in libcuda over host memory compiled from
  tests/fake_cuda/fake_libcuda.cpp (it checks what ctypes passes: 64-bit pointers, pitches,
  the kernel parameters and grid sizes), and on "gpu", the real driver and the real kernels
  (marked gpu_driver: skipped without a GPU); both from tests/driver_backends.py;
* GPU-only ones, some over more than 2^31 bytes (marked slow too).
"""

from __future__ import annotations

import ctypes
import json
import pickle
import subprocess
import sys
import threading
import zlib
from pathlib import Path

import numpy as np
import pytest
from driver_backends import FATBIN_MAGIC, Backend  # (the backend fixtures come with conftest)

from imgops import _build_support
from imgops.engine import cuda_driver as cd
from imgops.reference import png_filter_reference

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "imgops"
FILTERS = (-1, 0, 1, 2, 3, 4)


# --- errors, the library, DeviceArray -----------------------------------------------------------


@pytest.fixture
def no_driver(monkeypatch):
    """cuda_driver as on a machine without libcuda."""
    monkeypatch.setattr(cd, "_LIBRARY_NAMES", ("libcuda-that-does-not-exist.so.1",))
    monkeypatch.setattr(cd, "_lib", None)


def test_cuda_error_text_without_the_driver(no_driver):
    error = cd.CudaError(2, "cuMemAllocAsync")
    assert str(error) == "CUDA_ERROR_OUT_OF_MEMORY: out of memory (cuMemAllocAsync)"
    assert (error.code, error.name, error.call) == (
        2,
        "CUDA_ERROR_OUT_OF_MEMORY",
        "cuMemAllocAsync",
    )
    assert error.out_of_memory
    assert isinstance(error, RuntimeError)
    other = cd.CudaError(700, "cuStreamSynchronize")
    assert not other.out_of_memory
    assert str(other).startswith("CUDA_ERROR_ILLEGAL_ADDRESS: ")
    unknown = cd.CudaError(12345, "cuSomething")
    assert unknown.name == "CUresult 12345" and "(cuSomething)" in str(unknown)
    copy = pickle.loads(pickle.dumps(error))
    assert (str(copy), copy.code, copy.call) == (str(error), 2, "cuMemAllocAsync")


def test_check_raises_for_any_result_but_success(no_driver):
    cd._check(0, "cuInit")
    with pytest.raises(cd.CudaError) as caught:
        cd._check(1, "cuLaunchKernel imgops_gray_u8")
    assert str(caught.value) == (
        "CUDA_ERROR_INVALID_VALUE: invalid argument (cuLaunchKernel imgops_gray_u8)"
    )


def test_without_libcuda_nothing_raises_but_device(no_driver):
    assert cd.driver_available() is False
    with pytest.raises(cd.CudaError) as caught:
        cd.Device(0)
    assert caught.value.code == -1 and caught.value.call == "dlopen"
    assert "libcuda-that-does-not-exist" in str(caught.value)


def test_driver_available_never_raises(monkeypatch):
    def broken():
        raise OSError("a broken driver install")

    monkeypatch.setattr(cd, "_driver", broken)
    assert cd.driver_available() is False


def test_the_module_does_not_import_torch():
    code = (
        "import sys; import imgops.engine.cuda_driver as m; "
        "print(sorted({'torch', 'cuda', 'cupy'} & set(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "[]"


def test_device_array_interface():
    rng = np.random.default_rng()
    ptr = int(rng.integers(1 << 40, 1 << 47))
    view = cd.DeviceArray(ptr, (480, 640, 3), (2048, 3, 1), stream=0x7F00_1234_5678)
    assert view.__cuda_array_interface__ == {
        "shape": (480, 640, 3),
        "typestr": "|u1",
        "data": (ptr, False),
        "strides": (2048, 3, 1),
        "version": 3,
        "stream": 0x7F00_1234_5678,
    }
    plain = cd.DeviceArray(ptr, (5, 7), None, "<u2").__cuda_array_interface__
    assert plain["strides"] is None and plain["typestr"] == "<u2" and "stream" not in plain
    with pytest.raises(ValueError):
        cd.DeviceArray(ptr, (5, 7), (7,))
    with pytest.raises(ValueError):
        cd.DeviceArray(ptr, (5, 7), None, stream=0)


# --- the build: fatbin flags, the packaged file --------------------------------------------------


def test_kernels_name_is_the_builds():
    assert cd.KERNELS_NAME == _build_support.DEVICE_KERNELS_NAME


def test_kernels_path_follows_the_build_meta():
    meta_file = PACKAGE / _build_support.BUILD_META_NAME
    if not meta_file.exists():
        pytest.skip("no in-place build here (src/imgops/_build_meta.json)")
    meta = json.loads(meta_file.read_text())
    path = cd.kernels_path()
    assert (path is not None) == bool(meta.get("device_kernels")), (meta, path)
    if path is not None:
        assert path == PACKAGE / cd.KERNELS_NAME
        assert path.read_bytes()[:4] == FATBIN_MAGIC


@pytest.mark.parametrize(
    ("archs", "expected"),
    [
        ("9.0", ["arch=compute_90,code=sm_90", "arch=compute_90,code=compute_90"]),
        (
            "8.0;9.0+PTX",
            [
                "arch=compute_80,code=sm_80",
                "arch=compute_90,code=sm_90",
                "arch=compute_90,code=compute_90",
            ],
        ),
        (
            "12.0 9.0a 10.0",
            [
                "arch=compute_120,code=sm_120",
                "arch=compute_90a,code=sm_90a",
                "arch=compute_100,code=sm_100",
                "arch=compute_120,code=compute_120",
            ],
        ),
    ],
)
def test_fatbin_gencode_flags(archs, expected):
    assert _build_support.fatbin_gencode_flags(archs) == [f"-gencode={e}" for e in expected]


def test_fatbin_gencode_flags_for_every_default_arch():
    flags = _build_support.fatbin_gencode_flags(_build_support.DEFAULT_CUDA_ARCHS)
    assert len(flags) == 8 and flags[-1] == "-gencode=arch=compute_120,code=compute_120"


@pytest.mark.parametrize("archs", ["", "Hopper", "9", "9.0+SASS"])
def test_fatbin_gencode_flags_refuse_what_they_cannot_read(archs):
    with pytest.raises(ValueError):
        _build_support.fatbin_gencode_flags(archs)


def test_device_kernels_command():
    command = _build_support.device_kernels_command(
        "/opt/cuda", Path("/src/csrc"), Path("/tmp/k.fatbin"), "9.0"
    )
    assert command[:4] == ["/opt/cuda/bin/nvcc", "-fatbin", "-O3", "-std=c++17"]
    assert "-gencode=arch=compute_90,code=sm_90" in command
    assert command[-3:] == ["/src/csrc/device/engine_kernels.cu", "-o", "/tmp/k.fatbin"]


def test_device_kernels_compile_with_nvcc(tmp_path):
    cuda_home = _build_support.find_cuda_home()
    if cuda_home is None:
        pytest.skip("no CUDA toolkit (nvcc)")
    output = tmp_path / cd.KERNELS_NAME
    _build_support.build_device_kernels(cuda_home, ROOT / "csrc", output, "9.0")
    data = output.read_bytes()
    assert data[:4] == FATBIN_MAGIC
    assert b"imgops_gray_u8" in data and b"imgops_png_filter_u8" in data
    for name in cd._DEFLATE_KERNELS:
        assert name.encode() in data
    assert not list(tmp_path.glob("*.partial"))


def test_device_kernels_compile_failure_says_why(tmp_path):
    cuda_home = _build_support.find_cuda_home()
    if cuda_home is None:
        pytest.skip("no CUDA toolkit (nvcc)")
    csrc = tmp_path / "csrc"
    (csrc / "device").mkdir(parents=True)
    (csrc / "device" / "engine_kernels.cu").write_text("this is not CUDA\n")
    output = tmp_path / "out" / cd.KERNELS_NAME
    with pytest.raises(RuntimeError, match="failed"):
        _build_support.build_device_kernels(cuda_home, csrc, output, "9.0")
    assert not output.exists() and not list(output.parent.glob("*"))


# --- backends: the fake libcuda and the real GPU ---------------------------------------------


def test_device_properties(backend):
    device = backend.device
    assert device.index == 0 and device.name and device.total_memory > 0
    assert device.multiprocessors > 0
    free, total = device.mem_info()
    assert 0 < free <= total == device.total_memory
    assert backend.stream.handle != 0


def test_quick_driver_calls_keep_the_gil(fake, monkeypatch):
    """Launches, stream-ordered allocations and copies are made holding the GIL (winning it
    back after each call cost the device thread most of its time); waits release it."""
    keeps = ctypes._FUNCFLAG_PYTHONAPI
    lib = cd._driver()
    for name in ("cuLaunchKernel", "cuMemAllocAsync", "cuMemFreeAsync", "cuEventRecord"):
        assert getattr(lib, name)._flags_ & keeps, name
    for name in ("cuStreamSynchronize", "cuEventSynchronize", "cuMemHostAlloc", "cuInit"):
        assert not getattr(lib, name)._flags_ & keeps, name
    monkeypatch.setenv("IMGOPS_DRIVER_GIL", "release")
    monkeypatch.setattr(cd, "_lib", None)
    assert not cd._driver().cuLaunchKernel._flags_ & keeps


def test_the_pool_may_be_kept_from_making_streams_wait_for_each_other(backend):
    """Device.pool_internal_dependencies sets the default pool's
    REUSE_ALLOW_INTERNAL_DEPENDENCIES (the driver accepts it both ways)."""
    backend.device.pool_internal_dependencies(False)
    if backend.kind == "fake":
        assert backend.counter("fake_internal_dependencies") == 0
    backend.device.pool_internal_dependencies(True)
    if backend.kind == "fake":
        assert backend.counter("fake_internal_dependencies") == 1


def test_fake_device_sets_the_pool_threshold_and_context_once(fake):
    assert fake.counter("fake_last_threshold", ctypes.c_uint64) == 2**64 - 1
    before = fake.counter("fake_ctx_set_current_calls")
    for _ in range(5):
        fake.device.mem_info()
        fake.device.make_current()
    assert fake.counter("fake_ctx_set_current_calls") == before
    seen = []
    thread = threading.Thread(target=lambda: seen.append(fake.device.mem_info()))
    thread.start()
    thread.join()
    assert seen and fake.counter("fake_ctx_set_current_calls") == before + 1


@pytest.mark.parametrize("nbytes", [1, 4099, (1 << 20) + 3])
def test_round_trip_through_device_memory(backend, nbytes):
    rng = np.random.default_rng()
    data = rng.integers(0, 256, nbytes, dtype=np.uint8)
    device, stream = backend.device, backend.stream
    ptr = device.alloc(nbytes, stream)
    assert ptr > 0
    with device.pinned(nbytes) as source, device.pinned(nbytes) as target:
        assert source.ptr and source.nbytes == nbytes and source.array().shape == (nbytes,)
        source.array()[:] = data
        target.array()[:] = ~data
        device.copy_to_device(ptr, source.ptr, nbytes, stream)
        source.array()[:] = 0  # the copy above is done before anything after it on the stream
        device.copy_to_host(target.ptr, ptr, nbytes, stream)
        event = device.event(stream)
        event.synchronize()
        assert event.done()
        np.testing.assert_array_equal(target.array(), data)
        event.close()
        event.close()
    device.free(ptr, stream)
    stream.synchronize()


def test_zero_sizes(backend):
    device, stream = backend.device, backend.stream
    assert device.alloc(0, stream) == 0
    device.free(0, stream)
    with device.pinned(0) as empty:
        assert empty.ptr == 0 and empty.array().size == 0
    device.copy_to_host(0, 0, 0, stream)
    with pytest.raises(ValueError):
        device.alloc(-1, stream)


def test_an_absurd_allocation_is_out_of_memory(backend):
    device, stream = backend.device, backend.stream
    with pytest.raises(cd.CudaError) as caught:
        device.alloc(device.total_memory * 2, stream)
    assert caught.value.out_of_memory, caught.value
    assert caught.value.call == "cuMemAllocAsync"
    assert str(caught.value).startswith("CUDA_ERROR_OUT_OF_MEMORY: ")
    # and the device still works
    ptr = device.alloc(1024, stream)
    device.free(ptr, stream)
    stream.synchronize()


def test_event_waited_for_on_another_thread(backend):
    rng = np.random.default_rng()
    device, stream = backend.device, backend.stream
    nbytes = 3 << 20
    data = rng.integers(0, 256, nbytes, dtype=np.uint8)
    with device.pinned(nbytes) as source, device.pinned(nbytes) as target:
        source.array()[:] = data
        ptr = device.alloc(nbytes, stream)
        device.copy_to_device(ptr, source.ptr, nbytes, stream)
        device.copy_to_host(target.ptr, ptr, nbytes, stream)
        event = device.event(stream)
        device.free(ptr, stream)
        seen = []

        def wait() -> None:
            event.synchronize()
            seen.append(event.done() and np.array_equal(target.array(), data))

        thread = threading.Thread(target=wait)
        thread.start()
        thread.join(60)
        assert seen == [True]
        event.close()
        stream.synchronize()


def test_a_stream_waits_for_an_event_of_another(backend):
    """Data copied in on one stream, copied out on a second that waits for the first's event
    (and freed there): the second sees all of it."""
    rng = np.random.default_rng()
    device, first = backend.device, backend.stream
    second = device.stream()
    nbytes = 16 << 20
    data = rng.integers(0, 256, nbytes, dtype=np.uint8)
    with device.pinned(nbytes) as source, device.pinned(nbytes) as target:
        source.array()[:] = data
        ptr = device.alloc(nbytes, first)
        device.copy_to_device(ptr, source.ptr, nbytes, first)
        ready = device.event(first, blocking=False)
        second.wait(ready)
        ready.close()  # (the wait keeps what it needs)
        device.copy_to_host(target.ptr, ptr, nbytes, second)
        device.free(ptr, second)
        second.synchronize()
        assert np.array_equal(target.array(), data)
    first.synchronize()
    second.close()


def test_streams_are_distinct_and_close_once(backend):
    other = backend.device.stream()
    assert other.handle not in (0, backend.stream.handle)
    other.synchronize()
    other.close()
    other.close()


def test_kernels_need_their_file(backend, tmp_path):
    with pytest.raises(FileNotFoundError):
        cd.Kernels(backend.device, tmp_path / "missing.fatbin")
    bad = tmp_path / "bad.fatbin"
    bad.write_bytes(np.random.default_rng().bytes(256))
    with pytest.raises(cd.CudaError) as caught:
        cd.Kernels(backend.device, bad)
    assert caught.value.call == "cuModuleLoadData"


def test_a_closed_device_says_so(fake):
    device = cd.Device(0)
    device.close()
    device.close()
    with pytest.raises(cd.CudaError, match="closed"):
        device.mem_info()


def _gray_expected(rgb: np.ndarray, bgr: bool) -> np.ndarray:
    channels = rgb.astype(np.uint32)
    r, g, b = channels[..., 0], channels[..., 1], channels[..., 2]
    if bgr:
        r, b = b, r
    return ((299 * r + 587 * g + 114 * b + 500) // 1000).astype(np.uint8)


GRAY_CASES = [
    # height, width, extra source pitch bytes, extra gray pitch bytes
    (1, 1, 0, 0),
    (1, 1, 5, 3),
    (5, 1, 0, 0),
    (1, 300, 0, 0),
    (7, 13, 1, 0),
    (31, 257, 29, 7),
    (64, 1000, 64 * 3, 24),
    (3, 5000, 0, 1),
]


@pytest.mark.parametrize("bgr", [False, True])
@pytest.mark.parametrize(("height", "width", "src_extra", "dst_extra"), GRAY_CASES)
def test_gray_u8(backend, height, width, src_extra, dst_extra, bgr):
    rng = np.random.default_rng()
    src_pitch, dst_pitch = 3 * width + src_extra, width + dst_extra
    source = rng.integers(0, 256, (height, src_pitch), dtype=np.uint8)
    before = rng.integers(0, 256, (height, dst_pitch), dtype=np.uint8)
    src = backend.upload(source)
    dst = backend.upload(before)
    backend.kernels.gray_u8(src, src_pitch, dst, dst_pitch, width, height, bgr, backend.stream)
    got = backend.download(dst, height * dst_pitch).reshape(height, dst_pitch)
    backend.free(src, dst)
    pixels = source[:, : 3 * width].reshape(height, width, 3)
    np.testing.assert_array_equal(got[:, :width], _gray_expected(pixels, bgr))
    np.testing.assert_array_equal(got[:, width:], before[:, width:])  # the padding untouched


def test_gray_u8_checks_its_sizes(backend):
    kernels, stream = backend.kernels, backend.stream
    with pytest.raises(ValueError):
        kernels.gray_u8(1, 3 * 10 - 1, 1, 10, 10, 2, False, stream)
    with pytest.raises(ValueError):
        kernels.gray_u8(1, 30, 1, 9, 10, 2, False, stream)
    kernels.gray_u8(1, 30, 1, 10, 10, 0, False, stream)  # nothing to do: no launch
    kernels.gray_u8(1, 30, 1, 10, 0, 5, False, stream)


def test_fake_gray_grid(fake):
    src = fake.upload(np.random.default_rng().integers(0, 256, (70000, 3), dtype=np.uint8))
    dst = fake.device.alloc(70000, fake.stream)
    fake.kernels.gray_u8(src, 3, dst, 1, 1, 70000, False, fake.stream)
    assert fake.launch_shape() == ([1, 65535, 1], [32, 1, 1])
    fake.free(src, dst)


def _smooth(height: int, width: int, channels: int, rng) -> np.ndarray:
    """A gradient with a little noise: the adaptive choice differs between rows."""
    base = np.add.outer(np.arange(height) * 3, np.arange(width) * 2)[:, :, None]
    base = base + np.arange(channels) * 17 + rng.integers(0, 4, (height, width, channels))
    return (base % 256).astype(np.uint8)


PNG_SHAPES = [(1, 1), (2, 3), (9, 21), (17, 63), (12, 64), (33, 255), (5, 1000)]


@pytest.mark.parametrize("smooth", [False, True])
@pytest.mark.parametrize("bpp", [1, 3])
@pytest.mark.parametrize(("height", "width"), PNG_SHAPES)
@pytest.mark.parametrize("filter", FILTERS)
def test_png_filter_u8(backend, filter, height, width, bpp, smooth):
    rng = np.random.default_rng()
    if smooth:
        image = _smooth(height, width, bpp, rng)
    else:
        image = rng.integers(0, 256, (height, width, bpp), dtype=np.uint8)
    row_bytes = width * bpp
    src_pitch = row_bytes + int(rng.integers(0, 40))
    padded = rng.integers(0, 256, (height, src_pitch), dtype=np.uint8)
    padded[:, :row_bytes] = image.reshape(height, row_bytes)
    src = backend.upload(padded)
    out_bytes = height * (row_bytes + 1)
    dst = backend.device.alloc(out_bytes, backend.stream)
    backend.kernels.png_filter_u8(
        src, src_pitch, row_bytes, height, bpp, filter, dst, backend.stream
    )
    got = backend.download(dst, out_bytes).reshape(height, row_bytes + 1)
    backend.free(src, dst)
    reference = png_filter_reference(image if bpp == 3 else image[:, :, 0], filter)
    np.testing.assert_array_equal(got, reference)


@pytest.mark.parametrize("filter", FILTERS)
def test_png_filter_u8_matches_the_torch_op(backend, filter):
    torch = pytest.importorskip("torch")
    from imgops import _extension, ops

    try:
        _extension.load()
    except _extension.ExtensionError as error:  # e.g. IMGOPS_NO_JIT=1 and no prebuilt module
        pytest.skip(f"no torch extension: {error}")

    rng = np.random.default_rng()
    height, width = 23, 97
    image = _smooth(height, width, 3, rng)
    image[::3] = rng.integers(0, 256, image[::3].shape, dtype=np.uint8)
    src = backend.upload(image)
    dst = backend.device.alloc(height * (3 * width + 1), backend.stream)
    backend.kernels.png_filter_u8(src, 3 * width, 3 * width, height, 3, filter, dst, backend.stream)
    got = backend.download(dst, height * (3 * width + 1)).reshape(height, -1)
    backend.free(src, dst)
    expected = ops.png_filter(torch.from_numpy(image), filter).numpy()
    np.testing.assert_array_equal(got, expected)


def test_png_filter_u8_checks_its_arguments(backend):
    kernels, stream = backend.kernels, backend.stream
    for bad in (
        dict(filter=5),
        dict(filter=-2),
        dict(bpp=0),
        dict(bpp=9),
        dict(src_pitch=9),
        dict(height=-1),
    ):
        args = dict(src=1, src_pitch=30, row_bytes=30, height=2, bpp=3, filter=0, dst=1)
        args.update(bad)
        with pytest.raises(ValueError):
            kernels.png_filter_u8(**args, stream=stream)
    kernels.png_filter_u8(1, 30, 30, 0, 3, 0, 1, stream)  # no rows: no launch


def test_fake_png_filter_grid(fake):
    height, row_bytes = 100, 7
    src = fake.upload(np.random.default_rng().integers(0, 256, (height, row_bytes), np.uint8))
    dst = fake.device.alloc(height * (row_bytes + 1), fake.stream)
    fake.kernels.png_filter_u8(src, row_bytes, row_bytes, height, 1, -1, dst, fake.stream)
    assert fake.launch_shape() == ([min(height, 3 * 16), 1, 1], [256, 1, 1])
    fake.free(src, dst)


# --- the deflate kernels: the CPU encoder's exact zlib stream ---------------------------------


def _deflate_case(kind: str, height: int, row: int, rng: np.random.Generator) -> np.ndarray:
    """height filtered rows of `row` bytes (filter byte first) of one kind of content."""
    body = row - 1
    if kind == "noise":  # incompressible: stored blocks
        pixels = rng.integers(0, 256, (height, body), dtype=np.uint8)
    elif kind == "flat":  # runs across every chunk and block edge
        pixels = np.full((height, body), int(rng.integers(0, 256)), np.uint8)
    elif kind == "runs":  # runs of random lengths, some just 3 or 4 long
        lengths = rng.integers(1, 300, height * body // 2 + 1)
        values = rng.integers(0, 256, lengths.size, dtype=np.uint8)
        pixels = np.repeat(values, lengths)[: height * body].reshape(height, body)
    else:  # smooth: photo-like residuals
        pixels = _smooth(height, body, 1, rng)[..., 0]
    filters = rng.integers(0, 5, (height, 1), dtype=np.uint8)
    return np.ascontiguousarray(np.hstack([filters, pixels]))


def _cpu_zlib(rows: np.ndarray) -> bytes:
    """The CPU encoder's zlib stream for filtered rows: its PNG file's IDAT payloads joined
    (a stream over 1 GiB spans several IDAT chunks)."""
    from imgops.native import cli_kernels

    kernels = cli_kernels()
    height, row = rows.shape
    png = memoryview(kernels.png_encode_filtered(rows.tobytes(), row - 1, height, 1, 1))
    pieces, at = [], 8  # after the signature
    while at < len(png):
        length = int.from_bytes(png[at : at + 4], "big")
        if png[at + 4 : at + 8] == b"IDAT":
            pieces.append(png[at + 8 : at + 8 + length])
        at += 12 + length
    assert pieces, "no IDAT chunk"
    return b"".join(pieces)


def _device_zlib(backend: Backend, rows: np.ndarray) -> bytes:
    from imgops.native import cli_kernels

    height, row = rows.shape
    layout = cd.DeflateLayout(*cli_kernels().png_deflate_layout(row, height))
    src = backend.upload(rows)
    work = backend.device.alloc(layout.total, backend.stream)
    try:
        backend.kernels.png_deflate(src, row, height, work, layout, backend.stream)
        size = int(backend.download(work + layout.size, 8).view(np.uint64)[0])
        assert 6 <= size <= layout.out_bytes
        return backend.download(work + layout.out, size).tobytes()
    finally:
        backend.free(src, work)


DEFLATE_SHAPES = [(1, 2), (1, 65), (3, 129), (40, 1000), (300, 3841), (5, 70001), (2000, 257)]


@pytest.mark.parametrize(("height", "row"), DEFLATE_SHAPES)
@pytest.mark.parametrize("kind", ["noise", "flat", "runs", "smooth"])
def test_png_deflate_gives_the_cpu_encoders_bytes(backend, kind, height, row):
    pytest.importorskip("imgops._cli_kernels")
    rows = _deflate_case(kind, height, row, np.random.default_rng())
    expected = _cpu_zlib(rows)
    got = _device_zlib(backend, rows)
    assert got == expected
    assert zlib.decompress(got) == rows.tobytes()


def test_png_deflate_on_sample_photos(backend):
    """Gray sample photos, filtered as the engine filters them, more than 8 blocks each."""
    kernels = pytest.importorskip("imgops._cli_kernels")
    cv2 = pytest.importorskip("cv2")
    from imgops.io.png import filter_code_for

    photos = sorted((ROOT / "samples").glob("*.jpg"))
    assert photos
    for path in photos:
        gray = cv2.imread(str(path), cv2.IMREAD_GRAYSCALE)
        rows = png_filter_reference(gray, filter_code_for(2))
        assert kernels.png_deflate_layout(rows.shape[1], rows.shape[0])[4] > 1
        assert _device_zlib(backend, rows) == _cpu_zlib(rows), path.name


def test_png_deflate_checks_its_arguments(backend):
    kernels = pytest.importorskip("imgops._cli_kernels")
    layout = cd.DeflateLayout(*kernels.png_deflate_layout(10, 10))
    for row, height in ((0, 10), (10, 0), (-1, 3)):
        with pytest.raises(ValueError):
            backend.kernels.png_deflate(1, row, height, 1, layout, backend.stream)


def test_fake_png_deflate_grids(fake):
    kernels = pytest.importorskip("imgops._cli_kernels")
    rows = _deflate_case("smooth", 400, 1001, np.random.default_rng())
    before = fake.counter("fake_launches")
    assert _device_zlib(fake, rows) == _cpu_zlib(rows)
    assert fake.counter("fake_launches") == before + len(cd._DEFLATE_KERNELS)
    blocks = kernels.png_deflate_layout(1001, 400)[4]
    assert fake.launch_shape() == (
        [min(blocks, 3 * 16), 1, 1],
        [cd._DEFLATE_BLOCK_THREADS, 1, 1],
    )  # the write


# --- the GPU only: more than 2^31 bytes -------------------------------------------------------


def _fill_repeating(backend: Backend, ptr: int, total: int, chunk: np.ndarray) -> None:
    """Fills `total` device bytes at ptr with `chunk` repeated (one pinned copy, many uploads)."""
    with backend.device.pinned(chunk.size) as staging:
        staging.array()[:] = chunk
        for offset in range(0, total, chunk.size):
            n = min(chunk.size, total - offset)
            backend.device.copy_to_device(ptr + offset, staging.ptr, n, backend.stream)
        backend.stream.synchronize()


def _rows(backend: Backend, ptr: int, first: int, count: int, row_bytes: int) -> np.ndarray:
    return backend.download(ptr + first * row_bytes, count * row_bytes).reshape(count, row_bytes)


@pytest.mark.gpu_driver
@pytest.mark.slow
@pytest.mark.parametrize("filter", [-1, 4])
def test_png_filter_u8_over_2_gib(gpu, filter):
    rng = np.random.default_rng()
    height, row_bytes, bpp = 40000, 60000, 3
    chunk_rows = 97  # rows repeat every 97: every row differs from the one above
    chunk = _smooth(chunk_rows, row_bytes // bpp, bpp, rng).reshape(-1)
    chunk[: chunk.size // 2] = rng.integers(0, 256, chunk.size // 2, dtype=np.uint8)
    image_rows = chunk.reshape(chunk_rows, row_bytes)
    out_row = row_bytes + 1
    assert height * out_row > 2**31
    src = gpu.device.alloc(height * row_bytes, gpu.stream)
    dst = gpu.device.alloc(height * out_row, gpu.stream)
    try:
        _fill_repeating(gpu, src, height * row_bytes, chunk)
        gpu.kernels.png_filter_u8(src, row_bytes, row_bytes, height, bpp, filter, dst, gpu.stream)
        crossing = 2**31 // out_row  # the output row that straddles byte 2^31
        for first in (0, crossing - 1, height - 3):
            count = 3
            got = _rows(gpu, dst, first, count, out_row)
            above = image_rows[(first - 1) % chunk_rows] if first else None
            rows = np.stack([image_rows[(first + k) % chunk_rows] for k in range(count)])
            if above is not None:
                rows = np.vstack([above, rows])
            expected = png_filter_reference(rows.reshape(len(rows), -1, bpp), filter)[-count:]
            np.testing.assert_array_equal(got, expected, err_msg=f"rows {first}..")
    finally:
        gpu.free(src, dst)


@pytest.mark.gpu_driver
@pytest.mark.slow
def test_gray_u8_over_2g_pixels(gpu):
    rng = np.random.default_rng()
    height, width = 43000, 50000  # 2.15e9 pixels
    src_pitch, dst_pitch = 3 * width + 16, width + 8
    assert height * width > 2**31
    chunk_rows = 13
    chunk = rng.integers(0, 256, chunk_rows * src_pitch, dtype=np.uint8)
    src = gpu.device.alloc(height * src_pitch, gpu.stream)
    dst = gpu.device.alloc(height * dst_pitch, gpu.stream)
    try:
        _fill_repeating(gpu, src, height * src_pitch, chunk)
        gpu.kernels.gray_u8(src, src_pitch, dst, dst_pitch, width, height, True, gpu.stream)
        source_rows = chunk.reshape(chunk_rows, src_pitch)[:, : 3 * width]
        crossing = 2**31 // width
        for y in (0, 1, crossing - 1, crossing, crossing + 1, height - 1):
            got = _rows(gpu, dst, y, 1, dst_pitch)[0, :width]
            pixels = source_rows[y % chunk_rows].reshape(width, 3)
            np.testing.assert_array_equal(got, _gray_expected(pixels, True), err_msg=f"row {y}")
    finally:
        gpu.free(src, dst)


@pytest.mark.gpu_driver
@pytest.mark.slow
def test_png_deflate_over_2_gib(gpu):
    """More than 2^31 bytes of rows: one stream, the CPU encoder's bytes."""
    pytest.importorskip("imgops._cli_kernels")
    rng = np.random.default_rng()
    height, row = 30700, 70001  # 2.149e9 bytes; one row a block
    assert height * row > 2**31
    chunk_rows = 11
    chunk = _deflate_case("smooth", chunk_rows, row, rng)
    chunk[3] = _deflate_case("noise", 1, row, rng)  # a stored block every 11
    rows = np.tile(chunk, (height // chunk_rows + 1, 1))[:height]
    expected = _cpu_zlib(rows)
    assert _device_zlib(gpu, rows) == expected
