#!/usr/bin/env python
"""Fuzz the kinds of path `imgops gray` and `imgops normvol` are given, for a time budget.

    $ python scripts/fuzz_paths.py --seconds 150 [--seed 1] [--command gray|normvol|both]

Each case builds a random tree: real images (gray) or small uint16 stacks (normvol), hard
links and symlinks to them, names of 200-255 bytes, non-UTF-8 names, FIFOs, device nodes
(os.mknod where permitted), symlinks to /dev/null and /dev/zero, sockets, dangling links,
self and mutual symlink loops, folder links back up the tree, empty files, text named like an
image, unreadable files and folders, sub-folders of all these. It runs the command over the
folder (with or without -r) or over every entry by name, into a fresh -d folder, in a real
process under a timeout, and judges it:

- no hang (the timeout) and no traceback;
- exit status 0 when every entry is good, 1 when any is bad (2, a usage error, is wrong here);
- every bad entry is named in exactly one `imgops: error:` line, and no other error line;
- every good entry has its output, exact (gray: the integer BT.601 formula of what OpenCV
  decodes; normvol: float32(x) / float32(max)), and nothing else is written;
- no input changed (sha256 of every regular file, and the kind of every other entry);
- no temporary file (`.imgops-tmp-`) left anywhere in the case folder.

Unreadable entries: root ignores permission bits, so as root the command runs under
`setpriv` with CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH dropped (chmod 000 then applies to
root as to any owner); root without setpriv leaves those kinds out and says so.
Prints a JSON summary; exits 1 if any case was mishandled (each one printed with its seed:
`--seed S --cases 1` replays it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np
import tifffile

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"
TEMP = b"imgops-tmp"
GOOD_IMAGES = {".png": "light_palette_64px.png", ".jpg": "rocket_baseline_rgb.jpg"}
VOLUME_MAX = 4095
NO_DAC = [
    "--inh-caps=-dac_override,-dac_read_search",
    "--bounding-set=-dac_override,-dac_read_search",
]
FILE_KINDS = (
    "good", "good", "good", "hardlink", "symlink", "long_name", "non_utf8",
    "fifo", "char_device", "dev_null_link", "dev_zero_link", "socket", "dangling",
    "self_loop", "mutual_loop", "empty", "text", "unreadable",
)  # fmt: skip
FOLDER_KINDS = ("subfolder", "unreadable_folder", "up_link", "empty_folder")
BAD = {
    "fifo", "char_device", "dev_null_link", "dev_zero_link", "socket", "dangling",
    "self_loop", "mutual_loop", "empty", "text", "unreadable", "unreadable_folder", "up_link",
}  # fmt: skip


@dataclass
class Entry:
    """One thing in the tree: `token` (ASCII, in its name) finds it in messages."""

    token: str
    kind: str
    path: bytes  # relative to the tree
    expected: np.ndarray | None = None  # a good entry's exact output
    named_once: int = 1  # error lines that must name it (mutual loops: each side once)
    also: bytes | None = None  # the other side of a mutual loop (named too in "named" mode)


@dataclass
class Case:
    seed: int
    command: str
    mode: str
    entries: list[Entry] = field(default_factory=list)


# ----------------------------------------------------------------------- building a tree


def _luma(bgr: np.ndarray) -> np.ndarray:
    wide = bgr.astype(np.int64)
    y = (299 * wide[..., 2] + 587 * wide[..., 1] + 114 * wide[..., 0] + 500) // 1000
    return y.astype(bgr.dtype)


class Builder:
    """Makes entries of each kind for one command inside a tree."""

    def __init__(self, tree: Path, command: str, rng: random.Random, allow: set[str]) -> None:
        self.tree, self.command, self.rng, self.allow = os.fsencode(tree), command, rng, allow
        self.targets = os.path.join(os.path.dirname(self.tree), b"targets")
        os.makedirs(self.targets, exist_ok=True)
        self.sockets: list[socket.socket] = []
        self.count = 0

    def token(self) -> str:
        self.count += 1
        return f"e{self.count:02d}-"

    def suffix(self) -> str:
        return self.rng.choice(list(GOOD_IMAGES)) if self.command == "gray" else ".tif"

    def good_bytes(self, suffix: str) -> tuple[bytes, np.ndarray]:
        """A good input's bytes and its exact expected output."""
        if self.command == "gray":
            source = SAMPLES / GOOD_IMAGES[suffix]
            return source.read_bytes(), _luma(cv2.imread(str(source), cv2.IMREAD_COLOR))
        # 2-D images and ZYX stacks; degenerate axes of 1 (which tifffile stores as extra
        # "Q" axes of one page) are left to the volume tests
        shape = (self.rng.randint(2, 24), self.rng.randint(2, 24))
        if self.rng.random() < 0.7:
            shape = (self.rng.randint(2, 4), *shape)
        data = np.random.default_rng(self.rng.getrandbits(32)).integers(
            0, VOLUME_MAX + 1, shape, dtype=np.uint16
        )
        scratch = os.path.join(self.targets, b"scratch.tif")
        tifffile.imwrite(os.fsdecode(scratch), data, photometric="minisblack")
        with open(scratch, "rb") as handle:
            encoded = handle.read()
        os.unlink(scratch)
        return encoded, data.astype(np.float32) / np.float32(VOLUME_MAX)

    def make(self, where: bytes, kind: str) -> list[Entry]:
        """Creates one entry of `kind` in the folder `where` (relative to the tree)."""
        token, suffix = self.token(), self.suffix()
        rel = os.path.join(where, os.fsencode(f"{token}{kind}{suffix}"))
        path = os.path.join(self.tree, rel)
        expected = None
        if kind in ("good", "hardlink", "symlink", "long_name", "non_utf8"):
            data, expected = self.good_bytes(suffix)
            if kind == "long_name":
                length = self.rng.randint(200, 255)
                stem = os.fsencode(token) + b"n" * (length - len(token) - len(suffix))
                rel = os.path.join(where, stem + suffix.encode())
                path = os.path.join(self.tree, rel)
            elif kind == "non_utf8":
                rel = os.path.join(
                    where, os.fsencode(token) + b"\xff\xfe-caf\xe9" + suffix.encode()
                )
                path = os.path.join(self.tree, rel)
            if kind in ("hardlink", "symlink"):
                target = os.path.join(self.targets, os.fsencode(token) + suffix.encode())
                with open(target, "wb") as handle:
                    handle.write(data)
                (os.link if kind == "hardlink" else os.symlink)(target, path)
            else:
                with open(path, "wb") as handle:
                    handle.write(data)
        elif kind == "fifo":
            os.mkfifo(path)
        elif kind == "char_device":
            try:
                os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # what /dev/null is
            except OSError:
                os.symlink(b"/dev/null", path)  # not permitted: a link to the real one
        elif kind == "dev_null_link":
            os.symlink(b"/dev/null", path)
        elif kind == "dev_zero_link":
            os.symlink(b"/dev/zero", path)
        elif kind == "socket":
            if len(path) > 100:
                return self.make(where, "dangling")
            server = socket.socket(socket.AF_UNIX)
            server.bind(path)
            self.sockets.append(server)
        elif kind == "dangling":
            os.symlink(os.path.join(self.targets, b"missing" + suffix.encode()), path)
        elif kind == "self_loop":
            os.symlink(os.path.basename(path), path)
        elif kind == "mutual_loop":
            other_rel = os.path.join(where, os.fsencode(f"{token}mutual_other{suffix}"))
            other = os.path.join(self.tree, other_rel)
            os.symlink(os.path.basename(other), path)
            os.symlink(os.path.basename(path), other)
            return [Entry(token, kind, rel, named_once=2, also=other_rel)]  # one token, 2 names
        elif kind == "empty":
            open(path, "wb").close()
        elif kind == "text":
            with open(path, "wb") as handle:
                handle.write(b"not an image at all\n" * 3)
        elif kind == "unreadable":
            with open(path, "wb") as handle:
                handle.write(self.good_bytes(suffix)[0])
            os.chmod(path, 0)
        return [Entry(token, kind, rel, expected)]

    def make_folder(self, where: bytes, kind: str, depth: int) -> list[Entry]:
        """A folder entry: a sub-folder of entries, an unreadable one, an empty one, or a link
        to the folder above (a loop under -r)."""
        token = self.token()
        rel = os.path.join(where, os.fsencode(f"{token}{kind}"))
        path = os.path.join(self.tree, rel)
        if kind == "up_link":
            os.symlink(b"..", path) if where else os.symlink(b".", path)
            return [Entry(token, kind, rel)]
        os.mkdir(path)
        if kind == "empty_folder":
            return [Entry(token, kind, rel)]
        inner = [Entry(token, kind, rel)]
        for _ in range(self.rng.randint(1, 3)):
            inner += self.make(rel, self.rng.choice(self.file_kinds()))
        if depth < 2 and self.folder_kinds() and self.rng.random() < 0.3:
            inner += self.make_folder(rel, self.rng.choice(self.folder_kinds()), depth + 1)
        if kind == "unreadable_folder":
            os.chmod(path, 0)
            return inner[:1]  # never listed: only the folder itself is named
        return inner

    def file_kinds(self) -> list[str]:
        return [kind for kind in FILE_KINDS if kind in self.allow]

    def folder_kinds(self) -> list[str]:
        return [kind for kind in FOLDER_KINDS if kind in self.allow]

    def close(self) -> None:
        for server in self.sockets:
            server.close()


