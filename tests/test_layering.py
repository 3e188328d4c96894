"""docs/ARCHITECTURE.md's import rules, read out of the sources: library code never imports click
nor the CLI layer; the command line starts without torch, numpy, cv2 or dask; and every command
turns the library's plain errors into one line with their exit status."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from imgops.cli_common import ImgopsCommand
from imgops.errors import FileError, ImgopsError, UsageProblem

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = SRC / "imgops"
#: The CLI layer: the only modules that may import click (and the CLI modules).
CLI_MODULES = ("imgops.cli", "imgops.cli_common", "imgops.entry")
CLI_PACKAGES = ("imgops.commands",)
HEAVY = ("torch", "numpy", "cv2", "dask", "distributed", "zarr", "tifffile")


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_cli(module: str) -> bool:
    return module in CLI_MODULES or any(
        module == p or module.startswith(p + ".") for p in CLI_PACKAGES
    )


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in `path`, at module level or inside a
    function, relative imports resolved (`from ..x import y` gives x and x.y)."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            found.append((node.lineno, name))
            found += [(node.lineno, f"{name}.{alias.name}") for alias in node.names]
    return found


def _library_sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if not _is_cli(_module_name(p)))


def test_the_scan_sees_the_whole_package():
    names = {_module_name(p) for p in _library_sources()}
    assert {"imgops.planner", "imgops.report", "imgops.dask.run", "imgops.engine.run"} <= names
    assert not {"imgops.cli", "imgops.cli_common", "imgops.commands.gray"} & names
    # the scan finds click where it is: the CLI imports it
    assert any(name == "click" for _, name in _imports(PACKAGE / "commands" / "gray.py"))
    assert "imgops.dask.run" in {n for _, n in _imports(PACKAGE / "commands" / "gray.py")}


def test_no_library_module_imports_click_or_the_cli():
    offenders = [
        f"{path.relative_to(SRC)}:{line}: imports {name}"
        for path in _library_sources()
        for line, name in _imports(path)
        if name.split(".")[0] == "click" or _is_cli(name)
    ]
    assert offenders == []


def test_no_command_imports_another_command():
    """Shared command code lives in shared modules (cli_common, commands/volume_batch.py)."""
    commands = {p.stem for p in (PACKAGE / "commands").glob("*.py")} - {"__init__"}
    # the modules `cli.py` registers are the commands; the others are shared helpers
    registered = {
        name.rpartition(".")[2]
        for _, name in _imports(PACKAGE / "cli.py")
        if name.startswith("imgops.commands.") and name.count(".") == 2
    }
    assert registered and registered <= commands
    offenders = [
        f"commands/{path.name}:{line}: imports {name}"
        for path in (PACKAGE / "commands").glob("*.py")
        for line, name in _imports(path)
        if name.startswith("imgops.commands.")
        and name.split(".")[2] in registered
        and name.split(".")[2] != path.stem
    ]
    assert offenders == []


_FRESH = """
import json, sys
from imgops.cli import main
sys.argv = ["imgops", *sys.argv[1:]]
try:
    main()
except SystemExit as done:
    code = done.code
print(json.dumps([code, sorted(m for m in {heavy} if m in sys.modules)]), file=sys.stderr)
"""


@pytest.mark.parametrize("args", [["--help"], ["gray", "--help"], ["normvol", "--help"],
                                  ["bin", "--help"], ["bench", "--help"]])  # fmt: skip
def test_help_in_a_fresh_process_imports_nothing_heavy(args):
    """`imgops --help` (and each command's) through the entry point, in a new interpreter:
    no torch, numpy, cv2, dask, zarr or tifffile (the speed is checked in test_planner_cli)."""
    env = dict(os.environ, PYTHONPATH=str(SRC))
    result = subprocess.run(
        [sys.executable, "-c", _FRESH.format(heavy=HEAVY), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    code, imported = json.loads(result.stderr.strip().splitlines()[-1])
    assert code == 0, result.stderr
    assert "Usage: imgops" in result.stdout
    assert imported == [], f"imgops {' '.join(args)} imported {imported}"


def test_library_packages_alone_import_no_click():
    """The scan above, at run time: the library's entry modules import no click."""
    modules = ["imgops", "imgops.planner", "imgops.report", "imgops.errors", "imgops.dask",
               "imgops.dask.run", "imgops.dask.cluster", "imgops.gray_files"]  # fmt: skip
    code = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(m for m in ('click', 'torch', 'dask') if m in sys.modules)))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(SRC))
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []


def _raising(error: BaseException) -> click.Command:
    @click.command(cls=ImgopsCommand)
    def command() -> None:
        raise error

    return command


@pytest.mark.parametrize(
    ("error", "code", "line"),
    [
        (ImgopsError("the scheduler is gone"), 1, "imgops: error: the scheduler is gone"),
        (FileError("a.tif", "is broken"), 1, "imgops: error: a.tif: is broken"),
        (UsageProblem("--scheduler: needs files"), 2, "Error: --scheduler: needs files"),
    ],
)
def test_every_command_maps_the_librarys_plain_errors(error, code, line):
    """What lets imgops.dask.run raise plain errors (a UsageProblem for stdin/stdout jobs)."""
    result = CliRunner().invoke(_raising(error), [])
    assert result.exit_code == code
    assert line in result.output.splitlines()
