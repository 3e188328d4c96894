"""One planner for every command: which inputs a batch has, and where each output goes.

`collect_inputs` turns what the user named (files, folders, `-r`, globs, `--files-from` lists
with `-0`, stdin `-`) into sources; `plan_outputs` pairs each source with its target (`-o`,
`-d`, `--name` templates) and enforces the one rule: **no output may equal, by path or by
inode, any input of the batch, any other output, or the stats file**, and existing targets
must be regular files. A command's own outputs (its naming rule applied to another input of
the batch) are never taken as inputs, so a rerun over a glob or folder does not read back
`a_gray.png`.

Problems of the batch as a whole (two inputs writing one output, an output that is an input)
raise `imgops.errors.PlanError` subclasses before anything is done. Problems of one entry (an
unreadable sub-folder, a symlink loop, a FIFO, an output folder that is a file, an existing
output) become `Problem`s: the command reports each as a failure and the rest of the batch
runs. Plain Python: no click, no torch, no numpy.
"""

from __future__ import annotations

import errno
import functools
import glob
import os
import stat
import string
import sys
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from .errors import (
    BadTarget,
    OutputCollision,
    OutputIsInput,
    UsageProblem,
    output_exists_message,
)
from .io.inputs import check_input, file_kind

__all__ = [
    "STDIO",
    "NameRule",
    "Plan",
    "Problem",
    "Source",
    "Sources",
    "Task",
    "check_stats_path",
    "collect_inputs",
    "make_output_folders",
    "plan_outputs",
    "read_file_list",
]

STDIO = "-"
NAME_FIELDS = ("stem", "ext", "suffix", "parent")


@dataclass(frozen=True)
class Source:
    """One input: `path` None is stdin; `base` is the folder it was found in (None if named)."""

    path: Path | None
    base: Path | None = None

    @property
    def label(self) -> str:
        """How messages name this input: the path as found, or <stdin>."""
        return "<stdin>" if self.path is None else str(self.path)


@dataclass(frozen=True)
class Problem:
    """One entry that cannot be processed: `label` names it, `reason` says why (one line)."""

    label: str
    reason: str


@dataclass
class Sources:
    """What collect_inputs found: the usable inputs, in order, and the entries it could not use."""

    items: list[Source] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    @property
    def from_stdin(self) -> bool:
        """Whether the one input is stdin."""
        return len(self.items) == 1 and self.items[0].path is None


@dataclass(frozen=True)
class Task:
    """One planned job: a source and its target (`target` None is stdout)."""

    source: Source
    target: Path | None


@dataclass
class Plan:
    """Every task to run, the entries skipped (`--skip-existing`) and the problems."""

    tasks: list[Task] = field(default_factory=list)
    skipped: list[Problem] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    #: Files named or found that are outputs of other inputs (a rerun): not part of the batch.
    left_out: list[Problem] = field(default_factory=list)

    @property
    def total(self) -> int:
        """Every entry of the batch: tasks, skips and problems."""
        return len(self.tasks) + len(self.skipped) + len(self.problems)


# ----------------------------------------------------------------------------- inputs


def _describe(error: OSError) -> str:
    if error.errno == errno.ELOOP:
        return "symlink loop (too many levels of symbolic links)"
    return error.strerror or str(error)


def read_file_list(stream: IO[bytes], *, null: bool = False) -> list[str]:
    """Paths from a `--files-from` stream: one a line, or NUL-separated with `null` (find -print0).

    Blank entries are ignored; bytes are decoded as the OS decodes file names. Without `null`,
    a NUL byte is a usage error that names -0 (instead of Python's 'embedded null byte').
    """
    data = stream.read()
    if isinstance(data, str):
        data = os.fsencode(data)
    if null:
        entries = data.split(b"\0")
    else:
        if b"\0" in data:
            raise UsageProblem(
                "--files-from: the list contains NUL bytes; use -0/--null for `find -print0`"
            )
        entries = [line.rstrip(b"\r") for line in data.split(b"\n")]
    return [os.fsdecode(entry) for entry in entries if entry.strip()]


