"""README.md against the code: every command and option it shows exists, the facts it states
(name fields, the Ctrl-C line, what --device auto means, the numerics headers) are the code's,
and its Python example runs. `imgops --help`'s speed is tested in test_planner_cli.py."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

from imgops.cli import cli
from imgops.cli_common import DEVICE_HELP, GRAY_CUDA_MIN_FILES, GRAY_CUDA_MIN_FILES_TORCH
from imgops.planner import NAME_FIELDS
from imgops.report import Report

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
DOC_FILES = ("README.md", "CONTRIBUTING.md", "docs/ARCHITECTURE.md")
DOCS = {name: (ROOT / name).read_text() for name in DOC_FILES}


def _command_lines() -> list[str]:
    """Every `imgops ...` invocation in README's indented examples (after a pipe, too)."""
    found = []
    for line in README.splitlines():
        if not line.startswith("    ") or "imgops " not in line or ".venv/" in line:
            continue
        code = line.split(" # ")[0].strip().lstrip("$ ")
        for part in code.split("|"):
            part = part.strip()
            if part.startswith("imgops "):
                found.append(part.split(">")[0].split("<")[0])
    return found


def _options(command: click.Command) -> set[str]:
    return {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}


def test_readme_shows_commands_and_options_that_exist():
    lines = _command_lines()
    assert len(lines) >= 15, lines
    group_options = _options(cli)
    for line in lines:
        words = shlex.split(line)[1:]
        while words and words[0].startswith("-"):
            assert words.pop(0) in group_options, line
        name = words.pop(0)
        assert name in cli.commands, line
        known = _options(cli.commands[name])
        for word in words:
            if word.startswith("-") and word != "-" and not re.fullmatch(r"-?\d+(\.\d+)?", word):
                assert word in known, f"{word} is no option of imgops {name}: {line}"


def test_readme_names_every_command():
    for name in cli.commands:
        assert f"`imgops {name}`" in README, name


def test_name_fields_are_the_planners_and_every_name_option_lists_them():
    for field in NAME_FIELDS:
        assert f"`{{{field}}}`" in README, field
    for name, command in cli.commands.items():
        for param in command.params:
            if "--name" in param.opts:
                assert all(f"{{{f}}}" in param.help for f in NAME_FIELDS), name


def test_the_ctrl_c_line_in_readme_is_the_reports():
    report = Report(total=400, written=46)
    assert f"`imgops: error: {report.interrupted_line()}`" in README


def test_device_auto_is_described_with_the_engines_threshold():
    from imgops.engine.device import CUDA_MIN_FILES, CUDA_MIN_FILES_DRIVER

    assert GRAY_CUDA_MIN_FILES == CUDA_MIN_FILES_DRIVER
    assert GRAY_CUDA_MIN_FILES_TORCH == CUDA_MIN_FILES
    assert f"at least {CUDA_MIN_FILES_DRIVER} files" in README and "CUDA_MIN_FILES" in README
    assert f"at least {CUDA_MIN_FILES_DRIVER} files" in DEVICE_HELP
    assert f"{CUDA_MIN_FILES} on the torch engine" in DEVICE_HELP


@pytest.mark.parametrize("doc", sorted(DOCS))
def test_every_source_path_the_docs_name_exists(doc: str):
    """Catches renamed files (csrc/luma.h became bt601.h, rounding.h, normalize_math.h)."""
    paths = set(re.findall(r"`((?:csrc|src/imgops|docs|tests|scripts)/[\w./*-]+)`", DOCS[doc]))
    assert paths, doc
    for path in sorted(paths):
        if "*" in path:
            assert list(ROOT.glob(path)), f"{doc}: {path} matches nothing"
        else:
            assert (ROOT / path).exists(), f"{doc}: {path} does not exist"
    assert "luma.h" not in DOCS[doc]


def test_readme_python_example_runs_on_the_cpu(tmp_path: Path):
    code = re.search(r"```python\n(.*?)```", README, re.S).group(1)
    code = code.replace('device="cuda"', 'device="cpu"')
    shutil.copy(ROOT / "samples" / "rocket_baseline_rgb.jpg", tmp_path / "photo.jpg")
    shutil.copy(ROOT / "samples" / "mri_dwi_b0_u16.tif", tmp_path / "scan.tif")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "photo_gray.png").stat().st_size > 0
    assert (tmp_path / "scan_norm.tif").stat().st_size > 0
