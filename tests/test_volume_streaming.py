"""imgops.volume: chunk plans, the streaming normalisation, the first pass and exact percentiles."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tifffile
import torch
from hypothesis import given
from hypothesis import strategies as st

import imgops.ops as ops
from imgops.io.atomic import atomic_output
from imgops.io.volumes import VolumeReader, open_volume, write_volume
from imgops.reference import normalize_volume_reference
from imgops.volume import (
    normalize_stream,
    percentile_from_histogram,
    plan_chunks,
    scan_volume,
)

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
SAMPLE_STACKS = sorted(SAMPLES.glob("mri_*.tif"))
CPU = torch.device("cpu")


def _run(path: Path, out: Path, device=CPU, chunk_mb: float = 256, **kwargs):
    with open_volume(path) as reader:
        plan = plan_chunks(
            reader.info.shape, reader.info.dtype, kwargs.get("dtype", "float32"), chunk_mb
        )
        stats = normalize_stream(
            reader,
            lambda pages: write_volume(out, pages, reader.info, kwargs.get("dtype", "float32")),
            plan,
            device,
            **kwargs,
        )
    return stats, tifffile.imread(out)


def _chunk_mb_for(path: Path, slices: int) -> float:
    """The --chunk-mb that gives exactly `slices` slices per chunk (2 slots of uint16+float32)."""
    with open_volume(path) as reader:
        per_slice = reader.info.shape[1] * reader.info.shape[2] * (2 + 4) * 2
    return (slices * per_slice + per_slice // 2) / 2**20


# ---------------------------------------------------------------- chunk plans and memory bound


def test_plan_chunks_arithmetic():
    plan = plan_chunks((100, 512, 512), "uint16", "float32", chunk_mb=12)
    assert plan.slices_per_chunk == 4 and plan.chunk_count == 25
    assert plan.buffer_bytes == 2 * 4 * 512 * 512 * 6 <= 12 * 2**20
    assert list(plan.chunks())[-1] == (96, 100)
    tiny = plan_chunks((7, 4096, 4096), "uint16", "float16", chunk_mb=1)
    assert tiny.slices_per_chunk == 1 and tiny.chunk_count == 7  # at least one whole slice
    whole = plan_chunks((7, 8, 8), "uint8", "float32", chunk_mb=256)
    assert whole.slices_per_chunk == 7 and whole.chunk_count == 1
    with pytest.raises(ValueError):
        plan_chunks((7, 8, 8), "uint8", "float32", chunk_mb=0)


def test_pinned_plans_count_power_of_two_buffers():
    # 1024 x 1024 uint16 -> float32: 2 MiB in + 4 MiB out a slice.
    plain = plan_chunks((2000, 1024, 1024), "uint16", "float32", chunk_mb=256)
    pinned = plan_chunks((2000, 1024, 1024), "uint16", "float32", chunk_mb=256, pinned=True)
    assert plain.slices_per_chunk == 21 and plain.buffer_bytes <= 256 * 2**20
    assert pinned.slices_per_chunk == 16 and pinned.buffer_bytes == 2 * (32 + 64) * 2**20
    for k in range(1, 40):
        plan = plan_chunks((500, 300, 700), "uint16", "float16", chunk_mb=k, pinned=True)
        assert plan.buffer_bytes <= k * 2**20 or plan.slices_per_chunk == 1


def test_memory_stays_within_the_chunk_budget_for_a_stack_far_larger(tmp_path: Path):
    depth, height, width = 300, 64, 96
    data = (np.arange(depth * height * width, dtype=np.uint32) % 4096).astype(np.uint16)
    data = data.reshape(depth, height, width)
    src = tmp_path / "big.tif"
    tifffile.imwrite(src, data, photometric="minisblack")
    volume_bytes = data.nbytes * 3  # input + float32 output
    stats, out = _run(src, tmp_path / "out.tif", chunk_mb=0.5, maximum=4095.0)
    plan = plan_chunks(data.shape, "uint16", "float32", 0.5)
    assert stats.chunks == plan.chunk_count == -(-depth // plan.slices_per_chunk)
    assert stats.slices == depth and stats.chunks >= 10
    assert 0 < stats.peak_buffer_bytes <= plan.buffer_bytes <= 0.5 * 2**20
    assert stats.peak_buffer_bytes * 20 < volume_bytes
    expected = normalize_volume_reference(torch.from_numpy(data), 4095.0).numpy()
    np.testing.assert_array_equal(out, expected)


# ---------------------------------------------------------------- correctness of the stream


@pytest.mark.parametrize("path", SAMPLE_STACKS, ids=lambda p: p.name)
def test_chunked_equals_whole_volume_bit_for_bit(tmp_path: Path, path: Path):
    data = tifffile.imread(path)
    depth = data.shape[0]
    whole = ops.normalize_volume(torch.from_numpy(data), max=float(data.max())).numpy()
    dividing = next(k for k in (5, 4, 3, 2) if depth % k == 0)
    not_dividing = next(k for k in (7, 3, 4) if depth % k)
    for slices in (1, dividing, not_dividing, depth):
        chunk_mb = _chunk_mb_for(path, slices)
        with open_volume(path) as reader:
            plan = plan_chunks(reader.info.shape, "uint16", "float32", chunk_mb)
        assert plan.slices_per_chunk == slices
        stats, out = _run(
            path, tmp_path / f"k{slices}.tif", chunk_mb=chunk_mb, maximum=float(data.max())
        )
        assert stats.chunks == -(-depth // slices)
        assert out.dtype == np.float32
        assert out.tobytes() == whole.tobytes()


def _ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    ia = a.astype(np.float32).view(np.int32).astype(np.int64)
    ib = b.astype(np.float32).view(np.int32).astype(np.int64)
    return np.abs(ia - ib)


@pytest.mark.parametrize("path", SAMPLE_STACKS, ids=lambda p: p.name)
@pytest.mark.parametrize(("low", "high"), [(0.0, None), (100.0, 4095.0), (0.0, 65535.0)])
def test_samples_match_the_reference_and_numpy_float64(tmp_path: Path, path: Path, low, high):
    data = tifffile.imread(path)
    high = float(data.max()) if high is None else high
    _, out = _run(path, tmp_path / "o.tif", maximum=high, minimum=low)
    reference = normalize_volume_reference(torch.from_numpy(data), high, low).numpy()
    np.testing.assert_array_equal(out, reference)
    exact = (data.astype(np.float64) - low) / (high - low)
    assert _ulp_distance(out, exact.astype(np.float32)).max() <= 1


def test_float16_and_clip(tmp_path: Path):
    path = SAMPLES / "mri_anat_shift610_zlib.tif"
    data = tifffile.imread(path)
    _, out = _run(
        path, tmp_path / "h.tif", dtype="float16", maximum=20000.0, minimum=1000.0, clip=True
    )
    assert out.dtype == np.float16
    expected = normalize_volume_reference(
        torch.from_numpy(data), 20000.0, 1000.0, dtype=torch.float16, clip=True
    ).numpy()
    np.testing.assert_array_equal(out, expected)
    assert out.min() == 0.0 and out.max() == 1.0
    _, unclipped = _run(path, tmp_path / "u.tif", maximum=20000.0, minimum=1000.0)
    assert unclipped.min() < 0.0 and unclipped.max() > 1.0


# ---------------------------------------------------------------- failures leave nothing behind


class _FailingReader(VolumeReader):
    """A reader whose third chunk read fails, as a bad sector or a vanished NFS mount would."""

    def __init__(self, path, fail_at: int) -> None:
        super().__init__(path)
        self.fail_at, self.calls = fail_at, 0

    def read_into(self, start, out):
        self.calls += 1
        if self.calls == self.fail_at:
            raise OSError(5, "Input/output error (simulated)")
        super().read_into(start, out)


def test_failure_mid_stack_leaves_no_output(tmp_path: Path):
    target = tmp_path / "out.tif"
    reader = _FailingReader(SAMPLES / "mri_fmri_imagej.tif", fail_at=3)
    plan = plan_chunks(reader.info.shape, "uint16", "float32", _chunk_mb_for(reader.path, 2))
    with pytest.raises(OSError, match="simulated"), atomic_output(target, overwrite=False) as temp:
        normalize_stream(
            reader, lambda pages: write_volume(temp, pages, reader.info), plan, CPU, maximum=1162.0
        )
    reader.close()
    assert list(tmp_path.iterdir()) == []


def test_writer_failure_stops_the_reader(tmp_path: Path):
    written = []

    def failing_writer(pages):
        for index, page in enumerate(pages):
            if index == 5:
                raise OSError(28, "No space left on device (simulated)")
            written.append(page.copy())

    with open_volume(SAMPLES / "mri_fmri_imagej.tif") as reader:
        plan = plan_chunks(reader.info.shape, "uint16", "float32", _chunk_mb_for(reader.path, 2))
        with pytest.raises(OSError, match="No space left"):
            normalize_stream(reader, failing_writer, plan, CPU, maximum=1162.0)
    assert len(written) == 5


def test_interrupt_in_the_device_stage_stops_everything(tmp_path: Path, monkeypatch):
    calls = {"n": 0}
    real = ops.normalize_volume

    def interrupted(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(ops, "normalize_volume", interrupted)
    target = tmp_path / "out.tif"
    with open_volume(SAMPLES / "mri_fmri_imagej.tif") as reader:
        plan = plan_chunks(reader.info.shape, "uint16", "float32", _chunk_mb_for(reader.path, 3))
        with pytest.raises(KeyboardInterrupt), atomic_output(target, overwrite=False) as temp:
            normalize_stream(
                reader, lambda pages: write_volume(temp, pages, reader.info), plan, CPU, maximum=9.0
            )
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- first pass and percentiles


@pytest.mark.parametrize("path", SAMPLE_STACKS, ids=lambda p: p.name)
def test_scan_min_max_and_percentiles_equal_numpy_on_the_samples(path: Path):
    data = tifffile.imread(path)
    with open_volume(path) as reader:
        plan = plan_chunks(reader.info.shape, "uint16", "float32", _chunk_mb_for(path, 3))
        quick = scan_volume(reader, plan, CPU)
        full = scan_volume(reader, plan, CPU, histogram=True)
    assert (quick.minimum, quick.maximum) == (data.min(), data.max())
    assert (full.minimum, full.maximum, full.count) == (data.min(), data.max(), data.size)
    np.testing.assert_array_equal(full.histogram, np.bincount(data.ravel(), minlength=65536))
    for q in (0, 0.1, 1, 2.5, 33.3, 50, 99, 99.8, 99.99, 100):
        assert full.percentile(q) == np.percentile(data, q), q


@pytest.mark.parametrize("dtype", ["uint8", "int16"])
def test_scan_other_integer_types(tmp_path: Path, dtype):
    rng = np.random.default_rng(3)
    low, high = (0, 255) if dtype == "uint8" else (-3000, 3000)
    data = rng.integers(low, high, (9, 17, 23), endpoint=True).astype(dtype)
    tifffile.imwrite(tmp_path / "v.tif", data, photometric="minisblack")
    with open_volume(tmp_path / "v.tif") as reader:
        plan = plan_chunks(reader.info.shape, dtype, "float32", 0.01)
        quick = scan_volume(reader, plan, CPU)
        full = scan_volume(reader, plan, CPU, histogram=True)
    assert (
        (quick.minimum, quick.maximum) == (full.minimum, full.maximum) == (data.min(), data.max())
    )
    for q in (0.5, 1, 50, 99.8):
        assert full.percentile(q) == np.percentile(data, q)


@pytest.mark.parametrize("edges", [(0, 65535), (32767, 32768), (32768, 65535), (5, 32767)])
def test_scan_uint16_min_max_across_the_sign_bit(tmp_path: Path, edges):
    rng = np.random.default_rng(11)
    data = rng.integers(edges[0], edges[1], (6, 10, 12), endpoint=True).astype(np.uint16)
    data[2, 3, 4], data[5, 0, 0] = edges
    tifffile.imwrite(tmp_path / "v.tif", data, photometric="minisblack")
    with open_volume(tmp_path / "v.tif") as reader:
        plan = plan_chunks(reader.info.shape, "uint16", "float32", 0.002)
        quick = scan_volume(reader, plan, CPU)
    assert (quick.minimum, quick.maximum) == edges


@given(
    values=st.lists(st.integers(0, 65535), min_size=1, max_size=300),
    q=st.floats(0, 100, allow_nan=False),
)
def test_percentile_from_histogram_equals_numpy_uint16(values, q):
    data = np.array(values, dtype=np.uint16)
    histogram = np.bincount(data, minlength=65536)
    assert percentile_from_histogram(histogram, q) == np.percentile(data, q)


@given(
    values=st.lists(st.integers(-16000, 16000), min_size=1, max_size=300),
    q=st.floats(0, 100, allow_nan=False),
)
def test_percentile_from_histogram_equals_numpy_int16(values, q):
    data = np.array(values, dtype=np.int16)
    histogram = np.bincount(data.astype(np.int64) + 32768, minlength=65536)
    assert percentile_from_histogram(histogram, q, offset=-32768) == np.percentile(data, q)


def test_percentile_rejects_bad_input():
    with pytest.raises(ValueError):
        percentile_from_histogram(np.zeros(256, np.int64), 50)
    with pytest.raises(ValueError):
        percentile_from_histogram(np.ones(256, np.int64), 101)


# ---------------------------------------------------------------- the histogram op


@pytest.mark.parametrize("dtype", [torch.uint8, torch.uint16, torch.int16])
def test_value_histogram_equals_numpy_bincount(device, dtype):
    data = tifffile.imread(SAMPLES / "mri_anat_shift610_zlib.tif")
    if dtype == torch.uint8:
        values = torch.from_numpy((data >> 7).astype(np.uint8))
    elif dtype == torch.int16:
        values = torch.from_numpy((data.astype(np.int32) - 610).astype(np.int16))
    else:
        values = torch.from_numpy(data)
    counts = ops.value_histogram(values.to(device)).cpu().numpy()
    offset = 32768 if dtype == torch.int16 else 0
    bins = 256 if dtype == torch.uint8 else 65536
    expected = np.bincount(values.numpy().astype(np.int64).ravel() + offset, minlength=bins)
    np.testing.assert_array_equal(counts, expected)


# ---------------------------------------------------------------- CUDA (skipped without a GPU)


@pytest.mark.cuda
@pytest.mark.parametrize("path", SAMPLE_STACKS, ids=lambda p: p.name)
def test_cuda_stream_equals_cpu_bit_for_bit(tmp_path: Path, path: Path):
    cuda = torch.device("cuda")
    for slices in (1, 3):
        chunk_mb = _chunk_mb_for(path, slices)
        _, on_cpu = _run(path, tmp_path / "c.tif", CPU, chunk_mb, maximum=4095.0, minimum=7.0)
        stats, on_gpu = _run(path, tmp_path / "g.tif", cuda, chunk_mb, maximum=4095.0, minimum=7.0)
        assert stats.device.startswith("cuda")
        assert on_gpu.tobytes() == on_cpu.tobytes()


@pytest.mark.cuda
@pytest.mark.parametrize("path", SAMPLE_STACKS, ids=lambda p: p.name)
def test_cuda_scan_equals_cpu(path: Path):
    with open_volume(path) as reader:
        plan = plan_chunks(reader.info.shape, "uint16", "float32", _chunk_mb_for(path, 3))
        on_cpu = scan_volume(reader, plan, CPU, histogram=True)
        on_gpu = scan_volume(reader, plan, torch.device("cuda"), histogram=True)
        quick = scan_volume(reader, plan, torch.device("cuda"))
    np.testing.assert_array_equal(on_gpu.histogram, on_cpu.histogram)
    assert (quick.minimum, quick.maximum) == (on_cpu.minimum, on_cpu.maximum)