def _open_list(files_from: str | os.PathLike | IO[bytes], stdin: IO[bytes] | None) -> IO[bytes]:
    if hasattr(files_from, "read"):
        return files_from  # type: ignore[return-value]
    if str(files_from) == STDIO:
        return stdin if stdin is not None else sys.stdin.buffer
    path = Path(files_from)  # type: ignore[arg-type]
    if path.is_dir():
        raise UsageProblem(f"--files-from {path}: is a directory, not a list of files")
    try:
        return open(path, "rb")
    except OSError as error:
        raise UsageProblem(f"--files-from {path}: {_describe(error)}") from None


_NOT_NAMES = ("", ".", "..")

if os.name == "posix":

    def _folder_and_name(text: str) -> tuple[str, str]:
        """os.path.split(text) with the folder part as written (trailing slashes kept): the
        name, and a key that is one for all the names of one folder."""
        cut = text.rfind("/") + 1
        return text[:cut], text[cut:]

else:
    _folder_and_name = os.path.split

#: pathlib's own way to make `folder / name` for a name of one part (iterdir and glob use it),
#: from `folder`'s parsed parts: 5x faster, a millisecond on 800 files. Python < 3.13, POSIX.
_MAKE_CHILD = getattr(Path, "_make_child_relpath", None) if os.name == "posix" else None


def _child(folder: Path, entry: os.DirEntry) -> Path:
    """Path(entry.path) for an entry of os.scandir(folder)."""
    if _MAKE_CHILD is None:
        return Path(entry.path)
    return _MAKE_CHILD(folder, entry.name)


def _join_name(folder: Path, name: str) -> Path:
    """folder / name."""
    if _MAKE_CHILD is None or "/" in name or name in _NOT_NAMES:
        return folder / name
    return _MAKE_CHILD(folder, name)


class _Walker:
    """Lists image files of folders: sorted, hidden entries left out, every problem recorded."""

    def __init__(
        self,
        suffixes: frozenset[str],
        recursive: bool,
        skip_dirs: Iterable[Path],
        sources: Sources,
    ) -> None:
        self.suffixes = suffixes
        self.recursive = recursive
        self.skip = {_path_key(p) for p in skip_dirs}
        self.sources = sources
        #: str(path) of the files found that readdir says are no symlink (see _Keys.real_key).
        self.not_links: set[str] = set()

    def walk(self, top: Path) -> None:
        """Adds the images of `top` (and of its sub-folders with -r); a folder without any is a
        problem, as is every folder that cannot be read."""
        before = (len(self.sources.items), len(self.sources.problems))
        self._folder(top, top)
        if (len(self.sources.items), len(self.sources.problems)) == before:
            where = (
                "in it or its sub-folders" if self.recursive else "in it (use -r for sub-folders)"
            )
            self.sources.problems.append(Problem(str(top), f"no image files found {where}"))

    def _folder(self, folder: Path, base: Path, ancestors: tuple = ()) -> None:
        problems = self.sources.problems
        try:
            info = os.stat(folder)
            key = (info.st_dev, info.st_ino)
            if key in ancestors:
                problems.append(Problem(str(folder), "symlink loop: a link to a folder above it"))
                return
            with os.scandir(folder) as listing:
                entries = sorted(listing, key=lambda e: e.name)
        except OSError as error:
            problems.append(Problem(str(folder), f"cannot read folder: {_describe(error)}"))
            return
        ancestors = (*ancestors, key)
        subfolders = []
        for entry in entries:
            if entry.name.startswith("."):
                continue
            path = _child(folder, entry)
            try:
                is_dir = entry.is_dir()  # follows symlinks
            except OSError as error:
                is_dir = False
                if path.suffix.lower() not in self.suffixes:
                    self.sources.problems.append(Problem(str(path), _describe(error)))
                    continue
            if is_dir:
                if self.recursive and _path_key(path) not in self.skip:
                    subfolders.append(path)
                continue
            if path.suffix.lower() not in self.suffixes:
                continue
            text = str(path)
            try:
                check_input(text)
            except OSError as error:
                self.sources.problems.append(Problem(text, _describe(error)))
                continue
            self.sources.items.append(Source(path, base))
            try:
                if not entry.is_symlink():  # readdir's d_type: no system call
                    self.not_links.add(text)
            except OSError:
                pass
        for sub in subfolders:
            self._folder(sub, base, ancestors)


