"""nvImageCodec's JPEG encoder (imgops.io.gpu_encode): the backends it asks for, round trips.

nvImageCodec's CPU backend needs no GPU, so the encoder's own code paths (batching, gray and
RGB, refusals, quality) run here; the tests marked cuda repeat them with nvJPEG on the GPU,
where the reported failure was: `Encoder(backends=[GPU_ONLY])` finds no JPEG encoder (status 7).
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from imgops.io import gpu_decode

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
PHOTO_NAMES = ("rocket_baseline_rgb.jpg", "flower_progressive_3mp.jpg", "flower_gray_3mp.jpg",
               "coffee_rgb.png", "camera_gray.png")  # fmt: skip
PHOTOS = [SAMPLES / name for name in PHOTO_NAMES]

needs_nvimgcodec = pytest.mark.skipif(
    gpu_decode.version() is None, reason="nvImageCodec not installed"
)
pytestmark = needs_nvimgcodec


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """Peak signal-to-noise ratio of two uint8 images, in dB (inf when equal)."""
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def load_rgb_or_gray(path: Path) -> np.ndarray:
    """8-bit pixels as the engine hands them to the encoder: gray (H, W) or RGB (H, W, 3)."""
    pixels = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    if pixels.ndim == 3:
        pixels = cv2.cvtColor(pixels[..., :3], cv2.COLOR_BGR2RGB)
    return np.ascontiguousarray(pixels)


def opencv_round_trip(pixels: np.ndarray, quality: int) -> tuple[np.ndarray, int]:
    """OpenCV's encode (what the CPU path writes) decoded again, and its size in bytes."""
    bgr = pixels if pixels.ndim == 2 else pixels[..., ::-1]
    ok, data = cv2.imencode(".jpg", np.ascontiguousarray(bgr), [cv2.IMWRITE_JPEG_QUALITY, quality])
    assert ok
    return decode(data.tobytes()), len(data)


def decode(data: bytes) -> np.ndarray:
    """JPEG bytes to gray (H, W) or RGB (H, W, 3) with OpenCV, asserting they are a JPEG."""
    assert data[:3] == b"\xff\xd8\xff" and data[-2:] == b"\xff\xd9"
    pixels = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    assert pixels is not None
    return pixels if pixels.ndim == 2 else cv2.cvtColor(pixels, cv2.COLOR_BGR2RGB)


@pytest.fixture(scope="module")
def cpu_encoder():
    from imgops.io.gpu_encode import GpuJpegEncoder

    return GpuJpegEncoder(95, cpu_backend=True)


def as_tensors(arrays, device: str = "cpu"):
    import torch

    return [torch.from_numpy(np.ascontiguousarray(a)).to(device) for a in arrays]


# ------------------------------------------------------------------ the backends it asks for
def test_the_gpu_encoder_asks_for_nvjpegs_kinds_never_gpu_only_nor_the_cpu():
    from imgops.io.gpu_encode import backend_kinds

    assert backend_kinds() == ("HW_GPU_ONLY", "HYBRID_CPU_GPU")
    assert backend_kinds(cpu_backend=True) == ("CPU_ONLY",)


def test_nvimgcodec_files_its_nvjpeg_encoder_under_hybrid_not_gpu_only():
    """The root cause of the H200 failure, reproduced without a GPU: creation matches the
    requested kinds against the registered encoders before any CUDA call is made."""
    nv = gpu_decode.module()
    cpu = nv.NVIMGCODEC_DEVICE_CPU_ONLY
    with pytest.raises(Exception, match="Code: 7"):  # ARCH_MISMATCH: no encoder of that kind
        nv.Encoder(device_id=cpu, backends=[nv.Backend(nv.BackendKind.GPU_ONLY)])
    nv.Encoder(device_id=cpu, backends=[nv.Backend(nv.BackendKind.HYBRID_CPU_GPU)])
    nv.Encoder(device_id=cpu, backends=[nv.Backend(nv.BackendKind.CPU_ONLY)])


def test_a_creation_failure_is_one_line_that_names_the_status():
    from imgops.io.gpu_encode import GPU_BACKEND_KINDS, _explain

    error = RuntimeError(
        "Internal error - Could not create encoder. Code: 7 at /home/jenkins/x/encoder.cpp:63"
    )
    line = _explain(error, GPU_BACKEND_KINDS)
    assert "\n" not in line and "/home/jenkins" not in line
    assert "ARCH_MISMATCH" in line and "HYBRID_CPU_GPU" in line and "nvidia-nvjpeg" in line
    assert "CUDA driver" in _explain(RuntimeError("Could not create encoder. Code: 8"), ())
    assert _explain(RuntimeError("CUDA Runtime failure"), ()) == "CUDA Runtime failure"


def test_quality_outside_1_to_100_is_refused():
    from imgops.io.gpu_encode import GpuJpegEncoder

    for quality in (0, 101):
        with pytest.raises(ValueError, match="1..100"):
            GpuJpegEncoder(quality, cpu_backend=True)


