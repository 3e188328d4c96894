"""`imgops gray` end to end: click's CliRunner and real subprocesses, on the real sample files.

Every output is checked against the exact integer formula and within 1 of OpenCV and Pillow.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
from click.testing import CliRunner
from helpers_gray import (
    COLOUR_SAMPLES,
    GRAY_SAMPLES,
    IMAGE_SAMPLES,
    SAMPLES,
    SMALL,
    assert_gray_matches,
    decode_bytes,
    error_lines,
    expected_gray,
    read_output,
    run_imgops,
)

from imgops.cli import cli
from imgops.commands import gray as gray_command
from imgops.io import images


def invoke(*args: str, input: bytes | str | None = None):
    """Runs `imgops gray ARGS` in-process; stdout and stderr kept apart."""
    return CliRunner().invoke(cli, ["gray", *args], input=input, catch_exceptions=False)


@pytest.fixture
def work(tmp_path):
    """A folder with copies of a few small samples."""
    for name in SMALL:
        shutil.copy(SAMPLES / name, tmp_path / name)
    return tmp_path


def copy_samples(folder, names):
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copy(SAMPLES / name, folder / name)


# ------------------------------------------------------------------------- single files


def test_one_file_with_output(work):
    result = invoke(str(work / "coffee_rgb.png"), "-o", str(work / "out.png"), "--device", "cpu")
    assert result.exit_code == 0, result.stderr
    assert_gray_matches(read_output(work / "out.png"), SAMPLES / "coffee_rgb.png")
    assert result.stderr.strip() == "1 written, 0 skipped, 0 failed"
    assert result.stdout == ""


def test_default_output_is_stem_gray_png_beside_the_input(work):
    result = invoke(str(work / "rocket_baseline_rgb.jpg"))
    assert result.exit_code == 0, result.stderr
    assert_gray_matches(
        read_output(work / "rocket_baseline_rgb_gray.png"), SAMPLES / "rocket_baseline_rgb.jpg"
    )


def test_every_sample_in_one_batch_matches_the_formula(tmp_path):
    """Colour, gray, RGBA, palette, 16-bit PNG and 16-bit TIFF inputs, all in one run."""
    result = invoke(*map(str, IMAGE_SAMPLES), "-d", str(tmp_path), "--device", "cpu", "-j", "2")
    assert result.exit_code == 0, result.stderr
    *notes, summary = result.stderr.strip().splitlines()
    assert summary == f"{len(IMAGE_SAMPLES)} written, 0 skipped, 0 failed"
    # multi-page TIFF stacks say which page became the image
    assert all("page 0 was converted" in note for note in notes)
    for path in IMAGE_SAMPLES:
        assert_gray_matches(read_output(tmp_path / f"{path.stem}.png"), path)


def test_sixteen_bit_png_gives_sixteen_bit_png(tmp_path):
    result = invoke(str(SAMPLES / "room_rgb16.png"), "-o", str(tmp_path / "room.png"))
    assert result.exit_code == 0, result.stderr
    out = read_output(tmp_path / "room.png")
    assert out.dtype == np.uint16 and out.max() > 255
    assert_gray_matches(out, SAMPLES / "room_rgb16.png")


def test_palette_gives_the_gray_of_its_light_colours(tmp_path):
    invoke(str(SAMPLES / "light_palette_64px.png"), "-o", str(tmp_path / "p.png"))
    out = read_output(tmp_path / "p.png")
    assert out.min() >= 200  # not the palette indices 0..45
    assert_gray_matches(out, SAMPLES / "light_palette_64px.png")


@pytest.mark.parametrize("name", GRAY_SAMPLES)
def test_gray_input_passes_through_unchanged(tmp_path, name):
    fmt = "tif" if name.endswith(".tif") else "png"
    result = invoke(str(SAMPLES / name), "-o", str(tmp_path / f"o.{fmt}"))
    assert result.exit_code == 0, result.stderr
    out = read_output(tmp_path / f"o.{fmt}")
    np.testing.assert_array_equal(out, expected_gray(SAMPLES / name))


def test_rgba_alpha_is_dropped(tmp_path):
    invoke(str(SAMPLES / "tulips_rgba.png"), "-o", str(tmp_path / "t.png"))
    out = read_output(tmp_path / "t.png")
    assert out.ndim == 2
    assert_gray_matches(out, SAMPLES / "tulips_rgba.png")


@pytest.mark.parametrize("fmt", ["tif", "jpg", "bmp", "webp"])
def test_other_formats(work, fmt):
    result = invoke(str(work / "coffee_rgb.png"), "-d", str(work / "o"), "--format", fmt)
    assert result.exit_code == 0, result.stderr
    out = read_output(work / "o" / f"coffee_rgb.{fmt}")
    if fmt == "jpg":
        expected = expected_gray(SAMPLES / "coffee_rgb.png").astype(int)
        assert np.abs(out.astype(int) - expected).mean() < 2
    else:
        assert_gray_matches(out, SAMPLES / "coffee_rgb.png")


def test_output_suffix_chooses_the_format_and_conflicts_are_usage_errors(work):
    assert invoke(str(work / "coffee_rgb.png"), "-o", str(work / "c.tiff")).exit_code == 0
    assert (work / "c.tiff").read_bytes()[:4] == b"II*\x00"
    result = invoke(str(work / "coffee_rgb.png"), "-o", str(work / "d.jpg"), "--format", "png")
    assert result.exit_code == 2
    assert "names a jpg file but --format is png" in result.stderr
    assert not (work / "d.jpg").exists()


def test_sixteen_bit_to_jpeg_is_a_per_file_failure(tmp_path):
    result = invoke(str(SAMPLES / "room_rgb16.png"), "-o", str(tmp_path / "r.jpg"))
    assert result.exit_code == 1
    assert error_lines(result.stderr) == [
        f"imgops: error: {SAMPLES / 'room_rgb16.png'}: "
        "16-bit images can be written as png or tif only, not jpg"
    ]
    assert not (tmp_path / "r.jpg").exists()


@pytest.mark.parametrize("level", ["0", "2", "9"])
def test_png_level(work, level):
    result = invoke(
        str(work / "rocket_baseline_rgb.jpg"), "-o", str(work / "r.png"), "--png-level", level
    )
    assert result.exit_code == 0, result.stderr
    assert_gray_matches(read_output(work / "r.png"), SAMPLES / "rocket_baseline_rgb.jpg")


def test_png_level_for_another_format_is_a_usage_error(work):
    result = invoke(str(work / "coffee_rgb.png"), "--format", "tif", "--png-level", "3")
    assert result.exit_code == 2
    assert "--png-level applies to png output" in result.stderr


def test_jobs_do_not_change_the_bytes(tmp_path):
    names = [str(SAMPLES / n) for n in COLOUR_SAMPLES]
    for jobs in ("1", "3"):
        assert invoke(*names, "-d", str(tmp_path / jobs), "-j", jobs).exit_code == 0
    for name in COLOUR_SAMPLES:
        stem = name.rsplit(".", 1)[0]
        assert (tmp_path / "1" / f"{stem}.png").read_bytes() == (
            tmp_path / "3" / f"{stem}.png"
        ).read_bytes()


# ------------------------------------------------------------------------- batches and failures


def test_batch_with_corrupt_empty_and_non_image_files(work):
    (work / "empty.jpg").write_bytes(b"")
    (work / "notes.png").write_text("these are notes, not pixels\n" * 20)
    data = (SAMPLES / "flower_progressive_3mp.jpg").read_bytes()
    (work / "cut.jpg").write_bytes(data[: len(data) // 3])
    names = ["coffee_rgb.png", "empty.jpg", "rocket_baseline_rgb.jpg", "notes.png", "cut.jpg"]
    names += ["light_palette_64px.png", "missing.png"]
    result = invoke(*[str(work / n) for n in names], "-d", str(work / "out"))
    assert result.exit_code == 1
    errors = error_lines(result.stderr)
    assert len(errors) == 4
    assert f"imgops: error: {work / 'empty.jpg'}: empty file (0 bytes)" in errors
    assert any(e.startswith(f"imgops: error: {work / 'notes.png'}: not an image") for e in errors)
    assert any(e.startswith(f"imgops: error: {work / 'cut.jpg'}: truncated JPEG") for e in errors)
    assert f"imgops: error: {work / 'missing.png'}: No such file or directory" in errors
    assert result.stderr.splitlines()[-1] == "3 written, 0 skipped, 4 failed"
    assert "Traceback" not in result.stderr
    for good in ("coffee_rgb", "rocket_baseline_rgb", "light_palette_64px"):
        source = next(SAMPLES.glob(f"{good}.*"))
        assert_gray_matches(read_output(work / "out" / f"{good}.png"), source)
    assert sorted(p.name for p in (work / "out").iterdir()) == [
        "coffee_rgb.png",
        "light_palette_64px.png",
        "rocket_baseline_rgb.png",
    ]  # nothing for the bad files, and no temporary files left behind


def test_batch_failures_in_a_real_process(work):
    (work / "zero.png").write_bytes(b"")
    result = run_imgops("gray", "coffee_rgb.png", "zero.png", "rocket_baseline_rgb.jpg", cwd=work)
    stderr = result.stderr.decode()
    assert result.returncode == 1, stderr
    assert error_lines(stderr) == ["imgops: error: zero.png: empty file (0 bytes)"]
    assert stderr.splitlines()[-1] == "2 written, 0 skipped, 1 failed"
    assert_gray_matches(read_output(work / "coffee_rgb_gray.png"), SAMPLES / "coffee_rgb.png")


def test_quiet_hides_the_summary_but_not_errors(work):
    (work / "zero.png").write_bytes(b"")
    result = invoke(str(work / "coffee_rgb.png"), str(work / "zero.png"), "-q")
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        f"imgops: error: {work / 'zero.png'}: empty file (0 bytes)"
    ]


def test_verbose_names_each_output(work):
    result = invoke(str(work / "coffee_rgb.png"), "-o", str(work / "c.png"), "-v")
    assert result.exit_code == 0
    assert f"coffee_rgb.png -> {work / 'c.png'} (600x400 uint8" in result.stderr


# ------------------------------------------------------------------------- clobbering


def test_existing_output_is_refused_and_left_alone(work):
    target = work / "coffee_rgb_gray.png"
    target.write_bytes(b"precious")
    result = invoke(str(work / "coffee_rgb.png"), str(work / "rocket_baseline_rgb.jpg"))
    assert result.exit_code == 1
    assert error_lines(result.stderr) == [
        f"imgops: error: {work / 'coffee_rgb.png'}: output {target} exists (use --overwrite)"
    ]
    assert target.read_bytes() == b"precious"
    assert (work / "rocket_baseline_rgb_gray.png").exists()


def test_overwrite_replaces(work):
    target = work / "coffee_rgb_gray.png"
    target.write_bytes(b"old")
    result = invoke(str(work / "coffee_rgb.png"), "--overwrite")
    assert result.exit_code == 0, result.stderr
    assert_gray_matches(read_output(target), SAMPLES / "coffee_rgb.png")


def test_skip_existing(work):
    target = work / "coffee_rgb_gray.png"
    target.write_bytes(b"old")
    result = invoke(
        str(work / "coffee_rgb.png"), str(work / "rocket_baseline_rgb.jpg"), "--skip-existing"
    )
    assert result.exit_code == 0, result.stderr
    assert result.stderr.strip() == "1 written, 1 skipped, 0 failed"
    assert target.read_bytes() == b"old"
    again = invoke(
        str(work / "coffee_rgb.png"), str(work / "rocket_baseline_rgb.jpg"), "--skip-existing"
    )
    assert again.stderr.strip() == "0 written, 2 skipped, 0 failed"


def test_overwrite_and_skip_existing_together_is_a_usage_error(work):
    result = invoke(str(work / "coffee_rgb.png"), "--overwrite", "--skip-existing")
    assert result.exit_code == 2


def test_output_equal_to_input_is_refused_even_with_overwrite(work):
    source = work / "coffee_rgb.png"
    before = source.read_bytes()
    result = invoke(str(source), "-o", str(source), "--overwrite")
    assert result.exit_code == 2
    assert "would overwrite its input" in result.stderr
    assert source.read_bytes() == before


def test_an_input_that_is_another_inputs_output_is_left_out_not_read(work):
    """Changed deliberately (issue 16): `gray *.png` over earlier outputs was refused; an input
    that is another input's output (its naming rule) is now left out of the batch."""
    shutil.copy(work / "coffee_rgb.png", work / "coffee_rgb_gray.png")
    names = [str(work / "coffee_rgb.png"), str(work / "coffee_rgb_gray.png")]
    result = invoke(*names, "--overwrite", "-v")
    assert result.exit_code == 0, result.stderr
    assert f"coffee_rgb_gray.png: left out: the output of {work / 'coffee_rgb.png'}" in (
        result.stderr
    )
    assert result.stderr.splitlines()[-1] == "1 written, 0 skipped, 0 failed"
    assert_gray_matches(read_output(work / "coffee_rgb_gray.png"), SAMPLES / "coffee_rgb.png")
    assert not (work / "coffee_rgb_gray_gray.png").exists()