def collect_inputs(
    names: Iterable[str | os.PathLike],
    *,
    recursive: bool = False,
    files_from: str | os.PathLike | IO[bytes] | None = None,
    null: bool = False,
    suffixes: Iterable[str],
    skip_dirs: Iterable[Path] = (),
    stdin: IO[bytes] | None = None,
) -> Sources:
    """The inputs of a batch, in the order named (folders sorted), each file once.

    `names` are files, folders (their files with one of `suffixes`; sub-folders with
    `recursive`), glob patterns the shell did not expand, or `-` (stdin, the only input).
    `files_from` is a list file, `-` (`stdin`, else sys.stdin) or an open binary stream
    (NUL-separated with `null`).
    `skip_dirs` (an output folder inside an input folder) are never descended into.
    Raises UsageProblem for stdin mixed with other inputs; every other problem is a Problem.
    """
    _resolved_folder.cache_clear()
    names = [os.fspath(name) for name in names]
    if files_from is not None:
        if str(files_from) == STDIO and STDIO in names:
            raise UsageProblem("stdin cannot be both an input and --files-from")
        stream = _open_list(files_from, stdin)
        try:
            names += read_file_list(stream, null=null)
        finally:
            if stream is not files_from and str(files_from) != STDIO:
                stream.close()
    sources = Sources()
    if STDIO in names:
        if len(names) > 1:
            raise UsageProblem("'-' (stdin) must be the only input")
        sources.items.append(Source(None))
        return sources
    walker = _Walker(frozenset(s.lower() for s in suffixes), recursive, skip_dirs, sources)
    for name in names:
        _add_named(name, walker, sources)
    sources.items = _unique(sources.items, _Keys(), walker.not_links)
    return sources


def _add_named(name: str, walker: _Walker, sources: Sources) -> None:
    path = Path(name)
    if _is_pattern(name) and not os.path.lexists(path):
        matches = sorted(glob.glob(name, recursive=True))
        if not matches:
            sources.problems.append(Problem(name, "no file matches this pattern"))
        for match in matches:
            _add_named_path(Path(match), walker, sources)
        return
    _add_named_path(path, walker, sources)


def _is_pattern(name: str) -> bool:
    """Whether `name` has a glob character (* ? [)."""
    return "*" in name or "?" in name or "[" in name


def _add_named_path(path: Path, walker: _Walker, sources: Sources) -> None:
    try:
        is_dir = path.is_dir()
    except OSError:
        is_dir = False
    if is_dir:
        walker.walk(path)
        return
    try:
        check_input(path)
    except OSError as error:
        sources.problems.append(Problem(str(path), _describe(error)))
        return
    sources.items.append(Source(path))


def _unique(
    items: list[Source], keys: _Keys, not_links: Collection[str] = frozenset()
) -> list[Source]:
    """The same file named twice (or through a symlink) is done once, where it first appeared.
    Hard links are different names with different outputs: each is done. `not_links`: paths
    (str) that readdir said are no symlink."""
    seen: set[object] = set()
    unique = []
    for item in items:
        if item.path is None:
            key = None
        else:
            name = str(item.path)
            key = keys.real_key(name, not_link=name in not_links)
        if key is None or key not in seen:
            unique.append(item)
            if key is not None:
                seen.add(key)
    return unique


# ----------------------------------------------------------------------------- outputs


def _path_key(path: Path) -> str:
    """A comparable form of a path: absolute, its folder's symlinks resolved where they exist."""
    folder, name = os.path.split(os.path.abspath(path))
    return os.path.normcase(os.path.join(_resolved_folder(folder), name))