def _build(case: Case, tree: Path, allow: set[str]) -> Builder:
    rng = random.Random(case.seed)
    builder = Builder(tree, case.command, rng, allow)
    os.mkdir(tree)
    for _ in range(rng.randint(2, 7)):
        if case.mode == "folder_r" and builder.folder_kinds() and rng.random() < 0.3:
            case.entries += builder.make_folder(b"", rng.choice(builder.folder_kinds()), 0)
        elif case.mode == "named" and rng.random() < 0.1 and "unreadable_folder" in allow:
            case.entries += builder.make_folder(b"", "unreadable_folder", 0)
        else:
            case.entries += builder.make(b"", rng.choice(builder.file_kinds()))
    return builder


# ----------------------------------------------------------------------- judging a run


def _inventory(folder: bytes) -> dict[bytes, str]:
    """Every entry under `folder` (not following links): a regular file's sha256, else its
    kind and, for a link, its target."""
    found: dict[bytes, str] = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(root, name)
            info = os.lstat(path)
            if stat.S_ISREG(info.st_mode):
                if info.st_mode & 0o444 == 0:
                    os.chmod(path, 0o600)
                    with open(path, "rb") as handle:
                        found[path] = hashlib.sha256(handle.read()).hexdigest()
                    os.chmod(path, 0)
                else:
                    with open(path, "rb") as handle:
                        found[path] = hashlib.sha256(handle.read()).hexdigest()
            elif stat.S_ISLNK(info.st_mode):
                found[path] = "link -> " + os.readlink(path).decode("utf-8", "replace")
            else:
                found[path] = f"mode {stat.S_IFMT(info.st_mode):o}"
    return found


