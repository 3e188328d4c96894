"""Reading inputs and writing to streams: the one place every command's bytes go through.

- `check_input(path)`: is `path` something imgops may read (a readable regular file)? The
  planner calls it for every input, so a FIFO, a device, a socket or a folder is one clear error
  before any work, and nothing can hang.
- `read_input_bytes(path)`: the whole content of one input file. It opens non-blocking (a FIFO
  swapped in after planning cannot hang it), refuses anything but a regular file from the open
  descriptor, bounds the size before reading (so /dev/zero or a 40 GB file cannot exhaust
  memory) and reads exactly the size fstat reported, failing if the file grows or shrinks.
- `write_stream(stream, data, name)`: writes encoded bytes to an open binary stream (stdout),
  checking the count of every write() (raw unbuffered streams may write less: the rest is
  written again; 0 bytes, EPIPE or ENOSPC are errors), so a full disk or a closed pipe is a
  failure, never "1 written".

All raise OSError with the file name and a one-line reason.
"""

from __future__ import annotations

import errno
import io
import os
import select
import stat
from pathlib import Path
from typing import IO, Any

from ..native import cli_kernels

__all__ = [
    "MAX_INPUT_BYTES",
    "check_input",
    "describe_file_type",
    "file_kind",
    "read_input_bytes",
    "write_stream",
]

#: Default size bound of one input: OpenCV decodes buffers of at most 2**31 - 1 bytes.
MAX_INPUT_BYTES = (1 << 31) - 1

_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)


def file_kind(mode: int) -> str | None:
    """What a file of mode `mode` is, in words ("a FIFO (named pipe)"); None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def describe_file_type(mode: int) -> str | None:
    """Why a file of mode `mode` is no input ("is a FIFO (named pipe), ..."); None if regular."""
    kind = file_kind(mode)
    if kind is None:
        return None
    if kind in ("a directory", "not a regular file"):
        return f"is {kind}"
    return f"is {kind}, not a regular file"


def _not_regular(mode: int, path: Path | str) -> OSError:
    reason = describe_file_type(mode) or "is not a regular file"
    code = errno.EISDIR if stat.S_ISDIR(mode) else errno.EINVAL
    return OSError(code, reason, str(path))


def _size_text(size: int) -> str:
    if size >= 1 << 30:
        return f"{size / (1 << 30):.1f} GiB"
    return f"{size / (1 << 20):.1f} MiB"


def check_input(path: str | os.PathLike[str]) -> os.stat_result:
    """The stat of `path` if it is a readable regular file (symlinks followed); else OSError.

    Never opens the file, so it cannot block. The OSError's strerror is a one-line reason
    ("is a FIFO (named pipe), not a regular file", "broken symbolic link", "Permission denied").
    """
    name = os.fspath(path)
    try:
        info = os.stat(name)
    except FileNotFoundError:
        if os.path.islink(name):
            raise FileNotFoundError(errno.ENOENT, "broken symbolic link", name) from None
        raise
    if not stat.S_ISREG(info.st_mode):
        raise _not_regular(info.st_mode, name)
    if not os.access(name, os.R_OK):
        raise PermissionError(errno.EACCES, "Permission denied", name)
    return info


def _too_large(size: int, limit: int, name: str) -> OSError:
    return OSError(
        errno.EFBIG,
        f"file is {_size_text(size)} ({size} bytes), over imgops' limit of "
        f"{_size_text(limit)} for one image",
        name,
    )


def _unopenable(error: OSError, name: str) -> OSError:
    """The error to raise for a failed open: a socket or a device without a driver (ENXIO,
    EOPNOTSUPP) is said for what it is; anything else is the open's own error."""
    if error.errno not in (errno.ENXIO, errno.EOPNOTSUPP):
        return error
    try:
        mode = os.stat(name).st_mode
    except OSError:
        return error
    return _not_regular(mode, name)