@functools.lru_cache(maxsize=4096)
def _resolved_folder(folder: str) -> str:
    """`folder` with its symlinks resolved where they exist (cached: a batch's files share a few
    folders; collect_inputs and plan_outputs clear it, so each plan sees the disk as it is)."""
    try:
        return str(Path(folder).resolve())
    except (OSError, RuntimeError):
        return folder


def _real_key(path: Path) -> str:
    """The path with every symlink resolved (where it can be)."""
    try:
        return os.path.normcase(os.path.realpath(path))
    except (OSError, ValueError):
        return _path_key(path)


def _file_key(path: Path) -> object:
    """(device, inode) of an existing file (links followed), else its path key."""
    try:
        info = os.stat(path)
    except (OSError, ValueError):
        return _path_key(path)
    return (info.st_dev, info.st_ino)


class _Keys:
    """The keys above of the paths of one plan, each computed once, and the system calls they
    share made once (800 files: a few milliseconds, not tens).

    Each method gives what the function of its name gives, through short cuts that path
    resolution makes exact (tests/test_planner_unit.py compares them on links, '..', missing
    and relative paths):

    - `path_key`: abspath(`folder/name`) is abspath(`folder/x`)'s folder joined with `name`, for
      every name but '', '.' and '..': its folder is resolved once for all of its names.
    - `real_key`: realpath(`folder/name`) resolves `folder`, then `name` only if that is a
      symlink; where it is none (readdir's d_type said so, or one lstat found it so), that is
      realpath(folder), made once, joined with `name`. Otherwise realpath() itself.
    - `file_key`, `target_problem` and `exists` share one lstat() of the path: where it fails
      with no such file, so would stat() (which resolves the same folders, then follows the
      name only where it is a symlink) and there is nothing; where it finds no symlink, it is
      the stat(); only a symlink is stat() too, and any other error of lstat() is stat()'s own.
      And in a folder that does not exist (stat() of it: no such file), no name exists:
      resolving `folder/name` fails where resolving `folder` does, so its names are not looked
      up at all (`-d` into a new folder).
    """

    __slots__ = ("_files", "_folders", "_gone", "_paths", "_real_folders", "_reals", "_stats")

    def __init__(self) -> None:
        self._paths: dict[str, str] = {}
        self._folders: dict[str, str] = {}
        self._reals: dict[str, str] = {}
        self._real_folders: dict[str, str | None] = {}
        self._files: dict[str, object] = {}
        self._stats: dict[str, tuple[os.stat_result | Exception, bool | None]] = {}
        self._gone: dict[str, bool] = {}

    def path_key(self, text: str) -> str:
        """_path_key(text)."""
        key = self._paths.get(text)
        if key is None:
            folder, name = _folder_and_name(text)
            if name in _NOT_NAMES:
                key = _path_key(text)  # type: ignore[arg-type]
            else:
                prefix = self._folders.get(folder)
                if prefix is None:
                    resolved = _resolved_folder(os.path.split(os.path.abspath(text))[0])
                    prefix = self._folders[folder] = os.path.join(resolved, "")
                key = os.path.normcase(prefix + name)
            self._paths[text] = key
        return key

    def real_key(self, text: str, not_link: bool = False) -> str:
        """_real_key(text); `not_link`: readdir said `text` is no symlink (else one lstat)."""
        key = self._reals.get(text)
        if key is None:
            key = self._reals[text] = self._real_key(text, not_link)
        return key

    def _real_key(self, text: str, not_link: bool) -> str:
        folder, name = _folder_and_name(text)
        if name in _NOT_NAMES:
            return _real_key(text)  # type: ignore[arg-type]
        if not not_link:
            try:
                info = os.lstat(text)
            except (OSError, ValueError):
                return _real_key(text)  # type: ignore[arg-type]
            if stat.S_ISLNK(info.st_mode):
                return _real_key(text)  # type: ignore[arg-type]
            self._files.setdefault(text, (info.st_dev, info.st_ino))
        try:
            prefix = self._real_folders[folder]
        except KeyError:
            try:
                prefix = os.path.join(os.path.realpath(os.path.split(text)[0]), "")
            except (OSError, ValueError):
                prefix = None
            self._real_folders[folder] = prefix
        if prefix is None:
            return _real_key(text)  # type: ignore[arg-type]
        return os.path.normcase(prefix + name)

    def stat(self, text: str) -> os.stat_result | Exception:
        """os.stat(text), or the OSError or ValueError it raised."""
        return self._look(text)[0]

    def _look(self, text: str) -> tuple[os.stat_result | Exception, bool | None]:
        """(os.stat(text) or its error, os.path.lexists(text) or None where not known yet)."""
        found = self._stats.get(text)
        if found is None:
            folder = _folder_and_name(text)[0]
            gone = self._gone.get(folder)
            if gone is None:
                gone = self._gone[folder] = _gone(folder)
            found = (_GONE, False) if gone else _stat_and_lexists(text)
            self._stats[text] = found
        return found

    def file_key(self, text: str) -> object:
        """_file_key(text)."""
        key = self._files.get(text)
        if key is None:
            info = self.stat(text)
            if isinstance(info, os.stat_result):
                key = (info.st_dev, info.st_ino)
            else:
                key = self.path_key(text)
            self._files[text] = key
        return key

    def target_problem(self, text: str) -> str | None:
        """_target_problem(text)."""
        info = self.stat(text)
        if isinstance(info, ValueError):
            return _target_problem(text)  # type: ignore[arg-type]  # raises it, as os.stat does
        return _target_problem_of(text, info)

    def exists(self, text: str) -> bool:
        """os.path.lexists(text)."""
        exists = self._look(text)[1]
        return os.path.lexists(text) if exists is None else exists


