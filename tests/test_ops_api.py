"""The Python tensor API: dir(imgops), percentiles against numpy, channels-first gray."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import imgops
from imgops import ops

API = {
    "bin",
    "build_info",
    "gray_file",
    "normalize_file",
    "normalize_volume",
    "percentiles",
    "png_filter",
    "rgb_to_gray",
    "value_histogram",
}


def test_dir_lists_the_api():
    assert set(dir(imgops)) >= API
    assert set(imgops.__all__) >= API
    for name in API - {"gray_file", "normalize_file"}:  # those two come from other branches
        assert callable(getattr(imgops, name)), name
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        imgops.nope  # noqa: B018


def test_import_imgops_does_not_import_torch():
    code = "import sys, imgops; dir(imgops); print('torch' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


QS = (0, 0.1, 1, 2.5, 33.3, 50, 99, 99.8, 100)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.int16, np.float32, np.float64])
def test_percentiles_equal_numpy(device, dtype):
    rng = np.random.default_rng(3)
    for n in (1, 2, 7, 1000, 100_003):
        if np.issubdtype(dtype, np.integer):
            info = np.iinfo(dtype)
            data = rng.integers(info.min, info.max, size=n, endpoint=True, dtype=dtype)
        else:
            data = (rng.standard_normal(n) * 1000).astype(dtype)
        got = ops.percentiles(torch.from_numpy(data).to(device), QS)
        want = np.percentile(data, QS)
        assert got == want.tolist(), (n, dtype)


def test_percentiles_of_real_scans(samples):
    tifffile = pytest.importorskip("tifffile")
    for path in sorted(samples.glob("mri_*.tif")):
        data = tifffile.imread(path)
        assert (
            imgops.percentiles(torch.from_numpy(data), (1, 99.8))
            == np.percentile(data, (1, 99.8)).tolist()
        )


@given(
    hnp.arrays(
        st.sampled_from([np.uint8, np.uint16, np.float64]),
        st.integers(1, 300),
    ),
    st.lists(st.floats(0, 100), min_size=1, max_size=5),
)
def test_percentiles_random(data, qs):
    got = ops.percentiles(torch.from_numpy(data), qs)
    want = np.percentile(data, qs)
    np.testing.assert_array_equal(np.array(got), want)


def test_percentiles_nan_and_bad_arguments():
    assert np.isnan(ops.percentiles(torch.tensor([1.0, float("nan")]), [50])).all()
    with pytest.raises(ValueError, match="in \\[0, 100\\]"):
        ops.percentiles(torch.zeros(3, dtype=torch.uint8), [101])
    with pytest.raises(ValueError, match="empty"):
        ops.percentiles(torch.zeros(0, dtype=torch.uint8), [50])


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
def test_rgb_to_gray_channels_first(device, dtype):
    image = torch.randint(0, 256, (2, 5, 7, 3)).to(dtype).to(device)
    want = ops.rgb_to_gray(image)
    planar = image.permute(0, 3, 1, 2).contiguous()  # (N, 3, H, W)
    assert torch.equal(ops.rgb_to_gray(planar, channel_dim=1), want)
    assert torch.equal(ops.rgb_to_gray(planar, channel_dim=-3), want)
    assert torch.equal(ops.rgb_to_gray(image, channel_dim=3), want)
    bgr = planar.flip(1)
    assert torch.equal(ops.rgb_to_gray(bgr, "bgr", channel_dim=1), want)


def test_rgb_to_gray_channels_first_gradient():
    image = torch.rand(3, 4, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: ops.rgb_to_gray(x, channel_dim=0), (image,))


def test_rgb_to_gray_bad_channel_dim():
    with pytest.raises(IndexError, match="channel_dim 3 is out of range"):
        ops.rgb_to_gray(torch.zeros(3, 4, 5, dtype=torch.uint8), channel_dim=3)
    with pytest.raises(ValueError, match="expected an image of shape"):
        ops.rgb_to_gray(torch.zeros(4, 4, 5, dtype=torch.uint8), channel_dim=0)
