"""Signal handling for the command line: a killed run leaves no temporary or partial output.

SIGTERM, SIGHUP (a closed terminal) and SIGQUIT remove this process's pending temporary files
and exit with 128 + the signal number, as a shell reports a death by that signal. SIGINT stays
Python's KeyboardInterrupt, which the commands turn into a summary and exit status 130.
"""

from __future__ import annotations

import os
import signal

from .atomic import remove_pending_temporaries

__all__ = ["TERMINATING_SIGNALS", "install"]

TERMINATING_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGHUP", "SIGQUIT") if hasattr(signal, name)
)


def _terminate(signum: int, frame) -> None:
    remove_pending_temporaries(final=True)  # no new temporaries; late ones swept up too
    os._exit(128 + signum)


def install() -> None:
    """Makes SIGTERM, SIGHUP and SIGQUIT clean up pending temporary files, then exit."""
    for signum in TERMINATING_SIGNALS:
        signal.signal(signum, _terminate)