def test_status_says_why_without_a_gpu(monkeypatch):
    from imgops.io import gpu_encode

    monkeypatch.setattr(gpu_encode, "driver_device_count", lambda: 0)
    usable, line = gpu_encode.status(0)
    assert not usable and "no CUDA GPU 0" in line and "\n" not in line


# ------------------------------------------------------------------ round trips (CPU backend)
@pytest.mark.parametrize("path", PHOTOS, ids=lambda p: p.name)
def test_cpu_backend_round_trip_is_as_good_as_opencvs(cpu_encoder, path: Path):
    pixels = load_rgb_or_gray(path)
    (data,) = cpu_encoder.encode(as_tensors([pixels]))
    assert data is not None
    back = decode(data)
    assert back.shape == pixels.shape
    reference, _ = opencv_round_trip(pixels, 95)
    assert psnr(back, pixels) >= psnr(reference, pixels) - 0.5, path.name


def test_a_batch_keeps_its_order_and_refuses_what_it_cannot_encode(cpu_encoder):
    import torch

    rgb = load_rgb_or_gray(SAMPLES / "rocket_baseline_rgb.jpg")
    gray = load_rgb_or_gray(SAMPLES / "camera_gray.png")
    refused = [
        torch.zeros((8, 8), dtype=torch.uint16),  # 16-bit: OpenCV says why
        torch.zeros((8, 8, 4), dtype=torch.uint8),  # RGBA
        torch.zeros((0, 8), dtype=torch.uint8),  # empty
        None,
    ]
    batch = [as_tensors([gray])[0], refused[0], as_tensors([rgb])[0], *refused[1:]]
    out = cpu_encoder.encode(batch)
    assert [o is None for o in out] == [False, True, False, True, True, True]
    assert decode(out[0]).shape == gray.shape and decode(out[2]).shape == rgb.shape


def test_a_lower_quality_gives_fewer_bytes():
    from imgops.io.gpu_encode import GpuJpegEncoder

    pixels = as_tensors([load_rgb_or_gray(SAMPLES / "rocket_baseline_rgb.jpg")])
    low = GpuJpegEncoder(40, cpu_backend=True).encode(pixels)[0]
    high = GpuJpegEncoder(95, cpu_backend=True).encode(pixels)[0]
    assert len(low) < 0.6 * len(high)


def test_the_cpu_backend_does_not_take_device_tensors(cpu_encoder):
    class FakeCuda:  # what accepts() reads of a CUDA tensor
        dtype, is_cuda = "torch.uint8", True

        def dim(self):
            return 2

        def numel(self):
            return 64

    assert not cpu_encoder.accepts(FakeCuda())