def test_an_output_that_is_another_input_is_refused(work):
    """-d into the input folder: a.png's output would be a.png (the input) itself."""
    shutil.copy(work / "rocket_baseline_rgb.jpg", work / "coffee_rgb.jpg")
    before = (work / "coffee_rgb.png").read_bytes()
    result = invoke(str(work), "-d", str(work), "--overwrite")
    assert result.exit_code == 2
    assert "would overwrite an input" in result.stderr
    assert (work / "coffee_rgb.png").read_bytes() == before


def test_two_inputs_with_one_output_is_a_usage_error_before_any_work(tmp_path):
    copy_samples(tmp_path / "a", ["coffee_rgb.png"])
    copy_samples(tmp_path / "b", ["coffee_rgb.png", "rocket_baseline_rgb.jpg"])
    result = invoke(
        str(tmp_path / "b" / "rocket_baseline_rgb.jpg"),
        str(tmp_path / "a" / "coffee_rgb.png"),
        str(tmp_path / "b" / "coffee_rgb.png"),
        "-d",
        str(tmp_path / "out"),
    )
    assert result.exit_code == 2
    assert "would both write" in result.stderr
    assert not (tmp_path / "out").exists()


def test_the_same_file_named_twice_is_done_once(work):
    result = invoke(
        str(work / "coffee_rgb.png"), str(work / "coffee_rgb.png"), "-d", str(work / "o")
    )
    assert result.exit_code == 0, result.stderr
    assert result.stderr.strip() == "1 written, 0 skipped, 0 failed"


