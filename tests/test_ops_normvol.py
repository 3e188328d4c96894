"""normalize_volume against the torch reference (bit for bit) and numpy float64 (1 ulp)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import imgops
from imgops.reference import normalize_volume_reference

IN_DTYPES = [torch.uint8, torch.uint16, torch.int16, torch.float32, torch.float64]
OUT_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


def random_volume(shape, dtype, generator=None) -> torch.Tensor:
    """Fresh random values over the dtype's range (floats spread over [-1000, 5000))."""
    if dtype == torch.uint8:
        return torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator)
    if dtype == torch.uint16:
        return torch.randint(0, 65536, shape, dtype=torch.int32, generator=generator).to(dtype)
    if dtype == torch.int16:
        return torch.randint(-32768, 32768, shape, dtype=torch.int32, generator=generator).to(dtype)
    return (torch.rand(shape, dtype=torch.float64, generator=generator) * 6000 - 1000).to(dtype)


@pytest.mark.parametrize("in_dtype", IN_DTYPES)
@pytest.mark.parametrize("out_dtype", OUT_DTYPES)
@pytest.mark.parametrize("clip", [False, True])
def test_equals_reference_bit_for_bit(device, in_dtype, out_dtype, clip):
    volume = random_volume((5, 33, 47), in_dtype)
    out = imgops.normalize_volume(
        volume.to(device), max=4095, min=100, dtype=out_dtype, clip=clip
    ).cpu()
    assert out.dtype == out_dtype and out.shape == volume.shape
    expected = normalize_volume_reference(volume, 4095, 100, dtype=out_dtype, clip=clip)
    torch.testing.assert_close(out, expected, rtol=0, atol=0, equal_nan=True)
    if clip:
        assert out.min() >= 0 and out.max() <= 1


def test_within_one_ulp_of_numpy_float64(samples):
    tifffile = pytest.importorskip("tifffile")
    for name in ("mri_dwi_b0_u16.tif", "mri_fmri_imagej.tif", "mri_anat_shift610_zlib.tif"):
        data = tifffile.imread(samples / name)
        assert data.dtype == np.uint16
        out = imgops.normalize_volume(torch.from_numpy(data), max=4095).numpy()
        exact = (data.astype(np.float64) - 0.0) / 4095.0
        ulp = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
        assert np.all(np.abs(out.astype(np.float64) - exact) <= ulp), name


def test_known_values():
    volume = torch.tensor([0, 1, 2048, 4095, 65535], dtype=torch.uint16)
    out = imgops.normalize_volume(volume, max=4095)
    assert out[0] == 0 and out[3] == 1 and out[4] > 1
    assert imgops.normalize_volume(volume, max=4095, clip=True)[4] == 1
    out = imgops.normalize_volume(torch.tensor([-5, 5], dtype=torch.int16), max=5, min=-5)
    assert out.tolist() == [0.0, 1.0]


def test_nan_and_inf_in_float_input_propagate():
    volume = torch.tensor([float("nan"), float("inf"), -float("inf"), 2.0])
    out = imgops.normalize_volume(volume, max=4.0, clip=False)
    assert torch.isnan(out[0]) and out[1] == float("inf") and out[2] == -float("inf")
    clipped = imgops.normalize_volume(volume, max=4.0, clip=True)
    assert torch.isnan(clipped[0]) and clipped[1] == 1 and clipped[2] == 0


@st.composite
def strided_volumes(draw):
    dtype = draw(st.sampled_from(IN_DTYPES))
    shape = draw(st.lists(st.integers(0, 9), min_size=0, max_size=4))
    seed = draw(st.integers(0, 2**31 - 1))
    volume = random_volume(tuple(s + 2 for s in shape), dtype, torch.Generator().manual_seed(seed))
    if volume.dim() >= 2 and draw(st.booleans()):
        volume = volume.transpose(0, -1)
    if volume.dim() >= 1 and draw(st.booleans()):
        volume = volume[1::2]
    lo = draw(st.floats(-1000, 1000, allow_nan=False))
    span = draw(st.floats(1e-3, 1e5, allow_nan=False))
    return volume, lo + span, lo, draw(st.sampled_from(OUT_DTYPES)), draw(st.booleans())


@given(strided_volumes())
def test_random_shapes_strides_dtypes_and_ranges(case):
    volume, high, low, dtype, clip = case
    out = imgops.normalize_volume(volume, max=high, min=low, dtype=dtype, clip=clip)
    expected = normalize_volume_reference(volume, high, low, dtype=dtype, clip=clip)
    torch.testing.assert_close(out, expected, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (1, 1, 1)])
