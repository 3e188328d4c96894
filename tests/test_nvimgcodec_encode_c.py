"""nvImageCodec's JPEG encoder through its C API (imgops.io.nvimgcodec_encode_c), on its CPU
backend (no GPU needed; its structures are checked against the wheel's header with the
decoder's, in test_nvimgcodec_c.py): the very bytes of the
Python module's encoder (GpuJpegEncoder) at the same settings, pitched and gray inputs, what it
refuses, the instance it shares with a C API decoder, and that it encodes without the GIL.
The GPU backends run in tests/test_gpu_jpeg_encode.py's cuda tests and the CLI's."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
from gil_probe import ticks_while
from hypothesis import given, settings
from hypothesis import strategies as st

from imgops.io import nvimgcodec_c

pytestmark = pytest.mark.skipif(
    nvimgcodec_c.package_dir() is None, reason="nvImageCodec not installed"
)
SAMPLES = Path(__file__).resolve().parent.parent / "samples"


def _rocket() -> np.ndarray:
    return cv2.imread(str(SAMPLES / "rocket_baseline_rgb.jpg"))[..., ::-1].copy()


@pytest.fixture(scope="module")
def encoder():
    from imgops.io.nvimgcodec_encode_c import CEncoder

    made = CEncoder(90, cpu_backend=True, threads=2)
    yield made
    made.close()


@pytest.fixture(scope="module")
def python_encoder():
    from imgops.io.gpu_encode import GpuJpegEncoder

    return GpuJpegEncoder(90, cpu_backend=True, threads=2)


def test_the_bytes_are_the_python_modules_at_the_same_settings(encoder, python_encoder):
    """Colour (4:2:0) and gray, the same quality and Huffman tables: byte for byte."""
    import torch

    rgb = _rocket()
    gray = cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)
    ours = encoder.encode_arrays([rgb, gray[..., None]])
    theirs = python_encoder.encode([torch.from_numpy(rgb), torch.from_numpy(gray)])
    assert ours == theirs and all(ours)


@settings(max_examples=60, deadline=None)
@given(
    height=st.integers(1, 70),
    width=st.integers(1, 70),
    channels=st.sampled_from([1, 3]),
    pad=st.integers(0, 40),
    seed=st.integers(0, 2**31),
)
def test_any_size_and_pitch_round_trips(encoder, height, width, channels, pad, seed):
    """Random images, rows padded to any pitch: the JPEG decodes (OpenCV) to their size, and
    its error is about that of OpenCV's own JPEG of the image at the same quality (4:2:0 too:
    on a tiny saturated colour image both lose a lot of chroma)."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (1, 1, channels)).astype(np.float64)
    ramp = np.linspace(0, 60, width)[None, :, None] + np.linspace(0, 60, height)[:, None, None]
    pixels = np.clip(base + ramp, 0, 255).astype(np.uint8)
    padded = np.zeros((height, width * channels + pad), np.uint8)
    view = padded[:, : width * channels].reshape(height, width, channels)
    view[...] = pixels
    (data,) = encoder.encode_arrays([view])
    assert data is not None
    decoded = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    if channels == 3:
        decoded = decoded[..., ::-1]
    assert decoded.shape[:2] == (height, width)
    error = np.abs(decoded.astype(int) - pixels.reshape(decoded.shape)).mean()
    bgr = pixels[..., ::-1] if channels == 3 else pixels[..., 0]
    ok, theirs = cv2.imencode(".jpg", np.ascontiguousarray(bgr), [cv2.IMWRITE_JPEG_QUALITY, 90])
    back = cv2.imdecode(theirs, cv2.IMREAD_UNCHANGED)
    back = back[..., ::-1] if channels == 3 else back
    assert ok and error <= np.abs(back.astype(int) - pixels.reshape(back.shape)).mean() + 3