# ------------------------------------------------------------------------- folders and lists


def test_folder_and_recursive(tmp_path):
    copy_samples(tmp_path / "in", ["coffee_rgb.png", "rocket_baseline_rgb.jpg"])
    copy_samples(tmp_path / "in" / "sub", ["light_palette_64px.png"])
    (tmp_path / "in" / "README.txt").write_text("not an image; ignored")
    flat = invoke(str(tmp_path / "in"), "-d", str(tmp_path / "flat"))
    assert flat.exit_code == 0, flat.stderr
    assert sorted(p.name for p in (tmp_path / "flat").iterdir()) == [
        "coffee_rgb.png",
        "rocket_baseline_rgb.png",
    ]
    deep = invoke(str(tmp_path / "in"), "-r", "-d", str(tmp_path / "deep"))
    assert deep.exit_code == 0, deep.stderr
    assert_gray_matches(
        read_output(tmp_path / "deep" / "sub" / "light_palette_64px.png"),
        SAMPLES / "light_palette_64px.png",
    )


def test_folder_without_output_dir_ignores_its_earlier_outputs(tmp_path):
    copy_samples(tmp_path, ["coffee_rgb.png", "rocket_baseline_rgb.jpg"])
    assert invoke(str(tmp_path)).exit_code == 0
    again = invoke(str(tmp_path), "--skip-existing")
    assert again.exit_code == 0, again.stderr
    assert again.stderr.strip() == "0 written, 2 skipped, 0 failed"
    assert not list(tmp_path.glob("*_gray_gray.png"))