def _read_natively(kernels: Any, name: str, limit: int) -> bytes:
    """read_input_bytes through imgops._cli_kernels.read_file: the same checks and errors, two
    GIL hand-offs a file instead of five system calls' worth."""
    try:
        data = kernels.read_file(name, limit)
    except OSError as error:
        raise _unopenable(error, name) from None
    if isinstance(data, bytes):
        return data
    why = data[0]
    if why == "not regular":
        raise _not_regular(data[1], name)
    if why == "too large":
        raise _too_large(data[1], limit, name)
    if why == "shrank":
        raise OSError(
            errno.EIO, f"file shrank while being read ({data[1]} of {data[2]} bytes)", name
        )
    raise OSError(errno.EIO, f"file grew while being read (past {data[1]} bytes)", name)


def read_input_bytes(path: str | os.PathLike[str], *, max_bytes: int | None = None) -> bytes:
    """The whole content of the regular file `path`, at most `max_bytes` (default MAX_INPUT_BYTES).

    Raises OSError (naming `path`) for a FIFO, device, socket or folder, a file over the bound
    (checked before reading), and a file that grows or shrinks while it is read.
    """
    name = os.fspath(path)
    limit = MAX_INPUT_BYTES if max_bytes is None else max_bytes
    kernels = cli_kernels()
    if kernels is not None and hasattr(kernels, "read_file"):
        return _read_natively(kernels, name, limit)
    try:
        fd = os.open(name, _OPEN_FLAGS)
    except OSError as error:
        raise _unopenable(error, name) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _not_regular(info.st_mode, name)
        size = info.st_size
        if size > limit:
            raise _too_large(size, limit, name)
        chunks: list[bytes] = []
        remaining = size
        while remaining > 0:
            chunk = os.read(fd, remaining)
            if not chunk:
                raise OSError(
                    errno.EIO, f"file shrank while being read ({size - remaining} of {size} bytes)",
                    name,
                )  # fmt: skip
            chunks.append(chunk)
            remaining -= len(chunk)
        if os.read(fd, 1):
            raise OSError(errno.EIO, f"file grew while being read (past {size} bytes)", name)
    finally:
        os.close(fd)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _wait_writable(stream: IO[bytes], name: str) -> None:
    """Blocks until a non-blocking stream can take bytes again (a raw write returned None)."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        raise OSError(errno.EAGAIN, "stream would block and cannot be waited on", name) from None
    select.select([], [fd], [])


def write_stream(stream: IO[bytes], data: bytes | memoryview, name: str = "<stdout>") -> None:
    """Writes all of `data` to `stream` (named `name` in errors) and flushes it.

    Short writes are continued; a write of 0 bytes, a closed pipe (EPIPE) or a full disk
    (ENOSPC) raise OSError naming `name` with the count written so far.
    """
    view = memoryview(data).cast("B")
    total, done = len(view), 0
    try:
        while done < total:
            try:
                written = stream.write(view[done:])
            except BlockingIOError as error:  # buffered stream over a non-blocking descriptor
                written = error.characters_written
                if not written:
                    _wait_writable(stream, name)
                    continue
            if written is None:  # raw stream, non-blocking descriptor, nothing taken
                _wait_writable(stream, name)
                continue
            if written <= 0:
                raise OSError(
                    errno.EIO, f"write returned {written} after {done} of {total} bytes", name
                )
            done += written
        stream.flush()
    except BrokenPipeError:
        raise OSError(
            errno.EPIPE, f"the reader closed the pipe before all {total} bytes were written", name
        ) from None
    except OSError as error:
        if error.filename is not None:
            raise
        reason = error.strerror or str(error)
        # A buffered stream takes bytes before they reach the file and fails on a later flush:
        # how many arrived is unknown then, so only a raw stream's count is given.
        if isinstance(stream, io.RawIOBase):
            detail = f"wrote {done} of {total} bytes"
        else:
            detail = f"the output is short of its {total} bytes"
        raise OSError(error.errno, f"{reason} ({detail})", name) from None
