"""One Report for every command (black's report.py is the model): what was written, skipped and
failed, with reasons; the summary line; the exit status; the JSON for `--stats-json`.

Messages and the progress bar share one rich Console on stderr, so a file's error prints above
the bar, never on its row. `quiet` silences progress and information, never errors. Plain
Python: rich is imported only when the first message or bar needs it; no click.
"""

from __future__ import annotations

import contextlib
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_OK", "Failure", "Report"]

EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130
ERROR_PREFIX = "imgops: error: "


@dataclass(frozen=True)
class Failure:
    """One input that was not done: `label` names it, `reason` says why in one line."""

    label: str
    reason: str


@dataclass
class Report:
    """Counts and messages for one batch; feed it with `add` (the engine's on_result) or the
    planner's entries (`skip`, `fail`). `total` is the number of entries of the batch."""

    quiet: bool = False
    verbose: bool = False
    total: int = 0
    written: int = 0
    skipped: int = 0
    failures: list[Failure] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    interrupted: bool = False
    #: False for library callers (imgops.gray_file): failures are raised, not printed.
    print_errors: bool = True
    _console: Any = field(default=None, repr=False)

    # ------------------------------------------------------------------ counting
    @property
    def failed(self) -> int:
        """How many inputs failed."""
        return len(self.failures)

    @property
    def done(self) -> int:
        """Entries finished one way or another."""
        return self.written + self.skipped + self.failed

    def wrote(self, label: str, target: object = None, detail: str | None = None) -> None:
        """Counts one written output (named with -v)."""
        self.written += 1
        where = "<stdout>" if target is None else str(target)
        self.outputs.append(where)
        if self.shows_details:
            self.detail(f"{label} -> {where}" + (f" ({detail})" if detail else ""))

    @property
    def shows_details(self) -> bool:
        """Whether detail() prints (-v without -q): per-file lines are built only then."""
        return self.verbose and not self.quiet

    def skip(self, label: str, reason: str) -> None:
        """Counts one skipped input (the reason shown with -v)."""
        self.skipped += 1
        self.detail(f"{label}: {reason}")

    def fail(self, label: str, reason: str, error: BaseException | None = None) -> None:
        """Counts one failed input and prints its one line (even with -q; the traceback, -v)."""
        self.failures.append(Failure(label, reason))
        if not self.print_errors:
            return
        self.error(f"{label}: {reason}")
        if self.verbose and error is not None and error.__traceback__ is not None:
            self._print("".join(traceback.format_exception(error)).rstrip())

    def add(self, result: Any) -> None:
        """Counts one result of the batch engine (imgops.pipeline.JobResult)."""
        label = result.job.label
        if result.status == "failed":
            self.fail(label, result.reason or "failed", result.error)
        elif result.status == "skipped":
            self.skip(label, f"skipped, {result.job.target} exists")
        else:
            if result.note:
                self.info(f"{label}: {result.note}")
            detail = _result_detail(result) if self.shows_details else None
            self.wrote(label, result.job.target, detail)

    def add_plan(self, plan: Any) -> None:
        """Counts the planner's own entries (an imgops.planner.Plan): `total` becomes the
        plan's, its problems fail, its skips skip; inputs left out (a rerun) are named with -v."""
        self.total = plan.total
        for problem in plan.problems:
            self.fail(problem.label, problem.reason)
        for skipped in plan.skipped:
            self.skip(skipped.label, skipped.reason)
        for left in plan.left_out:
            self.detail(f"{left.label}: {left.reason}")

    # ------------------------------------------------------------------ the end
    def line(self) -> str:
        """The summary line: "N written, M skipped, K failed"."""
        return f"{self.written} written, {self.skipped} skipped, {self.failed} failed"

    def interrupted_line(self) -> str:
        """What Ctrl-C leaves: "interrupted: N written, M left; rerun with --skip-existing"."""
        left = max(0, self.total - self.done)
        return (
            f"interrupted: {self.written} written, {left} left; "
            "rerun with --skip-existing to finish"
        )

    @property
    def exit_code(self) -> int:
        """0 when everything was written or skipped, 1 if anything failed, 130 if interrupted."""
        if self.interrupted:
            return EXIT_INTERRUPTED
        return EXIT_FAILED if self.failures else EXIT_OK

    def as_dict(self) -> dict[str, Any]:
        """Counts and the failed inputs with reasons, JSON-ready (for --stats-json)."""
        return {
            "written": self.written,
            "skipped": self.skipped,
            "failed": self.failed,
            "interrupted": self.interrupted,
            "failures": [{"input": f.label, "reason": f.reason} for f in self.failures],
        }

    def finish(self) -> int:
        """Prints the summary (or the interrupted line) and returns the exit status."""
        if self.interrupted:
            self.error(self.interrupted_line())
        else:
            self.info(self.line())
        return self.exit_code

    # ------------------------------------------------------------------ printing
    @property
    def console(self):
        """The one rich Console on stderr that messages and the progress bar share."""
        if self._console is None:
            from rich.console import Console

            self._console = Console(file=_Stderr(), highlight=False, emoji=False)
        return self._console

    def _print(self, text: str) -> None:
        from rich.text import Text

        # A Text is printed as is (no markup in file names); soft_wrap: never wrapped.
        self.console.print(Text(text), soft_wrap=True)

    def error(self, message: str) -> None:
        """One error line, always printed: `imgops: error: MESSAGE`."""
        self._print(ERROR_PREFIX + message)

    def info(self, message: str) -> None:
        """A line for the user; silent with -q."""
        if not self.quiet:
            self._print(message)

    def detail(self, message: str) -> None:
        """A line shown only with -v (and not -q)."""
        if self.verbose and not self.quiet:
            self._print(message)

    @property
    def show_progress(self) -> bool:
        """A bar only on a terminal, and not with -q."""
        return not self.quiet and sys.stderr.isatty()

    @contextlib.contextmanager
    def progress(self, description: str, total: float | None) -> Iterator[Callable[..., None]]:
        """A rich progress bar on the shared console; yields advance(n=1)."""
        if not self.show_progress:
            yield lambda n=1: None
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

        with Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
            # Every message goes through self.console already; stdout may carry image data.
            redirect_stdout=False,
            redirect_stderr=False,
        ) as bar:
            task = bar.add_task(description, total=total)
            yield lambda n=1: bar.advance(task, n)


class _Stderr:
    """Whatever sys.stderr is at the time of each write (test runners swap it)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        return sys.stderr.isatty()

    def fileno(self) -> int:
        return sys.stderr.fileno()

    @property
    def encoding(self) -> str:
        return getattr(sys.stderr, "encoding", None) or "utf-8"


def _result_detail(result: Any) -> str | None:
    """ "600x400 uint8, 1234 bytes, 12 ms" for a written engine result."""
    shape = getattr(result, "shape", None)
    if not shape:
        return None
    size = "x".join(str(n) for n in shape[:2][::-1])
    millis = 1000 * sum(getattr(result, "seconds", {}).values())
    return f"{size} {result.dtype}, {result.bytes_written} bytes, {millis:.0f} ms"


def write_stats(path: Path, stats: dict[str, Any]) -> None:
    """Writes `stats` as JSON to `path` atomically (a temporary file renamed into place)."""
    import json

    from .io.atomic import write_bytes_atomic

    data = (json.dumps(stats, indent=2, default=str) + "\n").encode()
    write_bytes_atomic(Path(path), data, overwrite=True, durable=False)
