"""Reading inputs and writing to streams: the one place every command's bytes go through.

`read_input_bytes` reads one input file whole; `write_stream` writes encoded bytes to an open
binary stream (stdout). Both raise OSError naming the file or stream on any problem.
"""

from __future__ import annotations

from pathlib import Path
from typing import IO

__all__ = ["read_input_bytes", "write_stream"]


def read_input_bytes(path: Path) -> bytes:
    """The whole content of the input file `path`."""
    if path.is_dir():
        raise IsADirectoryError(21, "is a directory", str(path))
    with open(path, "rb") as handle:
        return handle.read()


def write_stream(stream: IO[bytes], data: bytes | memoryview, name: str = "<stdout>") -> None:
    """Writes all of `data` to `stream` (named `name` in errors) and flushes it."""
    written = stream.write(data)
    if written is not None and written != len(data):
        raise OSError(f"{name}: short write ({written} of {len(data)} bytes)")
    stream.flush()
