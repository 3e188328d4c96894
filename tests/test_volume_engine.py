"""The volume engine's parts: chunk plans with halo/align/spans, numpy statistics for every
dtype (exact percentiles against numpy), map/reduce with a Z halo, and out-of-memory halving.

Real data: the MRI sample stacks in samples/ (see samples/SOURCES.md)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tifffile
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from imgops.io.volumes import open_volume
from imgops.volume import map_volume, plan_chunks, reduce_volume, run_with_smaller_chunks
from imgops.volume.stats import (
    VolumeStats,
    plane_stats,
    sortable_keys,
    values_from_keys,
)

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
FMRI = SAMPLES / "mri_fmri_imagej.tif"
CPU = torch.device("cpu")
DTYPES = ["uint8", "uint16", "int16", "float16", "uint32", "int32", "float32"]


# ------------------------------------------------------------------------------ chunk plans


def test_plan_with_halo_align_and_spans():
    plan = plan_chunks((30, 64, 64), "uint16", "float32", chunk_mb=0.5, halo=2, align=4)
    assert plan.slices_per_chunk % 4 == 0
    assert plan.slices_per_chunk > 4 and plan.buffer_bytes <= 0.5 * 2**20
    assert plan.read_range(0, plan.slices_per_chunk) == (0, plan.slices_per_chunk + 2)
    assert plan.read_range(28, 30) == (26, 30)
    spans = plan_chunks((10, 8, 8), "uint8", chunk_mb=1, spans=((0, 4), (5, 9)))
    assert list(spans.chunks()) == [(0, 4), (5, 9)]
    assert spans.halved().slices_per_chunk == 2 and spans.halved().chunk_count == 4
    assert plan.halved().slices_per_chunk % 4 == 0


# ------------------------------------------------------------------------------ statistics


@pytest.mark.parametrize("dtype", DTYPES)
def test_sortable_keys_keep_order_and_invert(dtype: str):
    info = np.finfo(dtype) if dtype.startswith("float") else np.iinfo(dtype)
    values = np.array([info.min, -1, -0.0, 0, 1, 2, info.max], dtype=np.float64)
    values = np.unique(values.clip(info.min, info.max)).astype(dtype)
    keys = sortable_keys(values)
    assert keys.dtype.kind == "u" and np.all(np.diff(keys.astype(np.int64)) > 0)
    np.testing.assert_array_equal(values_from_keys(keys, dtype), values)


def _exact_percentiles(data: np.ndarray, qs, planes_per_chunk: int = 3):
    parts = [
        plane_stats(data[i : i + planes_per_chunk], histogram=True)
        for i in range(0, len(data), planes_per_chunk)
    ]
    total = parts[0]
    for part in parts[1:]:
        total = total.merge(part)
    stats = VolumeStats(data.dtype.name, [total])
    if stats.needs_refinement():
        refinement = stats.refinement(tuple(qs))
        fine: dict = {}
        for i in range(0, len(data), planes_per_chunk):
            refinement.merge(fine, refinement.count(0, data[i : i + planes_per_chunk]))
        stats.refined = fine
    return stats, [stats.percentile(q) for q in qs]


@pytest.mark.parametrize("dtype", DTYPES)
def test_percentiles_equal_numpy_on_the_sample_scaled_to_each_dtype(dtype: str):
    base = tifffile.imread(FMRI).astype(np.float64)
    scaled = {
        "uint8": base / 5,
        "int16": base - 600,
        "float16": base / 7 - 40,
        "uint32": base * 3000,
        "int32": base * 3000 - 1.5e6,
        "float32": base / 3 - 100,
    }.get(dtype, base)
    data = scaled.astype(dtype)
    qs = (0, 1, 3, 50, 99.8, 100)
    stats, got = _exact_percentiles(data, qs)
    assert (stats.minimum, stats.maximum) == (data.min(), data.max())
    want = [float(np.percentile(data.astype(np.float64), q)) for q in qs]
    assert got == want


@given(
    hnp.arrays(
        st.sampled_from([np.float32, np.int32, np.uint32, np.float16]),
        st.tuples(st.integers(1, 4), st.integers(1, 6), st.integers(1, 6)),
        elements={"allow_nan": False, "allow_infinity": False},
    ),
    st.floats(0, 100),
)
def test_percentiles_equal_numpy_random(data: np.ndarray, q: float):
    _, (got,) = _exact_percentiles(data, (q,), planes_per_chunk=2)
    assert got == float(np.percentile(data.astype(np.float64), q))


def test_nan_and_inf_are_left_out_of_the_statistics():
    data = np.array([[[np.nan, 1.0, -np.inf], [3.0, np.inf, 2.0]]], dtype=np.float32)
    stats = plane_stats(data, histogram=True)
    assert (stats.minimum, stats.maximum, stats.count, stats.nonfinite) == (1.0, 3.0, 3, 3)
    volume = VolumeStats("float32", [stats])
    volume.refined = volume.refinement((50,)).count(0, data)
    assert volume.percentile(50) == 2.0


# ------------------------------------------------------------------------------ streaming


def _z_mean3(chunk: torch.Tensor, span) -> torch.Tensor:
    """A Z-neighbourhood op: the mean of each plane and its neighbours (edges: what exists)."""
    x = chunk.to(torch.float64)
    out = []
    for z in range(span.start, span.stop):
        lo, hi = max(z - 1, span.read_start), min(z + 2, span.read_stop)
        out.append(x[lo - span.read_start : hi - span.read_start].mean(0))
    return torch.stack(out)


@pytest.mark.parametrize("planes", [1, 2, 5, 24])
def test_map_with_a_halo_equals_the_whole_volume_op(planes: int):
    data = tifffile.imread(FMRI)
    expected = np.stack(
        [data[max(z - 1, 0) : z + 2].astype(np.float64).mean(0) for z in range(len(data))]
    )
    written: list[np.ndarray] = []
    with open_volume(FMRI) as reader:
        slot = (planes + 2) * data[0].nbytes + planes * data[0].size * 8
        plan = plan_chunks(reader.info.shape, "uint16", "float64", 2 * slot / 2**20, halo=1)
        assert plan.slices_per_chunk == planes
        map_volume(
            reader, _z_mean3, lambda pages: written.extend(p.copy() for p in pages), plan, CPU
        )
    np.testing.assert_array_equal(np.stack(written), expected)


def test_reduce_merges_in_order():
    data = tifffile.imread(FMRI)
    with open_volume(FMRI) as reader:
        plan = plan_chunks(reader.info.shape, "uint16", chunk_mb=0.3)
        assert plan.chunk_count > 2
        total = reduce_volume(
            reader,
            lambda c, s: [(s.start, int(c.to(torch.int64).sum()))],
            lambda a, b: a + b,
            plan,
            CPU,
        )
    assert [start for start, _ in total] == [a for a, _ in plan.chunks()]
    assert sum(v for _, v in total) == int(data.astype(np.int64).sum())


@pytest.mark.parametrize("error", [torch.OutOfMemoryError, MemoryError])
def test_out_of_memory_halves_the_chunks_and_retries(error):
    plan = plan_chunks((64, 32, 32), "uint16", chunk_mb=1)
    seen = []

    def run(p):
        seen.append(p.slices_per_chunk)
        if p.slices_per_chunk > 8:
            raise error("out of memory")
        return "ok"

    result, final = run_with_smaller_chunks(run, plan, CPU, on_retry=lambda a, b: None)
    assert result == "ok" and final.slices_per_chunk <= 8
    assert seen == sorted(seen, reverse=True) and len(seen) >= 2


def test_other_errors_are_not_retried_and_one_plane_gives_up():
    plan = plan_chunks((4, 32, 32), "uint16", chunk_mb=1)
    calls = []

    def failing(p):
        calls.append(p.slices_per_chunk)
        raise RuntimeError("CUDA error: failed to allocate")  # not an OOM type: no retry

    with pytest.raises(RuntimeError):
        run_with_smaller_chunks(failing, plan, CPU)
    assert len(calls) == 1

    def always_oom(p):
        raise MemoryError

    with pytest.raises(MemoryError):
        run_with_smaller_chunks(always_oom, plan, CPU)


# ------------------------------------------------------------------------------ CUDA


def _collector(into: list):
    return lambda pages: into.extend(page.copy() for page in pages)


@pytest.mark.cuda
@pytest.mark.parametrize("planes", [1, 5])
def test_cuda_map_with_a_halo_equals_the_cpu(planes: int):
    cuda = torch.device("cuda")
    results = {}
    for device in (CPU, cuda):
        written: list[np.ndarray] = []
        with open_volume(FMRI) as reader:
            slot = (planes + 2) * reader.info.slice_bytes + planes * reader.info.slice_bytes * 4
            plan = plan_chunks(
                reader.info.shape,
                "uint16",
                "float64",
                2 * slot / 2**20,
                halo=1,
                pinned=device.type == "cuda",
            )
            map_volume(reader, _z_mean3, _collector(written), plan, device)
        results[device.type] = np.stack(written)
    # float64 means: CUDA and the CPU may round the last bit differently (measured: 1 ulp);
    # a wrong halo plane would be off by whole levels.
    np.testing.assert_allclose(results["cuda"], results["cpu"], rtol=1e-14, atol=0)


@pytest.mark.cuda
def test_cuda_out_of_memory_halves_and_retries():
    cuda = torch.device("cuda")
    with open_volume(FMRI) as reader:
        plan = plan_chunks(reader.info.shape, "uint16", chunk_mb=8, pinned=True)
        tries = []

        def run(p):
            tries.append(p.slices_per_chunk)
            if p.slices_per_chunk > 2:
                torch.empty(2**50, dtype=torch.uint8, device=cuda)  # a real torch.OutOfMemoryError
            return reduce_volume(
                reader, lambda c, s: int(c.to(torch.int64).sum()), lambda a, b: a + b, p, cuda
            )

        total, final = run_with_smaller_chunks(run, plan, cuda)
    assert final.slices_per_chunk <= 2 and len(tries) >= 2
    assert total == int(tifffile.imread(FMRI).astype(np.int64).sum())


@given(
    hnp.arrays(
        np.float32,
        st.tuples(st.integers(1, 4), st.integers(1, 9), st.integers(1, 9)),
        elements=st.floats(-2, 3, width=32) | st.sampled_from([np.nan, np.inf, -np.inf, 0, 1]),
    ),
    st.booleans(),
    st.booleans(),
)
def test_outside_counter_equals_numpy(source: np.ndarray, clip: bool, half: bool):
    from imgops.volume.normalize import OutsideCounter

    out = source.astype(np.float16) if half else source.copy()
    counter = OutsideCounter(clip=clip, float16=half)
    counter.add(torch.from_numpy(out[:1]), torch.from_numpy(source[:1]))
    counter.add(torch.from_numpy(out[1:]), torch.from_numpy(source[1:]))
    expected_outside = 0 if clip else int(((out < 0) | (out > 1)).sum())
    expected_overflow = int((np.isinf(out) & np.isfinite(source)).sum()) if half else 0
    assert counter.totals() == (expected_outside, expected_overflow)