def _stat_and_lexists(text: str) -> tuple[os.stat_result | Exception, bool | None]:
    """(os.stat(text) or the error it raises, os.path.lexists(text) or None), from one lstat()
    where that finds no symlink or nothing (see _Keys)."""
    try:
        info = os.lstat(text)
    except FileNotFoundError as error:
        return error, False
    except (OSError, ValueError):
        exists = None
    else:
        if not stat.S_ISLNK(info.st_mode):
            return info, True
        exists = True
    try:
        return os.stat(text), exists
    except (OSError, ValueError) as error:
        return error, exists


#: What _Keys.stat gives for a name in a folder that does not exist.
_GONE = FileNotFoundError(errno.ENOENT, "No such file or directory")


def _gone(folder: str) -> bool:
    """Whether `folder` (a path's folder part, as written) is missing: stat() of it, and so of
    every name in it, fails with no such file. False for '' (the working folder)."""
    if not folder:
        return False
    try:
        os.stat(folder)
    except FileNotFoundError:
        return True
    except (OSError, ValueError):
        return False
    return False


class NameRule:
    """An output file name template with fields {stem} {ext} {suffix} {parent}.

    {stem}: the input name without its suffix; {suffix}: the input's suffix without the dot
    ("jpg"); {parent}: the input's folder name; {ext}: the output format's suffix ("png").

    Example:
        >>> NameRule("{stem}_{suffix}_gray.{ext}", "png").render(Path("photos/a.jpg"))
        'a_jpg_gray.png'
    """

    def __init__(self, template: str, ext: str, stem: Callable[[Path], str] | None = None) -> None:
        try:
            fields = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
        except ValueError as error:
            raise UsageProblem(f"--name {template!r}: {error}") from None
        unknown = sorted(fields - set(NAME_FIELDS))
        if unknown or any(not f for f in fields):
            known = " ".join(f"{{{f}}}" for f in NAME_FIELDS)
            raise UsageProblem(
                f"--name {template!r}: unknown field {{{(unknown or [''])[0]}}} (known: {known})"
            )
        if "/" in template or os.sep in template:
            raise UsageProblem(f"--name {template!r}: a file name, not a path (use -d for folders)")
        self.template = template
        self.ext = ext.lstrip(".")
        self._stem = stem or (lambda p: p.stem)
        self._parent = "parent" in fields

    def render(self, path: Path) -> str:
        """The output file name for input `path`."""
        name = self.template.format(
            stem=self._stem(path),
            ext=self.ext,
            suffix=path.suffix.lstrip("."),
            parent=self._parent_name(path) if self._parent else "",
        )
        if name in ("", ".", ".."):
            raise UsageProblem(f"--name {self.template!r} gives the empty name {name!r}")
        return name

    @staticmethod
    def _parent_name(path: Path) -> str:
        return path.parent.name or Path(os.path.abspath(path)).parent.name