def test_output_dir_inside_the_input_folder_is_not_read_back(tmp_path):
    copy_samples(tmp_path, ["coffee_rgb.png"])
    assert invoke(str(tmp_path), "-r", "-d", str(tmp_path / "gray")).exit_code == 0
    again = invoke(str(tmp_path), "-r", "-d", str(tmp_path / "gray"), "--skip-existing")
    assert again.stderr.strip() == "0 written, 1 skipped, 0 failed"


def test_files_from_a_list_file(work):
    (work / "list.txt").write_text(
        f"{work / 'coffee_rgb.png'}\n\n{work / 'light_palette_64px.png'}\n"
    )
    result = invoke("--files-from", str(work / "list.txt"), "-d", str(work / "o"))
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in (work / "o").iterdir()) == [
        "coffee_rgb.png",
        "light_palette_64px.png",
    ]


def test_files_from_stdin_in_a_real_process(work):
    listing = b"coffee_rgb.png\nrocket_baseline_rgb.jpg\n"
    result = run_imgops(
        "gray", "--files-from", "-", "-d", "out", "-j", "2", input=listing, cwd=work
    )
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout == b""
    for name in ("coffee_rgb.png", "rocket_baseline_rgb.jpg"):
        stem = name.rsplit(".", 1)[0]
        assert_gray_matches(read_output(work / "out" / f"{stem}.png"), SAMPLES / name)


