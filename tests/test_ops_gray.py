"""rgb_to_gray against independent references: the integer formula, OpenCV, Pillow, torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import imgops
from imgops.reference import rgb_to_gray_reference

FLOAT_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
ALL_DTYPES = [torch.uint8, torch.uint16, *FLOAT_DTYPES]


def bt601_numpy(rgb: np.ndarray) -> np.ndarray:
    """The exact integer BT.601 formula in numpy int64, independent of torch and the kernels."""
    wide = rgb.astype(np.int64)
    return (299 * wide[..., 0] + 587 * wide[..., 1] + 114 * wide[..., 2] + 500) // 1000


def random_image(shape, dtype, device="cpu", generator=None) -> torch.Tensor:
    """Fresh random pixels over the dtype's whole range (floats in [0, 1))."""
    if dtype == torch.uint8:
        return torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator).to(device)
    if dtype == torch.uint16:
        wide = torch.randint(0, 65536, shape, dtype=torch.int32, generator=generator)
        return wide.to(torch.uint16).to(device)
    return torch.rand(shape, dtype=torch.float32, generator=generator).to(dtype).to(device)


def test_every_uint8_triple_matches_the_formula(device):
    values = torch.arange(1 << 24, dtype=torch.int32)
    rgb = torch.stack([(values >> 16) & 255, (values >> 8) & 255, values & 255], dim=-1)
    rgb = rgb.to(torch.uint8).reshape(4096, 4096, 3)
    expected = bt601_numpy(rgb.numpy())
    out = imgops.rgb_to_gray(rgb.to(device)).cpu().numpy()
    np.testing.assert_array_equal(out, expected)
    out_bgr = imgops.rgb_to_gray(rgb.flip(-1).contiguous().to(device), "bgr").cpu().numpy()
    np.testing.assert_array_equal(out_bgr, expected)


def test_uint16_extremes_and_random_match_the_formula(device):
    edges = torch.tensor([0, 1, 499, 500, 32767, 32768, 65534, 65535], dtype=torch.int32)
    grid = torch.cartesian_prod(edges, edges, edges).to(torch.uint16).reshape(1, -1, 3)
    rand = random_image((333, 517, 3), torch.uint16)
    for image in (grid, rand):
        out = imgops.rgb_to_gray(image.to(device)).cpu()
        assert out.dtype == torch.uint16
        np.testing.assert_array_equal(out.numpy().astype(np.int64), bt601_numpy(image.numpy()))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("order", ["rgb", "bgr"])
def test_floats_equal_the_torch_reference_bit_for_bit(device, dtype, order):
    image = random_image((3, 67, 45, 3), dtype)
    out = imgops.rgb_to_gray(image.to(device), order).cpu()
    assert out.dtype == dtype and out.shape == (3, 67, 45)
    torch.testing.assert_close(out, rgb_to_gray_reference(image, order), rtol=0, atol=0)


def test_float32_within_rounding_of_numpy_float64():
    image = random_image((128, 96, 3), torch.float32)
    expected = image.double().numpy() @ np.array([0.299, 0.587, 0.114])
    out = imgops.rgb_to_gray(image).double().numpy()
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    "name", ["rocket_baseline_rgb.jpg", "flower_progressive_3mp.jpg", "coffee_rgb.png"]
)
def test_real_photos_match_formula_and_are_within_one_of_opencv_and_pillow(samples, name, device):
    cv2 = pytest.importorskip("cv2")
    from PIL import Image

    bgr = cv2.imread(str(samples / name), cv2.IMREAD_COLOR)
    out = imgops.rgb_to_gray(torch.from_numpy(bgr).to(device), "bgr").cpu().numpy()
    np.testing.assert_array_equal(out, bt601_numpy(bgr[..., ::-1]))
    opencv = cv2.cvtColor(bgr, cv2.COLOR_BGR2GRAY)
    assert np.abs(out.astype(int) - opencv.astype(int)).max() <= 1
    rgb = np.asarray(Image.open(samples / name).convert("RGB"))
    if rgb.shape == out.shape + (3,) and name.endswith(".png"):  # same pixels only for lossless
        pillow = np.asarray(Image.fromarray(rgb).convert("L"))
        assert np.abs(out.astype(int) - pillow.astype(int)).max() <= 1


def test_sixteen_bit_photo_matches_formula(samples, device):
    cv2 = pytest.importorskip("cv2")
    bgr = cv2.imread(str(samples / "room_rgb16.png"), cv2.IMREAD_UNCHANGED)
    assert bgr.dtype == np.uint16
    out = imgops.rgb_to_gray(torch.from_numpy(bgr).to(device), "bgr").cpu().numpy()
    np.testing.assert_array_equal(out.astype(np.int64), bt601_numpy(bgr[..., ::-1]))


@st.composite
def strided_images(draw):
    """Random shapes, batch dims, dtypes and non-contiguous views (crops, steps, transposes)."""
    dtype = draw(st.sampled_from(ALL_DTYPES))
    batch = draw(st.lists(st.integers(1, 3), min_size=0, max_size=2))
    h, w = draw(st.integers(1, 40)), draw(st.integers(1, 40))
    seed = draw(st.integers(0, 2**31 - 1))
    base = random_image(
        (*batch, h + 3, w + 5, 3), dtype, generator=torch.Generator().manual_seed(seed)
    )
    view = draw(st.sampled_from(["contiguous", "crop", "step", "transpose", "offset"]))
    if view == "crop":
        base = base[..., 1 : h + 1, 2 : w + 2, :]
    elif view == "step":
        base = base[..., ::2, ::3, :]
    elif view == "transpose":
        base = base.transpose(-3, -2)
    elif view == "offset":  # contiguous memory that starts at an odd element
        flat = base.reshape(-1)[1 : 1 + 3 * h * w]
        base = flat.reshape(h, w, 3)
    return base, draw(st.sampled_from(["rgb", "bgr"]))


