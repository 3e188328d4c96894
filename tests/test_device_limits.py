"""Device limits (issue 6): GPU out-of-memory falls back, and nothing stays allocated between files.

On CUDA the limit is real: `torch.cuda.set_per_process_memory_fraction` caps this process's
allocator so that an image or a chunk no longer fits. Everywhere, the retry logic is also
driven by an injected out-of-memory error, so CI checks it without a GPU.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tifffile
import torch
from click.testing import CliRunner

from imgops.cli import cli
from imgops.pipeline import GRAY, GrayJob, PipelineSettings, run_gray
from imgops.volume import plan_chunks
from imgops.volume.stream import run_with_smaller_chunks

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
CPU = torch.device("cpu")


def _stack(path: Path, depth: int, side: int) -> np.ndarray:
    slices = tifffile.imread(SAMPLES / "mri_dwi_b0_u16.tif")
    volume = np.stack([np.resize(slices[z % len(slices)], (side, side)) for z in range(depth)])
    tifffile.imwrite(path, volume, photometric="minisblack")
    return volume


@pytest.fixture
def memory_cap():
    """Caps this process's CUDA allocator to `mib` MiB; lifted (and the cache emptied) after."""

    def cap(mib: float) -> None:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(mib * 2**20 / total)

    yield cap
    torch.cuda.set_per_process_memory_fraction(1.0)
    torch.cuda.empty_cache()


def test_chunk_fallback_halves_until_the_chunk_fits():
    plan = plan_chunks((64, 256, 256), "uint16", "float32", chunk_mb=64)
    assert plan.slices_per_chunk > 8
    tried, retries = [], []

    def run(p):
        tried.append(p.slices_per_chunk)
        if p.slices_per_chunk > 8:
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return "done"

    on_retry = lambda old, new: retries.append((old.slices_per_chunk, new.slices_per_chunk))  # noqa: E731
    result, final = run_with_smaller_chunks(run, plan, torch.device("cpu"), on_retry=on_retry)
    assert result == "done" and final.slices_per_chunk <= 8
    assert tried == sorted(tried, reverse=True) and len(tried) == len(retries) + 1
    assert all(new < old for old, new in retries)


def test_chunk_fallback_gives_up_at_one_slice_and_retries_only_out_of_memory():
    plan = plan_chunks((16, 64, 64), "uint16", "float32", chunk_mb=1)

    def run(p):
        raise torch.OutOfMemoryError("CUDA out of memory (injected)")

    with pytest.raises(torch.OutOfMemoryError):
        run_with_smaller_chunks(run, plan, torch.device("cpu"))
    calls = []

    def run_other(p):
        calls.append(p)
        raise RuntimeError("CUDA error: an illegal memory access (not memory exhaustion)")

    with pytest.raises(RuntimeError):
        run_with_smaller_chunks(run_other, plan, torch.device("cpu"))
    assert len(calls) == 1


@pytest.mark.parametrize(
    ("device", "error", "reason"),
    [
        ("cuda", torch.OutOfMemoryError, "out of GPU memory"),
        ("cuda:0", torch.OutOfMemoryError, "out of GPU memory"),
        ("cuda", MemoryError, "out of memory"),  # host memory (pinned buffers, numpy)
        ("cpu", torch.OutOfMemoryError, "out of memory"),  # the CPU allocator's error
        ("cpu", MemoryError, "out of memory"),
    ],
)
def test_the_retry_line_says_which_memory_ran_out(device, error, reason):
    plan = plan_chunks((64, 256, 256), "uint16", "float32", chunk_mb=64)
    notes = []

    def run(p):
        if p.slices_per_chunk > plan.slices_per_chunk // 2:
            raise error("injected")
        return "done"

    # a CUDA device object needs no GPU until memory is touched; nothing is here
    run_with_smaller_chunks(run, plan, torch.device(device), on_note=notes.append)
    old, new = plan.slices_per_chunk, plan.halved().slices_per_chunk
    assert notes == [f"{reason} with {old} planes per chunk; retrying with {new}"]


