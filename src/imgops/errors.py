"""Errors: plain exceptions for the library (planner, file API), click ones for the commands.

`PlanError` and its subclasses are plain exceptions (no click): the planner and
`imgops.gray_file` raise them, and the command line maps `exit_code` (2: the batch as asked
cannot run, nothing was done; 1: the input cannot be used) onto its exit status.
`ImgopsError`/`FileError` are plain too (library code raises them: volumes, zarr, dask); the
commands turn them into click's one-line errors (imgops.cli_common.ImgopsCommand). This
module never imports click.
"""

from __future__ import annotations

#: The one wording of the no-clobber rule (every command and the planner use it).
OVERWRITE_HINT = "(use --overwrite)"


def output_exists_message(target: object) -> str:
    """The reason given when an existing output is not replaced: 'output T exists (use ...)'."""
    return f"output {target} exists {OVERWRITE_HINT}"


class PlanError(Exception):
    """The batch as asked cannot be planned; nothing has been done. Plain (no click)."""

    exit_code = 2


class UsageProblem(PlanError):
    """Options or inputs that do not go together (exit 2)."""


class OutputCollision(PlanError):
    """Two inputs would write the same output (exit 2); `pairs` lists (first, second, target)."""

    def __init__(self, message: str, pairs: list[tuple[str, str, str]]) -> None:
        super().__init__(message)
        self.pairs = pairs


class OutputIsInput(PlanError):
    """An output (or the stats file) would replace an input or another output (exit 2)."""


class BadTarget(PlanError):
    """An output path that is not, and cannot become, a regular file (exit 2)."""


class InputProblem(PlanError):
    """An input that cannot be used at all (exit 1), e.g. the only input is missing."""

    exit_code = 1

    def __init__(self, path: object, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = str(path)
        self.problem = problem


class FileFailedError(Exception):
    """One file could not be processed (`imgops.gray_file`); `reason` is the one-line why."""

    def __init__(self, path: object, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = str(path)
        self.reason = reason


class ImgopsError(Exception):
    """A failure the user can act on, one line (exit status `exit_code`, 1). Plain: the commands
    print it as `imgops: error: ...` (imgops.cli_common.ImgopsCommand maps it)."""

    exit_code = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def format_message(self) -> str:
        """The one line (click's name for it, kept for callers of the click-era class)."""
        return self.message


class FileError(ImgopsError):
    """A problem with one input or output file: "PATH: PROBLEM"."""

    def __init__(self, path: object, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = str(path)
        self.problem = problem
