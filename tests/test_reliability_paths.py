"""Fuzzing the kinds of path an input can be (issue 11): FIFOs, devices, sockets, links (good,
broken, looping, to a device), 240-251-byte and non-UTF-8 names, empty files, folders named
like images, unreadable files, hard links. Each case builds a random folder of such entries and
runs `imgops gray FOLDER -d OUT` (sometimes with -r, sometimes naming every entry) in a real
process under a timeout.

The oracle, per case: no hang, no traceback; exit 0 when every entry is good and 1 otherwise;
every good image has an output equal to the BT.601 formula (one file reached through several
symlinks: one output, where it first appears, as the planner documents; hard links: each); every bad
entry is named in exactly one error line (and nothing else is); no temporary file is left; the
inputs are unchanged. Needs the shared planner (imgops.planner): skipped without it.

CI runs a few seeded cases; `IMGOPS_FUZZ_SECONDS=300` runs cases for that long.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import pytest

pytest.importorskip("imgops.planner", reason="the path oracle needs the shared planner")

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
ENV = {**os.environ, "PYTHONWARNINGS": "ignore"}
#: As root, imgops runs without CAP_DAC_OVERRIDE/CAP_DAC_READ_SEARCH, so chmod 000 applies.
SETPRIV = shutil.which("setpriv") if os.geteuid() == 0 else None
NO_DAC = [
    b"--inh-caps=-dac_override,-dac_read_search",
    b"--bounding-set=-dac_override,-dac_read_search",
]
GOOD = {"png": "coffee_rgb.png", "jpg": "rocket_baseline_rgb.jpg"}
KINDS = (
    "good", "good", "good", "hardlink", "symlink_good", "long_name", "non_utf8",
    "fifo", "dev_null_link", "dev_zero_link", "char_device", "socket", "broken_link",
    "loop_link", "empty", "folder_named_png", "unreadable", "text_named_png",
)  # fmt: skip
BAD = {
    "fifo", "dev_null_link", "dev_zero_link", "char_device", "socket", "broken_link",
    "loop_link", "empty", "unreadable", "text_named_png",
}  # fmt: skip


def luma(bgr: np.ndarray) -> np.ndarray:
    wide = bgr.astype(np.int64)
    return ((299 * wide[..., 2] + 587 * wide[..., 1] + 114 * wide[..., 0] + 500) // 1000).astype(
        bgr.dtype
    )


@dataclass
class Entry:
    token: str  # an ASCII id in the name, to find it in messages
    kind: str
    name: str | bytes
    expected: np.ndarray | None = None


def _make(folder: Path, token: str, kind: str, rng: random.Random, sockets: list) -> Entry | None:
    ext = rng.choice(list(GOOD))
    name: str | bytes = f"{token}-{kind}.{ext}"
    path = folder / name
    source = SAMPLES / GOOD[ext]
    expected = luma(cv2.imread(str(source), cv2.IMREAD_COLOR))
    if kind == "good":
        path.write_bytes(source.read_bytes())
    elif kind == "hardlink":
        os.link(source, path)
    elif kind == "symlink_good":
        path.symlink_to(source)
    elif kind == "long_name":
        name = f"{token}-" + "l" * rng.randint(230, 250 - len(token)) + f".{ext}"
        (folder / name).write_bytes(source.read_bytes())
    elif kind == "non_utf8":
        name = os.fsencode(f"{token}-") + b"\xff\xfe-caf\xe9." + ext.encode()
        with open(os.path.join(os.fsencode(folder), name), "wb") as handle:
            handle.write(source.read_bytes())
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev_null_link":
        path.symlink_to("/dev/null")
    elif kind == "dev_zero_link":
        path.symlink_to("/dev/zero")
    elif kind == "char_device":
        try:
            os.mknod(path, 0o600 | 0o020000, os.makedev(1, 3))  # like /dev/null
        except OSError:
            return None
    elif kind == "socket":
        server = socket.socket(socket.AF_UNIX)
        try:
            server.bind(str(path))
        except OSError:  # AF_UNIX paths are limited to 108 bytes
            server.close()
            return None
        sockets.append(server)
    elif kind == "broken_link":
        path.symlink_to(folder / "does-not-exist.png")
    elif kind == "loop_link":
        path.symlink_to(path)
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "folder_named_png":
        path.mkdir()
    elif kind == "unreadable":
        if os.geteuid() == 0 and SETPRIV is None:
            return None  # root reads everything: permission bits do not apply
        path.write_bytes(source.read_bytes())
        path.chmod(0)
    elif kind == "text_named_png":
        path.write_bytes(b"just some text, not an image\n" * 3)
    neutral = kind in BAD or kind == "folder_named_png"  # an empty folder: no output, no error
    return Entry(token, kind, name, None if neutral else expected)


def _snapshot(folder: Path) -> dict[bytes, str]:
    found = {}
    for root, _, files in os.walk(os.fsencode(folder)):
        for name in files:
            path = os.path.join(root, name)
            if os.path.isfile(path) and not os.path.islink(path):
                found[path] = hashlib.sha256(Path(os.fsdecode(path)).read_bytes()).hexdigest()
    return found


def run_case(tmp: Path, seed: int) -> None:
    """One random folder of entries through `imgops gray`; asserts the oracle."""
    rng = random.Random(seed)
    folder = tmp / f"case{seed}"
    folder.mkdir()
    sockets: list[socket.socket] = []
    entries = []
    for i in range(rng.randint(2, 7)):
        entry = _make(folder, f"e{i:02d}", rng.choice(KINDS), rng, sockets)
        if entry is not None:
            entries.append(entry)
    before = _snapshot(folder)
    out = tmp / f"out{seed}"
    mode = rng.choice(["folder", "folder_r", "named"])
    if mode == "named":
        targets = [os.path.join(os.fsencode(folder), os.fsencode(e.name)) for e in entries]
        args = [*targets, b"-d", os.fsencode(out)]
        for entry in entries:  # a folder named as an input with no images in it is an error
            if entry.kind == "folder_named_png":
                entry.kind = "empty_folder_input"
    else:
        args = [os.fsencode(folder), b"-d", os.fsencode(out)] + (
            [b"-r"] if mode == "folder_r" else []
        )
    try:
        process = subprocess.run(
            [
                *([os.fsencode(SETPRIV), *NO_DAC] if SETPRIV else []),
                sys.executable.encode(),
                b"-m",
                b"imgops.cli",
                b"gray",
                *args,
            ],
            capture_output=True,
            timeout=60,
            env=ENV,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"seed {seed}: imgops hung on {[e.kind for e in entries]}")
    finally:
        for server in sockets:
            server.close()
    stderr = process.stderr.decode("utf-8", "replace")
    context = f"seed {seed} mode {mode} {[(e.token, e.kind) for e in entries]}:\n{stderr}"
    assert "Traceback" not in stderr, context
    bad = [e for e in entries if e.kind in BAD or e.kind == "empty_folder_input"]
    good = [e for e in entries if e.expected is not None]
    assert process.returncode == (1 if bad else 0), context
    error_lines = [line for line in stderr.splitlines() if line.startswith("imgops: error:")]
    for entry in bad:
        named = [line for line in error_lines if f"{entry.token}-" in line]
        assert len(named) == 1, (entry.kind, context)
    assert len(error_lines) == len(bad), context
    done_files: set[bytes] = set()
    for entry in good:  # in the planner's order (the tokens sort as the names do)
        stem = os.path.splitext(os.fsencode(entry.name))[0]
        target = os.path.join(os.fsencode(out), stem + b".png")
        real = os.path.realpath(os.path.join(os.fsencode(folder), os.fsencode(entry.name)))
        if real in done_files:
            # the planner does one file named twice (through symlinks) once, where it came
            # first; hard links are different names and each is done
            assert not os.path.exists(target), context
            continue
        done_files.add(real)
        written = cv2.imdecode(np.fromfile(os.fsdecode(target), np.uint8), cv2.IMREAD_UNCHANGED)
        np.testing.assert_array_equal(written, entry.expected, err_msg=context)
    leftovers = [p for p in tmp.rglob("*") if ".imgops-tmp-" in p.name]
    assert leftovers == [], context
    assert _snapshot(folder) == before, context


@pytest.mark.parametrize("seed", range(6))
def test_path_kinds_fuzz_seeded(tmp_path: Path, seed: int):
    run_case(tmp_path, seed)


@pytest.mark.skipif(not os.environ.get("IMGOPS_FUZZ_SECONDS"), reason="IMGOPS_FUZZ_SECONDS unset")
def test_path_kinds_fuzz_for_a_time_budget(tmp_path: Path):
    deadline = time.monotonic() + float(os.environ["IMGOPS_FUZZ_SECONDS"])
    seed = 1000
    while time.monotonic() < deadline:
        run_case(tmp_path, seed)
        seed += 1
    print(f"path fuzz: {seed - 1000} cases, 0 mishandled")
