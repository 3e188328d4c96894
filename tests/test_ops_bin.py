"""bin against numpy's float64 block mean, on CPU and CUDA: real stacks, random shapes, autograd."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from imgops import ops
from imgops.reference import bin_reference

INT_DTYPES = (np.uint8, np.uint16, np.int16)
FLOAT_DTYPES = (np.float32, np.float64)


def _assert_matches_reference(got: np.ndarray, x: np.ndarray, factors) -> None:
    want = bin_reference(x, tuple(factors))
    if np.issubdtype(x.dtype, np.integer):
        np.testing.assert_array_equal(got, want)
    else:  # the kernels sum in order, numpy pairwise: the float64 sums agree to rounding
        scale = float(np.abs(x).max()) if x.size else 0.0
        atol = 64 * np.finfo(np.float64).eps * scale
        np.testing.assert_allclose(got, want, rtol=2 * np.finfo(x.dtype).eps, atol=atol)


def _stacks(samples):
    tifffile = pytest.importorskip("tifffile")
    paths = sorted(samples.glob("mri_*.tif"))
    assert paths
    for path in paths:
        data = tifffile.imread(path)
        yield path.name, data
        # the same scan as an 8-bit stack (as Fiji's 8-bit conversion scales it)
        yield f"{path.name} 8-bit", (data.astype(np.float64) * 255 / data.max()).astype(np.uint8)


@pytest.mark.parametrize("factors", [(1, 2, 2), (2, 2, 2), (3, 3, 5), (2, 7), (4,), (1, 1, 1)])
def test_real_stacks_equal_numpy_block_mean(samples, device, factors):
    for name, data in _stacks(samples):
        got = ops.bin(torch.from_numpy(data).to(device), factors).cpu().numpy()
        assert got.dtype == data.dtype, name
        np.testing.assert_array_equal(got, bin_reference(data, factors), name)


def test_real_stack_as_float32_and_float64(samples, device):
    for _name, data in _stacks(samples):
        for dtype in FLOAT_DTYPES:
            x = data.astype(dtype) / 7
            got = ops.bin(torch.from_numpy(x).to(device), (2, 3, 3)).cpu().numpy()
            _assert_matches_reference(got, x, (2, 3, 3))


def test_known_values_and_rounding_half_up():
    x = torch.tensor([[1, 2], [3, 5]], dtype=torch.uint8)  # mean 2.75
    assert ops.bin(x, (2, 2)).item() == 3
    assert ops.bin(torch.tensor([1, 2], dtype=torch.uint16), (2,)).item() == 2  # 1.5 -> 2
    assert ops.bin(torch.tensor([-1, -2], dtype=torch.int16), (2,)).item() == -1  # -1.5 -> -1
    assert ops.bin(torch.tensor([-2, -3, -3], dtype=torch.int16), (3,)).item() == -3  # -2.67
    assert ops.bin(torch.tensor([255, 255, 254], dtype=torch.uint8), (3,)).item() == 255
    assert ops.bin(torch.tensor([65535] * 8, dtype=torch.uint16), (8,)).item() == 65535
    assert ops.bin(torch.tensor([1.0, 2.0]), (2,)).item() == 1.5


def test_partial_blocks_are_dropped_and_leading_dims_kept(device):
    x = torch.arange(2 * 5 * 7 * 9, dtype=torch.float64, device=device).reshape(2, 5, 7, 9)
    out = ops.bin(x, (2, 3, 4))
    assert out.shape == (2, 2, 2, 2)
    _assert_matches_reference(out.cpu().numpy(), x.cpu().numpy(), (2, 3, 4))
    assert ops.bin(x, (6, 1, 1)).shape == (2, 0, 7, 9)  # no whole block: an empty result


dtypes = st.sampled_from(INT_DTYPES + FLOAT_DTYPES)


@st.composite
def bin_cases(draw):
    dtype = draw(dtypes)
    ndim = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=ndim, max_size=ndim)))
    k = draw(st.integers(1, min(3, ndim)))
    factors = tuple(draw(st.lists(st.integers(1, 4), min_size=k, max_size=k)))
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        elements = st.integers(int(info.min), int(info.max))
    else:
        elements = st.floats(-1e6, 1e6, width=32)
    x = draw(hnp.arrays(dtype, shape, elements=elements))
    return x, factors, draw(st.booleans())


@given(bin_cases())
def test_random_shapes_dtypes_and_views(case):
    x, factors, transposed = case
    tensor = torch.from_numpy(x)
    if transposed and x.ndim >= 2:  # a non-contiguous view
        tensor, x = tensor.transpose(-1, -2), np.swapaxes(x, -1, -2)
    got = ops.bin(tensor, factors).numpy()
    assert got.shape == bin_reference(x, factors).shape
    _assert_matches_reference(got, x, factors)


@pytest.mark.parametrize(
    ("x", "factors", "error", "message"),
    [
        (torch.zeros(4, 4), (), ValueError, "1 to 3 factors"),
        (torch.zeros(4, 4, 4, 4), (1, 1, 1, 1), ValueError, "1 to 3 factors"),
        (torch.zeros(4), (2, 2), ValueError, "at least as many dimensions"),
        (torch.zeros(4, 4), (0, 2), ValueError, "factors must be >= 1"),
        (torch.zeros(4, 4), (2, -1), ValueError, "factors must be >= 1"),
        (torch.zeros(4, 4, dtype=torch.int32), (2, 2), TypeError, "uint8, uint16, int16"),
        (torch.zeros(4, 4, dtype=torch.float16), (2, 2), TypeError, "uint8, uint16, int16"),
    ],
)
def test_bad_arguments(x, factors, error, message):
    with pytest.raises(error, match=message):
        ops.bin(x, factors)


def test_gradcheck_float64(device):
    x = torch.rand(3, 5, 7, dtype=torch.float64, device=device, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: ops.bin(t, (2, 2, 3)), (x,))
    assert torch.autograd.gradgradcheck(lambda t: ops.bin(t, (1, 2)), (x,))


def test_gradient_is_upsampled_grad_over_block_size():
    x = torch.rand(5, 7, requires_grad=True)
    out = ops.bin(x, (2, 3))
    grad = torch.arange(out.numel(), dtype=torch.float32).reshape(out.shape)
    out.backward(grad)
    want = torch.zeros(5, 7)
    want[:4, :6] = grad.repeat_interleave(2, 0).repeat_interleave(3, 1) / 6
    assert torch.equal(x.grad, want)


def test_opcheck(device):
    for dtype in (torch.uint16, torch.float32):
        x = torch.randint(0, 1000, (3, 9, 10), device=device).to(dtype)
        torch.library.opcheck(torch.ops.imgops.bin.default, (x, [1, 2, 3]))
    x = torch.rand(4, 6, 8, dtype=torch.float64, device=device, requires_grad=True)
    torch.library.opcheck(torch.ops.imgops.bin.default, (x, [2, 2]))


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_torch_compile_fullgraph(device, backend):
    if backend == "inductor" and device == "cpu":
        pytest.importorskip("torch._inductor")
    x = torch.rand(6, 10, 14, dtype=torch.float32, device=device)
    compiled = torch.compile(lambda t: ops.bin(t, (2, 2, 2)) * 2, fullgraph=True, backend=backend)
    assert torch.equal(compiled(x), ops.bin(x, (2, 2, 2)) * 2)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.uint8, torch.uint16, torch.int16, torch.float32])
def test_cuda_equals_cpu_bit_for_bit(dtype):
    x = torch.randint(-1000 if dtype == torch.int16 else 0, 255, (17, 131, 257)).to(dtype)
    for factors in ((1, 2, 2), (3, 5, 7), (2,)):
        assert torch.equal(ops.bin(x.cuda(), factors).cpu(), ops.bin(x, factors))


@pytest.mark.cuda
def test_cuda_more_than_2_pow_31_elements():
    z, y, x = 4, (1 << 29) // 1000 + 3, 1000 + 1  # > 2^31 input, > 2^31 / 4 output
    volume = torch.randint(0, 256, (z, y, x), dtype=torch.uint8, device="cuda")
    out = ops.bin(volume, (1, 2, 1))
    for plane in (0, z - 1):
        for rows in (slice(0, 64), slice(out.shape[1] - 64, out.shape[1])):
            src = volume[plane, rows.start * 2 : rows.stop * 2].cpu()
            assert torch.equal(out[plane, rows].cpu(), ops.bin(src, (2, 1)))