def test_the_device_cache_is_handed_back_once_per_pass_not_per_chunk(tmp_path: Path, monkeypatch):
    from imgops.volume import stream

    _stack(tmp_path / "scan.tif", 24, 128)
    calls = []
    monkeypatch.setattr(stream, "release_cached_memory", lambda device: calls.append(device))
    from imgops.io.volumes import open_volume

    with open_volume(tmp_path / "scan.tif") as reader:
        plan = plan_chunks(reader.info.shape, "uint16", "float32", chunk_mb=0.5)
        assert plan.chunk_count > 3
        pages = []
        stream.map_volume(reader, lambda c, s: c[s.core].float(), pages.extend, plan, CPU)
        assert len(pages) == 24 and len(calls) == 1
        stream.reduce_volume(reader, lambda c, s: 1, lambda a, b: a + b, plan, CPU)
        assert len(calls) == 2


@pytest.mark.cuda
def test_gray_batch_too_big_for_the_gpu_is_converted_on_the_cpu(tmp_path: Path, memory_cap):
    rng = np.random.default_rng(5)
    pixels = rng.integers(0, 256, (6000, 6000, 3), dtype=np.uint8)  # 108 MB in, 36 MB out
    source = tmp_path / "big.png"
    import cv2

    cv2.imwrite(str(source), pixels, [cv2.IMWRITE_PNG_COMPRESSION, 0])
    torch.zeros(1, device="cuda")
    memory_cap(64)
    results = []
    settings = PipelineSettings(device="cuda", decoder="cpu", jobs=2)
    summary = run_gray([GrayJob(source, tmp_path / "out.png", "big")], settings, results.append)
    assert summary.written == 1, summary.failures
    assert results[0].note is not None and "converted on the CPU" in results[0].note
    got = cv2.imread(str(tmp_path / "out.png"), cv2.IMREAD_UNCHANGED)
    np.testing.assert_array_equal(got, GRAY.cpu(pixels, "bgr"))


@pytest.mark.cuda
def test_normvol_chunk_too_big_for_the_gpu_retries_smaller(tmp_path: Path, memory_cap):
    volume = _stack(tmp_path / "scan.tif", 48, 1024)  # 96 MB uint16
    cpu = CliRunner().invoke(
        cli, ["normvol", str(tmp_path / "scan.tif"), "-o", str(tmp_path / "cpu.tif"),
              "--device", "cpu"],
    )  # fmt: skip
    assert cpu.exit_code == 0, cpu.output
    memory_cap(80)  # a 256 MiB chunk plan needs far more on the device
    result = CliRunner().invoke(
        cli, ["normvol", str(tmp_path / "scan.tif"), "-o", str(tmp_path / "gpu.tif"),
              "--device", "cuda", "--chunk-mb", "512"],
        catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "out of GPU memory" in result.stderr and "retrying with" in result.stderr
    got = tifffile.imread(tmp_path / "gpu.tif")
    np.testing.assert_array_equal(got, tifffile.imread(tmp_path / "cpu.tif"))
    assert got.shape == volume.shape
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cpu.tif", "gpu.tif", "scan.tif"]


@pytest.mark.cuda
def test_normvol_leaves_nothing_allocated_between_files(tmp_path: Path):
    for name in ("a.tif", "b.tif"):
        _stack(tmp_path / name, 24, 512)
    torch.cuda.synchronize()
    allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    result = CliRunner().invoke(
        cli, ["normvol", str(tmp_path / "a.tif"), str(tmp_path / "b.tif"), "-d",
              str(tmp_path / "out"), "--device", "cuda", "--percentile", "1", "99"],
        catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == allocated
    assert torch.cuda.memory_reserved() <= reserved  # the cache was handed back


@pytest.mark.cuda
def test_gray_batch_leaves_nothing_allocated(tmp_path: Path):
    torch.cuda.synchronize()
    allocated = torch.cuda.memory_allocated()
    result = CliRunner().invoke(
        cli, ["gray", str(SAMPLES), "-d", str(tmp_path / "out"), "--device", "cuda", "-q"],
        catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == allocated


def test_file_functions_hand_back_the_device_cache():
    """The CPU-side guard of the CUDA test above: both file functions carry the hand-back
    decorator (a helper inserted under it once took it from normalize_file)."""
    from imgops import volume_files

    for function in (volume_files.normalize_file, volume_files.bin_file):
        assert function.__wrapped__.__name__ == function.__name__
        assert function.__code__ is not function.__wrapped__.__code__