def _target_for(source: Source, rule: NameRule, output_dir: Path | None) -> Path:
    assert source.path is not None
    name = rule.render(source.path)
    if output_dir is None:
        return source.path.with_name(name)
    if source.base is None:
        return output_dir / name
    return output_dir / source.path.parent.relative_to(source.base) / name


#: A source, its target, and their str: what the checks of a batch go through.
_Pair = tuple[Source, Path, str, str]


def _targets(items: list[Source], rule: NameRule, output_dir: Path | None) -> list[_Pair]:
    """[(item, _target_for(item, rule, output_dir), str(item.path), str(target))]; the output
    folder of the files of one input folder is made once."""
    fspath = os.fspath
    folders: dict[tuple[str, Path | None], Path] = {}
    pairs = []
    for item in items:
        path, base = item.path, item.base
        assert path is not None
        text = fspath(path)
        name = rule.render(path)
        if output_dir is None:
            if _MAKE_CHILD is None or "/" in name or name in _NOT_NAMES:
                target = path.with_name(name)
            else:  # path.with_name(name) is path.parent / name
                where = (_folder_and_name(text)[0], None)
                folder = folders.get(where)
                if folder is None:
                    folder = folders[where] = path.parent
                target = _join_name(folder, name)
        elif base is None:
            target = _join_name(output_dir, name)
        else:
            where = (_folder_and_name(text)[0], base)
            folder = folders.get(where)
            if folder is None:
                folder = folders[where] = output_dir / path.parent.relative_to(base)
            target = _join_name(folder, name)
        pairs.append((item, target, text, fspath(target)))
    return pairs


def _target_problem(target: Path) -> str | None:
    """Why an existing `target` can never be written (a device, FIFO, folder...), else None."""
    try:
        info = os.stat(target)
    except OSError as error:
        return _target_problem_of(target, error)
    return _target_problem_of(target, info)


def _target_problem_of(target: Path, info: os.stat_result | OSError) -> str | None:
    """_target_problem from the stat of `target`, or the OSError it raised."""
    if isinstance(info, FileNotFoundError):
        return None
    if isinstance(info, OSError):
        if info.errno == errno.ENOTDIR:
            return None  # an ancestor is a file: make_output_folders names it
        return f"output {target}: {_describe(info)}"
    kind = file_kind(info.st_mode)
    if kind is None:
        return None
    return f"output {target} is {kind}; imgops replaces only regular files"


def plan_outputs(
    sources: Sources,
    *,
    rule: NameRule,
    output: str | os.PathLike | None = None,
    output_dir: Path | None = None,
    overwrite: bool = False,
    skip_existing: bool = False,
    stats_path: Path | None = None,
    collision_hint: str = "",
) -> Plan:
    """Pairs every source with its target and checks the batch against the one rule.

    `output` is `-o` (one input; `-` is stdout), `output_dir` is `-d` (sources found in a
    folder keep their sub-folders); otherwise each output goes beside its input. Inputs that
    are the rule's output of another input (a rerun) are left out as skipped. Raises
    OutputIsInput, OutputCollision, BadTarget or UsageProblem for the batch; existing
    outputs without `overwrite` and non-regular targets are per-entry problems (with
    `skip_existing`, existing outputs are skipped).
    """
    _resolved_folder.cache_clear()
    keys = _Keys()
    if overwrite and skip_existing:
        raise UsageProblem("--overwrite and --skip-existing cannot be used together")
    if output is not None and output_dir is not None:
        raise UsageProblem("-o and -d cannot be used together")
    if output_dir is not None and output_dir.exists() and not output_dir.is_dir():
        raise UsageProblem(f"-d {output_dir} is not a directory")
    plan = Plan(problems=list(sources.problems))
    if output is not None:
        _plan_single(sources, os.fspath(output), overwrite, skip_existing, plan)
    else:
        if sources.from_stdin:
            raise UsageProblem("reading stdin needs -o OUTPUT (or -o - for stdout)")
        pairs = _drop_earlier_outputs(_targets(sources.items, rule, output_dir), plan, keys)
        _check_batch(pairs, collision_hint, keys)
        for item, target, _, text in pairs:
            _add_task(plan, item, target, overwrite, skip_existing, keys, text)
    if stats_path is not None:
        check_stats_path(stats_path, sources, plan, keys)
    return plan