def test_files_from_stdin_in_process(work):
    result = invoke(
        "--files-from", "-", "-d", str(work / "o"), input=f"{work / 'coffee_rgb.png'}\n"
    )
    assert result.exit_code == 0, result.stderr
    assert (work / "o" / "coffee_rgb.png").exists()


def test_an_empty_folder_is_an_error_naming_it(tmp_path):
    """Changed deliberately (issue 16): an empty input folder exited 0."""
    result = invoke(str(tmp_path), "-d", str(tmp_path / "o"))
    assert result.exit_code == 1
    assert error_lines(result.stderr) == [
        f"imgops: error: {tmp_path}: no image files found in it (use -r for sub-folders)"
    ]


# ------------------------------------------------------------------------- stdin and stdout


def test_stdin_to_stdout_in_a_real_process():
    data = (SAMPLES / "rocket_baseline_rgb.jpg").read_bytes()
    result = run_imgops("gray", "-", "-o", "-", "--device", "cpu", input=data)
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout[:8] == b"\x89PNG\r\n\x1a\n"
    assert_gray_matches(decode_bytes(result.stdout), SAMPLES / "rocket_baseline_rgb.jpg")
    assert result.stderr.decode().strip().endswith("1 written, 0 skipped, 0 failed")


def test_stdin_to_stdout_in_process_as_tiff():
    data = (SAMPLES / "room_rgb16.png").read_bytes()
    result = CliRunner().invoke(cli, ["gray", "-", "-o", "-", "--format", "tif"], input=data)
    assert result.exit_code == 0, result.stderr
    out = decode_bytes(result.stdout_bytes)
    assert out.dtype == np.uint16
    assert_gray_matches(out, SAMPLES / "room_rgb16.png")


def test_file_to_stdout_and_stdin_to_file(work):
    result = invoke(str(work / "coffee_rgb.png"), "-o", "-")
    assert_gray_matches(decode_bytes(result.stdout_bytes), SAMPLES / "coffee_rgb.png")
    result = invoke("-", "-o", str(work / "s.png"), input=(work / "coffee_rgb.png").read_bytes())
    assert result.exit_code == 0, result.stderr
    assert_gray_matches(read_output(work / "s.png"), SAMPLES / "coffee_rgb.png")