def _output_for(case: Case, entry: Entry, out: bytes) -> bytes:
    stem, _ = os.path.splitext(entry.path)
    return os.path.join(out, stem + (b".png" if case.command == "gray" else b".tif"))


def _read_output(case: Case, path: bytes) -> np.ndarray | None:
    if case.command == "gray":
        return cv2.imdecode(np.fromfile(os.fsdecode(path), np.uint8), cv2.IMREAD_UNCHANGED)
    return tifffile.imread(os.fsdecode(path))


def _expected_bad(case: Case) -> list[Entry]:
    """The entries that must be named: bad kinds reached by this mode."""
    bad = []
    for entry in case.entries:
        nested = os.sep.encode() in entry.path
        if case.mode == "folder" and (nested or entry.kind in FOLDER_KINDS):
            continue  # without -r sub-folders are not entered: neither errors nor outputs
        if entry.kind in BAD:
            bad.append(entry)
    if not any(e.expected is not None for e in _expected_good(case)) and not bad:
        bad.append(Entry("", "nothing", b""))  # "no image files found": one line, the folder
    return bad


def _expected_good(case: Case) -> list[Entry]:
    good = []
    for entry in case.entries:
        nested = os.sep.encode() in entry.path
        if entry.expected is None or (case.mode == "folder" and nested):
            continue
        good.append(entry)
    return good


