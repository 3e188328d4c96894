"""The batch engine: the op parameter, both engines' bytes, nvImageCodec paths and fallbacks.

nvImageCodec's CPU backend needs no GPU, so the device engine's decode, fallback and JPEG
paths run here on torch's CPU device; the tests marked cuda repeat them on the GPU.
"""

from __future__ import annotations

import io
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from imgops.engine import GRAY, ImageOp, Job, PipelineSettings, run_batch
from imgops.engine import device as device_choice
from imgops.engine.buffers import BufferPool, ByteBudget
from imgops.engine.device import Plan
from imgops.engine.run import device_engine
from imgops.io import gpu_decode

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
ALL_SAMPLES = sorted(p for p in SAMPLES.iterdir() if p.suffix in (".jpg", ".png", ".tif"))
JPEGS = [p for p in ALL_SAMPLES if p.suffix == ".jpg"]
CPU_PLAN = Plan("cpu", "cpu", "test")


def has_nvimgcodec() -> bool:
    return gpu_decode.version() is not None


needs_nvimgcodec = pytest.mark.skipif(not has_nvimgcodec(), reason="nvImageCodec not installed")


def formula(bgr: np.ndarray) -> np.ndarray:
    if bgr.ndim == 2:
        return bgr
    wide = bgr.astype(np.int64)
    luma = (299 * wide[..., 2] + 587 * wide[..., 1] + 114 * wide[..., 0] + 500) // 1000
    return luma.astype(bgr.dtype)


def _invert_numpy(pixels: np.ndarray, order: str | None) -> np.ndarray:
    return np.iinfo(pixels.dtype).max - pixels


def _invert_torch(batch, order):
    import torch

    top = 255 if batch.dtype == torch.uint8 else 65535
    return (top - batch.to(torch.int32)).to(batch.dtype)


INVERT = ImageOp("invert", _invert_numpy, _invert_torch, "_inv")
INVERT_TORCH_ONLY = ImageOp("invert", None, _invert_torch, "_inv")


def run_engine(kind: str, op, paths, out: Path, **options) -> dict[str, object]:
    """Runs `paths` through the host engine ("host"), the torch-CPU device engine ("device") or
    the device engine with nvImageCodec's CPU backend ("nv"); returns results by file name."""
    out.mkdir(parents=True, exist_ok=True)
    fmt = options.get("fmt", "png")
    jobs = [Job(p, out / f"{p.name}.{fmt}", p.name) for p in paths]
    settings = PipelineSettings(device="cpu", jobs=2, batch_size=3, **options)
    results = []
    if kind == "host":
        run_batch(jobs, op, settings, results.append)
    else:
        engine = device_engine(op, settings, CPU_PLAN, 2, cpu_backend=kind == "nv")
        engine.run(iter(jobs), results.append)
    return {r.job.label: r for r in results}