def _plan_single(
    sources: Sources, output: str, overwrite: bool, skip_existing: bool, plan: Plan
) -> None:
    count = len(sources.items) + len(sources.problems)
    if count != 1:
        raise UsageProblem(f"-o takes exactly one input, got {count}; use -d DIR for several")
    if not sources.items:
        return  # the one input is a problem: reported as such
    item = sources.items[0]
    if output == STDIO:
        plan.tasks.append(Task(item, None))
        return
    target = Path(output)
    if target.is_dir():
        raise UsageProblem(f"-o {output} is a directory; use -d {output}")
    problem = _target_problem(target)
    if problem is not None:
        raise BadTarget(f"-o {problem} (for stdout use -o -)")
    if item.path is not None and _file_key(target) == _file_key(item.path):
        raise OutputIsInput(f"-o {output} would overwrite its input")
    if item.path is not None and _path_key(target) == _path_key(item.path):
        raise OutputIsInput(f"-o {output} would overwrite its input")
    _add_task(plan, item, target, overwrite, skip_existing)


def _drop_earlier_outputs(pairs: list[_Pair], plan: Plan, keys: _Keys | None = None) -> list[_Pair]:
    """Leaves out inputs that are an earlier run's output of another input (a rerun over
    `*.png` or a folder): named as that input's output, with its width and height. Any other
    input named like another's output is a real file the batch would overwrite: it stays, and
    _check_batch refuses the batch. So is an input whose own output is itself."""
    path_key = (keys or _Keys()).path_key
    inputs = [path_key(pair[2]) for pair in pairs]
    outputs = [path_key(pair[3]) for pair in pairs]
    makers = dict(zip(outputs, [pair[0] for pair in pairs], strict=True))  # a name's last maker
    kept = []
    for pair, own, output in zip(pairs, inputs, outputs, strict=True):
        item = pair[0]
        assert item.path is not None
        maker = makers.get(own)
        if (
            maker is not None
            and maker is not item
            and output != own  # not an input whose own output is itself
            and maker.path is not None
            and _same_size(item.path, maker.path)
        ):
            plan.left_out.append(Problem(item.label, f"left out: the output of {maker.label}"))
            continue
        kept.append(pair)
    return kept


def _same_size(candidate: Path, source: Path) -> bool:
    """Whether two image files' headers give the same width and height (False if either
    header cannot be read): what an earlier output of `source` looks like."""
    from .io.image_headers import header_info

    sizes = []
    for path in (candidate, source):
        try:
            with open(path, "rb") as f:
                head = f.read(1 << 20)
        except OSError:
            return False
        info = header_info(head)
        if info is None:
            return False
        sizes.append((info.width, info.height))
    return sizes[0] == sizes[1]