def judge(case: Case, work: Path, result: subprocess.CompletedProcess | None, before) -> list:
    """The problems with one run (an empty list: handled correctly)."""
    problems = []
    if result is None:
        return ["hang: no exit within the timeout"]
    stderr = result.stderr.decode("utf-8", "replace")
    if "Traceback" in stderr:
        problems.append("traceback on stderr")
    bad, good = _expected_bad(case), _expected_good(case)
    want_status = 1 if bad else 0
    if result.returncode != want_status:
        problems.append(f"exit {result.returncode}, expected {want_status}")
    errors = [line for line in stderr.splitlines() if line.startswith("imgops: error:")]
    claimed = set()
    for entry in bad:
        if entry.kind == "nothing":
            continue
        lines = [i for i, line in enumerate(errors) if entry.token in line]
        claimed.update(lines)
        if len(lines) != entry.named_once:
            problems.append(f"{entry.kind} {entry.token} named in {len(lines)} error lines")
    others = [
        line for i, line in enumerate(errors)
        if i not in claimed and not (bad and bad[0].kind == "nothing" and "no image" in line)
    ]  # fmt: skip
    if others:
        problems.append(f"unexpected error lines: {others[:3]}")
    out = os.fsencode(work / "out")
    wanted = set()
    for entry in good:
        target = _output_for(case, entry, out)
        wanted.add(target)
        if not os.path.isfile(target):
            problems.append(f"{entry.kind} {entry.token}: no output")
            continue
        image = _read_output(case, target)
        if image is None or image.shape != entry.expected.shape:
            problems.append(f"{entry.kind} {entry.token}: output unreadable or misshapen")
        elif not np.array_equal(image, entry.expected):
            problems.append(f"{entry.kind} {entry.token}: output differs from the reference")
    if os.path.isdir(out):
        written = {os.path.join(r, f) for r, _, files in os.walk(out) for f in files}
        extra = [os.fsdecode(p) for p in written - wanted if TEMP not in p]
        if extra:
            problems.append(f"unexpected outputs: {extra[:3]}")
    after = _inventory(os.fsencode(work / "tree")) | _inventory(os.fsencode(work / "targets"))
    if after != before:
        changed = sorted(set(after.items()) ^ set(before.items()))[:3]
        problems.append(f"inputs changed: {changed}")
    stray = [
        os.fsdecode(os.path.join(r, f))
        for r, dirs, files in os.walk(os.fsencode(work))
        for f in files + dirs
        if TEMP in f
    ]
    if stray:
        problems.append(f"temporary files left: {stray[:3]}")
    return problems


# ----------------------------------------------------------------------- running


def _command_line(case: Case, work: Path, drop_dac: bool) -> list:
    tree = os.fsencode(work / "tree")
    args: list = [sys.executable, "-m", "imgops.cli", case.command]
    if case.mode == "named":
        for entry in case.entries:
            if os.sep.encode() not in entry.path:
                args += [os.path.join(tree, p) for p in (entry.path, entry.also) if p]
    else:
        args.append(tree)
    args += [b"-d", os.fsencode(work / "out")] + ([b"-r"] if case.mode == "folder_r" else [])
    if case.command == "normvol":
        args += [b"--max", str(VOLUME_MAX).encode(), b"--device", b"cpu"]
    else:
        args += [b"-j", b"2"]
    return ([shutil.which("setpriv"), *NO_DAC] if drop_dac else []) + args


def _run(argv: list, cwd: Path, timeout: float) -> subprocess.CompletedProcess | None:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    process = subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return None
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)


def _unlock(folder: Path) -> None:
    for root, dirs, _ in os.walk(folder):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o755)
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(root, name)
            if not os.path.islink(path) and stat.S_ISREG(os.lstat(path).st_mode):
                os.chmod(path, 0o644)


def _unreadable_blocks(drop_dac: bool, scratch: Path) -> bool:
    """Whether a chmod 000 file really cannot be read by the command (root: only with setpriv)."""
    probe = scratch / "probe"
    probe.write_bytes(b"x")
    probe.chmod(0)
    prefix = [shutil.which("setpriv"), *NO_DAC] if drop_dac else []
    code = subprocess.run([*prefix, "cat", str(probe)], capture_output=True).returncode
    probe.unlink()
    return code != 0


