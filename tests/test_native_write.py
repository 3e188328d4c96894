"""The native writers of imgops._cli_kernels: write_file_atomic (write, sync, commit in one
call) and png_encode_to_file (encode into the thread's reused buffer, then the same write),
through imgops.io.atomic.write_bytes_atomic, imgops.io.png.write_png_atomic and the engine's
Writer: the same files, refusals and clean-up as the Python writer."""

from __future__ import annotations

import errno
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imgops.engine.files import Writer
from imgops.engine.types import PipelineSettings
from imgops.io import atomic, png
from imgops.io.atomic import TEMP_MARKER, OutputExistsError, write_bytes_atomic

KERNELS = png.cli_kernels()
pytestmark = pytest.mark.skipif(KERNELS is None, reason="imgops._cli_kernels was not built")


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if TEMP_MARKER in p.name)


def test_write_file_atomic_writes_commits_and_leaves_no_temporary(tmp_path: Path):
    target = tmp_path / "out.bin"
    data = os.urandom(3 << 20)
    assert write_bytes_atomic(target, data, overwrite=False, durable=True) == len(data)
    assert target.read_bytes() == data
    assert _leftovers(tmp_path) == []


def test_native_write_never_replaces_without_overwrite(tmp_path: Path):
    target = tmp_path / "out.png"
    target.write_bytes(b"keep me")
    with pytest.raises(OutputExistsError):
        write_bytes_atomic(target, b"new", overwrite=False)
    assert target.read_bytes() == b"keep me"
    assert _leftovers(tmp_path) == []
    write_bytes_atomic(target, b"new", overwrite=True)
    assert target.read_bytes() == b"new"
    assert _leftovers(tmp_path) == []


def test_native_write_failure_removes_the_temporary_and_names_the_target(tmp_path: Path):
    target = tmp_path / "a-folder"
    target.mkdir()
    (target / "inside").write_bytes(b"x")  # rename over a non-empty folder fails
    with pytest.raises(OSError) as caught:
        write_bytes_atomic(target, b"data", overwrite=True)
    assert caught.value.errno in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST)
    assert caught.value.filename == str(target)
    assert _leftovers(tmp_path) == []
    writer = Writer(PipelineSettings(overwrite=True))
    with pytest.raises(OSError, match="cannot write") as caught:
        writer.write(target, b"data")
    assert caught.value.filename == str(target)
    assert TEMP_MARKER not in str(caught.value)


def test_native_write_into_a_missing_folder_names_the_temporary_then_the_writer_the_target(
    tmp_path: Path,
):
    target = tmp_path / "missing" / "out.png"
    with pytest.raises(FileNotFoundError) as caught:
        write_bytes_atomic(target, b"data", overwrite=False)
    assert TEMP_MARKER in str(caught.value.filename)
    with pytest.raises(OSError) as caught:
        Writer(PipelineSettings()).write(target, b"data")
    assert caught.value.filename == str(target) and TEMP_MARKER not in str(caught.value)


