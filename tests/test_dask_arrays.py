"""imgops.dask.arrays on dask's threaded scheduler: bit-identical to the single-process ops."""

from __future__ import annotations

import signal

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

da = pytest.importorskip("dask.array")
import dask  # noqa: E402

from imgops import ops  # noqa: E402
from imgops.dask import arrays  # noqa: E402
from imgops.dask._blocks import bin_numpy  # noqa: E402

TIME_LIMIT_S = 60


@pytest.fixture(autouse=True)
def _bounded_time():
    """Fails a test that runs past TIME_LIMIT_S instead of hanging CI."""

    def expire(signum, frame):
        raise TimeoutError(f"test ran past {TIME_LIMIT_S} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(TIME_LIMIT_S)
    with dask.config.set(scheduler="threads"):
        yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def _volume(seed: int, shape, dtype: str, high: int | None = None) -> np.ndarray:
    rng = np.random.default_rng(seed)
    info = np.iinfo(dtype)
    return rng.integers(info.min, (high or info.max) + 1, shape, dtype=dtype)


shapes = st.tuples(st.integers(1, 9), st.integers(1, 23), st.integers(1, 23))
chunkings = st.tuples(st.integers(2, 5), st.integers(5, 11), st.integers(5, 11))  # <= 125 blocks


@settings(max_examples=20)
@given(
    seed=st.integers(0, 2**32 - 1),
    shape=shapes,
    chunks=chunkings,
    dtype=st.sampled_from(["uint8", "uint16", "int16"]),
    clip=st.booleans(),
)
def test_normalize_with_percentiles_equals_the_op_on_the_whole_array(
    seed, shape, chunks, dtype, clip
):
    data = _volume(seed, shape, dtype, high=4095 if dtype == "uint16" else None)
    qs = (1.5, 99.8)
    # numpy subtracts int16 neighbours in int16 (wrapping past 32767 apart); int32 is exact
    expected_bounds = np.percentile(data.astype(np.int32) if dtype == "int16" else data, qs)
    low, high = arrays.percentiles(da.from_array(data, chunks=chunks), qs, split_every=3)
    assert [low, high] == list(expected_bounds)  # exact, numpy's float64 steps
    if not high > low:
        with pytest.raises(ValueError, match="not above"):
            arrays.normalize(da.from_array(data, chunks=chunks), percentile=qs)
        return
    result = arrays.normalize(da.from_array(data, chunks=chunks), percentile=qs, clip=clip)
    expected = ops.normalize_volume(
        torch.from_numpy(data), max=high, min=low, dtype=torch.float32, clip=clip
    ).numpy()
    computed = result.compute()
    assert computed.dtype == np.float32
    assert np.array_equal(computed, expected, equal_nan=True)


def test_percentiles_cover_the_whole_range_and_int16_offsets():
    data = _volume(3, (6, 40, 50), "int16")
    qs = (0, 0.01, 25, 50, 75, 100)
    assert arrays.percentiles(da.from_array(data, chunks=(2, 13, 17)), qs) == list(
        np.percentile(data, qs)
    )


def test_default_bounds_are_zero_and_the_data_max_like_normvol():
    data = _volume(4, (5, 30, 31), "uint16", high=1000)
    result = arrays.normalize(da.from_array(data, chunks=(2, 8, 8)), dtype="float16").compute()
    expected = ops.normalize_volume(
        torch.from_numpy(data), max=float(data.max()), min=0.0, dtype=torch.float16
    ).numpy()
    assert result.dtype == np.float16 and np.array_equal(result, expected)


def test_dtype_and_data_bounds():
    data = _volume(5, (4, 20, 20), "uint8")
    d = da.from_array(data, chunks=(1, 10, 10))
    assert arrays.bounds(d, "dtype", "dtype") == (0.0, 255.0)
    assert arrays.bounds(d, "data", "data") == (float(data.min()), float(data.max()))


def test_float_inputs_normalize_with_explicit_bounds_and_refuse_percentiles():
    data = np.random.default_rng(6).normal(size=(4, 10, 12)).astype(np.float32)
    d = da.from_array(data, chunks=(2, 5, 5))
    expected = ops.normalize_volume(torch.from_numpy(data), max=2.0, min=-2.0, clip=True).numpy()
    assert np.array_equal(arrays.normalize(d, min=-2, max=2, clip=True).compute(), expected)
    with pytest.raises(TypeError, match="exact percentiles: unsupported dtype float32"):
        arrays.percentiles(d, (1, 99))


def test_constant_volume_and_unsupported_dtype_are_clear_errors():
    with pytest.raises(ValueError, match="not above"):
        arrays.normalize(da.zeros((3, 4, 4), dtype=np.uint16, chunks=2))
    with pytest.raises(TypeError, match="unsupported dtype int32"):
        arrays.normalize(da.zeros((3, 4, 4), dtype=np.int32, chunks=2), max=1)


@settings(max_examples=20)
@given(
    seed=st.integers(0, 2**32 - 1),
    dtype=st.sampled_from(["uint8", "uint16"]),
    shape=st.tuples(st.integers(1, 3), st.integers(1, 17), st.integers(1, 17)),
    chunks=st.tuples(st.integers(1, 2), st.integers(3, 9), st.integers(3, 9), st.integers(1, 3)),
)
def test_gray_equals_the_op(seed, dtype, shape, chunks):
    image = _volume(seed, (*shape, 3), dtype)
    expected = ops.rgb_to_gray(torch.from_numpy(image)).numpy()
    result = arrays.gray(da.from_array(image, chunks=chunks)).compute()
    assert result.dtype == image.dtype and np.array_equal(result, expected)
    channel_first = np.ascontiguousarray(np.moveaxis(image, -1, 1))
    moved = arrays.gray(da.from_array(channel_first, chunks=2), channel_dim=1).compute()
    assert np.array_equal(moved, expected)


def _bin_reference(data: np.ndarray, factors) -> np.ndarray:
    """Independent reference: float64 means by explicit loops over the bins, rounded half up."""
    lead = data.ndim - len(factors)
    binned = zip(data.shape[lead:], factors, strict=True)
    out_shape = data.shape[:lead] + tuple(s // f for s, f in binned)
    out = np.empty(out_shape, dtype=np.float64)
    for index in np.ndindex(*out_shape[lead:]):
        window = tuple(slice(i * f, (i + 1) * f) for i, f in zip(index, factors, strict=True))
        out[(Ellipsis, *index)] = (
            data[(Ellipsis, *window)].astype(np.float64).mean(axis=tuple(range(lead, data.ndim)))
        )
    if np.issubdtype(data.dtype, np.integer):
        return np.floor(out + 0.5).astype(data.dtype)
    return out.astype(data.dtype)


@settings(max_examples=20)
@given(
    seed=st.integers(0, 2**32 - 1),
    dtype=st.sampled_from(["uint8", "uint16", "int16"]),
    shape=st.tuples(st.integers(2, 7), st.integers(3, 13), st.integers(3, 13)),
    factors=st.tuples(st.integers(1, 2), st.integers(1, 3), st.integers(1, 3)),
    chunks=st.tuples(st.integers(1, 4), st.integers(2, 7), st.integers(2, 7)),
)
def test_bin_matches_the_single_process_result_across_block_boundaries(
    seed, dtype, shape, factors, chunks
):
    data = _volume(seed, shape, dtype)
    result = arrays.bin(da.from_array(data, chunks=chunks), factors)
    computed = result.compute()
    if hasattr(ops, "bin"):
        expected = ops.bin(torch.from_numpy(data), list(factors)).numpy()
    else:  # the op is not on this branch yet: the definition, computed independently
        expected = _bin_reference(data, factors)
    assert computed.dtype == data.dtype and np.array_equal(computed, expected)
    assert computed.shape == tuple(s // f for s, f in zip(shape, factors, strict=True))


def test_bin_fallback_equals_the_reference_for_floats_and_leading_axes():
    data = np.random.default_rng(8).random((2, 6, 9), dtype=np.float32)
    assert np.array_equal(bin_numpy(data[:, :6, :9], (3, 3)), _bin_reference(data, (3, 3)))


def test_bin_rejects_factors_larger_than_the_axis():
    with pytest.raises(ValueError, match="exceeds the axis size 4"):
        arrays.bin(da.zeros((4, 4), dtype=np.uint8), (5, 1))
