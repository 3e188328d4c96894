"""The bad-input matrix (issue 6): every bad input ends in one clear line and loses nothing.

Each case runs `imgops gray` or `imgops normvol` and asserts: the exit status (1 for a bad
file, 2 for usage), exactly one error line naming the file and the problem, no traceback, no
output file and no temporary file (or the old output untouched, byte for byte). The inputs
that must work (1x1, 1xN, extreme aspect ratios, odd names) are checked against the formula.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
import tifffile
from click.testing import CliRunner

from imgops.cli import cli

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
STACK = "mri_dwi_b0_u16.tif"


def run(*args: object):
    """Runs the CLI in-process; an unexpected exception fails the test (never swallowed)."""
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` with its bytes (to prove nothing changed)."""
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def assert_clean_failure(result, status: int, *needles: str) -> None:
    """Exit `status`; one error line containing every needle; no traceback."""
    assert result.exit_code == status, (result.exit_code, result.output)
    assert "Traceback" not in result.output
    if status == 1:
        lines = [line for line in result.stderr.splitlines() if line.startswith("imgops: error:")]
    else:  # click's usage errors: "Usage: ...", "Try ...", "Error: ..."
        lines = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def no_temporaries(folder: Path) -> bool:
    return not any(".imgops-tmp-" in p.name for p in folder.rglob("*"))


def luma(bgr: np.ndarray) -> np.ndarray:
    wide = bgr.astype(np.int64)
    return ((299 * wide[..., 2] + 587 * wide[..., 1] + 114 * wide[..., 0] + 500) // 1000).astype(
        bgr.dtype
    )


@pytest.fixture
def work(tmp_path: Path) -> Path:
    shutil.copy(SAMPLES / "coffee_rgb.png", tmp_path / "good.png")
    shutil.copy(SAMPLES / STACK, tmp_path / "stack.tif")
    return tmp_path


# ------------------------------------------------------------------ gray: bad input files


def _truncated(name: str, fraction: float):
    def make(path: Path) -> None:
        data = (SAMPLES / name).read_bytes()
        path.write_bytes(data[: int(len(data) * fraction)])

    return make


def _wrong_magic(path: Path) -> None:
    data = bytearray((SAMPLES / "coffee_rgb.png").read_bytes())
    data[:8] = b"\x00NG\r\n\x1a\n\x00"
    path.write_bytes(bytes(data))