@given(strided_images())
def test_strided_views_random_shapes_and_dtypes(case):
    image, order = case
    out = imgops.rgb_to_gray(image, order)
    torch.testing.assert_close(out, rgb_to_gray_reference(image, order), rtol=0, atol=0)


@pytest.mark.parametrize("shape", [(0, 5, 3), (4, 0, 3), (2, 0, 7, 3), (1, 1, 3)])
def test_empty_and_single_pixel(device, shape):
    image = random_image(shape, torch.uint8).to(device)
    out = imgops.rgb_to_gray(image)
    assert out.shape == shape[:-1] and out.device.type == device
    torch.testing.assert_close(out.cpu(), rgb_to_gray_reference(image.cpu()), rtol=0, atol=0)


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: torch.zeros(4, 4, 4, dtype=torch.uint8), ValueError, r"\(\.\.\., H, W, 3\)"),
        (lambda: torch.zeros(4, 3, dtype=torch.uint8), ValueError, r"got shape \(4, 3\)"),
        (lambda: torch.zeros(4, 4, 3, dtype=torch.int32), TypeError, "got Int"),
        (lambda: np.zeros((4, 4, 3), np.uint8), TypeError, "torch.Tensor"),
    ],
)
def test_bad_input_raises_a_clear_error(make, error, message):
    with pytest.raises(error, match=message):
        imgops.rgb_to_gray(make())


def test_bad_channel_order():
    with pytest.raises(ValueError, match='"rgb" or "bgr"'):
        imgops.rgb_to_gray(torch.zeros(2, 2, 3, dtype=torch.uint8), "grb")


def test_gradcheck_float64(device):
    image = torch.rand(2, 5, 4, 3, dtype=torch.float64, device=device, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: imgops.rgb_to_gray(x), (image,))
    assert torch.autograd.gradcheck(lambda x: imgops.rgb_to_gray(x, "bgr"), (image,))
    assert torch.autograd.gradgradcheck(lambda x: imgops.rgb_to_gray(x), (image,))


def test_gradient_float32_matches_reference():
    image = torch.rand(6, 7, 3, requires_grad=True)
    grad = torch.rand(6, 7)
    (ours,) = torch.autograd.grad(imgops.rgb_to_gray(image, "bgr"), image, grad)
    (ref,) = torch.autograd.grad(rgb_to_gray_reference(image, "bgr"), image, grad)
    torch.testing.assert_close(ours, ref)


def sample_inputs(device: str):
    yield (random_image((5, 7, 3), torch.uint8, device),), {}
    yield (random_image((2, 5, 7, 3), torch.uint16, device), "bgr"), {}
    yield (torch.rand(3, 4, 3, device=device, requires_grad=True),), {}
    yield (torch.rand(3, 4, 3, device=device, dtype=torch.float64, requires_grad=True), "bgr"), {}


def test_opcheck(device):
    for args, kwargs in sample_inputs(device):
        torch.library.opcheck(torch.ops.imgops.rgb_to_gray.default, args, kwargs)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph(device, backend):
    def pipeline(x: torch.Tensor) -> torch.Tensor:
        return imgops.rgb_to_gray(x, "bgr").float() / 255.0

    torch._dynamo.reset()
    compiled = torch.compile(pipeline, fullgraph=True, backend=backend)
    image = random_image((2, 31, 17, 3), torch.uint8, device)
    torch.testing.assert_close(compiled(image), pipeline(image), rtol=0, atol=0)


@pytest.mark.cuda
def test_cpu_and_cuda_agree_bit_for_bit_on_random_data():
    for dtype in ALL_DTYPES:
        image = random_image((3, 257, 129, 3), dtype)
        cpu = imgops.rgb_to_gray(image)
        gpu = imgops.rgb_to_gray(image.cuda()).cpu()
        assert torch.equal(cpu, gpu), dtype


@pytest.mark.cuda
def test_cuda_unaligned_views_and_odd_widths():
    base = random_image((1, 8 + 3 * 1001 * 7), torch.uint8, "cuda").reshape(-1)
    for start in (1, 2, 3, 5):
        flat = base[start : start + 3 * 1001 * 7]
        image = flat.reshape(1001, 7, 3)
        expected = rgb_to_gray_reference(image.cpu())
        torch.testing.assert_close(imgops.rgb_to_gray(image).cpu(), expected, rtol=0, atol=0)


@pytest.mark.cuda
def test_cuda_runs_on_the_current_stream_and_device():
    image = random_image((64, 64, 3), torch.uint8, "cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        out = imgops.rgb_to_gray(image)
    stream.synchronize()
    torch.testing.assert_close(out.cpu(), rgb_to_gray_reference(image.cpu()), rtol=0, atol=0)


@pytest.mark.cuda
@pytest.mark.slow
def test_cuda_more_than_2_pow_31_elements():
    pixels = (1 << 31) // 3 + 4099  # the input has more than 2^31 elements
    image = torch.randint(0, 256, (pixels, 3), dtype=torch.uint8, device="cuda").reshape(
        1, pixels, 3
    )
    assert image.numel() > 2**31
    out = imgops.rgb_to_gray(image)
    for sl in (slice(0, 1 << 20), slice(pixels - (1 << 20), pixels), slice(715827000, 715828000)):
        part = image[:, sl].cpu()
        torch.testing.assert_close(out[:, sl].cpu(), rgb_to_gray_reference(part), rtol=0, atol=0)
