"""User-facing errors: one line, naming the file and the problem, exit status 1."""

from __future__ import annotations

import click


class ImgopsError(click.ClickException):
    """A failure the user can act on; printed as one line `imgops: error: ...`, exit status 1."""

    exit_code = 1

    def show(self, file=None) -> None:
        click.echo(f"imgops: error: {self.format_message()}", err=True)


class FileError(ImgopsError):
    """A problem with one input or output file."""

    def __init__(self, path: object, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = str(path)
        self.problem = problem