def outputs(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_a_second_op_runs_on_both_engines_with_the_same_bytes(tmp_path: Path):
    host = run_engine("host", INVERT, ALL_SAMPLES, tmp_path / "host")
    device = run_engine("device", INVERT, ALL_SAMPLES, tmp_path / "device")
    assert {r.status for r in [*host.values(), *device.values()]} == {"written"}
    assert outputs(tmp_path / "host") == outputs(tmp_path / "device")
    for path in ALL_SAMPLES:
        expected = cv2.imread(str(path), cv2.IMREAD_ANYDEPTH | cv2.IMREAD_ANYCOLOR)
        if expected.ndim == 3 and expected.shape[2] == 4:
            expected = expected[..., :3]
        got = cv2.imread(str(tmp_path / "host" / f"{path.name}.png"), cv2.IMREAD_UNCHANGED)
        np.testing.assert_array_equal(got, np.iinfo(expected.dtype).max - expected)


def test_an_op_without_a_numpy_function_runs_on_torchs_cpu_device(tmp_path: Path):
    paths = [SAMPLES / "coffee_rgb.png", SAMPLES / "camera_gray.png"]
    jobs = [Job(p, tmp_path / f"{p.stem}.png", p.name) for p in paths]
    summary = run_batch(jobs, INVERT_TORCH_ONLY, PipelineSettings(device="cpu", jobs=2))
    assert summary.written == 2 and summary.device == "cpu"
    got = cv2.imread(str(tmp_path / "coffee_rgb.png"), cv2.IMREAD_UNCHANGED)
    np.testing.assert_array_equal(got, 255 - cv2.imread(str(paths[0])))


def test_a_device_failure_stops_the_batch_with_the_original_error(tmp_path: Path):
    def broken(batch, order):
        raise ValueError("the device op broke")

    jobs = [Job(SAMPLES / "coffee_rgb.png", tmp_path / f"{i}.png", str(i)) for i in range(5)]
    with pytest.raises(ValueError, match="the device op broke"):
        run_batch(jobs, ImageOp("broken", None, broken, "_b"), PipelineSettings(device="cpu"))
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("fmt", ["png", "tif"])
def test_gray_bytes_equal_between_torch_free_and_torch_cpu_paths(tmp_path: Path, fmt: str):
    run_engine("host", GRAY, ALL_SAMPLES, tmp_path / "host", fmt=fmt)
    run_engine("device", GRAY, ALL_SAMPLES, tmp_path / "device", fmt=fmt)
    assert outputs(tmp_path / "host") == outputs(tmp_path / "device")
    for path in ALL_SAMPLES:
        source = cv2.imread(str(path), cv2.IMREAD_ANYDEPTH | cv2.IMREAD_ANYCOLOR)
        got = cv2.imread(str(tmp_path / "host" / f"{path.name}.{fmt}"), cv2.IMREAD_UNCHANGED)
        np.testing.assert_array_equal(got, formula(source[..., :3] if source.ndim == 3 else source))


def _exif_jpeg(rgb: np.ndarray, orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, "JPEG", quality=90, exif=exif.tobytes())
    return buffer.getvalue()


def _odd_files(folder: Path) -> dict[str, Path]:
    """Rotated (EXIF 1..8), CMYK, truncated and 4:2:0 files made from a real photo."""
    folder.mkdir(parents=True, exist_ok=True)
    rgb = cv2.imread(str(SAMPLES / "rocket_baseline_rgb.jpg"))[:90:, :130, ::-1].copy()
    files = {}
    for orientation in range(1, 9):
        files[f"exif{orientation}"] = folder / f"exif{orientation}.jpg"
        files[f"exif{orientation}"].write_bytes(_exif_jpeg(rgb, orientation))
    buffer = io.BytesIO()
    Image.fromarray(rgb).convert("CMYK").save(buffer, "JPEG", quality=90)
    (folder / "cmyk.jpg").write_bytes(buffer.getvalue())
    files["cmyk"] = folder / "cmyk.jpg"
    whole = (SAMPLES / "rocket_baseline_rgb.jpg").read_bytes()
    (folder / "truncated.jpg").write_bytes(whole[: len(whole) // 2])
    files["truncated"] = folder / "truncated.jpg"
    (folder / "notjpeg.jpg").write_bytes(b"\xff\xd8\xff\xe0" + b"\x00" * 64)
    files["notjpeg"] = folder / "notjpeg.jpg"
    return files


def test_opencv_applies_exif_orientation_in_imdecode(tmp_path: Path):
    files = _odd_files(tmp_path)
    plain = cv2.imread(str(files["exif1"]))
    for orientation in range(2, 9):
        data = np.frombuffer(files[f"exif{orientation}"].read_bytes(), np.uint8)
        rotated = cv2.imdecode(data, cv2.IMREAD_ANYDEPTH | cv2.IMREAD_ANYCOLOR)
        ignored = cv2.imdecode(data, cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)
        assert rotated.shape == (plain.shape if orientation <= 4 else plain.shape[1::-1] + (3,))
        assert not np.array_equal(rotated, ignored) or rotated.shape != ignored.shape


@needs_nvimgcodec
def test_nvimgcodec_paths_give_the_cpu_paths_bytes_and_fall_back_per_file(tmp_path: Path):
    files = _odd_files(tmp_path / "in")
    paths = ALL_SAMPLES + sorted(files.values())
    host = run_engine("host", GRAY, paths, tmp_path / "host")
    nv = run_engine("nv", GRAY, paths, tmp_path / "nv")
    for name, result in host.items():
        assert (nv[name].status, nv[name].reason) == (result.status, result.reason), name
    assert host["truncated.jpg"].status == "failed" and "truncated JPEG" in (
        host["truncated.jpg"].reason or ""
    )
    decoders = {name: r.decoder for name, r in nv.items() if r.status == "written"}
    assert decoders["rocket_baseline_rgb.jpg"] == "nvimgcodec"
    assert decoders["flower_gray_3mp.jpg"] == "nvimgcodec"
    assert decoders["exif6.jpg"] == "nvimgcodec"
    assert decoders["cmyk.jpg"] == "opencv"  # CMYK stays on the CPU decoder
    assert all(decoders[p.name] == "opencv" for p in ALL_SAMPLES if p.suffix != ".jpg")
    # nvImageCodec's CPU backend is libjpeg-turbo, like OpenCV's: the very same bytes
    assert outputs(tmp_path / "host") == outputs(tmp_path / "nv")


@needs_nvimgcodec
def test_batch_decoder_refuses_what_the_gpu_would_decode_differently(tmp_path: Path):
    files = _odd_files(tmp_path)
    decoder = gpu_decode.BatchDecoder(cpu_backend=True)
    limit = 1 << 28
    assert decoder.accept(files["cmyk"].read_bytes(), limit) is None
    assert decoder.accept((SAMPLES / "coffee_rgb.png").read_bytes(), limit) is None
    assert decoder.accept((SAMPLES / "mri_dwi_b0_u16.tif").read_bytes(), limit) is None
    assert decoder.accept(files["notjpeg"].read_bytes(), limit) is None
    photo = (SAMPLES / "flower_progressive_3mp.jpg").read_bytes()
    assert decoder.accept(photo, limit) is not None
    assert decoder.accept(photo, 1000) is None  # over the pixel limit: OpenCV says why


@needs_nvimgcodec
def test_jpeg_output_on_both_engines(tmp_path: Path):
    photos = [SAMPLES / "rocket_baseline_rgb.jpg", SAMPLES / "flower_rgb_3mp.png"]
    host = run_engine("host", GRAY, photos, tmp_path / "host", fmt="jpg", jpeg_quality=90)
    nv = run_engine("nv", GRAY, photos, tmp_path / "nv", fmt="jpg", jpeg_quality=90)
    low = run_engine("host", GRAY, photos, tmp_path / "low", fmt="jpg", jpeg_quality=40)
    for path in photos:
        name = f"{path.name}.jpg"
        expected = formula(cv2.imread(str(path))).astype(np.int64)
        for folder in ("host", "nv"):
            got = cv2.imread(str(tmp_path / folder / name), cv2.IMREAD_UNCHANGED)
            assert got.ndim == 2 and np.abs(got - expected).mean() < 1.5, folder
        assert low[path.name].bytes_written < host[path.name].bytes_written
        assert nv[path.name].status == "written"


def test_decoder_gpu_without_nvimgcodec_is_a_clear_error(monkeypatch, tmp_path: Path):
    monkeypatch.setattr(gpu_decode, "_load", lambda: (None, "nvImageCodec is not installed"))
    monkeypatch.setattr(device_choice, "cuda_device_count", lambda: 1)
    target = tmp_path / "out.png"
    jobs = [Job(SAMPLES / "coffee_rgb.png", target, "coffee")]
    with pytest.raises(gpu_decode.GpuDecoderUnavailable, match="not installed"):
        run_batch(jobs, GRAY, PipelineSettings(device="auto", decoder="gpu"))
    with pytest.raises(gpu_decode.GpuDecoderUnavailable, match="--device cuda"):
        run_batch(jobs, GRAY, PipelineSettings(device="cpu", decoder="gpu"))
    assert not target.exists()


def test_status_is_one_line_for_doctor(monkeypatch):
    usable, why = gpu_decode.status()
    assert isinstance(usable, bool) and why and "\n" not in why and "jenkins" not in why
    monkeypatch.setattr(gpu_decode, "_load", lambda: (None, "nvImageCodec is not installed"))
    assert gpu_decode.status() == (False, "nvImageCodec is not installed")


def test_decoder_gpu_without_a_gpu_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(device_choice, "cuda_device_count", lambda: 0)
    with pytest.raises(gpu_decode.GpuDecoderUnavailable, match="no CUDA GPU"):
        device_choice.choose(PipelineSettings(decoder="gpu"))


def test_auto_picks_the_cpu_for_small_batches_without_probing(monkeypatch):
    def probe():
        raise AssertionError("small batches must not probe the GPU")

    monkeypatch.setattr(device_choice, "cuda_device_count", probe)
    for files in (None, 1, device_choice.CUDA_MIN_FILES - 1):
        plan = device_choice.choose(PipelineSettings(expected_files=files))
        assert (plan.device, plan.decoder) == ("cpu", "cpu")


def test_auto_falls_back_to_the_cpu_when_the_gpu_path_is_unusable(monkeypatch):
    big = PipelineSettings(expected_files=10 * device_choice.CUDA_MIN_FILES)
    monkeypatch.setattr(device_choice, "cuda_device_count", lambda: 0)
    assert device_choice.choose(big).device == "cpu"
    monkeypatch.setattr(device_choice, "cuda_device_count", lambda: 1)
    monkeypatch.setattr(gpu_decode, "status", lambda index=0: (False, "no nvImageCodec"))
    plan = device_choice.choose(big)
    assert plan.device == "cpu" and "no nvImageCodec" in plan.why
    monkeypatch.setattr(gpu_decode, "status", lambda index=0: (True, "ok"))
    monkeypatch.setattr(device_choice, "_torch_cuda_problem", lambda d: "no kernels")
    assert device_choice.choose(big).device == "cpu"
    monkeypatch.setattr(device_choice, "_torch_cuda_problem", lambda d: None)
    assert device_choice.choose(big) == Plan("cuda", "gpu", device_choice.choose(big).why)


def test_device_engine_keeps_a_bounded_number_of_files_in_flight(tmp_path: Path):
    pulled, finished, ahead = [0], [0], []

    def jobs():
        for index in range(60):
            pulled[0] += 1
            yield Job(SAMPLES / "coffee_rgb.png", tmp_path / f"{index}.png", str(index))

    def on_result(result):
        assert result.status == "written", result.reason
        finished[0] += 1
        ahead.append(pulled[0] - finished[0])

    settings = PipelineSettings(device="cpu", jobs=2, batch_size=4, startup_buffer_bytes=1 << 20)
    engine = device_engine(GRAY, settings, CPU_PLAN, 2)
    engine.run(jobs(), on_result)
    assert finished[0] == 60
    assert max(ahead) <= engine.window == 5 * 4 + 2 * 2
    assert engine.decoded_budget.peak <= max(1 << 20, 400 * 600 * 3)
    assert engine.pool is not None and engine.pool.peak_bytes <= settings.pinned_bytes


def test_buffer_pool_reuses_buffers_and_waits_at_its_limit():
    import threading

    pool = BufferPool(1000, pin=False, granule=1)
    first = pool.acquire(600)
    pool.release(first)
    assert pool.acquire(500) is first and pool.allocated == 1
    second = pool.acquire(400)
    got = []
    waiter = threading.Thread(target=lambda: got.append(pool.acquire(300)))
    waiter.start()
    waiter.join(0.3)
    assert not got  # 600 + 400 held: 300 more must wait
    pool.release(second)
    waiter.join(2)
    assert got == [second] and pool.peak_bytes <= 1000


def test_buffer_pool_serves_nearby_sizes_from_one_buffer():
    pool = BufferPool(10 << 20, pin=False, granule=1 << 20)
    first = pool.acquire((3 << 20) + 5)  # rounded up to 4 MiB
    assert first.numel() == 4 << 20
    pool.release(first)
    assert pool.acquire((4 << 20) - 7) is first and pool.allocated == 1


def test_buffer_pool_allocates_and_frees_outside_its_lock():
    """Pinning takes milliseconds: a thread giving a buffer back must not wait for it."""
    import threading
    from types import SimpleNamespace

    def lock_free() -> bool:
        """Whether another thread can take the pool's lock right now."""
        free = []

        def probe() -> None:
            took = pool._cond.acquire(blocking=False)
            if took:
                pool._cond.release()
            free.append(took)

        thread = threading.Thread(target=probe)
        thread.start()
        thread.join()
        return free[0]

    seen = []

    def allocate(nbytes: int):
        seen.append(("allocate", lock_free()))
        return SimpleNamespace(nbytes=nbytes)

    def dispose(buffer) -> None:
        seen.append(("dispose", lock_free()))

    pool = BufferPool(100, pin=False, granule=1, allocate=allocate, dispose=dispose)
    small = pool.acquire(60)
    pool.release(small)
    big = pool.acquire(90)  # no room beside the free 60: it is dropped, then 90 allocated
    assert big.nbytes == 90 and pool.allocated == 2
    assert seen == [("allocate", True), ("dispose", True), ("allocate", True)]


def test_buffer_pool_gives_back_the_room_of_a_failed_allocation():
    def allocate(nbytes: int):
        raise MemoryError("pinned memory")

    pool = BufferPool(100, pin=False, granule=1, allocate=allocate)
    with pytest.raises(MemoryError):
        pool.acquire(60)
    assert pool._held == 0 and pool._out == 0 and pool.allocated == 0


def test_byte_budget_lets_one_oversized_request_through():
    budget = ByteBudget(10)
    assert budget.take(50)  # alone: allowed
    budget.give(50)
    assert budget.take(6) and budget.peak == 50


def _stand_in_png_filter(image, code):
    """torch.ops.imgops.png_filter's contract, through imgops._cli_kernels (CPU tensors)."""
    import torch

    from imgops.native import cli_kernels

    pixels = image.numpy()
    height = pixels.shape[0]
    bpp = (1 if pixels.ndim == 2 else pixels.shape[2]) * pixels.itemsize
    row_bytes = pixels.shape[1] * bpp
    rows = np.zeros((height + 1, row_bytes), dtype=np.uint8)
    rows[1:] = pixels.astype(pixels.dtype.newbyteorder(">")).view(np.uint8).reshape(height, -1)
    out = np.empty((height, 1 + row_bytes), dtype=np.uint8)
    cli_kernels().png_filter_rows(rows, out, height, row_bytes, bpp, code)
    return torch.from_numpy(out)


def _stand_in_encode_png_filtered(rows, *, width, height, channels, bit_depth, level):
    """encode_png_filtered's contract with plain zlib (same pixels, not the same bytes)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(data, zlib.crc32(kind))
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    assert rows.shape == (height, 1 + width * channels * bit_depth // 8)
    colour = {1: 0, 2: 4, 3: 2, 4: 6}[channels]
    header = struct.pack(">IIBBBBB", width, height, bit_depth, colour, 0, 0, 0)
    body = zlib.compress(rows.tobytes(), 1)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", body) + chunk(b"IEND", b"")
    )


@needs_nvimgcodec
@pytest.mark.skipif(
    __import__("imgops.native", fromlist=["x"]).cli_kernels() is None, reason="no _cli_kernels"
)
@pytest.mark.parametrize("impl", ["stand-in", "op"])
def test_device_png_filter_path_writes_the_cpu_paths_pixels(tmp_path: Path, monkeypatch, impl):
    """The rows-filtered-on-the-device path (png_filter + encode_png_filtered): the filter is
    the real torch op (or a stand-in of its contract), the encoder a stand-in of its contract
    until the PNG encoder's lands; pixels must be the host path's."""
    from imgops.engine import batched
    from imgops.io import png

    if impl == "op":
        import torch

        from imgops import _extension

        _extension.load()
        if batched._png_filter_op(torch) is None:
            pytest.skip("torch.ops.imgops.png_filter is not built")
    else:
        monkeypatch.setattr(batched, "_png_filter_op", lambda torch: _stand_in_png_filter)
    monkeypatch.setattr(batched, "_encode_png_filtered", lambda: _stand_in_encode_png_filtered)
    monkeypatch.setattr(png, "filter_code_for", lambda level: -1, raising=False)
    for op in (GRAY, INVERT):
        run_engine("host", op, ALL_SAMPLES, tmp_path / op.name / "host")
        nv = run_engine("nv", op, ALL_SAMPLES, tmp_path / op.name / "nv")
        assert {r.status for r in nv.values()} == {"written"}
        for path in ALL_SAMPLES:
            name = f"{path.name}.png"
            a = cv2.imread(str(tmp_path / op.name / "host" / name), cv2.IMREAD_UNCHANGED)
            b = cv2.imread(str(tmp_path / op.name / "nv" / name), cv2.IMREAD_UNCHANGED)
            np.testing.assert_array_equal(a, b, err_msg=f"{op.name} {name}")


# ----------------------------------------------------------------------------------- GPU


@pytest.mark.cuda
@needs_nvimgcodec
def test_gpu_decode_of_every_sample_and_odd_file_is_within_one_level(tmp_path: Path):
    files = _odd_files(tmp_path / "in")
    paths = ALL_SAMPLES + sorted(files.values())
    host = run_engine("host", GRAY, paths, tmp_path / "host")
    jobs = [Job(p, tmp_path / "gpu" / f"{p.name}.png", p.name) for p in paths]
    (tmp_path / "gpu").mkdir()
    results = []
    run_batch(jobs, GRAY, PipelineSettings(device="cuda", decoder="gpu"), results.append)
    gpu = {r.job.label: r for r in results}
    for name, result in host.items():
        assert (gpu[name].status, gpu[name].reason) == (result.status, result.reason), name
        if result.status != "written":
            continue
        a = cv2.imread(str(tmp_path / "host" / f"{name}.png"), cv2.IMREAD_UNCHANGED)
        b = cv2.imread(str(tmp_path / "gpu" / f"{name}.png"), cv2.IMREAD_UNCHANGED)
        assert a.shape == b.shape, name  # EXIF orientation applied the same way
        assert np.abs(a.astype(int) - b.astype(int)).max() <= 2, name
    rocket = gpu["rocket_baseline_rgb.jpg"]
    assert rocket.decoder == "nvimgcodec", rocket.fallback
    assert gpu["cmyk.jpg"].decoder == "opencv"


@pytest.mark.cuda
def test_whole_batch_is_byte_identical_on_both_devices_with_the_cpu_decoder(tmp_path: Path):
    for device in ("cpu", "cuda"):
        out = tmp_path / device
        out.mkdir()
        jobs = [Job(p, out / f"{p.name}.png", p.name) for p in ALL_SAMPLES]
        settings = PipelineSettings(device=device, decoder="cpu", batch_size=4)
        assert run_batch(jobs, GRAY, settings).written == len(ALL_SAMPLES)
    assert outputs(tmp_path / "cpu") == outputs(tmp_path / "cuda")


@pytest.mark.cuda
def test_png_filter_bytes_equal_on_cpu_and_cuda():
    torch = pytest.importorskip("torch")
    import imgops  # noqa: F401  (registers the ops)

    if not hasattr(torch.ops.imgops, "png_filter"):
        pytest.skip("torch.ops.imgops.png_filter is not built yet")
    rng = np.random.default_rng(3)
    for shape, dtype in (((37, 53), np.uint8), ((20, 31, 3), np.uint16), ((9, 7, 4), np.uint8)):
        image = torch.from_numpy(rng.integers(0, np.iinfo(dtype).max + 1, shape, dtype=dtype))
        for code in (-1, 0, 1, 2, 3, 4):
            cpu = torch.ops.imgops.png_filter(image, code)
            cuda = torch.ops.imgops.png_filter(image.cuda(), code).cpu()
            assert torch.equal(cpu, cuda), (shape, code)


@pytest.mark.cuda
@needs_nvimgcodec
def test_gpu_jpeg_output_is_close_to_the_cpu_encoders(tmp_path: Path):
    photos = [SAMPLES / "rocket_baseline_rgb.jpg", SAMPLES / "flower_progressive_3mp.jpg"]
    for device in ("cpu", "cuda"):
        (tmp_path / device).mkdir()
        jobs = [Job(p, tmp_path / device / f"{p.stem}.jpg", p.name) for p in photos]
        settings = PipelineSettings(device=device, fmt="jpg", jpeg_quality=90)
        seen: list = []
        assert run_batch(jobs, GRAY, settings, seen.append).written == len(photos)
        assert not any(r.note and "OpenCV instead" in r.note for r in seen)  # nvJPEG encoded
    for path in photos:
        a = cv2.imread(str(tmp_path / "cpu" / f"{path.stem}.jpg"), cv2.IMREAD_UNCHANGED)
        b = cv2.imread(str(tmp_path / "cuda" / f"{path.stem}.jpg"), cv2.IMREAD_UNCHANGED)
        assert a.shape == b.shape and b.ndim == 2
        assert np.abs(a.astype(int) - b.astype(int)).mean() < 1.5, path.name


@pytest.mark.cuda
@needs_nvimgcodec
def test_gpu_memory_stays_bounded_whatever_the_batch_size(tmp_path: Path):
    import shutil

    import torch

    folder = tmp_path / "in"
    folder.mkdir()
    for index in range(48):
        shutil.copy(SAMPLES / "flower_progressive_3mp.jpg", folder / f"{index}.jpg")
    peaks = {}
    for count in (12, 48):
        out = tmp_path / f"out{count}"
        out.mkdir()
        files = sorted(folder.iterdir())[:count]
        jobs = [Job(p, out / f"{p.stem}.png", p.name) for p in files]
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        settings = PipelineSettings(device="cuda", batch_size=8, batch_bytes=64 << 20)
        assert run_batch(jobs, GRAY, settings).written == count
        peaks[count] = torch.cuda.max_memory_allocated()
    assert peaks[48] <= 1.25 * peaks[12] + (32 << 20), peaks  # no growth with the batch


def test_flip_channels_reverses_uint16_channels_bit_for_bit():
    import torch

    from imgops.engine.batched import flip_channels

    rng = np.random.default_rng()
    pixels = rng.integers(0, 65536, size=(5, 7, 3), dtype=np.uint16)
    flipped = flip_channels(torch.from_numpy(pixels))
    assert flipped.dtype == torch.uint16
    assert np.array_equal(flipped.numpy(), pixels[..., ::-1])
    small = rng.integers(0, 256, size=(4, 3, 3), dtype=np.uint8)
    assert np.array_equal(flip_channels(torch.from_numpy(small)).numpy(), small[..., ::-1])


@needs_nvimgcodec
def test_jpeg_output_falls_back_to_opencv_when_the_gpu_encoder_cannot_start(tmp_path: Path):
    from imgops.engine.batched import DeviceEngine

    def no_encoder():
        raise gpu_decode.GpuDecoderUnavailable("nvImageCodec x cannot encode JPEG: test")

    photos = JPEGS[:3]
    expected = run_engine("host", GRAY, photos, tmp_path / "host", fmt="jpg")
    settings = PipelineSettings(device="cpu", jobs=2, batch_size=3, fmt="jpg")
    jobs = [Job(p, tmp_path / "dev" / f"{p.name}.jpg", p.name) for p in photos]
    (tmp_path / "dev").mkdir()
    engine = DeviceEngine(GRAY, settings, "cpu", 2, None, no_encoder)
    results: list = []
    engine.run(iter(jobs), results.append)
    assert [r.status for r in results] == ["written"] * len(photos)
    notes = [r.note for r in results if r.note]
    assert len(notes) == 1 and "encoded with OpenCV instead" in notes[0]
    assert outputs(tmp_path / "dev") == outputs(tmp_path / "host")
    assert set(expected) == {p.name for p in photos}


def test_device_engine_reports_where_its_threads_spend_time(tmp_path: Path):
    summary_jobs = [Job(p, tmp_path / f"{p.name}.png", p.name) for p in JPEGS[:3]]
    engine = device_engine(GRAY, PipelineSettings(device="cpu", jobs=2), CPU_PLAN, 2)
    engine.run(iter(summary_jobs), lambda r: None)
    phases = engine.phases.snapshot()
    for name in ("prep.read", "prep.cpu_decode", "device.run", "encode.encode", "encode.write"):
        assert phases.get(name, 0.0) > 0.0, (name, phases)


@pytest.mark.cuda
@needs_nvimgcodec
@pytest.mark.parametrize("decoder", ["cpu", "gpu"])
def test_many_large_images_on_cuda_equal_the_cpu_paths_bytes(tmp_path: Path, decoder: str):
    """Rows read back before their copy finished (the copies once ran on another stream than
    the batch's event) show as wrong bytes only under load: many big images, small batches."""
    rng = np.random.default_rng()
    base = cv2.imread(str(SAMPLES / "flower_rgb_3mp.png"), cv2.IMREAD_COLOR)
    folder = tmp_path / "in"
    folder.mkdir()
    for index in range(40):
        tiled = np.tile(np.roll(base, int(rng.integers(0, 400)), axis=1), (2, 2, 1))
        quality = [cv2.IMWRITE_JPEG_QUALITY, int(rng.integers(80, 96))]
        assert cv2.imwrite(str(folder / f"{index:02d}.jpg"), tiled, quality)
    files = sorted(folder.iterdir())
    digests = {}
    for device in ("cpu", "cuda"):
        out = tmp_path / device
        out.mkdir()
        jobs = [Job(p, out / f"{p.stem}.png", p.name) for p in files]
        settings = PipelineSettings(device=device, decoder="cpu" if device == "cpu" else decoder,
                                    batch_size=6, jobs=8)  # fmt: skip
        assert run_batch(jobs, GRAY, settings).written == len(files)
        digests[device] = outputs(out)
    if decoder == "cpu":
        assert digests["cuda"] == digests["cpu"]
    else:  # the GPU's decode may differ by one level: compare pixels to the CPU's
        for name, data in digests["cuda"].items():
            ours = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
            theirs = cv2.imdecode(np.frombuffer(digests["cpu"][name], np.uint8), -1)
            assert np.abs(ours.astype(int) - theirs.astype(int)).max() <= 1, name


@pytest.mark.parametrize("kind", ["host", "device"])
def test_an_interrupted_batch_counts_every_file_it_finished(tmp_path: Path, kind: str):
    """Ctrl-C (here: the result callback raising it) lets the files in progress finish; each
    finished file is complete on disk and must be counted, or the summary lies."""
    photos = (JPEGS * 4)[:10]
    jobs = [Job(p, tmp_path / f"{i:02d}.png", f"{i:02d}") for i, p in enumerate(photos)]
    settings = PipelineSettings(device="cpu", jobs=2, batch_size=3)
    reported: list = []

    def on_result(result) -> None:
        reported.append(result)
        if len(reported) == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        if kind == "host":
            run_batch(jobs, GRAY, settings, on_result)
        else:
            device_engine(GRAY, settings, CPU_PLAN, 2).run(iter(jobs), on_result)
    written = sorted(p.name for p in tmp_path.glob("*.png"))
    assert sorted(f"{r.job.label}.png" for r in reported if r.status == "written") == written
    assert 1 <= len(written) < len(photos)


@pytest.mark.parametrize("name", ["rocket_baseline_rgb.jpg", "flower_progressive_3mp.jpg"])
def test_the_fast_whole_jpeg_check_agrees_with_the_full_scan(name: str):
    from imgops.io.gpu_decode import jpeg_is_whole
    from imgops.io.images import jpeg_structure_problem

    data = (SAMPLES / name).read_bytes()
    step = 1 if len(data) < 100_000 else 97
    lengths = list(range(2, len(data), step)) + list(range(len(data) - 16, len(data) + 1))
    for cut in lengths:
        part = data[:cut]
        assert jpeg_is_whole(part) == (jpeg_structure_problem(part) is None), cut
    for tail in (b"\x00" * 3, b"\xff\xd9", b"\xff\xd8\xff\xe0\x00\x10", data[:500]):
        assert jpeg_is_whole(data + tail) == (jpeg_structure_problem(data + tail) is None)


def test_the_warm_up_jpeg_needs_neither_opencv_nor_numpy():
    """The GPU stage's warm-up file and its whole-file check import neither OpenCV nor numpy
    (the stage's thread would wait on those imports); the file is the 128x96 ramp."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from imgops.io.gpu_decode import jpeg_is_whole, warm_up_jpeg\n"
        "assert jpeg_is_whole(warm_up_jpeg())\n"
        "print(sorted(m for m in ('cv2', 'numpy') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
    from imgops.io.gpu_decode import warm_up_jpeg

    image = cv2.imdecode(np.frombuffer(warm_up_jpeg(), np.uint8), cv2.IMREAD_COLOR)
    ramp = np.add.outer(np.arange(96), np.arange(128)).astype(np.uint8)
    expected = np.dstack([ramp, ramp[::-1], 255 - ramp])
    assert image.shape == (96, 128, 3)
    assert np.abs(image.astype(int) - expected).mean() < 2


@needs_nvimgcodec
def test_files_take_the_cpu_path_while_torch_starts(tmp_path: Path, monkeypatch):
    """While torch/CUDA start, prep threads run whole files through the CPU path (the same
    bytes as the host engine); once torch is up, the rest go through the device."""
    import threading

    from imgops.engine import batched

    release = threading.Event()
    original = batched.TorchStage._start

    def slow_start(self) -> None:
        release.wait(20)
        original(self)

    monkeypatch.setattr(batched.TorchStage, "_start", slow_start)
    photos = (JPEGS * 8)[:12]
    jobs = [Job(p, tmp_path / "dev" / f"{i:02d}.png", f"{i:02d}") for i, p in enumerate(photos)]
    (tmp_path / "dev").mkdir()
    settings = PipelineSettings(device="cpu", jobs=2, batch_size=3)
    engine = device_engine(GRAY, settings, CPU_PLAN, 2, cpu_backend=True)
    results: list = []

    def on_result(result) -> None:
        results.append(result)
        if len(results) == 4:
            release.set()  # torch "arrives" after four files

    engine.run(iter(jobs), on_result)
    assert [r.status for r in results] == ["written"] * len(photos)
    decoders = [r.decoder for r in results]
    assert decoders[:4] == ["opencv"] * 4 and "nvimgcodec" in decoders[4:]
    host = [Job(p, tmp_path / "host" / f"{i:02d}.png", f"{i:02d}") for i, p in enumerate(photos)]
    (tmp_path / "host").mkdir()
    run_batch(host, GRAY, PipelineSettings(device="cpu", jobs=2))
    for result in results:
        if result.decoder == "opencv":  # the CPU path's bytes exactly
            name = result.job.target.name
            assert result.job.target.read_bytes() == (tmp_path / "host" / name).read_bytes()


@needs_nvimgcodec
def test_decoder_gpu_never_takes_the_cpu_path_while_torch_starts(tmp_path: Path):
    settings = PipelineSettings(device="cpu", jobs=2, batch_size=3, decoder="gpu")
    engine = device_engine(GRAY, settings, CPU_PLAN, 2, cpu_backend=True)
    assert not engine.host_while_starting


def test_buffer_pool_times_its_allocations():
    """allocate_seconds: what new (pinned) buffers cost; reuse adds nothing to it."""
    import time as clock
    from types import SimpleNamespace

    def slow(nbytes: int) -> SimpleNamespace:
        clock.sleep(0.05)
        return SimpleNamespace(nbytes=nbytes)

    pool = BufferPool(100, pin=False, granule=1, allocate=slow)
    first = pool.acquire(40)
    pool.release(first)
    assert pool.acquire(30) is first
    assert pool.allocated == 1 and 0.05 <= pool.allocate_seconds < 1.0
    pool.acquire(50)
    assert pool.allocated == 2 and pool.allocate_seconds >= 0.1


def test_run_batch_reports_the_device_pools_pinning_seconds(monkeypatch, tmp_path):
    """--stats-json's engine_seconds carry "device.pinning", the pool's allocate_seconds; its
    gpu_decode_batches the files of each GPU decode call."""
    from types import SimpleNamespace

    from imgops.engine import run as run_module
    from imgops.engine.phases import Phases
    from imgops.engine.types import JobResult

    class FakeEngine:
        def __init__(self) -> None:
            self.phases = Phases()
            self.phases.add("device.wait_pool", 0.5)
            self.pool = SimpleNamespace(allocate_seconds=0.25)
            self.gpu_peak_bytes = None
            self.decode_batches = [3, 1]

        def run(self, jobs, on_result) -> None:
            for job in jobs:
                on_result(JobResult(job, "written"))

    monkeypatch.setattr(run_module, "choose", lambda settings, op: Plan("cuda", "gpu", "test"))
    monkeypatch.setattr(run_module, "device_engine", lambda *args, **kwargs: FakeEngine())
    job = Job(tmp_path / "in.jpg", tmp_path / "out.png", "in.jpg")
    summary = run_batch([job], GRAY, PipelineSettings())
    assert summary.written == 1
    assert summary.engine == {"device.pinning": 0.25, "device.wait_pool": 0.5}
    assert summary.as_dict()["gpu_decode_batches"] == [3, 1]


def test_buffer_pool_never_waits_for_the_callers_own_buffers():
    """A batch whose buffers outgrow the pool gets the next one past the limit (waiting would
    be forever: only the caller can give its buffers back); with another thread's buffer out
    it waits for that one."""
    import threading

    pool = BufferPool(1000, pin=False, granule=1)
    first = pool.acquire(800)
    second = pool.acquire(800, held=1)  # only the caller's own buffer is out
    assert pool.allocated == 2 and second is not first
    pool.release(first)
    pool.release(second)
    mine = pool.acquire(800)  # reuses a free one
    others = pool.acquire(800)  # "another thread's": the caller holds none of them now
    got = []
    waiter = threading.Thread(target=lambda: got.append(pool.acquire(900, held=1)))
    waiter.start()
    waiter.join(0.3)
    assert not got  # `others` is out and not the caller's: it waits for it
    pool.release(others)
    waiter.join(2)
    assert got and got[0].nbytes >= 900
    assert mine is not None
