"""png_filter against the PNG specification (numpy) and imgops._cli_kernels, on CPU and CUDA."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from imgops import ops
from imgops.reference import png_filter_reference

FILTERS = (-1, 0, 1, 2, 3, 4)


def _cli_kernels():
    try:
        from imgops import _cli_kernels
    except ImportError:
        pytest.skip("imgops._cli_kernels is not built")
    return _cli_kernels


def _cli_filter(image: np.ndarray, filter: int) -> np.ndarray:
    """The torch-free encoder's bytes for the same image and filter code."""
    kernels = _cli_kernels()
    height = image.shape[0]
    data = np.ascontiguousarray(image.astype(image.dtype.newbyteorder(">"), copy=False))
    rows = data.view(np.uint8).reshape(height, -1)
    row_bytes = rows.shape[1]
    padded = np.zeros((height + 1, row_bytes), np.uint8)
    padded[1:] = rows
    out = np.empty((height, 1 + row_bytes), np.uint8)
    bpp = (image.shape[2] if image.ndim == 3 else 1) * image.dtype.itemsize
    try:
        kernels.png_filter_rows(padded, out, height, row_bytes, bpp, filter)
    except ValueError as error:
        pytest.skip(f"_cli_kernels.png_filter_rows: {error}")
    return out


def _random_image(shape, dtype, rng) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(0, info.max + 1, size=shape, dtype=dtype)


def _smooth_image(shape, dtype, rng) -> np.ndarray:
    """A gradient with a little noise: the adaptive choice differs between rows."""
    h, w = shape[:2]
    base = np.add.outer(np.arange(h) * 3, np.arange(w) * 2).astype(np.int64)
    if len(shape) == 3:
        base = base[:, :, None] + np.arange(shape[2]) * 17
    noise = rng.integers(0, 4, size=base.shape)
    top = np.iinfo(dtype).max + 1
    return ((base * (257 if dtype == np.uint16 else 1) + noise) % top).astype(dtype)


SHAPES = [(1, 1), (3, 5), (7, 63, 1), (5, 16, 4), (9, 33, 3), (6, 64), (4, 100, 2), (17, 255, 3)]


@pytest.mark.parametrize("filter", FILTERS)
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
def test_equals_the_specification(device, filter, dtype):
    rng = np.random.default_rng(filter + 10)
    for shape in SHAPES:
        for make in (_random_image, _smooth_image):
            image = make(shape, dtype, rng)
            got = ops.png_filter(torch.from_numpy(image).to(device), filter).cpu().numpy()
            np.testing.assert_array_equal(got, png_filter_reference(image, filter), str(shape))


@pytest.mark.parametrize("filter", FILTERS)
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
def test_equals_cli_kernels(device, filter, dtype):
    rng = np.random.default_rng(filter + 20)
    for shape in SHAPES:
        image = _smooth_image(shape, dtype, rng)
        got = ops.png_filter(torch.from_numpy(image).to(device), filter).cpu().numpy()
        np.testing.assert_array_equal(got, _cli_filter(image, filter), str(shape))