def test_bad_stdin_is_one_error_line():
    result = invoke("-", "-o", "-", input=b"")
    assert result.exit_code == 1
    assert error_lines(result.stderr) == ["imgops: error: <stdin>: empty file (0 bytes)"]
    assert result.stdout_bytes == b""


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")
def test_binary_output_to_a_terminal_is_refused():
    main, secondary = os.openpty()
    try:
        data = (SAMPLES / "coffee_rgb.png").read_bytes()
        result = subprocess.run(
            [sys.executable, "-m", "imgops.cli", "gray", "-", "-o", "-"],
            input=data,
            stdout=secondary,
            stderr=subprocess.PIPE,
            timeout=60,
        )
    finally:
        os.close(secondary)
        os.close(main)
    assert result.returncode == 2
    assert b"refusing to write binary image data to a terminal" in result.stderr


@pytest.mark.parametrize(
    "args,message",
    [
        ([], "no input"),
        (["-", "x.png", "-o", "y.png"], "must be the only input"),
        (["-"], "reading stdin needs -o"),
        (["a.png", "b.png", "-o", "c.png"], "-o takes exactly one input"),
        (["a.png", "-o", "b.png", "-d", "out"], "cannot be used together"),
        (["-", "--files-from", "-", "-o", "x.png"], "stdin cannot be both"),
        (["a.png", "--format", "gif"], "Invalid value for '-f' / '--format'"),
        (["a.png", "--png-level", "10"], "10 is not in the range 0<=x<=9"),
        (["a.png", "-j", "0"], "0 is not in the range x>=1"),
        (["a.png", "--device", "tpu"], "expected auto, cpu, cuda or cuda:N"),
    ],
)
def test_usage_errors_exit_2(tmp_path, args, message):
    (tmp_path / "a.png").write_bytes((SAMPLES / "light_palette_64px.png").read_bytes())
    (tmp_path / "b.png").write_bytes((SAMPLES / "light_palette_64px.png").read_bytes())
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        result = invoke(*args, input=b"")
    finally:
        os.chdir(cwd)
    assert result.exit_code == 2, result.stderr
    assert message in result.stderr
    assert not (tmp_path / "c.png").exists() and not (tmp_path / "a_gray.png").exists()


def test_output_that_is_a_directory_is_a_usage_error(work):
    result = invoke(str(work / "coffee_rgb.png"), "-o", str(work))
    assert result.exit_code == 2
    assert "is a directory; use -d" in result.stderr


# ------------------------------------------------------------------------- the pipeline API


def test_pipeline_parking_does_not_change_results(tmp_path):
    """Images decoded while the device starts (parked) or waited for give the same bytes."""
    from imgops.pipeline import GrayJob, PipelineSettings, run_gray

    names = COLOUR_SAMPLES + GRAY_SAMPLES
    outputs = {}
    for budget in (0, 1 << 30):
        out = tmp_path / str(budget)
        out.mkdir()
        jobs = [GrayJob(SAMPLES / n, out / f"{n}.png", n) for n in names]
        settings = PipelineSettings(device="cpu", jobs=3, startup_buffer_bytes=budget)
        summary = run_gray(jobs, settings)
        assert summary.line() == f"{len(names)} written, 0 skipped, 0 failed"
        assert summary.device == "cpu"
        outputs[budget] = {n: (out / f"{n}.png").read_bytes() for n in names}
    assert outputs[0] == outputs[1 << 30]
    for name in names:
        assert_gray_matches(decode_bytes(outputs[0][name]), SAMPLES / name)


def test_pipeline_keeps_few_items_in_flight(tmp_path):
    from imgops.pipeline import GrayJob, PipelineSettings, run_gray

    pulled, finished, ahead = [0], [0], []

    def jobs():
        for index in range(24):
            pulled[0] += 1
            yield GrayJob(SAMPLES / "camera_gray.png", tmp_path / f"{index}.png", str(index))

    def on_result(result):
        finished[0] += 1
        ahead.append(pulled[0] - finished[0])

    summary = run_gray(jobs(), PipelineSettings(device="cpu", jobs=2), on_result=on_result)
    assert summary.written == 24
    assert max(ahead) <= 2 + 2  # jobs + 2


