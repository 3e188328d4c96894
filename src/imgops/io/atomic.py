"""Atomic output: write to a temporary file beside the target, fsync, then rename into place.

A crash, a bad input, Ctrl-C or SIGTERM never leaves a half-written or clobbered file: the
temporary files of this process are tracked and removed on error and by the signal handlers
that imgops.cli installs (remove_pending_temporaries).

Temporary names are `.<stem, at most 40 bytes>.imgops-tmp-<pid>-<8 hex><suffix>`: hidden, at
most ~100 bytes whatever the target's name (a legal 255-byte name still gets a legal temporary
name), recognisable, and carrying the writer's pid. A run killed with SIGKILL cannot remove its
temporary files; the next run that writes into the same folder removes those of dead processes
older than STALE_AFTER_SECONDS (remove_stale_temporaries), and `imgops doctor` can list them
(stale_temporaries).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..native import cli_kernels

TEMP_MARKER = ".imgops-tmp-"
#: A dead process's temporary file is removed once it is this old (seconds since modified).
STALE_AFTER_SECONDS = 600
_STEM_BYTES = 40  # the part of the target's stem kept in a temporary name
_SUFFIX_BYTES = 16  # longer suffixes are dropped (no encoder chooses by such a suffix)
_TEMP_NAME = re.compile(r"^\..*\.imgops-tmp-(\d+)-[0-9a-f]{8}(\.[^.]*)?$", re.DOTALL)
_pending: set[Path] = set()
_pending_lock = threading.Lock()
_folders: set[Path] = set()  # every folder this process has made a temporary file in
_terminating = False  # set by the signal handlers' clean-up: no new temporary files after it
_active = 0  # atomic_output blocks running now (their temporary may exist, or be about to)
_swept: set[str] = set()
_swept_lock = threading.Lock()


class OutputExistsError(FileExistsError):
    """The output exists and overwriting was not asked for."""


class ExitingError(InterruptedError):
    """The process is exiting on a signal: no new output is started."""


def _cut(text: str, limit: int) -> str:
    """`text` cut to at most `limit` bytes of its file-system encoding, not inside a character."""
    raw = os.fsencode(text)
    if len(raw) <= limit:
        return text
    cut = raw[:limit]
    if raw[limit] & 0xC0 == 0x80:  # cut inside a UTF-8 sequence: drop its leading bytes too
        while cut and cut[-1] & 0xC0 == 0x80:
            cut = cut[:-1]
        if cut and cut[-1] >= 0xC0:
            cut = cut[:-1]
    return os.fsdecode(cut)


def temporary_path_for(target: Path) -> Path:
    """A hidden, unique name beside `target`, < 110 bytes, keeping a short suffix (encoders
    choose by suffix) and the writer's pid (stale files of dead runs are found by it)."""
    target = Path(target)
    suffix = target.suffix if len(os.fsencode(target.suffix)) <= _SUFFIX_BYTES else ""
    stem = _cut(target.name[: len(target.name) - len(suffix)], _STEM_BYTES)
    return target.with_name(f".{stem}{TEMP_MARKER}{os.getpid()}-{secrets.token_hex(4)}{suffix}")


def temporary_owner(path: Path) -> int | None:
    """The pid in an imgops temporary file's name, or None if `path` is not one."""
    match = _TEMP_NAME.match(Path(path).name)
    return int(match.group(1)) if match else None


def _process_alive(pid: int) -> bool:
    if pid <= 0:
        return True  # not a pid we can judge: leave it alone
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, owned by someone else
        return True
    return True


def stale_temporaries(
    folder: str | os.PathLike[str], *, min_age_seconds: float = STALE_AFTER_SECONDS
) -> list[Path]:
    """imgops temporary files in `folder` (not recursive) whose writer process is gone and that
    were last modified at least `min_age_seconds` ago (for doctor and the automatic clean-up)."""
    now = time.time()
    found: list[Path] = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return found
    for entry in entries:
        if TEMP_MARKER not in entry.name:
            continue
        pid = temporary_owner(Path(entry.name))
        if pid is None or pid == os.getpid() or _process_alive(pid):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not entry.is_file(follow_symlinks=False) or now - info.st_mtime < min_age_seconds:
            continue
        found.append(Path(entry.path))
    return sorted(found)


def remove_stale_temporaries(
    folder: str | os.PathLike[str], *, min_age_seconds: float = STALE_AFTER_SECONDS
) -> list[Path]:
    """Removes the stale temporaries of `folder` (see stale_temporaries); returns those removed."""
    removed = []
    for path in stale_temporaries(folder, min_age_seconds=min_age_seconds):
        with contextlib.suppress(OSError):
            path.unlink()
            removed.append(path)
    return removed