def test_empty_scalar_and_single_voxel(device, shape):
    volume = random_volume(shape, torch.uint16).to(device)
    out = imgops.normalize_volume(volume, max=100)
    assert out.shape == volume.shape
    torch.testing.assert_close(out.cpu(), normalize_volume_reference(volume.cpu(), 100))


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"max": 0.0}, ValueError, "greater than min, got max=0 min=0"),
        ({"max": 5.0, "min": 5.0}, ValueError, "greater than min"),
        ({"max": 1.5, "min": 2.25}, ValueError, "got max=1.5 min=2.25"),
        ({"max": float("nan")}, ValueError, "finite"),
        ({"max": float("inf")}, ValueError, "finite"),
        ({"max": 1.0, "dtype": torch.int32}, TypeError, "dtype must be"),
    ],
)
def test_bad_arguments_raise_clear_errors(kwargs, error, message):
    with pytest.raises(error, match=message):
        imgops.normalize_volume(torch.zeros(3, dtype=torch.uint16), **kwargs)


def test_bounds_are_keyword_only():
    volume = torch.zeros(3, dtype=torch.uint16)
    with pytest.raises(TypeError):
        imgops.normalize_volume(volume, 4095, 100)
    assert imgops.normalize_volume(volume, max=4095, dtype=None).dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.int32, torch.complex64, torch.bool, torch.int64])
def test_unsupported_input_dtypes(dtype):
    with pytest.raises(TypeError, match="expected dtype uint8, uint16, int16"):
        imgops.normalize_volume(torch.zeros(3, dtype=dtype), max=1.0)


def test_gradcheck_float64(device):
    volume = torch.randn(3, 4, 5, dtype=torch.float64, device=device, requires_grad=True)
    fn = lambda x: imgops.normalize_volume(x, max=2.5, min=-1.5, dtype=torch.float64)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (volume,))

    def clipped(x):
        return imgops.normalize_volume(x, max=0.5, min=-0.5, dtype=torch.float64, clip=True)

    assert torch.autograd.gradcheck(clipped, (volume,))


def test_float32_gradient_matches_reference():
    volume = torch.randn(50, requires_grad=True)
    grad = torch.randn(50)
    for clip in (False, True):
        (ours,) = torch.autograd.grad(
            imgops.normalize_volume(volume, max=1.0, min=-1.0, clip=clip), volume, grad
        )
        ref_out = normalize_volume_reference(volume, 1.0, -1.0, clip=clip)
        (ref,) = torch.autograd.grad(ref_out, volume, grad)
        torch.testing.assert_close(ours, ref)


def test_opcheck(device):
    cases = [
        ((random_volume((4, 6), torch.uint16).to(device), 4095.0), {}),
        ((random_volume((4, 6), torch.int16).to(device), 100.0, -100.0), {"clip": True}),
        ((torch.randn(5, device=device, requires_grad=True), 1.0), {"dtype": torch.float16}),
        (
            (torch.randn(5, device=device, dtype=torch.float64, requires_grad=True), 1.0),
            {"dtype": torch.float64},
        ),
    ]
    for args, kwargs in cases:
        torch.library.opcheck(torch.ops.imgops.normalize_volume.default, args, kwargs)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph(device, backend):
    def pipeline(x: torch.Tensor) -> torch.Tensor:
        return imgops.normalize_volume(x, max=4095.0, clip=True).mean(dim=0)

    torch._dynamo.reset()
    compiled = torch.compile(pipeline, fullgraph=True, backend=backend)
    volume = random_volume((4, 16, 16), torch.uint16).to(device)
    torch.testing.assert_close(compiled(volume), pipeline(volume))


@pytest.mark.cuda
def test_cpu_and_cuda_agree_bit_for_bit():
    for in_dtype in IN_DTYPES:
        for out_dtype in OUT_DTYPES:
            volume = random_volume((7, 129, 65), in_dtype)
            cpu = imgops.normalize_volume(volume, max=3000, min=-20, dtype=out_dtype)
            gpu = imgops.normalize_volume(volume.cuda(), max=3000, min=-20, dtype=out_dtype).cpu()
            assert torch.equal(cpu, gpu), (in_dtype, out_dtype)


@pytest.mark.cuda
def test_cuda_unaligned_views():
    base = random_volume((4099,), torch.uint16).cuda()
    for start in (1, 3, 7):
        view = base[start:]
        expected = normalize_volume_reference(view.cpu(), 4095)
        torch.testing.assert_close(
            imgops.normalize_volume(view, max=4095).cpu(), expected, rtol=0, atol=0
        )


@pytest.mark.cuda
@pytest.mark.slow
def test_cuda_more_than_2_pow_31_elements():
    n = (1 << 31) + 4099
    volume = torch.randint(0, 4096, (n,), dtype=torch.int16, device="cuda")
    out = imgops.normalize_volume(volume, max=4095, dtype=torch.float16)
    for sl in (slice(0, 1 << 20), slice(n - (1 << 20), n)):
        expected = normalize_volume_reference(volume[sl].cpu(), 4095, dtype=torch.float16)
        torch.testing.assert_close(out[sl].cpu(), expected, rtol=0, atol=0)
