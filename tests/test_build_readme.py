"""README's Quick start, as .ci/run reads it: exactly two commands that build once (issue 13)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _section(title: str) -> str:
    text = (ROOT / "README.md").read_text()
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert match, f"README.md has no '## {title}' section"
    return match.group(1)


def quick_start_commands() -> list[str]:
    """The lines .ci/run runs: those of the Quick start section that start with '    $ '."""
    return [line[6:] for line in _section("Quick start").splitlines() if line.startswith("    $ ")]


def test_quick_start_is_exactly_two_commands_each_self_contained():
    commands = quick_start_commands()
    assert len(commands) == 2
    for command in commands:
        # Each works on a fresh machine: it makes the venv and installs the build requirements.
        assert command.startswith("python3 -m venv .venv && ")
        assert ".venv/bin/pip install torch setuptools ninja numpy" in command


def test_both_installs_build_against_the_venv_torch_so_the_second_reuses_the_first():
    first, second = quick_start_commands()
    for command in (first, second):
        assert "pip install --no-build-isolation " in command
    assert "imgops gray samples/coffee_rgb.png -o coffee_gray.png" in first
    assert (ROOT / "samples" / "coffee_rgb.png").exists()
    assert "'.[test]'" in second and second.endswith(".venv/bin/python -m pytest")


def test_cpu_only_install_is_documented_beside_the_quick_start():
    text = _section("CPU-only install (lean)")
    assert "--index-url https://download.pytorch.org/whl/cpu" in text
    assert "    $ " not in text  # not a Quick start command: .ci/run must not pick it up