def test_a_batch_keeps_its_order_and_refuses_what_it_cannot_encode(encoder):
    """None (OpenCV encodes those) for empty, 2- or 4-channel, non-uint8 and non-packed
    images; the others in their places."""
    rgb = _rocket()
    odd = [
        np.zeros((0, 4, 3), np.uint8),
        np.zeros((8, 8, 4), np.uint8),
        np.zeros((8, 8, 3), np.uint16),
        rgb[:, ::2],  # pixels not packed
    ]
    out = encoder.encode_arrays([odd[0], rgb, odd[1], rgb[:50], odd[2], odd[3]])
    assert [o is not None for o in out] == [False, True, False, True, False, False]
    decoded = cv2.imdecode(np.frombuffer(out[3], np.uint8), cv2.IMREAD_COLOR)
    assert decoded.shape == (50, rgb.shape[1], 3)


def test_quality_outside_1_to_100_is_refused():
    from imgops.io.nvimgcodec_encode_c import CEncoder

    for quality in (0, 101):
        with pytest.raises(ValueError, match="1..100"):
            CEncoder(quality, cpu_backend=True)


def test_the_instance_lives_while_the_decoder_or_an_encoder_uses_it():
    """An encoder made on a decoder's instance keeps it after the decoder closes; the last
    user destroys it; a closed decoder lends nothing."""
    from imgops.io.gpu_decode import GpuDecoderUnavailable
    from imgops.io.nvimgcodec_encode_c import CEncoder

    decoder = nvimgcodec_c.CDecoder(cpu_backend=True, threads=1)
    encoder = CEncoder(80, decoder=decoder, cpu_backend=True, threads=1)
    assert decoder._instance_users == 2
    decoder.close()
    assert decoder._instance and decoder._instance_users == 1
    assert encoder.encode_arrays([_rocket()])[0] is not None
    encoder.close()
    encoder.close()  # twice: nothing more
    assert not decoder._instance and decoder._instance_users == 0
    with pytest.raises(GpuDecoderUnavailable, match="closed"):
        CEncoder(80, decoder=decoder, cpu_backend=True)
    assert encoder.encode_arrays([_rocket()]) == [None]


def test_it_encodes_without_holding_the_gil():
    """A pure-Python thread keeps running while the encoder is made and a batch encodes;
    nvImageCodec's output callbacks take the GIL only for a moment each."""
    from imgops.io.nvimgcodec_encode_c import CEncoder

    big = cv2.resize(_rocket(), (2560, 1700))
    ticks, out, took = ticks_while(
        lambda: CEncoder(90, cpu_backend=True, threads=1).encode_arrays([big] * 8)
    )
    assert all(out)
    assert ticks >= 10, (ticks, took)


@pytest.mark.cuda
def test_on_the_gpu_it_encodes_device_images_like_the_python_module():
    """nvJPEG on the GPU (its hardware encoder, else its CUDA one): device images, pitched
    or not, gray and colour; each decodes like the Python module's file of the same image
    (and, as on the CPU backend, the bytes are expected to be the same)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    from imgops.io.gpu_encode import GpuJpegEncoder
    from imgops.io.nvimgcodec_encode_c import CEncoder

    rgb = _rocket()
    gray = np.ascontiguousarray(cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY))
    padded = torch.zeros((rgb.shape[0], rgb.shape[1] * 3 + 96), dtype=torch.uint8, device="cuda")
    pitched = padded[:, : rgb.shape[1] * 3].view(rgb.shape[0], rgb.shape[1], 3)
    pitched.copy_(torch.from_numpy(rgb))
    images = [torch.from_numpy(rgb).cuda(), torch.from_numpy(gray).cuda()[..., None], pitched]
    stream = torch.cuda.current_stream().cuda_stream
    ours = CEncoder(90, 0).encode_arrays(images, stream)
    theirs = GpuJpegEncoder(90, 0).encode([images[0], images[1][..., 0], images[2]], stream)
    assert all(ours) and all(theirs)
    for a, b in zip(ours, theirs, strict=True):
        pa = cv2.imdecode(np.frombuffer(a, np.uint8), cv2.IMREAD_UNCHANGED)
        pb = cv2.imdecode(np.frombuffer(b, np.uint8), cv2.IMREAD_UNCHANGED)
        assert pa.shape == pb.shape
        assert np.abs(pa.astype(int) - pb).mean() < 1.0
