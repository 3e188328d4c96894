"""OME-Zarr and Zarr: normvol writes NGFF 0.5/0.4 images with a pyramid and reads Zarr back;
round trips through tifffile and zarr, metadata, a corrupt chunk, an interrupted write.

Data: the hyperstack built from the fMRI sample (tests/data/volume/SOURCES.md).
`numpy_block_mean` (below) is the numpy reference the pyramid levels are checked against; the
product builds them with imgops.ops.bin."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tifffile
import torch
from click.testing import CliRunner
from test_hyperstack import hyperstack

from imgops.cli import cli

zarr = pytest.importorskip("zarr")  # the zarr extra (the test extras install it)

ZCYX_META = {"axes": "ZCYX", "spacing": 2.2, "unit": "mm", "Ranges": (0.0, 1000.0, 100.0, 600.0)}


def numpy_block_mean(x: torch.Tensor, factors) -> torch.Tensor:
    """numpy reference for imgops.ops.bin: block mean over the last dims, partial blocks
    dropped, floats exact (float64 mean, then cast), integers rounded half up."""
    a = x.numpy()
    lead = a.ndim - len(factors)
    cut = a[
        (Ellipsis, *[slice(0, (n // f) * f) for n, f in zip(a.shape[lead:], factors, strict=True)])
    ]
    shape = list(cut.shape[:lead])
    for n, f in zip(cut.shape[lead:], factors, strict=True):
        shape += [n // f, f]
    blocks = cut.reshape(shape).astype(np.float64)
    mean = blocks.mean(axis=tuple(lead + 2 * i + 1 for i in range(len(factors))))
    if np.issubdtype(a.dtype, np.integer):
        mean = np.floor(mean + 0.5)
    return torch.from_numpy(mean.astype(a.dtype))


@pytest.fixture
def zcyx(tmp_path: Path) -> Path:
    path = tmp_path / "cells.tif"
    tifffile.imwrite(path, hyperstack(), imagej=True, resolution=(0.5, 0.5), metadata=ZCYX_META)
    return path


def invoke(*args):
    return CliRunner().invoke(cli, ["normvol", *map(str, args)], catch_exceptions=False)


def _reference_pyramid(level0: np.ndarray, levels: int) -> list[np.ndarray]:
    out = [level0]
    for _ in range(levels - 1):
        out.append(numpy_block_mean(torch.from_numpy(out[-1]), (2, 2)).numpy())
    return out


@pytest.mark.parametrize("ngff", ["0.5", "0.4"])
def test_ome_zarr_with_pyramid_equals_the_tiff_output_and_its_block_means(zcyx: Path, ngff: str):
    store, tif = zcyx.with_name("cells.ome.zarr"), zcyx.with_name("cells.tif.out.tif")
    args = ("--percentile", 1, 99.8, "--chunk-mb", 0.3)
    result = invoke(zcyx, *args, "-o", store, "--pyramid", 3, "--ngff", ngff)
    assert result.exit_code == 0, result.output
    assert result.stderr.count("written") == 1 and str(store) in result.stderr
    assert invoke(zcyx, *args, "-o", tif).exit_code == 0
    level0 = tifffile.imread(tif).transpose(1, 0, 2, 3)  # NGFF order: c, z, y, x
    group = zarr.open_group(store, mode="r")
    assert group.metadata.zarr_format == (3 if ngff == "0.5" else 2)
    for level, expected in enumerate(_reference_pyramid(level0, 3)):
        array = group[str(level)]
        assert array.dtype == np.float32 and array.shape == expected.shape
        np.testing.assert_array_equal(array[...], expected)
    attrs = group.attrs.asdict()
    meta = attrs["ome"] if ngff == "0.5" else attrs
    multiscale = meta["multiscales"][0]
    assert [a["name"] for a in multiscale["axes"]] == ["c", "z", "y", "x"]
    assert multiscale["axes"][1]["unit"] == "millimeter"
    scales = [d["coordinateTransformations"][0]["scale"] for d in multiscale["datasets"]]
    assert scales == [[1.0, 2.2, 2.0, 2.0], [1.0, 2.2, 4.0, 4.0], [1.0, 2.2, 8.0, 8.0]]
    windows = [c["window"] for c in meta["omero"]["channels"]]
    assert len(windows) == 2 and all(w["start"] == pytest.approx(0.0) for w in windows)


def test_the_store_validates_as_ngff(zcyx: Path):
    models = pytest.importorskip("ome_zarr_models.v05.image")
    store = zcyx.with_name("v.ome.zarr")
    assert invoke(zcyx, "--max", 1000, "-o", store, "--pyramid", 2).exit_code == 0
    image = models.Image.from_zarr(zarr.open_group(store, mode="r"))
    assert len(image.ome_attributes.multiscales[0].datasets) == 2  # validated on load
    v04 = pytest.importorskip("ome_zarr_models.v04.image")
    old = zcyx.with_name("v4.ome.zarr")
    assert invoke(zcyx, "--max", 1000, "-o", old, "--pyramid", 2, "--ngff", "0.4").exit_code == 0
    v04.Image.from_zarr(zarr.open_group(old, mode="r"))


def test_zarr_in_tiff_out_and_a_plain_array(tmp_path: Path, zcyx: Path):
    store = tmp_path / "in.ome.zarr"
    assert invoke(zcyx, "--max", 1000, "--per", "none", "-o", store, "--pyramid", 1).exit_code == 0
    result = invoke(store, "--max", 1, "--min", 0, "-o", tmp_path / "back.tif")
    assert result.exit_code == 0, result.output
    back = tifffile.imread(tmp_path / "back.tif")
    with tifffile.TiffFile(tmp_path / "back.tif") as tif:
        assert tif.series[0].axes == "CZYX"
    np.testing.assert_array_equal(back, zarr.open_array(store / "0", mode="r")[...])
    plain = zarr.create_array(
        tmp_path / "plain.zarr",
        shape=(24, 96, 128),
        chunks=(5, 96, 128),
        dtype="uint16",
        dimension_names=["z", "y", "x"],
    )
    plain[...] = hyperstack()[:, 0]
    result = invoke(tmp_path / "plain.zarr", "--max", 4095, "--chunk-mb", 0.2)
    assert result.exit_code == 0, result.output
    out = tifffile.imread(tmp_path / "plain_norm.ome.zarr/0") if False else None
    np.testing.assert_array_equal(
        zarr.open_group(tmp_path / "plain_norm.ome.zarr", mode="r")["0"][...],
        hyperstack()[:, 0].astype(np.float32) / np.float32(4095),
    )
    assert out is None


def test_a_corrupt_chunk_is_one_error_and_no_output(tmp_path: Path):
    plain = zarr.create_array(
        tmp_path / "bad.zarr", shape=(24, 96, 128), chunks=(4, 96, 128), dtype="uint16"
    )
    plain[...] = hyperstack()[:, 0]
    chunk = tmp_path / "bad.zarr" / "c" / "3" / "0" / "0"  # planes 12..15
    chunk.write_bytes(b"\x28\xb5\x2f\xfd garbage, not zstd")
    result = invoke(tmp_path / "bad.zarr", "--max", 4095, "-o", tmp_path / "o.tif")
    assert result.exit_code == 1 and str(tmp_path / "bad.zarr") in result.stderr
    assert "cannot read planes" in result.stderr and "Traceback" not in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.zarr"]


def test_unknown_zarr_axes_are_one_error(tmp_path: Path):
    array = zarr.create_array(
        tmp_path / "q.zarr",
        shape=(2, 8, 8),
        chunks=(1, 8, 8),
        dtype="uint16",
        dimension_names=["q", "y", "x"],
    )
    array[...] = 1
    result = invoke(tmp_path / "q.zarr", "--max", 9)
    assert result.exit_code == 1 and "unknown: Q" in result.stderr


def test_an_interrupted_write_leaves_nothing_that_looks_complete(zcyx: Path, monkeypatch):
    from imgops.io import zarr_io

    seen = {}
    real = zarr_io.OmeZarrWriter._write_block
    calls = {"n": 0}

    def interrupted(self, arrays, key, block):
        calls["n"] += 1
        root = json.loads((self.path / "zarr.json").read_text())
        seen["ome_before_end"] = "ome" in root.get("attributes", {})
        seen["temp_name"] = self.path.name
        if calls["n"] == 2:  # two blocks (one per channel): stop at the second
            raise KeyboardInterrupt
        return real(self, arrays, key, block)

    monkeypatch.setattr(zarr_io.OmeZarrWriter, "_write_block", interrupted)
    target = zcyx.with_name("cut.ome.zarr")
    result = invoke(zcyx, "--max", 1000, "-o", target, "--chunk-mb", 0.2, "--pyramid", 2)
    assert result.exit_code != 0  # click turns the KeyboardInterrupt into "Aborted!"
    assert seen == {"ome_before_end": False, "temp_name": seen["temp_name"]}
    assert seen["temp_name"].startswith(".cells.imgops-tmp-") or ".imgops-tmp-" in seen["temp_name"]
    assert sorted(p.name for p in zcyx.parent.iterdir()) == ["cells.tif"]


def test_overwrite_replaces_a_store_and_refuses_without(zcyx: Path):
    store = zcyx.with_name("s.ome.zarr")
    assert invoke(zcyx, "--max", 1000, "-o", store, "--pyramid", 1).exit_code == 0
    again = invoke(zcyx, "--max", 1000, "-o", store, "--pyramid", 1)
    assert again.exit_code == 1 and "exists" in again.stderr
    assert invoke(zcyx, "--max", 500, "-o", store, "--pyramid", 1, "--overwrite").exit_code == 0
    assert float(zarr.open_group(store, mode="r")["0"][...].max()) > 1.5
    assert sorted(p.name for p in zcyx.parent.iterdir()) == ["cells.tif", "s.ome.zarr"]


def _dead_pid() -> int:
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_later_run_removes_stale_temporary_stores_of_dead_runs(zcyx: Path):
    import os
    import time

    folder = zcyx.parent
    dead = _dead_pid()
    names = {
        "stale": f".old.ome.imgops-tmp-{dead}-0123abcd.zarr",  # a killed run's store: removed
        "young": f".new.ome.imgops-tmp-{dead}-4567abcd.zarr",  # dead, but touched just now: kept
        "alive": f".live.ome.imgops-tmp-{os.getppid()}-89abcdef.zarr",  # a live writer: kept
        "file": f".f.imgops-tmp-{dead}-fedcba98.zarr",  # not a folder: not this sweep's
        "user": "mine.zarr",  # not a temporary name: never touched
    }
    for kind, name in names.items():
        path = folder / name
        if kind == "file":
            path.write_bytes(b"x")
        else:
            (path / "0").mkdir(parents=True)
            (path / "zarr.json").write_text("{}")
        if kind != "young":
            for p in (path / "0", path / "zarr.json", path):
                if p.exists():
                    os.utime(p, (time.time() - 3600, time.time() - 3600))
    result = invoke(zcyx, "--max", 1000, "-o", folder / "out.ome.zarr", "--pyramid", 1)
    assert result.exit_code == 0, result.output
    left = {p.name for p in folder.iterdir()}
    assert names["stale"] not in left
    assert {names[k] for k in ("young", "alive", "file", "user")} <= left
    assert "out.ome.zarr" in left and not any(
        ".out.ome.imgops-tmp-" in name for name in left
    )  # its own temporary store became the output


def test_blocks_written_at_once_give_the_same_store_bytes_as_one_at_a_time(zcyx: Path):
    from imgops.io import zarr_io
    from imgops.io.volumes import open_volume

    def store_bytes(store: Path) -> dict[str, bytes]:
        return {str(p.relative_to(store)): p.read_bytes() for p in store.rglob("*") if p.is_file()}

    stores = {}
    with open_volume(zcyx) as reader:
        planes = reader.read(0, reader.info.depth).astype(np.float32) / np.float32(1000)
        for at_once in (1, 3):
            store = zcyx.with_name(f"s{at_once}.ome.zarr")
            writer = zarr_io.OmeZarrWriter(
                store, reader.info, "float32", levels=3, chunk_bytes=1, blocks_at_once=at_once
            )
            assert writer.chunk_depth == 1 and writer.blocks_at_once == at_once
            writer.write_pages(iter(planes))
            stores[at_once] = store_bytes(store)
    assert len([k for k in stores[1] if "/c/" in k]) >= 3 * reader.info.depth  # every block
    assert stores[1] == stores[3]


def _tiled_scan(planes: int, height: int, width: int) -> np.ndarray:
    """The fMRI scan's planes repeated across Y and X (cut to height x width), Z repeated."""
    scan = hyperstack()[:, 0]
    reps = (-(-planes // scan.shape[0]), -(-height // scan.shape[1]), -(-width // scan.shape[2]))
    return np.tile(scan, reps)[:planes, :height, :width]


@pytest.mark.parametrize("axes", ["ZYX", "ZCYX"])
def test_chunks_of_planes_larger_than_a_tile_equal_the_numpy_reference(tmp_path: Path, axes):
    # 1100 x 700: level 0 is 3 x 2 chunks (partial at the edges), level 1 (550 x 350) 2 x 1;
    # 9 planes: blocks of 4, 4 and 1 (cz = 4 for float32 512 x 512 tiles)
    stack = _tiled_scan(9, 1100, 700)
    if axes == "ZCYX":
        stack = np.stack([stack, stack[::-1] // 2], axis=1)
    src = tmp_path / "big.tif"
    tifffile.imwrite(src, stack, imagej=True, metadata={"axes": axes})
    store = tmp_path / "big.ome.zarr"
    result = invoke(src, "--max", 4095, "--per", "none", "-o", store, "--pyramid", 3)
    assert result.exit_code == 0, result.output
    level0 = stack.astype(np.float32) / np.float32(4095)
    if axes == "ZCYX":
        level0 = level0.transpose(1, 0, 2, 3)
    group = zarr.open_group(store, mode="r")
    assert group["0"].chunks[-3:] == (4, 512, 512)
    for level, expected in enumerate(_reference_pyramid(level0, 3)):
        np.testing.assert_array_equal(group[str(level)][...], expected)


_MEMORY_PROBE = """
import os, sys, threading, time
import numpy as np
from imgops.volume_files import normalize_file
src, tiny, out = sys.argv[1:4]
page = os.sysconf("SC_PAGE_SIZE")
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page
normalize_file(tiny, out + ".warm.ome.zarr", max=4095)  # zarr, codecs and threads loaded
base = rss()
peak = [base]
done = threading.Event()
def sample():
    while not done.is_set():
        peak[0] = max(peak[0], rss())
        time.sleep(0.002)
thread = threading.Thread(target=sample, daemon=True)
thread.start()
normalize_file(src, out, max=4095, chunk_mb=16)  # the CUDA share (the CPU takes more)
done.set()
thread.join()
print(peak[0] - base)
"""


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads /proc/self/statm")
def test_an_ome_zarr_write_holds_little_memory_beyond_the_start(tmp_path: Path):
    """The data part of the peak RSS (the process's RSS before the write subtracted) of a
    96 x 1024 x 1024 uint16 stack (192 MiB in, 384 MiB float32 out) written as OME-Zarr with
    its pyramid: about 90 MiB measured (the writer's blocks, the engine's planes, the chunks
    compressing), with the engine share of a CUDA run (chunk_mb=16; the CPU device takes more);
    265-275 MiB before the writer stored chunk by chunk with the default share (2-core machine)."""
    import subprocess
    import sys

    src, tiny = tmp_path / "big.tif", tmp_path / "tiny.tif"
    tifffile.imwrite(src, _tiled_scan(96, 1024, 1024), imagej=True, metadata={"axes": "ZYX"})
    tifffile.imwrite(tiny, _tiled_scan(4, 64, 64), imagej=True, metadata={"axes": "ZYX"})
    probe = subprocess.run(
        [sys.executable, "-c", _MEMORY_PROBE, str(src), str(tiny), str(tmp_path / "o.ome.zarr")],
        capture_output=True,
        text=True,
    )
    assert probe.returncode == 0, probe.stderr[-2000:]
    grown = int(probe.stdout.split()[-1])
    assert grown < 150 * 2**20, f"{grown / 2**20:.0f} MiB"