def test_pipeline_reports_each_failure_and_stage_times(tmp_path):
    from imgops.pipeline import STAGES, GrayJob, PipelineSettings, run_gray

    (tmp_path / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    jobs = [
        GrayJob(SAMPLES / "coffee_rgb.png", tmp_path / "a.png", "coffee"),
        GrayJob(tmp_path / "bad.png", tmp_path / "b.png", "bad"),
        GrayJob(tmp_path, tmp_path / "c.png", "a folder"),
    ]
    seen = []
    summary = run_gray(jobs, PipelineSettings(device="cpu"), on_result=seen.append)
    assert sorted(r.job.label for r in seen) == ["a folder", "bad", "coffee"]
    assert {r.job.label: r.reason for r in summary.failures} == {
        "a folder": "is a directory",
        "bad": "corrupt PNG: cannot read the image size from its header",
    }
    stats = summary.as_dict()
    assert (stats["written"], stats["failed"]) == (1, 2)
    assert set(stats["stage_seconds"]) == set(STAGES)
    assert stats["stage_seconds"]["encode"] > 0


def test_stats_json(work):
    import json

    result = invoke(str(work / "coffee_rgb.png"), "--stats-json", str(work / "s.json"), "-j", "1")
    assert result.exit_code == 0, result.stderr
    stats = json.loads((work / "s.json").read_text())
    assert stats["written"] == 1 and stats["jobs"] == 1 and stats["png_level"] == 2
    assert stats["stage_seconds"]["decode"] > 0


# ------------------------------------------------------------------------- start-up and help


def test_help_shows_examples():
    result = CliRunner().invoke(cli, ["gray", "--help"])
    assert result.exit_code == 0
    assert "$ imgops gray photo.jpg -o photo_gray.png" in result.output
    assert "--files-from" in result.output and "--png-level" in result.output


def test_formats_and_defaults_agree_with_the_image_module():
    assert tuple(images.FORMAT_EXTENSIONS) == gray_command.FORMATS
    assert gray_command.DEFAULT_PNG_LEVEL == images.DEFAULT_PNG_LEVEL


def test_help_and_gray_inputs_never_import_torch(tmp_path):
    """`imgops --help` and `gray --help` stay light; gray-only batches never start torch."""
    shutil.copy(SAMPLES / "camera_gray.png", tmp_path / "camera_gray.png")
    code = (
        "import sys\n"
        "from imgops.cli import cli\n"
        "for args in (['--help'], ['gray', '--help']):\n"
        "    cli.main(args, standalone_mode=False)\n"
        "heavy = sorted(m for m in ('torch', 'cv2', 'numpy', 'tifffile') if m in sys.modules)\n"
        "cli.main(['gray', 'camera_gray.png', '-q'], standalone_mode=False)\n"
        "print('help:', heavy, 'gray-only:', 'torch' in sys.modules)\n"
    )
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "help: [] gray-only: False"
    assert time.perf_counter() - started < 30
    assert_gray_matches(read_output(tmp_path / "camera_gray_gray.png"), SAMPLES / "camera_gray.png")


def test_gray_imports_no_numpy_before_the_cuda_stage_starts(tmp_path):
    """Everything the command does before it may start the CUDA stage (_prestart_cuda: the
    options, the plan, the settings) imports no numpy or OpenCV, so their import (0.3 s on the
    H100 host) overlaps the GPU's start instead of delaying it."""
    shutil.copy(SAMPLES / "camera_gray.png", tmp_path / "camera_gray.png")
    code = (
        "import sys\n"
        "import imgops.commands.gray as gray\n"
        "from imgops.cli import cli\n"
        "seen = []\n"
        "real = gray._prestart_cuda\n"
        "def spy(settings):\n"
        "    seen.append(sorted(m for m in ('numpy', 'cv2', 'torch') if m in sys.modules))\n"
        "    real(settings)\n"
        "gray._prestart_cuda = spy\n"
        "cli.main(['gray', 'camera_gray.png', '-q', '--device', 'cpu'], standalone_mode=False)\n"
        "print('at prestart:', seen, 'after:', 'numpy' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "at prestart: [[]] after: True"


# ------------------------------------------------------------------------- CUDA (GPU machine)


@pytest.mark.cuda
def test_cuda_batch_is_byte_identical_to_cpu(tmp_path):
    names = [str(p) for p in IMAGE_SAMPLES]
    timings = {}
    for device in ("cpu", "cuda"):
        started = time.perf_counter()
        result = invoke(*names, "-d", str(tmp_path / device), "--device", device)
        timings[device] = time.perf_counter() - started
        assert result.exit_code == 0, result.stderr
    for path in IMAGE_SAMPLES:
        cpu = (tmp_path / "cpu" / f"{path.stem}.png").read_bytes()
        assert (tmp_path / "cuda" / f"{path.stem}.png").read_bytes() == cpu, path.name
        assert_gray_matches(read_output(tmp_path / "cuda" / f"{path.stem}.png"), path)
    print(f"batch of {len(names)} samples: {timings}")


@pytest.mark.cuda
def test_cuda_stdin_stdout_and_16_bit(tmp_path):
    data = (SAMPLES / "room_rgb16.png").read_bytes()
    result = run_imgops("gray", "-", "-o", "-", "--device", "cuda", input=data)
    assert result.returncode == 0, result.stderr.decode()
    out = decode_bytes(result.stdout)
    assert out.dtype == np.uint16
    assert_gray_matches(out, SAMPLES / "room_rgb16.png")


@pytest.mark.cuda
def test_cuda_many_threads_reuse_pinned_buffers(tmp_path):
    """Different sizes through few threads: buffers grow and are reused without mixing images."""
    names = [str(SAMPLES / n) for n in COLOUR_SAMPLES * 2]
    for index, name in enumerate(names):
        shutil.copy(name, tmp_path / f"{index:02d}_{os.path.basename(name)}")
    result = invoke(str(tmp_path), "-d", str(tmp_path / "out"), "--device", "cuda", "-j", "3")
    assert result.exit_code == 0, result.stderr
    for index, name in enumerate(names):
        stem = f"{index:02d}_{os.path.basename(name).rsplit('.', 1)[0]}"
        assert_gray_matches(
            read_output(tmp_path / "out" / f"{stem}.png"), SAMPLES / os.path.basename(name)
        )


def test_cuda_device_without_a_gpu_is_one_clear_error(work):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    result = invoke(str(work / "coffee_rgb.png"), "--device", "cuda")
    assert result.exit_code == 1
    assert error_lines(result.stderr) == [
        "imgops: error: --device cuda: no CUDA GPU is visible to torch"
    ]
    assert not (work / "coffee_rgb_gray.png").exists()


def test_ctrl_c_still_writes_stats_json_and_exits_130(work, monkeypatch):
    """Ctrl-C during a batch: the interrupted line, exit 130, and --stats-json written with
    what was done (as bin does), no temporaries left."""
    real = gray_command.run_plan

    def interrupted(plan, report, settings, **kwargs):
        plan.tasks = plan.tasks[:1]
        real(plan, report, settings, **kwargs)  # one file written, then Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(gray_command, "run_plan", interrupted)
    stats = work / "stats" / "s.json"
    stats.parent.mkdir()
    out = work / "out"
    result = invoke(str(work), "-d", str(out), "--device", "cpu", "--stats-json", str(stats))
    assert result.exit_code == 130, result.stderr
    assert "interrupted: 1 written" in result.stderr
    data = __import__("json").loads(stats.read_text())
    assert data["interrupted"] is True and data["written"] == 1
    assert [p.name for p in out.iterdir() if "imgops-tmp" in p.name] == []
