"""imgops._C_stable, the stable-ABI prototype of rgb_to_gray (issue 13; csrc/stable/).

Built only with IMGOPS_STABLE_PROTOTYPE=1; every test is skipped where it was not built. The
tests use only imgops._C_stable and the pure-torch oracle (imgops.reference), never imgops._C,
so they also run under a torch other than the one the binary was built with (docs/INSTALL.md).
"""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from imgops.reference import rgb_to_gray_reference

stable = pytest.importorskip(
    "imgops._C_stable", reason="the stable-ABI prototype was not built (IMGOPS_STABLE_PROTOTYPE=1)"
)

DTYPES = [torch.uint8, torch.uint16, torch.float32, torch.float16, torch.bfloat16, torch.float64]


@torch.library.register_fake("imgops_stable::rgb_to_gray")
def _rgb_to_gray_fake(image, channel_order="rgb"):
    return image.new_empty(image.shape[:-1])


def _config() -> dict:
    return json.loads(torch.ops.imgops_stable._build_config())


def _random_image(shape, dtype, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        image = torch.rand(shape, generator=gen, dtype=torch.float64).to(dtype)
    else:
        top = 256 if dtype == torch.uint8 else 65536
        image = torch.randint(0, top, shape, generator=gen, dtype=torch.int64).to(dtype)
    return image.to(device)


def _gray(image, order="rgb"):
    return torch.ops.imgops_stable.rgb_to_gray(image, order)


def test_build_config_names_the_build_torch_and_the_target():
    config = _config()
    assert config["target"] == "2.10"
    assert isinstance(config["cuda_kernels"], bool)
    assert torch.__version__.split("+")[0].count(".") == 2 and config["torch"].count(".") == 2


def test_module_is_built_for_the_limited_api():
    assert stable.__file__.endswith(".abi3.so")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("order", ["rgb", "bgr"])
def test_matches_the_reference_bit_for_bit(dtype, order):
    image = _random_image((3, 67, 129, 3), dtype, seed=DTYPES.index(dtype))
    assert torch.equal(_gray(image, order), rgb_to_gray_reference(image, order))


@given(
    st.integers(1, 40),
    st.integers(1, 40),
    st.sampled_from([torch.uint8, torch.uint16]),
    st.integers(0, 2**31),
)
def test_exact_integer_luma_on_random_images(height, width, dtype, seed):
    image = _random_image((height, width, 3), dtype, seed=seed)
    wide = image.to(torch.int64)
    expected = (299 * wide[..., 0] + 587 * wide[..., 1] + 114 * wide[..., 2] + 500) // 1000
    assert torch.equal(_gray(image).to(torch.int64), expected)


def test_extremes_and_non_contiguous_views():
    white = torch.full((2, 2, 3), 65535, dtype=torch.int64).to(torch.uint16)
    assert torch.equal(_gray(white), torch.full((2, 2), 65535, dtype=torch.int64).to(torch.uint16))
    assert _gray(torch.tensor([[[255, 0, 0]]], dtype=torch.uint8)).item() == 76
    image = _random_image((20, 30, 3), torch.uint8).transpose(0, 1)
    assert not image.is_contiguous()
    assert torch.equal(_gray(image), rgb_to_gray_reference(image))


@pytest.mark.parametrize("shape", [(0, 5, 3), (4, 0, 3), (1, 1, 3), (2, 0, 7, 3)])
def test_empty_and_single_pixel(shape):
    image = _random_image(shape, torch.uint8)
    out = _gray(image)
    assert out.shape == shape[:-1] and out.dtype == torch.uint8
    assert torch.equal(out, rgb_to_gray_reference(image))


# The stable API has no TORCH_CHECK_VALUE/TYPE: every error is a RuntimeError (imgops._C raises
# ValueError and TypeError); the wording is the same as imgops._C's.
@pytest.mark.parametrize(
    ("make", "order", "message"),
    [
        (lambda: torch.zeros(4, 4, 4, dtype=torch.uint8), "rgb", r"\(\.\.\., H, W, 3\)"),
        (lambda: torch.zeros(4, 3, dtype=torch.uint8), "rgb", r"got shape \(4, 3\)"),
        (lambda: torch.zeros(4, 4, 3, dtype=torch.int32), "rgb", "got Int"),
        (lambda: torch.zeros(4, 4, 3, dtype=torch.uint8), "rbg", 'got "rbg"'),
    ],
)
def test_bad_arguments_raise_runtime_error_with_the_same_words(make, order, message):
    with pytest.raises(RuntimeError, match=message):
        _gray(make(), order)


def test_python_side_fake_kernel_and_opcheck_work_unchanged():
    """Fakes, autograd and opcheck are Python-side: a stable-ABI op takes them as before."""
    image = _random_image((5, 6, 3), torch.uint8)
    torch.library.opcheck(torch.ops.imgops_stable.rgb_to_gray.default, (image, "bgr"))
    compiled = torch.compile(lambda x: _gray(x) + 0, fullgraph=True, backend="eager")
    assert torch.equal(compiled(image), rgb_to_gray_reference(image))


def _stable_cuda_ready() -> bool:
    return torch.cuda.is_available() and _config()["cuda_kernels"]


@pytest.mark.cuda
@pytest.mark.skipif(not _stable_cuda_ready(), reason="no GPU or no stable CUDA kernels")
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_matches_cpu_on_the_current_stream(dtype):
    image = _random_image((2, 301, 257, 3), dtype, seed=7)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        out = _gray(image.to("cuda", non_blocking=False), "bgr")
    side.synchronize()
    assert out.device.type == "cuda"
    assert torch.equal(out.cpu(), _gray(image, "bgr"))


@pytest.mark.cuda
@pytest.mark.skipif(
    not _stable_cuda_ready() or torch.cuda.device_count() < 2, reason="needs two GPUs"
)
def test_cuda_second_device_uses_its_own_guard():
    image = _random_image((64, 64, 3), torch.uint8).to("cuda:1")
    assert torch.equal(_gray(image).cpu(), rgb_to_gray_reference(image.cpu()))