def run_case(case: Case, scratch: Path, allow: set[str], drop_dac: bool, timeout: float) -> dict:
    work = scratch / f"c{case.seed}"
    work.mkdir()
    builder = _build(case, work / "tree", allow)
    try:
        before = _inventory(os.fsencode(work / "tree")) | _inventory(os.fsencode(work / "targets"))
        started = time.monotonic()
        result = _run(_command_line(case, work, drop_dac), work, timeout)
        seconds = time.monotonic() - started
        problems = judge(case, work, result, before)
    finally:
        builder.close()
        _unlock(work)
        shutil.rmtree(work, ignore_errors=True)
    return {
        "seed": case.seed,
        "command": case.command,
        "mode": case.mode,
        "kinds": [e.kind for e in case.entries],
        "seconds": round(seconds, 2),
        "problems": problems,
        "stderr": "" if result is None else result.stderr.decode("utf-8", "replace")[-2000:],
    }


def _shape(problem: str) -> str:
    """A problem without its token and details, to count problems of one kind together."""
    words = [
        w for w in problem.split(":")[0].split() if not (w.startswith("e") and w[1:3].isdigit())
    ]
    return " ".join(words)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=150, help="time budget (default 150)")
    parser.add_argument("--seed", type=int, default=1, help="first case's seed (default 1)")
    parser.add_argument("--cases", type=int, default=0, help="stop after N cases (0: no limit)")
    parser.add_argument("--command", choices=["gray", "normvol", "both"], default="both")
    parser.add_argument("--timeout", type=float, default=60, help="per run, seconds (hang)")
    parser.add_argument(
        "--without", default="", help="kinds to leave out, comma-separated (e.g. a known bug's)"
    )
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="imgops-fuzz-paths-"))
    root = os.geteuid() == 0
    drop_dac = root and shutil.which("setpriv") is not None
    allow = set(FILE_KINDS) | set(FOLDER_KINDS)
    left_out = {kind for kind in args.without.split(",") if kind}
    if left_out - allow:
        parser.error(f"unknown kinds {sorted(left_out - allow)}; kinds: {sorted(allow)}")
    allow -= left_out
    notes = [f"left out: {sorted(left_out)}"] if left_out else []
    if not _unreadable_blocks(drop_dac, scratch):
        allow -= {"unreadable", "unreadable_folder"}
        notes.append("running as root without setpriv: chmod 000 does not block reads, so "
                     "unreadable files and folders are left out")  # fmt: skip
    elif drop_dac:
        notes.append("running as root: commands run under setpriv without CAP_DAC_OVERRIDE "
                     "and CAP_DAC_READ_SEARCH, so chmod 000 blocks reads")  # fmt: skip
    probe = scratch / "node"
    try:
        os.mknod(probe, stat.S_IFCHR | 0o600, os.makedev(1, 3))
        probe.unlink()
    except OSError:
        notes.append("os.mknod not permitted: device nodes are symlinks to /dev/null instead")
    commands = ["gray", "normvol"] if args.command == "both" else [args.command]
    deadline = time.monotonic() + args.seconds
    counts: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    bad_cases = []
    problems: Counter[str] = Counter()  # by kind of problem, tokens and paths left out
    seed = args.seed
    try:
        while time.monotonic() < deadline and not (args.cases and seed - args.seed >= args.cases):
            rng = random.Random(seed)
            case = Case(seed, rng.choice(commands), rng.choice(["folder", "folder_r", "named"]))
            report = run_case(case, scratch, allow, drop_dac, args.timeout)
            counts[case.command] += 1
            kinds.update(report["kinds"])
            if report["problems"]:
                bad_cases.append(report)
                problems.update(
                    f"{case.command} {case.mode}: {_shape(p)}" for p in report["problems"]
                )
                print(json.dumps(report, indent=1), file=sys.stderr)
            seed += 1
    finally:
        _unlock(scratch)
        shutil.rmtree(scratch, ignore_errors=True)
    summary = {
        "cases": sum(counts.values()),
        "per_command": dict(counts),
        "entries_per_kind": dict(sorted(kinds.items())),
        "mishandled": len(bad_cases),
        "mishandled_seeds": [c["seed"] for c in bad_cases],
        "problems": dict(problems.most_common()),
        "seeds": [args.seed, seed - 1],
        "notes": notes,
    }
    print(json.dumps(summary, indent=1))
    return 1 if bad_cases else 0


if __name__ == "__main__":
    sys.exit(main())
