"""Atomic output: write to a temporary file beside the target, fsync, then rename into place.

A crash, a bad input, Ctrl-C or SIGTERM never leaves a half-written or clobbered file: the
temporary files of this process are tracked and removed on error and by the signal handlers
that imgops.cli installs (remove_pending_temporaries).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import threading
from collections.abc import Iterator
from pathlib import Path

TEMP_MARKER = ".imgops-tmp-"
_pending: set[Path] = set()
_pending_lock = threading.Lock()


class OutputExistsError(FileExistsError):
    """The output exists and overwriting was not asked for."""


def temporary_path_for(target: Path) -> Path:
    """A hidden, unique name beside `target` that keeps its suffix (encoders choose by suffix)."""
    return target.with_name(
        f".{target.stem}{TEMP_MARKER}{os.getpid()}-{secrets.token_hex(4)}{target.suffix}"
    )


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):  # not every filesystem lets a directory be fsynced
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def commit(temp: Path, target: Path, *, overwrite: bool, durable: bool = True) -> None:
    """Moves a finished temporary file onto `target`; without `overwrite`, never replaces one."""
    if durable:
        _fsync_file(temp)
    if overwrite:
        os.replace(temp, target)
    else:
        try:
            os.link(temp, target)  # fails if target exists, even if another process just made it
        except FileExistsError:
            raise OutputExistsError(f"{target}: output exists (use --overwrite)") from None
        except OSError:
            # Filesystems without hard links: check-then-rename (a small race, documented).
            if target.exists():
                raise OutputExistsError(f"{target}: output exists (use --overwrite)") from None
            os.replace(temp, target)
        else:
            os.unlink(temp)
    if durable:
        _fsync_dir(target.parent)


def check_output_folder(target: Path) -> None:
    """Raises the OSError a write of `target` would meet if its folder is missing or read-only
    (so a long job fails before its work, not at the end)."""
    folder = Path(target).parent
    if not folder.exists():
        raise FileNotFoundError(errno.ENOENT, "output folder does not exist", str(folder))
    if not folder.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "output folder is not a directory", str(folder))
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PermissionError(errno.EACCES, "output folder is not writable", str(folder))


@contextlib.contextmanager
def atomic_output(target: Path, *, overwrite: bool, durable: bool = True) -> Iterator[Path]:
    """Yields a temporary path to write; on success it becomes `target`, on any error it is removed.

    Example:
        >>> with atomic_output(Path("out.png"), overwrite=False) as tmp:
        ...     cv2.imwrite(str(tmp), image)
    """
    target = Path(target)
    if not overwrite and target.exists():
        raise OutputExistsError(f"{target}: output exists (use --overwrite)")
    temp = temporary_path_for(target)
    with _pending_lock:
        _pending.add(temp)
    try:
        yield temp
        commit(temp, target, overwrite=overwrite, durable=durable)
    finally:
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()
        with _pending_lock:
            _pending.discard(temp)


def remove_pending_temporaries() -> None:
    """Deletes every temporary file this process has not committed yet (for signal handlers)."""
    with _pending_lock:
        pending = list(_pending)
        _pending.clear()
    for temp in pending:
        with contextlib.suppress(OSError):
            temp.unlink()


def write_bytes_atomic(
    target: Path, data: bytes | memoryview, *, overwrite: bool, durable: bool = True
) -> int:
    """Writes `data` to `target` atomically; returns the byte count, checked against len(data)."""
    with atomic_output(target, overwrite=overwrite, durable=durable) as temp, open(temp, "wb") as f:
        written = f.write(data)
        if written != len(data):
            raise OSError(errno.EIO, f"short write ({written} of {len(data)} bytes)", str(target))
    return written