def test_the_python_writer_still_serves_without_the_module(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(atomic, "cli_kernels", lambda: None)
    called = []
    monkeypatch.setattr(atomic, "native_write", lambda *a: called.append(a))
    write_bytes_atomic(tmp_path / "x.bin", b"abc", overwrite=False)
    assert (tmp_path / "x.bin").read_bytes() == b"abc" and called == []


def _image(rng: np.random.Generator, height: int, width: int, channels: int, dtype, kind: str):
    shape = (height, width) if channels == 1 else (height, width, channels)
    top = np.iinfo(dtype).max
    if kind == "flat":
        return np.full(shape, rng.integers(0, top + 1), dtype=dtype)
    if kind == "gradient":
        ramp = np.linspace(0, top, num=height * width).reshape(height, width).astype(dtype)
        return ramp if channels == 1 else np.repeat(ramp[..., None], channels, axis=2)
    return rng.integers(0, top + 1, size=shape, dtype=dtype)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    height=st.integers(1, 300),
    width=st.integers(1, 300),
    channels=st.sampled_from([1, 2, 3, 4]),
    dtype=st.sampled_from([np.uint8, np.uint16]),
    kind=st.sampled_from(["noise", "flat", "gradient"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_write_png_atomic_writes_encode_pngs_bytes(
    tmp_path: Path, height, width, channels, dtype, kind, seed
):
    image = _image(np.random.default_rng(seed), height, width, channels, dtype, kind)
    target = tmp_path / f"{seed}-{height}x{width}x{channels}.png"
    size, encode_seconds, write_seconds = png.write_png_atomic(
        target, image, overwrite=True, durable=False
    )
    expected = png.encode_png(image)
    assert target.read_bytes() == expected and size == len(expected)
    assert encode_seconds >= 0 and write_seconds >= 0
    target.unlink()


def test_the_reused_buffer_never_leaks_one_files_bytes_into_the_next(tmp_path: Path):
    """Large, small, large again on one thread, and many images on threads at once: every
    file is its own image's encode_png bytes (a buffer that kept a longer file's tail, or two
    threads sharing one, would show)."""
    rng = np.random.default_rng(7)
    images = [
        rng.integers(0, 256, size=(900, 1100), dtype=np.uint8),
        np.full((5, 7), 3, dtype=np.uint8),
        rng.integers(0, 65536, size=(400, 300, 3), dtype=np.uint16),
        np.zeros((1, 1), dtype=np.uint8),
        rng.integers(0, 256, size=(900, 1100), dtype=np.uint8),
    ]
    for i, image in enumerate(images):
        png.write_png_atomic(tmp_path / f"seq{i}.png", image, overwrite=False)
        assert (tmp_path / f"seq{i}.png").read_bytes() == png.encode_png(image)

    def one(i: int) -> bool:
        image = images[i % len(images)]
        target = tmp_path / f"par{i}.png"
        png.write_png_atomic(target, image, overwrite=False, durable=False)
        return target.read_bytes() == png.encode_png(image)

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(one, range(40)))
    assert _leftovers(tmp_path) == []


def test_an_image_larger_than_the_kept_buffer_gets_its_own(tmp_path: Path):
    """A file that may exceed 64 MiB is encoded into a buffer of its own (the kept one stays
    bounded); the bytes are the same."""
    rng = np.random.default_rng(3)
    image = rng.integers(0, 256, size=(8300, 8300), dtype=np.uint8)  # noise: ~69 MB stored
    target = tmp_path / "big.png"
    size, _, _ = png.write_png_atomic(target, image, overwrite=False, durable=False)
    assert target.read_bytes() == png.encode_png(image) and size > 64 << 20
    small = np.full((10, 10), 9, dtype=np.uint8)
    png.write_png_atomic(tmp_path / "small.png", small, overwrite=False)
    assert (tmp_path / "small.png").read_bytes() == png.encode_png(small)


def test_write_png_atomic_refuses_an_existing_target_and_serves_only_its_levels(tmp_path: Path):
    image = np.arange(64, dtype=np.uint8).reshape(8, 8)
    target = tmp_path / "a.png"
    target.write_bytes(b"old")
    with pytest.raises(OutputExistsError):
        png.write_png_atomic(target, image, overwrite=False)
    assert target.read_bytes() == b"old" and _leftovers(tmp_path) == []
    for level in range(10):
        served = png.write_png_atomic(
            tmp_path / f"l{level}.png", image, level=level, overwrite=False
        )
        assert (served is not None) == png._uses_row_deflate(level)
        if served is None:
            assert not (tmp_path / f"l{level}.png").exists()


@pytest.mark.parametrize(
    ("array", "order", "served"),
    [
        (np.zeros((4, 5), np.uint8), None, True),
        (np.zeros((4, 5, 3), np.uint16), "bgr", True),
        (np.zeros((4, 5, 3), np.uint8), "rgb", True),
        (np.zeros((4, 5, 4), np.uint8), "bgr", False),
        (np.zeros((4, 5), np.float32), None, False),
    ],
)
def test_writer_encode_and_write_matches_encode_host(tmp_path: Path, array, order, served):
    """The engine's one-call path writes what encode_host + write would (channel order
    included), and declines what encode_host alone knows how to refuse."""
    from imgops.engine.files import encode_host

    array = array.copy()
    array.reshape(-1)[:: max(1, array.size // 7)] = 200
    settings = PipelineSettings()
    target = tmp_path / "o.png"
    direct = Writer(settings).encode_and_write(target, array, order)
    assert (direct is not None) == served
    if served:
        assert target.read_bytes() == encode_host(array, order, settings)
    fmt = PipelineSettings(fmt="tif")
    assert Writer(fmt).encode_and_write(tmp_path / "o.tif", array, order) is None
    assert Writer(settings).encode_and_write(None, array, order) is None
