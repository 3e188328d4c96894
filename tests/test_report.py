"""imgops.report.Report and the -q/-v plumbing of imgops.cli_common.

The success line of `imgops bin` once went missing under pytest: a command's -q set a
process-wide flag that no later invocation reset, so every command run after it in the same
process (CliRunner, a notebook, a Python caller) was silently quiet. These tests pin the
per-invocation rule and that the Report's console writes to the stderr of the moment.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from imgops.cli import cli
from imgops.cli_common import VERBOSITY
from imgops.commands.gray import gray
from imgops.report import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, Report

SAMPLE = Path(__file__).resolve().parent.parent / "samples" / "coffee_rgb.png"


def _gray(*args: object) -> object:
    return CliRunner().invoke(gray, [str(a) for a in args], catch_exceptions=False)


def test_a_commands_q_does_not_silence_the_next_invocation(tmp_path: Path):
    quiet = _gray(SAMPLE, "-o", tmp_path / "a.png", "-q")
    assert quiet.exit_code == 0 and quiet.stderr == ""
    loud = _gray(SAMPLE, "-o", tmp_path / "b.png")
    assert loud.exit_code == 0
    assert loud.stderr.strip() == "1 written, 0 skipped, 0 failed"
    assert not VERBOSITY.quiet


def test_the_groups_q_and_v_reach_the_command_and_end_with_it(tmp_path: Path):
    runner = CliRunner()
    quiet = runner.invoke(cli, ["-q", "gray", str(SAMPLE), "-o", str(tmp_path / "a.png")])
    assert quiet.exit_code == 0 and quiet.stderr == ""
    verbose = runner.invoke(cli, ["-v", "gray", str(SAMPLE), "-o", str(tmp_path / "b.png")])
    assert verbose.exit_code == 0
    assert f"coffee_rgb.png -> {tmp_path / 'b.png'}" in verbose.stderr
    plain = runner.invoke(cli, ["gray", str(SAMPLE), "-o", str(tmp_path / "c.png")])
    assert plain.stderr.strip() == "1 written, 0 skipped, 0 failed"
    assert "->" not in plain.stderr


def test_the_console_writes_to_the_stderr_of_each_moment(monkeypatch: pytest.MonkeyPatch):
    report = Report()
    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    report.info("one")
    monkeypatch.setattr(sys, "stderr", second)
    report.error("two")
    assert (first.getvalue(), second.getvalue()) == ("one\n", "imgops: error: two\n")


def test_file_names_are_printed_as_given_not_as_markup(monkeypatch: pytest.MonkeyPatch):
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    report = Report()
    report.fail("[bold]x[/bold].png", "not an image")
    assert stream.getvalue() == "imgops: error: [bold]x[/bold].png: not an image\n"


def test_counts_summary_exit_codes_and_stats(monkeypatch: pytest.MonkeyPatch):
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    report = Report(total=4, quiet=True)
    report.wrote("a", Path("a_gray.png"))
    report.skip("b", "exists")
    assert report.finish() == EXIT_OK and stream.getvalue() == ""  # -q: no summary
    report.fail("c", "truncated JPEG")
    assert report.exit_code == EXIT_FAILED
    assert stream.getvalue() == "imgops: error: c: truncated JPEG\n"  # errors print with -q
    assert report.line() == "1 written, 1 skipped, 1 failed"
    assert report.as_dict()["failures"] == [{"input": "c", "reason": "truncated JPEG"}]
    report.interrupted = True
    assert report.exit_code == EXIT_INTERRUPTED
    assert report.interrupted_line() == (
        "interrupted: 1 written, 1 left; rerun with --skip-existing to finish"
    )


def test_library_reports_do_not_print_failures(monkeypatch: pytest.MonkeyPatch):
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    report = Report(print_errors=False)
    report.fail("a", "bad")
    assert report.failed == 1 and stream.getvalue() == ""


def test_decoder_warnings_are_reported_with_their_file_in_a_real_run(tmp_path: Path):
    """libpng's own line (a bad tEXt CRC) reaches the report as `FILE: warning`, never raw."""
    import struct
    import subprocess

    png = SAMPLE.read_bytes()
    chunk = b"tEXt" + b"Comment\x00hi"
    bad = tmp_path / "bad.png"
    bad.write_bytes(png[:33] + struct.pack(">I", 10) + chunk + b"\x00\x00\x00\x01" + png[33:])
    process = subprocess.run(
        [sys.executable, "-c", "from imgops.cli import main; main()", "gray", str(bad)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert process.returncode == 0, process.stderr
    assert process.stderr.splitlines() == [
        f"{bad}: libpng warning: tEXt: CRC error",
        "1 written, 0 skipped, 0 failed",
    ]


@pytest.mark.parametrize(
    ("args", "captured"),
    [
        (["gray", "a.png"], True),
        (["-q", "gray", "a.png"], True),
        (["gray", "--help"], False),
        (["--help"], False),
        (["-h"], False),
        (["normvol", "s.tif"], False),
        ([], False),
    ],
)
def test_descriptor_2_is_captured_only_for_runs_that_decode_images(args, captured):
    from imgops.cli import _decodes_images

    assert _decodes_images(args) is captured
