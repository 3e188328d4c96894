"""The command line keeps numpy's OpenBLAS to one thread (imgops.cli.single_threaded_blas):
its threads would spin ~0.1 s of CPU each at numpy's import, while the workers decode."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from imgops import cli

SAMPLE = Path(__file__).resolve().parent.parent / "samples" / "rocket_baseline_rgb.jpg"

# Run in a fresh interpreter: the CLI's gray command on a sample, then OpenBLAS asked how many
# threads it has (scipy-openblas names its functions with a prefix; other builds: -1).
_CHILD = r"""
import ctypes, os, sys
from imgops import cli
sys.argv = ["imgops", "-q", "gray", sys.argv[1], "-o", sys.argv[2], "--device", "cpu"]
try:
    cli.main()
except SystemExit as done:
    assert done.code in (0, None), done.code
import numpy  # imported by the command already
threads = -1
for line in open("/proc/self/maps"):
    if "openblas" in line.lower():
        library = ctypes.CDLL(line.split()[-1])
        for name in ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads"):
            if hasattr(library, name):
                threads = getattr(library, name)()
                break
        break
print(os.environ.get("OPENBLAS_NUM_THREADS"), threads)
"""


def _run_child(tmp_path: Path, env: dict[str, str]) -> tuple[str, int]:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(SAMPLE), str(tmp_path / "out.png")],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    value, threads = done.stdout.split()
    return value, int(threads)


def _env_without_blas_setting() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    return env


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_cli_keeps_openblas_to_one_thread(tmp_path: Path) -> None:
    value, threads = _run_child(tmp_path, _env_without_blas_setting())
    assert value == "1"
    assert (tmp_path / "out.png").stat().st_size > 0
    if threads == -1:
        pytest.skip("numpy's BLAS here is not an OpenBLAS that reports its threads")
    assert threads == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="OpenBLAS has one thread anyway")
def test_a_setting_of_the_caller_is_kept(tmp_path: Path) -> None:
    env = _env_without_blas_setting()
    env["OPENBLAS_NUM_THREADS"] = "2"
    value, threads = _run_child(tmp_path, env)
    assert value == "2"
    if threads != -1:
        assert threads == 2


def test_single_threaded_blas_sets_only_a_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    cli.single_threaded_blas()
    assert os.environ["OPENBLAS_NUM_THREADS"] == "1"
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "3")
    cli.single_threaded_blas()
    assert os.environ["OPENBLAS_NUM_THREADS"] == "3"