def _png_bomb(path: Path) -> None:
    """A few hundred bytes whose IHDR claims 100000 x 100000 pixels."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body)
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", 100_000, 100_000, 8, 2, 0, 0, 0)
    body = zlib.compress(b"\x00" * 300_001 * 2)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", body) + chunk(b"IEND", b"")
    )


def _tiff_bomb(path: Path, pages: int = 1, compression=None) -> None:
    """A tiny TIFF whose tags claim slices of 100000 x 100000 pixels."""
    tifffile.imwrite(
        path, np.zeros((pages, 4, 4), np.uint16), photometric="minisblack", compression=compression
    )
    with tifffile.TiffFile(path, mode="r+") as tif:
        for page in tif.pages:
            page.tags["ImageWidth"].overwrite(100_000)
            page.tags["ImageLength"].overwrite(100_000)
            page.tags["RowsPerStrip"].overwrite(100_000)


GRAY_BAD_FILES = {
    "zero_bytes": (lambda p: p.write_bytes(b""), "x.png", "empty file (0 bytes)"),
    "truncated_jpeg": (
        _truncated("rocket_baseline_rgb.jpg", 0.5),
        "x.jpg",
        "truncated JPEG",
    ),
    "truncated_progressive_jpeg": (
        _truncated("flower_progressive_3mp.jpg", 0.3),
        "x.jpg",
        "truncated JPEG",
    ),
    "truncated_png": (_truncated("coffee_rgb.png", 0.5), "x.png", "truncated PNG"),
    "png_cut_inside_header": (_truncated("coffee_rgb.png", 0.00004), "x.png", "PNG"),
    "text_named_jpg": (lambda p: p.write_text("not a picture\n" * 9), "x.jpg", "not an image"),
    "wrong_magic": (_wrong_magic, "x.png", "not an image"),
    "png_decompression_bomb": (_png_bomb, "x.png", "100000x100000"),
    "tiff_decompression_bomb": (_tiff_bomb, "x.tif", "100000x100000"),
}


@pytest.mark.parametrize("kind", sorted(GRAY_BAD_FILES))
def test_gray_bad_file_is_one_line_and_no_output(work: Path, kind: str):
    make, name, problem = GRAY_BAD_FILES[kind]
    source = work / name
    make(source)
    before = snapshot(work)
    result = run("gray", source, "-o", work / "out.png")
    assert_clean_failure(result, 1, str(source), problem)
    assert snapshot(work) == before  # no output, no temporary file


def test_gray_bad_file_with_overwrite_leaves_the_old_output_byte_for_byte(work: Path):
    (work / "bad.jpg").write_bytes((SAMPLES / "rocket_baseline_rgb.jpg").read_bytes()[:5000])
    assert run("gray", work / "good.png", "-o", work / "out.png").exit_code == 0
    before = snapshot(work)
    result = run("gray", work / "bad.jpg", "-o", work / "out.png", "--overwrite")
    assert_clean_failure(result, 1, str(work / "bad.jpg"), "truncated JPEG")
    assert snapshot(work) == before


def test_gray_missing_file(work: Path):
    result = run("gray", work / "absent.png", "-o", work / "out.png")
    assert_clean_failure(result, 1, str(work / "absent.png"), "No such file")
    assert not (work / "out.png").exists()


def test_gray_folder_where_a_file_list_is_expected(work: Path):
    result = run("gray", "--files-from", work, "-d", work / "out")
    assert_clean_failure(result, 2, "--files-from", "directory")
    assert not (work / "out").exists()


# ------------------------------------------------------------- gray: tiny and extreme shapes


@pytest.mark.parametrize(
    "shape",
    [(1, 1, 3), (1, 1), (1, 7, 3), (9, 1, 3), (1, 100_000, 3), (50_000, 2, 3), (3, 1, 3)],
    ids=lambda s: "x".join(map(str, s)),
)
def test_gray_tiny_and_extreme_shapes_are_exact(tmp_path: Path, shape):
    rng = np.random.default_rng(sum(shape))
    pixels = rng.integers(0, 256, shape, dtype=np.uint8)
    source, target = tmp_path / "in.png", tmp_path / "out.png"
    assert cv2.imwrite(str(source), pixels)
    result = run("gray", source, "-o", target)
    assert result.exit_code == 0, result.output
    written = cv2.imread(str(target), cv2.IMREAD_UNCHANGED)
    expected = pixels if pixels.ndim == 2 else luma(pixels)
    np.testing.assert_array_equal(written, expected)


def test_gray_sixteen_bit_one_pixel_is_exact(tmp_path: Path):
    pixels = np.array([[[65535, 1, 40000]]], np.uint16)
    assert cv2.imwrite(str(tmp_path / "p.png"), pixels)
    assert run("gray", tmp_path / "p.png", "-o", tmp_path / "o.png").exit_code == 0
    written = cv2.imread(str(tmp_path / "o.png"), cv2.IMREAD_UNCHANGED)
    assert written.dtype == np.uint16 and written.tolist() == luma(pixels).tolist()


# ------------------------------------------------------------------------ gray: outputs


def test_gray_output_folder_does_not_exist(work: Path):
    target = work / "missing" / "out.png"
    result = run("gray", work / "good.png", "-o", target)
    assert_clean_failure(result, 1, str(target), "No such file or directory")
    assert not (work / "missing").exists() and no_temporaries(work)


def test_gray_output_folder_is_a_file(work: Path):
    (work / "plain").write_text("a file, not a folder")
    target = work / "plain" / "out.png"
    result = run("gray", work / "good.png", "-o", target)
    assert_clean_failure(result, 1, str(target), "Not a directory")
    assert (work / "plain").read_text() == "a file, not a folder"


def test_gray_output_folder_not_writable(work: Path):
    locked = work / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("running as root: permission bits do not stop writes (see the cases above)")
        result = run("gray", work / "good.png", "-o", locked / "out.png")
        assert_clean_failure(result, 1, str(locked / "out.png"), "Permission denied")
        assert list(locked.iterdir()) == []
    finally:
        locked.chmod(0o755)


def test_gray_output_equal_to_input(work: Path):
    before = snapshot(work)
    result = run("gray", work / "good.png", "-o", work / "good.png", "--overwrite")
    assert_clean_failure(result, 2, "would overwrite its input")
    assert snapshot(work) == before


def test_gray_output_dir_equal_to_input_folder_never_overwrites(work: Path):
    before = snapshot(work)
    result = run("gray", work / "good.png", "-d", work, "--format", "png", "--overwrite")
    assert_clean_failure(result, 2, "would overwrite an input")
    assert snapshot(work) == before


def test_gray_output_path_is_a_directory(work: Path):
    (work / "out.png").mkdir()
    result = run("gray", work / "good.png", "-o", work / "out.png")
    assert_clean_failure(result, 2, "is a directory")
    assert list((work / "out.png").iterdir()) == []


def test_gray_spaces_and_non_ascii_names(tmp_path: Path):
    folder = tmp_path / "fotos del año"
    folder.mkdir()
    shutil.copy(SAMPLES / "rocket_baseline_rgb.jpg", folder / "cohete ñ 火箭.jpg")
    (folder / "roto ü.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    result = run("gray", folder, "-d", tmp_path / "salida é")
    assert_clean_failure(result, 1, str(folder / "roto ü.png"), "PNG")
    written = cv2.imdecode(
        np.fromfile(tmp_path / "salida é" / "cohete ñ 火箭.png", np.uint8), cv2.IMREAD_UNCHANGED
    )
    source = cv2.imread(str(SAMPLES / "rocket_baseline_rgb.jpg"), cv2.IMREAD_COLOR)
    np.testing.assert_array_equal(written, luma(source))
    assert sorted(p.name for p in (tmp_path / "salida é").iterdir()) == ["cohete ñ 火箭.png"]


# ---------------------------------------------------------------- normvol: bad input files


def _inconsistent(path: Path) -> None:
    with tifffile.TiffWriter(path) as writer:
        writer.write(np.zeros((10, 10), np.uint16))
        writer.write(np.zeros((5, 10), np.uint16))


NORMVOL_BAD_FILES = {
    "missing": (lambda p: None, "No such file"),
    "zero_bytes": (lambda p: p.write_bytes(b""), "not a readable TIFF"),
    "png_named_tif": (lambda p: shutil.copy(SAMPLES / "coffee_rgb.png", p), "not a readable TIFF"),
    "text_named_tif": (lambda p: p.write_text("II* but not really\n"), "not a readable TIFF"),
    "float64": (
        lambda p: tifffile.imwrite(p, np.zeros((3, 8, 8)), photometric="minisblack"),
        "float64",
    ),
    "complex64": (
        lambda p: tifffile.imwrite(p, np.zeros((3, 8, 8), np.complex64), photometric="minisblack"),
        "complex64",
    ),
    # 4-D and 5-D ImageJ hyperstacks are valid input now (tests/test_hyperstack.py).
    "inconsistent_pages": (_inconsistent, "pages of different shapes"),
    "bomb_uncompressed": (_tiff_bomb, "100000x100000"),
    "bomb_zlib": (lambda p: _tiff_bomb(p, pages=3, compression="zlib"), "100000x100000"),
    "truncated_stack": (
        lambda p: p.write_bytes((SAMPLES / STACK).read_bytes()[:100_000]),
        "truncated",
    ),
}


@pytest.mark.parametrize("kind", sorted(NORMVOL_BAD_FILES))
def test_normvol_bad_file_is_one_line_and_no_output(work: Path, kind: str):
    make, problem = NORMVOL_BAD_FILES[kind]
    source = work / f"{kind}.tif"
    make(source)
    before = snapshot(work)
    result = run("normvol", source, "-o", work / "out.tif", "--max", 100)
    assert_clean_failure(result, 1, str(source), problem)
    assert snapshot(work) == before


def test_normvol_folder_without_stacks_is_an_error(work: Path):
    empty = work / "empty"
    empty.mkdir()
    result = run("normvol", empty, "-d", work / "out", "--max", 9)
    assert_clean_failure(result, 1, str(empty), "no image files found")
    assert not (work / "out").exists() or not any((work / "out").iterdir())


def test_normvol_bad_input_with_overwrite_leaves_the_old_output(work: Path):
    (work / "cut.tif").write_bytes((SAMPLES / STACK).read_bytes()[:150_000])
    assert run("normvol", work / "stack.tif", "-o", work / "out.tif", "--max", 9).exit_code == 0
    before = snapshot(work)
    result = run("normvol", work / "cut.tif", "-o", work / "out.tif", "--max", 9, "--overwrite")
    assert_clean_failure(result, 1, str(work / "cut.tif"), "truncated")
    assert snapshot(work) == before


# ------------------------------------------------------------------ normvol: bad arguments


@pytest.mark.parametrize(
    "args,problem",
    [
        (["--max", "0"], "--max 0 must be greater than --min"),
        (["--max", "5", "--min", "9"], "--max 5 must be greater than --min 9"),
        (["--max", "nan"], "finite"),
        (["--max", "inf"], "finite"),
        (["--min", "-inf"], "finite"),
        (["--max", "1e999"], "finite"),
        (["--percentile", "nan", "99"], "0 <= LO < HI <= 100"),
        (["--percentile", "1", "inf"], "0 <= LO < HI <= 100"),
        (["--chunk-mb", "nan"], "positive"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else "",
)
def test_normvol_bad_numbers_are_usage_errors(work: Path, args, problem):
    before = snapshot(work)
    result = run("normvol", work / "stack.tif", *args)
    assert_clean_failure(result, 2, problem)
    assert snapshot(work) == before


# ------------------------------------------------------------------------ normvol: outputs


def test_normvol_missing_output_folder_is_created(work: Path):
    # The shared planner creates output folders (as -d and -r need), for -o too.
    target = work / "missing" / "out.tif"
    result = run("normvol", work / "stack.tif", "-o", target, "--max", 9)
    assert result.exit_code == 0, result.output
    assert target.is_file()


def test_normvol_output_folder_is_a_file(work: Path):
    (work / "plain").write_text("x")
    target = work / "plain" / "out.tif"
    result = run("normvol", work / "stack.tif", "-o", target, "--max", 9)
    assert_clean_failure(result, 1, str(work / "plain"), "is a file")


def test_normvol_output_equal_to_input(work: Path):
    before = snapshot(work)
    result = run("normvol", work / "stack.tif", "-o", work / "stack.tif", "--overwrite")
    assert_clean_failure(result, 2, "would overwrite its input")
    assert snapshot(work) == before


def test_normvol_output_path_is_a_directory(work: Path):
    (work / "out.tif").mkdir()
    result = run("normvol", work / "stack.tif", "-o", work / "out.tif", "--max", 9)
    assert_clean_failure(result, 2, "is a directory")
    assert list((work / "out.tif").iterdir()) == []


def test_normvol_spaces_and_non_ascii_names(tmp_path: Path):
    folder = tmp_path / "escáner 3d"
    folder.mkdir()
    shutil.copy(SAMPLES / STACK, folder / "cerebro ü 脑.tif")
    (folder / "dañado é.tif").write_bytes(b"II*\x00garbage")
    result = run("normvol", folder / "cerebro ü 脑.tif", folder / "dañado é.tif", "--max", 4095)
    assert_clean_failure(result, 1, str(folder / "dañado é.tif"), "holds no images")
    out = tifffile.imread(folder / "cerebro ü 脑_norm.tif")
    expected = tifffile.imread(SAMPLES / STACK).astype(np.float32) / np.float32(4095)
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-7)
    assert no_temporaries(tmp_path)


def test_one_by_n_stack_normalises_exactly(tmp_path: Path):
    data = np.arange(1, 8, dtype=np.uint16).reshape(1, 7)
    tifffile.imwrite(tmp_path / "row.tif", data, photometric="minisblack")
    result = run("normvol", tmp_path / "row.tif", "--max", 7)
    assert result.exit_code == 0, result.output
    out = tifffile.imread(tmp_path / "row_norm.tif")
    np.testing.assert_array_equal(out.reshape(data.shape), data.astype(np.float32) / np.float32(7))