def _spec_filter_row(code: int, cur: list[int], up: list[int], bpp: int) -> list[int]:
    """One row, byte by byte, as the PNG specification's section 9 writes it."""
    out = []
    for i, x in enumerate(cur):
        a = cur[i - bpp] if i >= bpp else 0
        b = up[i]
        c = up[i - bpp] if i >= bpp else 0
        if code == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
        else:
            pred = (0, a, b, (a + b) // 2)[code]
        out.append((x - pred) % 256)
    return out


@pytest.mark.parametrize("filter", [0, 1, 2, 3, 4])
def test_reference_equals_a_byte_by_byte_reading_of_the_spec(filter):
    rng = np.random.default_rng(filter)
    for shape, dtype in (((4, 5, 3), np.uint8), ((3, 4, 2), np.uint16), ((5, 9), np.uint8)):
        image = _random_image(shape, dtype, rng)
        rows = image.astype(image.dtype.newbyteorder(">")).view(np.uint8).reshape(shape[0], -1)
        bpp = (shape[2] if len(shape) == 3 else 1) * image.dtype.itemsize
        up = [0] * rows.shape[1]
        want = []
        for row in rows.tolist():
            want.append([filter, *_spec_filter_row(filter, row, up, bpp)])
            up = row
        np.testing.assert_array_equal(png_filter_reference(image, filter), np.array(want))


def test_reference_adaptive_picks_by_score_with_ties_to_the_earlier_filter():
    flat = np.full((2, 8), 7, np.uint8)  # row 0: Up = 7s, Sub = 7 then 0s; row 1: Up = 0s
    out = png_filter_reference(flat, -1)
    assert out[0, 0] == 1 and out[1, 0] == 2
    zeros = np.zeros((1, 80), np.uint8)  # every score 0: the first candidate, Sub
    assert png_filter_reference(zeros, -1)[0, 0] == 1


def test_known_bytes():
    image = torch.tensor([[1, 3, 6], [2, 2, 2]], dtype=torch.uint8)
    assert ops.png_filter(image, 1).tolist() == [[1, 1, 2, 3], [1, 2, 0, 0]]
    assert ops.png_filter(image, 2).tolist() == [[2, 1, 3, 6], [2, 1, 255, 252]]
    assert ops.png_filter(image, 3).tolist() == [[3, 1, 3, 5], [3, 2, 0, 254]]
    wide = torch.tensor([[0x0102, 0xFFFE]], dtype=torch.uint16)  # big-endian bytes
    assert ops.png_filter(wide, 0).tolist() == [[0, 1, 2, 255, 254]]


def test_real_images(samples, device):
    cv2 = pytest.importorskip("cv2")
    paths = sorted(samples.glob("*.png")) + sorted(samples.glob("*.jpg"))
    assert paths
    for path in paths[:4]:
        image = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
        for filter in (-1, 1, 3):
            got = ops.png_filter(torch.from_numpy(image).to(device), filter).cpu().numpy()
            np.testing.assert_array_equal(got, png_filter_reference(image, filter), path.name)


@given(
    st.sampled_from([np.uint8, np.uint16]).flatmap(
        lambda dtype: hnp.arrays(
            dtype,
            st.tuples(st.integers(1, 9), st.integers(1, 70), st.integers(0, 4)).map(
                lambda s: s[:2] if s[2] == 0 else s
            ),
        )
    ),
    st.sampled_from([-1, 0, 1, 2, 3]),
    st.booleans(),
)
def test_random_images_and_views(image, filter, strided):
    tensor = torch.from_numpy(image)
    if strided and tensor.shape[1] > 1:
        tensor, image = tensor[:, ::2], image[:, ::2]
    got = ops.png_filter(tensor, filter).numpy()
    np.testing.assert_array_equal(got, png_filter_reference(image, filter))


@pytest.mark.parametrize(
    ("image", "filter", "error", "message"),
    [
        (torch.zeros(4, dtype=torch.uint8), 0, ValueError, "shape"),
        (torch.zeros((2, 2, 5), dtype=torch.uint8), 0, ValueError, "C in 1..4"),
        (torch.zeros((2, 0), dtype=torch.uint8), 0, ValueError, "at least one pixel"),
        (torch.zeros((2, 2), dtype=torch.float32), 0, TypeError, "uint8 or uint16"),
        (torch.zeros((2, 2), dtype=torch.uint8), 5, ValueError, "filter must be"),
        (torch.zeros((2, 2), dtype=torch.uint8), -2, ValueError, "filter must be"),
    ],
)
def test_bad_arguments(image, filter, error, message):
    with pytest.raises(error, match=message):
        ops.png_filter(image, filter)


def test_empty_image_has_no_rows(device):
    out = ops.png_filter(torch.zeros((0, 5, 3), dtype=torch.uint16, device=device), -1)
    assert out.shape == (0, 31) and out.dtype == torch.uint8


def test_opcheck(device):
    image = torch.randint(0, 65536, (9, 40, 3), dtype=torch.int32).to(torch.uint16).to(device)
    for filter in (-1, 0, 2):
        torch.library.opcheck(torch.ops.imgops.png_filter.default, (image, filter))


def test_torch_compile_fullgraph(device):
    image = torch.randint(0, 256, (12, 70, 3), dtype=torch.uint8, device=device)
    compiled = torch.compile(lambda x: ops.png_filter(x, -1), fullgraph=True, backend="eager")
    assert torch.equal(compiled(image), ops.png_filter(image, -1))


@pytest.mark.cuda
@pytest.mark.parametrize("filter", FILTERS)
def test_cuda_equals_cpu_on_large_images(filter):
    rng = np.random.default_rng(5)
    for shape, dtype in (((2160, 3840), np.uint8), ((513, 1001, 3), np.uint16)):
        image = torch.from_numpy(_smooth_image(shape, dtype, rng))
        want = ops.png_filter(image, filter)
        assert torch.equal(ops.png_filter(image.cuda(), filter).cpu(), want)


@pytest.mark.cuda
def test_cuda_paeth_equals_the_specification_on_a_photo(samples):
    cv2 = pytest.importorskip("cv2")
    path = sorted(samples.glob("*.jpg"))[0]
    image = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    got = ops.png_filter(torch.from_numpy(image).cuda(), 4).cpu().numpy()
    np.testing.assert_array_equal(got, png_filter_reference(image, 4))


@pytest.mark.cuda
def test_cuda_more_than_2_pow_31_output_bytes():
    height, width = (1 << 31) // 4000 + 7, 4000
    image = torch.randint(0, 256, (height, width), dtype=torch.uint8, device="cuda")
    out = ops.png_filter(image, -1)
    for start in (0, height // 2, height - 64):
        above = max(start - 1, 0)  # the reference filters the row above too, then drops it
        want = png_filter_reference(image[above : start + 64].cpu().numpy(), -1)[start - above :]
        np.testing.assert_array_equal(out[start : start + 64].cpu().numpy(), want)