def _check_batch(pairs: list[_Pair], collision_hint: str, keys: _Keys | None = None) -> None:
    """Refuses the batch when an output would replace an input or two outputs are one file."""
    keys = keys or _Keys()
    path_key, file_key, real_key = keys.path_key, keys.file_key, keys.real_key
    inputs: dict[object, Source] = {}
    for item, _, text, _ in pairs:
        real = real_key(text)  # before file_key: its lstat may give that too
        inputs[file_key(text)] = item
        inputs[path_key(text)] = item
        inputs[real] = item
    seen: dict[str, tuple[Source, Path]] = {}
    collisions: list[tuple[str, str, str]] = []
    for item, target, _, text in pairs:
        key = path_key(text)
        if key in inputs or file_key(text) in inputs:
            raise OutputIsInput(f"{item.label}: its output {target} would overwrite an input")
        if key in seen:
            collisions.append((seen[key][0].label, item.label, str(target)))
        else:
            seen[key] = (item, target)
    if collisions:
        first, second, target = collisions[0]
        more = f" (and {len(collisions) - 1} more)" if len(collisions) > 1 else ""
        hint = f"; {collision_hint}" if collision_hint else "; rename one, or use --name"
        raise OutputCollision(
            f"{first} and {second} would both write {target}{more}{hint}", collisions
        )


def _add_task(
    plan: Plan,
    item: Source,
    target: Path,
    overwrite: bool,
    skip_existing: bool,
    keys: _Keys | None = None,
    text: str | None = None,
) -> None:
    keys = keys or _Keys()
    text = os.fspath(target) if text is None else text
    problem = keys.target_problem(text)
    if problem is not None:
        plan.problems.append(Problem(item.label, problem))
    elif not overwrite and keys.exists(text):
        if skip_existing:
            plan.skipped.append(Problem(item.label, f"skipped, {target} exists"))
        else:
            plan.problems.append(Problem(item.label, output_exists_message(target)))
    else:
        plan.tasks.append(Task(item, target))


def check_stats_path(
    stats_path: Path, sources: Sources, plan: Plan, keys: _Keys | None = None
) -> None:
    """Refuses a stats file that is an input or an output of the batch, or not a regular file.
    (`keys`: plan_outputs' own, whose stats of the inputs and outputs it reuses.)"""
    if stats_path.is_dir():
        raise BadTarget(f"--stats-json {stats_path} is a directory")
    problem = _target_problem(stats_path)
    if problem is not None:
        raise BadTarget(f"--stats-json: {problem}")
    found = keys or _Keys()
    own = {_path_key(stats_path), _file_key(stats_path)}
    # A path's file key is (device, inode) or, where it cannot be stat()ed, its path key: with
    # no stats file yet (`own` is its path key alone), the path keys tell it all.
    by_inode = not all(isinstance(key, str) for key in own)

    def same(path: Path) -> bool:
        text = os.fspath(path)
        return found.path_key(text) in own or (by_inode and found.file_key(text) in own)

    for item in sources.items:
        if item.path is not None and same(item.path):
            raise OutputIsInput(f"--stats-json {stats_path} would overwrite the input {item.label}")
    for task in plan.tasks:
        if task.target is not None and same(task.target):
            raise OutputIsInput(
                f"--stats-json {stats_path} is also the output of {task.source.label}"
            )


def make_output_folders(plan: Plan) -> None:
    """Creates the folders the tasks write into; a task whose folder cannot be made (a file of
    that name, no permission) becomes a problem and the rest go on."""
    failed: dict[Path, str] = {}
    kept = []
    for task in plan.tasks:
        if task.target is None:
            kept.append(task)
            continue
        folder = task.target.parent
        if folder not in failed:
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except (FileExistsError, NotADirectoryError):
                blocker = _first_non_folder(folder)
                failed[folder] = f"cannot create output folder {folder}: {blocker} is a file"
            except OSError as error:
                failed[folder] = f"cannot create output folder {folder}: {_describe(error)}"
            else:
                failed[folder] = ""
        if failed[folder]:
            plan.problems.append(Problem(task.source.label, failed[folder]))
        else:
            kept.append(task)
    plan.tasks = kept


def _first_non_folder(folder: Path) -> Path:
    """The nearest ancestor of `folder` (or itself) that exists but is not a folder."""
    for candidate in reversed((folder, *folder.parents)):
        if candidate.exists() and not candidate.is_dir():
            return candidate
    return folder