def _sweep_once(folder: Path) -> None:
    """Removes dead runs' temporaries from `folder` the first time this process writes there."""
    key = os.path.abspath(folder)
    with _swept_lock:
        if key in _swept:
            return
        _swept.add(key)
    remove_stale_temporaries(folder)


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
def tracked_temporary(target: Path, *, overwrite: bool, check: bool = True) -> Iterator[Path]:
    """Yields a temporary path beside `target`, known to the signal handlers' clean-up while the
    block runs, and removed if the block fails; whoever writes it also commits it (commit(), or
    a native call such as write_bytes_atomic's). `check`: refuse an existing target first
    (without `overwrite`), so a long write fails before its work."""
    target = Path(target)
    if check and not overwrite and target.exists():
        raise OutputExistsError(f"{target}: output exists (use --overwrite)")
    _sweep_once(target.parent)
    temp = temporary_path_for(target)
    global _active
    with _pending_lock:
        if _terminating:
            raise ExitingError(errno.EINTR, "imgops is exiting on a signal", str(target))
        _pending.add(temp)
        _folders.add(temp.parent)
        _active += 1
    try:
        yield temp
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()
        raise
    finally:
        with _pending_lock:
            _pending.discard(temp)
            _active -= 1


@contextlib.contextmanager
def atomic_output(target: Path, *, overwrite: bool, durable: bool = True) -> Iterator[Path]:
    """Yields a temporary path to write; on success it becomes `target`, on any error it is removed.

    Example:
        >>> with atomic_output(Path("out.png"), overwrite=False) as tmp:
        ...     cv2.imwrite(str(tmp), image)
    """
    target = Path(target)
    with tracked_temporary(target, overwrite=overwrite) as temp:
        yield temp
        commit(temp, target, overwrite=overwrite, durable=durable)


def native_write(call: Any, target: Path, *args: Any) -> Any:
    """Runs a native writer `call(*args)` that commits onto `target` (imgops._cli_kernels'
    write_file_atomic, png_encode_to_file); its refusal to replace `target` becomes
    OutputExistsError."""
    try:
        return call(*args)
    except FileExistsError as error:
        if error.filename == str(target):
            raise OutputExistsError(f"{target}: output exists (use --overwrite)") from None
        raise


def remove_pending_temporaries(
    *, final: bool = False, rounds: int = 3, drain_seconds: float = 2.0
) -> None:
    """Deletes every temporary file this process has not committed yet (for signal handlers).

    With `final` (the process exits right after), no new temporary file can be started, the
    writes in progress get up to `drain_seconds` to finish, and
    the folders this process wrote in are then swept `rounds` times, a millisecond apart, for
    temporaries carrying its pid: a worker thread still running while the handler runs may
    (re)create its file after it was unlinked (open() in another thread, or an encoder in C).
    """
    global _terminating
    if final:
        with _pending_lock:
            _terminating = True
        # The writes in progress end by themselves (committed, or their temporary unlinked by
        # their own clean-up) within milliseconds: wait for them, a bounded time, so no thread
        # (re)creates a temporary after the sweep below (seen on a loaded 2-core machine).
        deadline = time.monotonic() + drain_seconds
        while _active and time.monotonic() < deadline:
            time.sleep(0.002)
    with _pending_lock:
        pending = list(_pending)
        _pending.clear()
        folders = list(_folders) if final else []
    for temp in pending:
        with contextlib.suppress(OSError):
            temp.unlink()
    for round_ in range(rounds if folders else 0):
        if round_:
            time.sleep(0.001)
        for folder in folders:
            for temp in _own_temporaries(folder):
                with contextlib.suppress(OSError):
                    temp.unlink()


def _own_temporaries(folder: Path) -> list[Path]:
    """This process's temporary files in `folder` (by the pid in their names)."""
    mine = []
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for entry in entries:
            if TEMP_MARKER in entry.name and temporary_owner(Path(entry.path)) == os.getpid():
                mine.append(Path(entry.path))
    return mine


def write_bytes_atomic(
    target: Path, data: bytes | memoryview, *, overwrite: bool, durable: bool = True
) -> int:
    """Writes `data` to `target` atomically; returns the byte count (all of data's bytes).

    With imgops._cli_kernels, one native call writes, syncs and commits the file with the GIL
    released throughout (a batch's 30-odd threads contend for it: one hand-off per file instead
    of one per system call); else through os.open/os.write."""
    view = memoryview(data)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    target = Path(target)
    kernels = cli_kernels()
    if kernels is not None and hasattr(kernels, "write_file_atomic"):
        with tracked_temporary(target, overwrite=overwrite, check=False) as temp:
            return native_write(
                kernels.write_file_atomic, target, view, str(temp), str(target), overwrite, durable
            )
    with atomic_output(target, overwrite=overwrite, durable=durable) as temp:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
        try:
            written = 0
            while written < view.nbytes:  # a regular file takes it all, up to ~2 GiB a call
                count = os.write(fd, view[written:])
                if count <= 0:
                    raise OSError(
                        errno.EIO, f"short write ({written} of {view.nbytes} bytes)", str(target)
                    )
                written += count
        finally:
            os.close(fd)
    return written
