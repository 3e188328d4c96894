"""`imgops gray` and `imgops normvol` with `--scheduler`: a real 2-process LocalCluster per run,
against the same commands without it (bytes and arrays identical), and the one-line errors
(an unreachable scheduler, imgops[dask] missing). Each test is bounded in time.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import socket
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import tifffile
from click.testing import CliRunner

from imgops.cli import cli
from imgops.io.atomic import TEMP_MARKER

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
PHOTOS = [
    "coffee_rgb.png",
    "rocket_baseline_rgb.jpg",
    "room_rgb16.png",
    "tulips_rgba.png",
    "camera_gray.png",
    "light_palette_64px.png",
]
TIME_LIMIT_S = 100
UNREACHABLE = "tcp://127.0.0.1:9"  # the discard port: nothing listens there


@pytest.fixture(autouse=True)
def _bounded_time():
    def expire(signum, frame):
        raise TimeoutError(f"test ran past {TIME_LIMIT_S} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(TIME_LIMIT_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def invoke(*args: object):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def _error_lines(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip()]


def _temporaries(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if TEMP_MARKER in p.name]


def _photo_folder(tmp_path: Path, copies: int) -> Path:
    """Copies of the sample photos, and one truncated PNG the engine fails on."""
    folder = tmp_path / "photos"
    folder.mkdir()
    for i in range(copies):
        for name in PHOTOS:
            source = SAMPLES / name
            shutil.copy(source, folder / f"{source.stem}_{i}{source.suffix}")
    (folder / "bad.png").write_bytes((SAMPLES / "coffee_rgb.png").read_bytes()[:300])
    return folder


@contextlib.contextmanager
def _port_taken(port: int):
    """Holds `port` on localhost while inside (if nobody else already does)."""
    with socket.socket() as sock:
        with contextlib.suppress(OSError):
            sock.bind(("", port))
            sock.listen()
        yield


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_gray_on_local_2_writes_the_single_process_bytes_and_reports_the_bad_file_once(tmp_path):
    pytest.importorskip("distributed")
    photos = _photo_folder(tmp_path, copies=3)
    single = invoke("gray", photos, "-d", tmp_path / "single", "--device", "cpu")
    assert single.exit_code == 1
    stats = tmp_path / "stats.json"
    args = ("gray", photos, "-d", tmp_path / "dist", "--device", "cpu", "--stats-json", stats)
    # distributed's default HTTP port, busy: no warning may leak onto the user's stderr
    with _port_taken(8787), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = invoke(*args, "--scheduler", "local:2")
    assert not [w for w in caught if "distributed" in w.filename], [str(w) for w in caught]
    assert result.exit_code == 1, result.stderr
    lines = _error_lines(result)
    assert len(lines) == 2, lines  # the bad file, the summary: nothing from dask
    assert [line for line in lines if "bad.png" in line] == [
        line for line in _error_lines(single) if "bad.png" in line
    ]
    assert len([line for line in lines if "bad.png" in line]) == 1
    assert lines[-1] == f"{3 * len(PHOTOS)} written, 0 skipped, 1 failed"
    reference = _files(tmp_path / "single")
    assert len(reference) == 3 * len(PHOTOS)
    assert _files(tmp_path / "dist") == reference  # byte-identical, nothing for bad.png
    report = json.loads(stats.read_text())
    assert report["scheduler"] == "local:2"
    assert [f["input"] for f in report["failures"]] == [str(photos / "bad.png")]
    assert not _temporaries(tmp_path)


def test_gray_luma_stored_on_local_2_writes_the_single_process_bytes(tmp_path):
    """--luma stored reaches the cluster's workers: the same luma planes as in one process,
    which are not the exact luma."""
    pytest.importorskip("distributed")
    photos = tmp_path / "photos"
    photos.mkdir()
    for name in ("rocket_baseline_rgb.jpg", "coffee_rgb.png"):
        shutil.copy(SAMPLES / name, photos / name)
    for folder, extra in (("exact", ()), ("single", ()), ("dist", ("--scheduler", "local:2"))):
        luma = "exact" if folder == "exact" else "stored"
        result = invoke("gray", photos, "-d", tmp_path / folder, "--luma", luma, *extra)
        assert result.exit_code == 0, result.stderr
    assert _files(tmp_path / "dist") == _files(tmp_path / "single")
    exact, stored = _files(tmp_path / "exact"), _files(tmp_path / "single")
    assert exact["coffee_rgb.png"] == stored["coffee_rgb.png"]  # no stored plane in a PNG
    assert exact["rocket_baseline_rgb.png"] != stored["rocket_baseline_rgb.png"]


def test_gray_ctrl_c_on_the_cluster_leaves_only_complete_outputs(tmp_path, monkeypatch):
    pytest.importorskip("distributed")
    from imgops import report as report_module

    photos = _photo_folder(tmp_path, copies=4)
    assert invoke("gray", photos, "-d", tmp_path / "single", "--device", "cpu").exit_code == 1
    reference = _files(tmp_path / "single")
    original = report_module.Report.add
    seen = []

    def interrupt_after_three(self, result):
        seen.append(result)
        if len(seen) == 3:
            raise KeyboardInterrupt
        original(self, result)

    monkeypatch.setattr(report_module.Report, "add", interrupt_after_three)
    out = tmp_path / "dist"
    result = invoke("gray", photos, "-d", out, "--device", "cpu", "--scheduler", "local:2")
    assert result.exit_code == 130
    assert "interrupted:" in _error_lines(result)[-1]
    written = _files(out)
    assert len(written) < len(reference)  # stopped early (partitions not started: cancelled)
    assert all(reference[name] == data for name, data in written.items())  # none half-written
    assert not _temporaries(tmp_path)


def _zarr_inputs(folder: Path) -> list[Path]:
    """A real scan as a plain zarr array, and a fresh random OME-Zarr 0.4 image large enough
    for a 3-level pyramid, with a physical scale."""
    zarr = pytest.importorskip("zarr")
    folder.mkdir()
    scan = tifffile.imread(SAMPLES / "mri_dwi_b0_u16.tif")
    plain = folder / "dwi.zarr"
    zarr.create_array(str(plain), shape=scan.shape, chunks=(3, 64, 50), dtype=scan.dtype)[...] = (
        scan
    )
    data = np.random.default_rng().normal(1200, 300, (4, 601, 531)).clip(0, 4095)
    ome = folder / "cells.ome.zarr"
    group = zarr.open_group(str(ome), mode="w", zarr_format=2)
    group.create_array("s0", shape=data.shape, chunks=(2, 128, 100), dtype="uint16")[...] = data
    axes = [{"name": a, "type": "space", "unit": "micrometer"} for a in "zyx"]
    dataset = {
        "path": "s0",
        "coordinateTransformations": [{"type": "scale", "scale": [2, 0.5, 0.5]}],
    }
    group.attrs["multiscales"] = [{"version": "0.4", "axes": axes, "datasets": [dataset]}]
    return [plain, ome]


def _assert_same_store(left: Path, right: Path) -> int:
    """Same NGFF attributes (imgops' provenance aside) and every level equal bit for bit;
    returns the number of levels."""
    import zarr

    a, b = zarr.open_group(str(left), mode="r"), zarr.open_group(str(right), mode="r")
    attrs_a = {k: v for k, v in dict(a.attrs).items() if k != "imgops"}
    attrs_b = {k: v for k, v in dict(b.attrs).items() if k != "imgops"}
    assert attrs_a == attrs_b
    names = sorted(name for name, _ in a.arrays())
    assert names == sorted(name for name, _ in b.arrays())
    for name in names:
        x, y = a[name][...], b[name][...]
        assert x.dtype == y.dtype == np.float32 and x.shape == y.shape
        assert x.tobytes() == y.tobytes(), name
    return len(names)


def test_normvol_zarr_on_local_2_equals_the_single_process_ome_zarr(tmp_path):
    pytest.importorskip("distributed")
    folder = tmp_path / "in"
    plain, ome = _zarr_inputs(folder)
    shutil.copy(SAMPLES / "mri_anat_shift610_zlib.tif", folder / "anat.tif")
    options = ("--percentile", 1, 99.8, "--eps", 0.5, "--device", "cpu")  # CSBDeep eps counts
    single = invoke("normvol", plain, ome, "-d", tmp_path / "single", *options)
    assert single.exit_code == 0, single.stderr
    result = invoke("normvol", plain, ome, folder / "anat.tif", *options, "--scheduler", "local:2")
    assert result.exit_code == 1, result.stderr
    lines = _error_lines(result)
    anat = [line for line in lines if "anat.tif" in line]
    assert len(anat) == 1 and "--scheduler reads zarr" in anat[0]
    assert lines[-1] == "normvol: 2 written, 0 skipped, 1 failed"
    warnings = [line for line in lines if "warning" in line]  # values outside [0, 1], counted
    assert warnings and warnings == [line for line in _error_lines(single) if "warning" in line]
    # no -o: <stem>_norm.ome.zarr beside each input, as without --scheduler
    assert _assert_same_store(tmp_path / "single" / "dwi.ome.zarr", folder / "dwi_norm.ome.zarr")
    levels = _assert_same_store(
        tmp_path / "single" / "cells.ome.zarr", folder / "cells_norm.ome.zarr"
    )
    assert levels == 3
    assert not (folder / "anat_norm.tif").exists() and not _temporaries(tmp_path)


def test_normvol_default_output_of_a_zarr_input_is_stem_norm_ome_zarr(tmp_path):
    zarr = pytest.importorskip("zarr")
    shutil.copy(SAMPLES / "mri_anat_shift610_zlib.tif", tmp_path / "anat.tif")
    assert invoke("normvol", tmp_path / "anat.tif", "--max", 4095, "-q").exit_code == 0
    expected = tifffile.imread(tmp_path / "anat_norm.tif")
    scan = tifffile.imread(tmp_path / "anat.tif")
    for name, stem in (("scan.zarr", "scan"), ("head.ome.zarr", "head")):
        store = tmp_path / name
        array = zarr.create_array(str(store), shape=scan.shape, chunks=(5, 41, 33), dtype="u2")
        array[...] = scan
        assert invoke("normvol", store, "--max", 4095, "-q").exit_code == 0
        out = zarr.open_group(str(tmp_path / f"{stem}_norm.ome.zarr"), mode="r")
        assert out["0"][...].tobytes() == expected.tobytes()


@pytest.mark.parametrize("command", ["gray", "normvol"])
def test_an_unreachable_scheduler_is_one_line_and_exit_1(tmp_path, command):
    pytest.importorskip("distributed")
    if command == "gray":
        photos = _photo_folder(tmp_path, copies=1)
        args = ("gray", photos, "-d", tmp_path / "out")
    else:
        args = ("normvol", _zarr_inputs(tmp_path / "in")[0])
    result = invoke(*args, "--scheduler", UNREACHABLE)
    assert result.exit_code == 1
    lines = _error_lines(result)
    assert len(lines) == 1, lines
    assert lines[0].startswith("imgops: error: cannot reach the Dask scheduler at " + UNREACHABLE)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.parametrize("command", ["gray", "normvol"])
def test_dask_missing_names_the_extra(tmp_path, monkeypatch, command):
    if command == "gray":
        args = ("gray", _photo_folder(tmp_path, copies=1), "-d", tmp_path / "out")
    else:
        store = tmp_path / "in.zarr"
        store.mkdir()
        args = ("normvol", store)
    for name in ("dask", "dask.array", "distributed", "zarr"):
        monkeypatch.setitem(sys.modules, name, None)  # `import name` raises ImportError
    result = invoke(*args, "--scheduler", "local:2")
    assert result.exit_code == 1
    lines = _error_lines(result)
    assert len(lines) == 1, lines
    assert lines[0].startswith("imgops: error: ") and "imgops[dask]" in lines[0]
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_scheduler_with_stdin_or_stdout_is_a_usage_error(tmp_path):
    result = invoke("gray", SAMPLES / "coffee_rgb.png", "-o", "-", "--scheduler", "local:2")
    assert result.exit_code == 2
    result = invoke("gray", "-d", tmp_path, "--scheduler", "nonsense", SAMPLES / "coffee_rgb.png")
    assert result.exit_code == 2 and "unknown scheduler" in result.stderr


def test_ome_chunks_are_the_single_process_tiles_where_the_blocks_allow():
    da = pytest.importorskip("dask.array")
    from imgops.dask.volume import ome_chunks

    blocks = da.zeros((64, 1024, 2048), chunks=(8, 1024, 2048), dtype="float32")
    assert ome_chunks(blocks, "ZYX", "float32") == (4, 512, 512)  # as imgops.io.zarr_io
    odd = da.zeros((2, 9, 601, 531), chunks=(1, 3, 600, 531), dtype="float32")
    chunks = ome_chunks(odd, "CZYX", "float32")
    assert chunks == (1, 3, 300, 177)  # divisors: every block still writes whole chunks
    assert all(b % c == 0 for b, c in zip((1, 3, 600, 531), chunks, strict=True))