def _image(kind: str, height: int, width: int, channels: int, seed: int) -> np.ndarray:
    shape = (height, width) if channels == 1 else (height, width, 3)
    rng = np.random.default_rng(seed)
    if kind == "flat":
        return np.full(shape, rng.integers(0, 256), np.uint8)
    if kind == "noise":
        return rng.integers(0, 256, shape, dtype=np.uint8)
    ramp = np.linspace(0, 255, width)[None, :] + np.linspace(0, 40, height)[:, None]
    ramp = np.clip(ramp, 0, 255).astype(np.uint8)
    return ramp if channels == 1 else np.stack([ramp, 255 - ramp, ramp // 2], axis=-1)


@given(
    kind=st.sampled_from(["flat", "gradient", "noise"]),
    height=st.integers(1, 48),
    width=st.integers(1, 48),
    channels=st.sampled_from([1, 3]),
    seed=st.integers(0, 2**31),
)
def test_any_size_round_trips_on_the_cpu_backend(cpu_encoder, kind, height, width, channels, seed):
    pixels = _image(kind, height, width, channels, seed)
    (data,) = cpu_encoder.encode(as_tensors([pixels]))
    assert data is not None
    back = decode(data)
    assert back.shape == pixels.shape
    error = np.abs(back.astype(int) - pixels.astype(int))
    if kind == "flat":
        assert error.max() <= 2
    elif kind == "gradient" and channels == 1:
        assert error.mean() <= 2.0


# ------------------------------------------------------------------ nvJPEG on the GPU
@pytest.fixture(scope="module")
def gpu_encoder():
    from imgops.io.gpu_encode import GpuJpegEncoder

    return GpuJpegEncoder(95, 0)  # the H200 run failed right here, status 7


@pytest.mark.cuda
def test_the_gpu_encoder_starts_and_doctor_says_which(gpu_encoder):
    from imgops.io import gpu_encode

    usable, line = gpu_encode.status(0)
    assert usable, line
    assert "nvJPEG" in line


@pytest.mark.cuda
@pytest.mark.parametrize("path", PHOTOS, ids=lambda p: p.name)
def test_gpu_round_trip_is_close_to_opencvs_at_the_same_quality(gpu_encoder, path: Path):
    import torch

    pixels = load_rgb_or_gray(path)
    stream = torch.cuda.current_stream().cuda_stream
    (data,) = gpu_encoder.encode(as_tensors([pixels], "cuda"), stream)
    assert data is not None, path.name
    back = decode(data)
    assert back.shape == pixels.shape  # gray stays one channel
    reference, size = opencv_round_trip(pixels, 95)
    assert psnr(back, pixels) >= psnr(reference, pixels) - 1.5, path.name
    assert psnr(back, reference) >= 35.0, path.name
    assert len(data) <= 1.5 * size, (len(data), size)


@pytest.mark.cuda
def test_gpu_batch_of_mixed_images_keeps_its_order(gpu_encoder):
    import torch

    images = [load_rgb_or_gray(p) for p in PHOTOS]
    tensors = as_tensors(images, "cuda")
    batch = [
        tensors[0],
        torch.zeros((8, 8), dtype=torch.uint16, device="cuda"),
        *tensors[1:],
        torch.from_numpy(images[0]),  # on the host: not for the GPU encoder
    ]
    out = gpu_encoder.encode(batch, torch.cuda.current_stream().cuda_stream)
    assert out[1] is None and out[-1] is None
    for image, data in zip(images, [out[0], *out[2:-1]], strict=True):
        assert data is not None and decode(data).shape == image.shape


@pytest.mark.cuda
@pytest.mark.parametrize("shape", [(1, 1), (7, 5), (8, 8), (13, 1), (1, 300), (5, 7, 3),
                                   (16, 16), (17, 33, 3), (427, 641, 3), (1080, 1921)])  # fmt: skip
def test_gpu_encoder_never_raises_on_odd_sizes(gpu_encoder, shape):
    import torch

    pixels = _image("gradient", shape[0], shape[1], 1 if len(shape) == 2 else 3, 0)
    (data,) = gpu_encoder.encode(
        as_tensors([pixels], "cuda"), torch.cuda.current_stream().cuda_stream
    )
    if data is None:  # nvJPEG refuses some tiny sizes; the engine then uses OpenCV
        assert min(shape[:2]) < 16, shape
        return
    back = decode(data)
    assert back.shape == pixels.shape
    # As close as OpenCV's own JPEG at the same quality (4:2:0 chroma on a saturated colour
    # gradient of a few pixels loses more than 3 levels in either encoder).
    reference, _ = opencv_round_trip(pixels, gpu_encoder.quality)
    theirs = np.abs(reference.astype(int) - pixels.astype(int)).mean()
    assert np.abs(back.astype(int) - pixels.astype(int)).mean() <= max(3.0, 2 * theirs + 1)


@pytest.mark.cuda
def test_gpu_encode_waits_for_the_stream_that_made_the_pixels(gpu_encoder):
    import torch

    side = torch.cuda.Stream()
    pixels = torch.zeros((2048, 2048), dtype=torch.uint8, device="cuda")
    busy = torch.randn((4096, 4096), device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        for _ in range(20):  # keep the stream busy before the pixels are written
            busy = busy @ busy
            busy = busy / busy.abs().max()
        pixels.fill_(200)
        (data,) = gpu_encoder.encode([pixels], side.cuda_stream)
    assert data is not None
    assert np.abs(decode(data).astype(int) - 200).max() <= 1


@pytest.mark.cuda
def test_cuda_jpg_batch_is_encoded_on_the_gpu_not_by_the_fallback(tmp_path: Path):
    from imgops.engine import GRAY, Job, PipelineSettings, run_batch

    photos = [p for p in PHOTOS if p.suffix == ".jpg"]
    results = {}
    for device in ("cpu", "cuda"):
        (tmp_path / device).mkdir()
        jobs = [Job(p, tmp_path / device / f"{p.stem}.jpg", p.name) for p in photos]
        settings = PipelineSettings(
            device=device, fmt="jpg", jpeg_quality=95, host_while_starting=False
        )
        seen: list = []
        assert run_batch(jobs, GRAY, settings, seen.append).written == len(photos)
        results[device] = seen
    notes = [r.note for r in results["cuda"] if r.note]
    assert not any("OpenCV instead" in n for n in notes), notes
    # Files nvImageCodec does not decode (the progressive sample: the hardware decoder refuses
    # it) take the whole CPU path, OpenCV's JPEG included: only the others must differ.
    on_gpu = {r.job.source.name for r in results["cuda"] if r.decoder == "nvimgcodec"}
    photos = [p for p in photos if p.name in on_gpu]
    assert photos
    differ = 0
    for path in photos:
        a = (tmp_path / "cpu" / f"{path.stem}.jpg").read_bytes()
        b = (tmp_path / "cuda" / f"{path.stem}.jpg").read_bytes()
        differ += a != b  # nvJPEG's bytes, not OpenCV's
        pa, pb = decode(a), decode(b)
        assert pa.shape == pb.shape and pb.ndim == 2
        assert psnr(pa, pb) >= 36.0, path.name
    assert differ == len(photos)
