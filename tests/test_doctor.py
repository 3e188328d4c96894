"""`imgops doctor`: the build it reports and the problems it names, each with what to do."""

from __future__ import annotations

import json

from click.testing import CliRunner

from imgops.cli import cli
from imgops.commands.doctor import find_problems

HEALTHY = {
    "cuda_available": True,
    "cuda_kernels": True,
    "cuda_skipped_reason": "",
    "torch_cuda": "13.0",
    "nvcc_found": "13.0",
    "rebuild_reason": "",
    "cli_kernels": True,
}


def test_a_healthy_build_has_no_problems():
    assert find_problems(HEALTHY) == []
    assert find_problems({**HEALTHY, "cuda_available": False, "torch_cuda": None}) == []


def test_each_problem_says_what_to_do():
    cases = {
        "the CUDA kernels are not compiled in": {"cuda_kernels": False, "cuda_skipped_reason": "x"},
        "cannot be built; install a matching": {"nvcc_found": "12.8"},
        "no nvcc found": {"cuda_kernels": False, "nvcc_found": None},
        "a just-in-time build was used": {"rebuild_reason": "built for torch 2.10"},
        "imgops._cli_kernels is not built": {"cli_kernels": False},
    }
    for needle, change in cases.items():
        problems = find_problems({**HEALTHY, **change})
        assert any(needle in problem for problem in problems), (needle, problems)


def test_doctor_json_reports_the_build_and_the_cli_kernels():
    result = CliRunner().invoke(cli, ["doctor", "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    assert info["cli_kernels"] is True  # built ahead of time with the package
    assert {"torch", "cuda_kernels", "problems"} <= set(info)
