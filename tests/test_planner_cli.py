"""Issue 11's planner classes and issue 16's friction items, end to end through `imgops gray`.

Each test names the class or item it covers; each failed on the code before imgops.planner
(checked by running this file against it) and passes now.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers_gray import SAMPLES, assert_gray_matches, error_lines, read_output, run_imgops

from imgops.cli import cli

SMALL_PNG = SAMPLES / "light_palette_64px.png"
SMALL_JPG = SAMPLES / "rocket_baseline_rgb.jpg"


def invoke(*args: object, input: bytes | None = None):
    """`imgops ARGS` in-process; an unexpected exception fails the test."""
    return CliRunner().invoke(cli, [str(a) for a in args], input=input, catch_exceptions=False)


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every regular file under `folder` with its bytes."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def usage_error(result) -> str:
    """The `Error: ...` line of a usage error (exit 2)."""
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.fixture
def batch(tmp_path: Path) -> Path:
    """A folder holding b.png and d.jpg."""
    folder = tmp_path / "in"
    folder.mkdir()
    shutil.copy(SAMPLES / "coffee_rgb.png", folder / "b.png")
    shutil.copy(SMALL_JPG, folder / "d.jpg")
    return folder


@pytest.fixture
def pair(tmp_path: Path) -> Path:
    """A folder holding a.jpg and a.png (different pictures) and b.png."""
    folder = tmp_path / "in"
    folder.mkdir()
    shutil.copy(SMALL_JPG, folder / "a.jpg")
    shutil.copy(SMALL_PNG, folder / "a.png")
    shutil.copy(SAMPLES / "coffee_rgb.png", folder / "b.png")
    return folder


# ----------------------------------------------------- issue 11, class 1: inputs overwritten


def test_class1_output_dir_equal_to_the_input_folder_never_replaces_an_input(pair: Path):
    before = snapshot(pair)
    for extra in (["--overwrite"], []):
        result = invoke("gray", pair, "-d", pair, *extra)
        assert "would overwrite an input" in usage_error(result)
        assert snapshot(pair) == before  # a.png is neither replaced nor silently dropped


def test_class1_stats_json_never_replaces_an_input_or_an_output(pair: Path, tmp_path: Path):
    before = snapshot(pair)
    line = usage_error(
        invoke("gray", pair / "b.png", "-d", tmp_path / "o", "--stats-json", pair / "b.png")
    )
    assert "--stats-json" in line and "would overwrite the input" in line
    target = tmp_path / "o.png"
    line = usage_error(invoke("gray", pair / "b.png", "-o", target, "--stats-json", target))
    assert "--stats-json" in line and "output" in line
    assert snapshot(pair) == before and not target.exists()


def test_class1_stats_json_is_written_atomically(pair: Path, tmp_path: Path, monkeypatch):
    stats = tmp_path / "stats.json"
    stats.write_text("old")
    calls = []
    import imgops.io.atomic as atomic

    original = atomic.write_bytes_atomic
    monkeypatch.setattr(
        atomic, "write_bytes_atomic", lambda t, d, **k: calls.append(t) or original(t, d, **k)
    )
    result = invoke("gray", pair / "b.png", "-d", tmp_path / "o", "--stats-json", stats)
    assert result.exit_code == 0, result.stderr
    assert calls[-1] == stats and json.loads(stats.read_text())["written"] == 1


def test_class1_a_fifo_or_device_target_is_refused_even_with_overwrite(pair: Path, tmp_path: Path):
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    line = usage_error(invoke("gray", pair / "b.png", "-o", fifo, "--overwrite"))
    assert "FIFO" in line and "regular files" in line
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    device = tmp_path / "null.png"
    try:
        os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except (PermissionError, OSError):
        return  # not root, or a container without mknod: the FIFO case stands
    line = usage_error(invoke("gray", pair / "b.png", "-o", device, "--overwrite"))
    assert "character device" in line
    assert stat.S_ISCHR(os.stat(device).st_mode)


def test_class1_a_fifo_among_batch_targets_is_one_failure(pair: Path, tmp_path: Path):
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / "a.png")
    result = invoke("gray", pair / "a.png", pair / "b.png", "-d", out, "--overwrite")
    assert result.exit_code == 1
    assert len(error_lines(result.stderr)) == 1 and "FIFO" in result.stderr
    assert stat.S_ISFIFO(os.stat(out / "a.png").st_mode)
    assert_gray_matches(read_output(out / "b.png"), SAMPLES / "coffee_rgb.png")


def test_class1_hard_linked_output_of_an_input_is_refused(pair: Path, tmp_path: Path):
    out = tmp_path / "out"
    out.mkdir()
    os.link(pair / "a.png", out / "b.png")  # b.png's output is a second name of input a.png
    line = usage_error(invoke("gray", pair / "a.png", pair / "b.png", "-d", out, "--overwrite"))
    assert "would overwrite an input" in line


# ------------------------------------------- issue 11, class 4: one bad entry, batch goes on


def test_class4_symlink_loops_under_recursive_are_per_entry_errors(batch: Path, tmp_path: Path):
    os.symlink("self.jpg", batch / "self.jpg")  # a link to itself
    sub = batch / "sub"
    sub.mkdir()
    shutil.copy(SMALL_PNG, sub / "c.png")
    os.symlink("..", sub / "up")  # a folder link to its parent
    result = invoke("gray", batch, "-r", "-d", tmp_path / "out")
    assert result.exit_code == 1, result.stderr
    errors = error_lines(result.stderr)
    assert any(str(batch / "self.jpg") in e and "symlink loop" in e for e in errors), errors
    assert "Traceback" not in result.stderr and "RuntimeError" not in result.stderr
    assert (tmp_path / "out" / "b.png").exists()
    assert (tmp_path / "out" / "sub" / "c.png").exists()


def test_class4_output_sub_folder_that_is_a_file_fails_only_its_entries(batch: Path, tmp_path):
    sub = batch / "sub"
    sub.mkdir()
    shutil.copy(SMALL_PNG, sub / "c.png")
    out = tmp_path / "out"
    out.mkdir()
    (out / "sub").write_text("a file where a folder goes")
    result = invoke("gray", batch / "b.png", batch, "-r", "-d", out)
    assert result.exit_code == 1, result.stderr
    assert error_lines(result.stderr) == [
        f"imgops: error: {sub / 'c.png'}: cannot create output folder {out / 'sub'}: "
        f"{out / 'sub'} is a file"
    ]
    assert "FileExistsError" not in result.stderr
    assert (out / "b.png").exists() and (out / "d.png").exists()
    assert (out / "sub").read_text() == "a file where a folder goes"


# ---------------------------------------------- issue 11, class 5: silent missing work


def _refuse_listing(monkeypatch, denied: Path) -> None:
    """Makes os.scandir of `denied` fail as an unreadable folder does (root ignores chmod)."""
    real = os.scandir

    def scandir(path="."):
        if os.path.abspath(os.fspath(path)) == str(denied):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)


def test_class5_an_unreadable_folder_is_an_error(tmp_path: Path, monkeypatch):
    folder = tmp_path / "locked"
    folder.mkdir()
    shutil.copy(SMALL_PNG, folder / "x.png")
    _refuse_listing(monkeypatch, folder)
    result = invoke("gray", folder, "-d", tmp_path / "out")
    assert result.exit_code == 1, result.stderr
    assert error_lines(result.stderr) == [
        f"imgops: error: {folder}: cannot read folder: Permission denied"
    ]


def test_class5_an_unreadable_sub_folder_under_recursive_is_an_error(
    batch: Path, tmp_path, monkeypatch
):
    sub = batch / "sub"
    sub.mkdir()
    shutil.copy(SMALL_PNG, sub / "c.png")
    _refuse_listing(monkeypatch, sub)
    result = invoke("gray", batch, "-r", "-d", tmp_path / "out")
    assert result.exit_code == 1, result.stderr
    assert error_lines(result.stderr) == [
        f"imgops: error: {sub}: cannot read folder: Permission denied"
    ]
    assert (tmp_path / "out" / "b.png").exists()  # the rest of the batch ran


def test_class5_a_chmod_000_folder_is_an_error(tmp_path: Path):
    folder = tmp_path / "locked"
    folder.mkdir()
    shutil.copy(SMALL_PNG, folder / "x.png")
    folder.chmod(0)
    try:
        if os.access(folder, os.R_OK):
            pytest.skip("running as root: permission bits do not stop reads (see the case above)")
        result = invoke("gray", folder, "-d", tmp_path / "out")
        assert result.exit_code == 1 and "cannot read folder" in result.stderr
    finally:
        folder.chmod(0o755)


def test_class5_a_fifo_in_a_folder_is_named_and_never_read(batch: Path, tmp_path: Path):
    os.mkfifo(batch / "stream.png")
    result = run_imgops("gray", str(batch), "-d", str(tmp_path / "out"))
    stderr = result.stderr.decode()
    assert result.returncode == 1, stderr
    assert any(str(batch / "stream.png") in e and "FIFO" in e for e in error_lines(stderr))


# ----------------------------------------------------------- issue 16: friction items


def test_rerun_over_a_glob_with_earlier_outputs_skips_instead_of_refusing(pair: Path):
    names = [pair / "a.png", pair / "b.png"]
    assert invoke("gray", *names).exit_code == 0
    rerun = sorted(pair.glob("*.png"))  # what the shell gives for photos/*.png now
    result = invoke("gray", *rerun, "--skip-existing")
    assert result.exit_code == 0, result.stderr
    assert result.stderr.splitlines()[-1] == "0 written, 2 skipped, 0 failed"
    assert not list(pair.glob("*_gray_gray.png"))


def test_same_stem_different_suffix_names_both_and_the_way_out(pair: Path):
    line = usage_error(invoke("gray", pair))
    assert str(pair / "a.jpg") in line and str(pair / "a.png") in line
    assert "--name '{stem}_{suffix}_gray.{ext}'" in line
    assert not list(pair.glob("*_gray*"))
    result = invoke("gray", pair, "--name", "{stem}_{suffix}_gray.{ext}")
    assert result.exit_code == 0, result.stderr
    assert_gray_matches(read_output(pair / "a_jpg_gray.png"), SMALL_JPG)
    assert_gray_matches(read_output(pair / "a_png_gray.png"), SMALL_PNG)


def test_name_template_fields_and_errors(pair: Path, tmp_path: Path):
    result = invoke("gray", pair / "b.png", "-d", tmp_path / "o", "--name", "{parent}-{stem}.{ext}")
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "o" / "in-b.png").exists()
    assert "unknown field {size}" in usage_error(invoke("gray", pair, "--name", "{size}.{ext}"))
    assert "a file name, not a path" in usage_error(invoke("gray", pair, "--name", "x/{stem}.png"))
    assert "names a png file but --format is tif" in usage_error(
        invoke("gray", pair / "b.png", "--name", "{stem}.png", "-f", "tif")
    )


def test_files_from_stdin_with_print0(pair: Path, tmp_path: Path):
    listing = b"\0".join(os.fsencode(pair / n) for n in ("a.png", "b.png")) + b"\0"
    result = invoke("gray", "--files-from", "-", "-0", "-d", tmp_path / "o", input=listing)
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["a.png", "b.png"]
    line = usage_error(invoke("gray", "--files-from", "-", "-d", tmp_path / "p", input=listing))
    assert "-0/--null" in line and "embedded null byte" not in line


def test_find_print0_in_a_real_process(pair: Path, tmp_path: Path):
    found = subprocess.run(
        ["find", str(pair), "-name", "*.png", "-print0"], capture_output=True, check=True
    ).stdout
    result = run_imgops("gray", "--files-from", "-", "-0", "-d", str(tmp_path / "o"), input=found)
    assert result.returncode == 0, result.stderr.decode()
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["a.png", "b.png"]


def test_output_with_an_unknown_suffix_is_a_usage_error(pair: Path, tmp_path: Path):
    line = usage_error(invoke("gray", pair / "b.png", "-o", tmp_path / "out.xyz"))
    assert "suffix '.xyz'" in line and "-f FORMAT" in line
    assert not (tmp_path / "out.xyz").exists()
    result = invoke("gray", pair / "b.png", "-o", tmp_path / "out.xyz", "-f", "png")
    assert result.exit_code == 0 and (tmp_path / "out.xyz").read_bytes()[:4] == b"\x89PNG"


def test_stats_json_lists_the_failed_inputs(pair: Path, tmp_path: Path):
    (pair / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    stats = tmp_path / "stats.json"
    result = invoke(
        "gray", pair / "b.png", pair / "broken.png", tmp_path / "gone.png", "-d", tmp_path / "o",
        "--stats-json", stats,
    )  # fmt: skip
    assert result.exit_code == 1
    data = json.loads(stats.read_text())
    assert (data["written"], data["failed"]) == (1, 2)
    assert {f["input"] for f in data["failures"]} == {
        str(pair / "broken.png"),
        str(tmp_path / "gone.png"),
    }
    assert all(f["reason"] for f in data["failures"])


def test_quiet_and_verbose_on_the_group(pair: Path, tmp_path: Path):
    quiet = invoke("-q", "gray", pair / "b.png", "-o", tmp_path / "q.png")
    assert quiet.exit_code == 0 and quiet.stderr == ""
    verbose = invoke("-v", "gray", pair / "b.png", "-o", tmp_path / "v.png")
    assert f"{pair / 'b.png'} -> {tmp_path / 'v.png'} (600x400 uint8" in verbose.stderr
    (pair / "zero.png").write_bytes(b"")
    failing = invoke("-q", "gray", pair / "zero.png", "-o", tmp_path / "z.png")
    assert error_lines(failing.stderr) == [
        f"imgops: error: {pair / 'zero.png'}: empty file (0 bytes)"
    ]


def test_quality_sets_the_jpeg_quality(pair: Path, tmp_path: Path):
    sizes = {}
    for quality in ("30", "95"):
        target = tmp_path / f"q{quality}.jpg"
        result = invoke("gray", SAMPLES / "flower_rgb_3mp.png", "-o", target, "--quality", quality)
        if result.exit_code == 2 and "not supported by this build" in result.stderr:
            pytest.skip("the batch engine has no jpeg_quality yet (engine helper)")
        assert result.exit_code == 0, result.stderr
        sizes[quality] = target.stat().st_size
    assert sizes["30"] < sizes["95"]
    line = usage_error(invoke("gray", pair / "b.png", "--quality", "50"))
    assert "--quality applies to jpg output" in line


def test_ctrl_c_says_what_was_done_and_how_to_finish(tmp_path: Path):
    source = tmp_path / "in"
    source.mkdir()
    for i in range(40):
        os.link(SAMPLES / "flower_rgb_3mp.png", source / f"f{i:02d}.png")
    out = tmp_path / "out"
    process = subprocess.Popen(
        [sys.executable, "-m", "imgops.cli", "gray", str(source), "-d", str(out), "-j", "1"],
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (out.exists() and any(out.glob("f*.png"))):
        time.sleep(0.02)
    process.send_signal(2)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    match = re.fullmatch(
        r"imgops: error: interrupted: (\d+) written, (\d+) left; rerun with --skip-existing"
        " to finish",
        stderr.splitlines()[-1],
    )
    assert match, stderr
    written, left = map(int, match.groups())
    assert 1 <= written <= len(list(out.glob("f*.png"))) and written + left == 40
    again = run_imgops("gray", str(source), "-d", str(out), "--skip-existing", "-q")
    assert again.returncode == 0 and len(list(out.glob("f*.png"))) == 40


def test_errors_print_above_the_progress_bar_not_on_its_row(pair: Path, tmp_path: Path):
    (pair / "zero.png").write_bytes(b"")
    main, secondary = os.openpty()
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "imgops.cli", "gray", str(pair / "zero.png"),
             str(pair / "b.png"), "-d", str(tmp_path / "o"), "-j", "1"],
            stdout=subprocess.DEVNULL, stderr=secondary,
        )  # fmt: skip
        os.close(secondary)
        chunks = []
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        process.wait(timeout=60)
    finally:
        os.close(main)
    text = re.sub(rb"\x1b\[[0-9;?]*[A-Za-z]", b"", b"".join(chunks)).decode(errors="replace")
    rows = [row for line in text.split("\n") for row in line.split("\r")]
    errors = [row for row in rows if "imgops: error:" in row]
    assert errors and all(row.startswith("imgops: error:") for row in errors), rows


def test_help_is_fast_and_imports_neither_torch_nor_cv2():
    """`imgops --help` in a fresh interpreter: < 0.3 s of CPU (the median of 3; CPU time, not
    wall time, so a loaded CI machine does not make it flaky), and no torch, cv2 or numpy."""
    import resource

    code = (
        "import sys\n"
        "from imgops.cli import cli\n"
        "cli.main(['--help'], standalone_mode=False)\n"
        "print(*(m in sys.modules for m in ('torch', 'cv2', 'numpy')), file=sys.stderr)\n"
    )
    seconds = []
    for _ in range(3):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        assert result.returncode == 0, result.stderr
        assert result.stderr.split() == ["False", "False", "False"], result.stderr
        seconds.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    assert sorted(seconds)[1] < 0.3, seconds
