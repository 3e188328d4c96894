"""value_histogram against numpy.bincount, on CPU and CUDA."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import imgops


def numpy_counts(values: np.ndarray) -> np.ndarray:
    if values.dtype == np.uint8:
        return np.bincount(values.ravel(), minlength=256)
    offset = 32768 if values.dtype == np.int16 else 0
    return np.bincount(values.ravel().astype(np.int64) + offset, minlength=65536)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.uint16, torch.int16])
def test_random_data_equals_bincount(device, dtype):
    info = torch.iinfo(dtype)
    values = torch.randint(info.min, info.max + 1, (300_001,), dtype=torch.int32).to(dtype)
    counts = imgops.value_histogram(values.to(device)).cpu().numpy()
    np.testing.assert_array_equal(counts, numpy_counts(values.numpy()))


def test_real_scans_equal_bincount(samples, device):
    tifffile = pytest.importorskip("tifffile")
    for path in sorted(samples.glob("mri_*.tif")):
        data = tifffile.imread(path)
        counts = imgops.value_histogram(torch.from_numpy(data).to(device)).cpu().numpy()
        np.testing.assert_array_equal(counts, numpy_counts(data))


def test_skewed_data_with_one_value_dominating(device):
    values = torch.zeros(1_000_003, dtype=torch.uint16)
    values[::97] = 4095
    counts = imgops.value_histogram(values.to(device)).cpu()
    assert counts[0] == 1_000_003 - values[::97].numel() and counts[4095] == values[::97].numel()
    assert counts.sum() == values.numel()


@given(
    st.lists(st.integers(0, 65535), min_size=0, max_size=2000),
    st.booleans(),
)
def test_random_lists_and_views(values, strided):
    tensor = torch.tensor(values, dtype=torch.int32).to(torch.uint16)
    if strided:
        tensor = tensor[::2]
    counts = imgops.value_histogram(tensor).numpy()
    np.testing.assert_array_equal(counts, numpy_counts(tensor.numpy()))


def test_rejects_other_dtypes():
    with pytest.raises(TypeError, match="uint8, uint16 or int16"):
        imgops.value_histogram(torch.zeros(3))


def test_opcheck(device):
    values = torch.randint(0, 65536, (1000,), dtype=torch.int32).to(torch.uint16).to(device)
    torch.library.opcheck(torch.ops.imgops.value_histogram.default, (values,))


@pytest.mark.cuda
def test_cpu_and_cuda_agree_on_a_large_input():
    values = torch.randint(0, 65536, (64 * 1024 * 1024 + 5,), dtype=torch.int32).to(torch.uint16)
    assert torch.equal(imgops.value_histogram(values), imgops.value_histogram(values.cuda()).cpu())
