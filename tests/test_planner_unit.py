"""imgops.planner on its own (no click, no engine): collect_inputs and plan_outputs.

Folders, -r, globs, --files-from (with -0), stdin, duplicates, non-regular files, the naming
rule and its fields, collisions, the no-clobber rules, and a rerun that must not read back its
own outputs. The same rules end to end, through the commands: test_planner_cli.py.
"""

from __future__ import annotations

import io
import os
import string
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from imgops.errors import BadTarget, OutputCollision, OutputIsInput, PlanError, UsageProblem
from imgops.planner import (
    NAME_FIELDS,
    NameRule,
    Sources,
    collect_inputs,
    make_output_folders,
    plan_outputs,
)

SUFFIXES = {".png", ".jpg"}
GRAY = NameRule("{stem}_gray.{ext}", "png")
IN_DIR = NameRule("{stem}.{ext}", "png")


def touch(path: Path, data: bytes = b"x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def paths(sources: Sources) -> list[str]:
    return [str(item.path) for item in sources.items]


def collect(*names, **options) -> Sources:
    return collect_inputs([str(n) for n in names], suffixes=SUFFIXES, **options)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """photos/{b.jpg, a.png, notes.txt, .hidden.png, sub/c.png, sub/deep/d.jpg}."""
    root = tmp_path / "photos"
    for name in ("b.jpg", "a.png", "notes.txt", ".hidden.png", "sub/c.png", "sub/deep/d.jpg"):
        touch(root / name)
    return root


# ----------------------------------------------------------------------------- collect_inputs


def test_a_folder_gives_its_images_sorted_without_hidden_or_other_files(tree: Path):
    found = collect(tree)
    assert paths(found) == [str(tree / "a.png"), str(tree / "b.jpg")]
    assert all(item.base == tree for item in found.items) and not found.problems


def test_recursive_descends_and_keeps_the_folder_as_base(tree: Path):
    found = collect(tree, recursive=True)
    assert paths(found) == [
        str(tree / n) for n in ("a.png", "b.jpg", "sub/c.png", "sub/deep/d.jpg")
    ]
    assert {item.base for item in found.items} == {tree}


def test_a_folder_without_images_is_a_problem_that_names_r(tmp_path: Path):
    touch(tmp_path / "empty" / "sub" / "x.png")
    found = collect(tmp_path / "empty")
    assert found.items == []
    assert [(p.label, p.reason) for p in found.problems] == [
        (str(tmp_path / "empty"), "no image files found in it (use -r for sub-folders)")
    ]
    assert paths(collect(tmp_path / "empty", recursive=True)) == [
        str(tmp_path / "empty" / "sub" / "x.png")
    ]


def test_an_output_folder_inside_an_input_folder_is_not_descended(tree: Path):
    found = collect(tree, recursive=True, skip_dirs=[tree / "sub"])
    assert paths(found) == [str(tree / "a.png"), str(tree / "b.jpg")]


def test_globs_the_shell_left_alone_are_expanded_sorted(tree: Path):
    assert paths(collect(tree / "*.png")) == [str(tree / "a.png")]
    assert paths(collect(tree / "**" / "*.png")) == [str(tree / "a.png"), str(tree / "sub/c.png")]
    nothing = collect(tree / "*.gif")
    assert nothing.items == [] and nothing.problems[0].reason == "no file matches this pattern"


def test_a_file_named_like_a_glob_is_taken_literally(tmp_path: Path):
    odd = touch(tmp_path / "[1].png")
    touch(tmp_path / "1.png")
    assert paths(collect(odd)) == [str(odd)]


def test_files_from_null_separated_keeps_newlines_in_names(tmp_path: Path):
    odd = touch(tmp_path / "line\nbreak.png")
    plain = touch(tmp_path / "plain.jpg")
    listing = io.BytesIO(os.fsencode(odd) + b"\0" + os.fsencode(plain) + b"\0")
    assert paths(collect(files_from=listing, null=True)) == [str(odd), str(plain)]


def test_files_from_with_nul_bytes_but_no_null_option_names_it(tmp_path: Path):
    listing = io.BytesIO(b"a.png\0b.png\0")
    with pytest.raises(UsageProblem, match="-0/--null"):
        collect(files_from=listing)


def test_files_from_lines_skip_blanks_and_crlf(tmp_path: Path):
    a, b = touch(tmp_path / "a.png"), touch(tmp_path / "b.png")
    listing = io.BytesIO(f"{a}\r\n\n  \n{b}\n".encode())
    assert paths(collect(files_from=listing)) == [str(a), str(b)]


def test_files_from_a_file_and_from_stdin(tmp_path: Path):
    a = touch(tmp_path / "a.png")
    (tmp_path / "list.txt").write_text(f"{a}\n")
    assert paths(collect(files_from=tmp_path / "list.txt")) == [str(a)]
    assert paths(collect(files_from="-", stdin=io.BytesIO(f"{a}\n".encode()))) == [str(a)]
    with pytest.raises(UsageProblem, match="is a directory"):
        collect(files_from=tmp_path)
    with pytest.raises(UsageProblem, match="No such file"):
        collect(files_from=tmp_path / "missing.txt")


def test_stdin_must_be_the_only_input(tmp_path: Path):
    assert collect("-").from_stdin
    with pytest.raises(UsageProblem, match="only input"):
        collect("-", touch(tmp_path / "a.png"))
    with pytest.raises(UsageProblem, match="both an input and --files-from"):
        collect("-", files_from="-", stdin=io.BytesIO(b""))


def test_the_same_file_named_twice_or_through_a_link_is_done_once(tmp_path: Path):
    a = touch(tmp_path / "a.png")
    (tmp_path / "link.png").symlink_to(a)
    assert paths(collect(a, tmp_path / "link.png", a)) == [str(a)]


def test_non_regular_and_missing_entries_are_problems_not_hangs(tmp_path: Path):
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    (tmp_path / "broken.png").symlink_to(tmp_path / "gone.png")
    good = touch(tmp_path / "good.png")
    found = collect(fifo, tmp_path / "broken.png", tmp_path / "nope.png", good)
    assert paths(found) == [str(good)]
    reasons = {p.label: p.reason for p in found.problems}
    assert reasons[str(fifo)] == "is a FIFO (named pipe), not a regular file"
    assert reasons[str(tmp_path / "broken.png")] == "broken symbolic link"
    assert "No such file" in reasons[str(tmp_path / "nope.png")]
    in_folder = collect(tmp_path)  # the FIFO inside a folder is a problem too
    assert str(fifo) in {p.label for p in in_folder.problems}


def test_a_symlink_loop_under_r_is_one_problem(tmp_path: Path):
    touch(tmp_path / "top" / "a.png")
    (tmp_path / "top" / "loop").symlink_to(tmp_path / "top")
    found = collect(tmp_path / "top", recursive=True)
    assert paths(found) == [str(tmp_path / "top" / "a.png")]
    assert [p.reason for p in found.problems] == ["symlink loop: a link to a folder above it"]


# ----------------------------------------------------------------------------- NameRule


def test_name_fields():
    rule = NameRule("{parent}_{stem}_{suffix}.{ext}", "png")
    assert rule.render(Path("shots/day1/a.b.jpg")) == "day1_a.b_jpg.png"
    assert NAME_FIELDS == ("stem", "ext", "suffix", "parent")
    assert NameRule("{parent}.{ext}", "tif").render(Path("a.png")) == f"{Path.cwd().name}.tif"


@pytest.mark.parametrize(
    ("template", "problem"),
    [
        ("{name}.{ext}", "unknown field {name}"),
        ("{}.png", "unknown field {}"),
        ("{stem", "--name '{stem'"),
        ("sub/{stem}.png", "a file name, not a path"),
    ],
)
def test_bad_templates_are_usage_problems(template: str, problem: str):
    with pytest.raises(UsageProblem, match=problem.replace("{", r"\{").replace("}", r"\}")):
        NameRule(template, "png")


def test_a_template_giving_an_empty_name_is_refused():
    with pytest.raises(UsageProblem, match="empty name"):
        NameRule("{suffix}", "png").render(Path("noext"))


# ----------------------------------------------------------------------------- plan_outputs


def plan(sources: Sources, **options):
    options.setdefault("rule", GRAY)
    return plan_outputs(sources, **options)


def targets(result) -> list[str]:
    return [str(task.target) for task in result.tasks]


def test_outputs_beside_the_inputs_and_in_a_folder_keeping_sub_folders(tree: Path, tmp_path):
    beside = plan(collect(tree))
    assert targets(beside) == [str(tree / "a_gray.png"), str(tree / "b_gray.png")]
    out = tmp_path / "out"
    into = plan(collect(tree, tree / "sub/c.png", recursive=True), rule=IN_DIR, output_dir=out)
    assert targets(into) == [
        str(out / n) for n in ("a.png", "b.png", "sub/c.png", "sub/deep/d.png")
    ]
    named = plan(collect(tree / "sub/c.png"), rule=IN_DIR, output_dir=out)
    assert targets(named) == [str(out / "c.png")]  # named files go flat into -d


def _png(path: Path, height: int, width: int, channels: int) -> Path:
    import cv2
    import numpy as np

    shape = (height, width) if channels == 1 else (height, width, channels)
    assert cv2.imwrite(str(path), np.zeros(shape, np.uint8))
    return path


def test_a_rerun_never_takes_its_own_outputs_as_inputs(tmp_path: Path):
    _png(tmp_path / "a.png", 30, 40, 3)
    _png(tmp_path / "a_gray.png", 30, 40, 1)  # the output of an earlier run: a's size
    for sources in (collect(tmp_path), collect(tmp_path / "*.png")):
        result = plan(sources, skip_existing=True)
        assert result.tasks == []
        assert [(s.label, s.reason) for s in result.skipped] == [
            (str(tmp_path / "a.png"), f"skipped, {tmp_path / 'a_gray.png'} exists")
        ]
        assert [(p.label, p.reason) for p in result.left_out] == [
            (str(tmp_path / "a_gray.png"), f"left out: the output of {tmp_path / 'a.png'}")
        ]
        assert result.total == 1


def test_a_file_named_like_an_output_but_not_one_is_never_overwritten(tmp_path: Path):
    """Named like a.png's output, but another image (another size): a real input. The batch
    would replace it, so it is refused, with or without --overwrite (issue 11, class 1)."""
    _png(tmp_path / "a.png", 30, 40, 3)
    _png(tmp_path / "a_gray.png", 31, 40, 1)
    for sources in (collect(tmp_path), collect(tmp_path / "a.png", tmp_path / "a_gray.png")):
        for overwrite in (False, True):
            with pytest.raises(OutputIsInput, match="would overwrite an input"):
                plan(sources, overwrite=overwrite)


def test_two_inputs_writing_one_output_refuse_the_batch_until_named_apart(tmp_path: Path):
    a_jpg, a_png = touch(tmp_path / "a.jpg"), touch(tmp_path / "a.png")
    out = tmp_path / "out"
    with pytest.raises(OutputCollision, match="would both write") as caught:
        plan(collect(a_jpg, a_png), rule=IN_DIR, output_dir=out, collision_hint="use --name")
    assert caught.value.pairs == [(str(a_jpg), str(a_png), str(out / "a.png"))]
    assert caught.value.exit_code == 2 and str(caught.value).endswith("; use --name")
    apart = plan(
        collect(a_jpg, a_png), rule=NameRule("{stem}_{suffix}.{ext}", "png"), output_dir=out
    )
    assert targets(apart) == [str(out / "a_jpg.png"), str(out / "a_png.png")]


def test_an_output_that_would_replace_an_input_is_refused_even_with_overwrite(tmp_path: Path):
    a = touch(tmp_path / "a.png")
    with pytest.raises(OutputIsInput, match="overwrite its input"):
        plan(collect(a), output=a, overwrite=True)
    os.link(a, tmp_path / "hard.png")  # the same inode under another name
    with pytest.raises(OutputIsInput):
        plan(collect(a), output=tmp_path / "hard.png", overwrite=True)
    # a.jpg's output in its own folder is a.png, another input of the batch
    b = touch(tmp_path / "a.jpg")
    with pytest.raises(OutputIsInput, match="would overwrite an input"):
        plan(collect(b, a), rule=IN_DIR, output_dir=tmp_path, overwrite=True)


def test_existing_outputs_are_per_entry_problems_skips_or_replaced(tmp_path: Path):
    a, b = touch(tmp_path / "a.png"), touch(tmp_path / "b.png")
    touch(tmp_path / "a_gray.png")
    refused = plan(collect(a, b))
    assert targets(refused) == [str(tmp_path / "b_gray.png")]
    assert [p.reason for p in refused.problems] == [
        f"output {tmp_path / 'a_gray.png'} exists (use --overwrite)"
    ]
    assert len(plan(collect(a, b), skip_existing=True).skipped) == 1
    assert len(plan(collect(a, b), overwrite=True).tasks) == 2
    with pytest.raises(UsageProblem, match="cannot be used together"):
        plan(collect(a), overwrite=True, skip_existing=True)


def test_non_regular_targets_are_never_replaced(tmp_path: Path):
    a = touch(tmp_path / "a.png")
    os.mkfifo(tmp_path / "a_gray.png")
    result = plan(collect(a), overwrite=True)
    assert result.tasks == [] and "is a FIFO (named pipe)" in result.problems[0].reason
    with pytest.raises(BadTarget, match="for stdout use -o -"):
        plan(collect(a), output="/dev/null", overwrite=True)
    with pytest.raises(UsageProblem, match="is a directory; use -d"):
        plan(collect(a), output=tmp_path)


def test_o_takes_one_input_and_stdin_needs_o(tmp_path: Path):
    a, b = touch(tmp_path / "a.png"), touch(tmp_path / "b.png")
    with pytest.raises(UsageProblem, match="exactly one input, got 2"):
        plan(collect(a, b), output=tmp_path / "x.png")
    with pytest.raises(UsageProblem, match="needs -o"):
        plan(collect("-"))
    assert plan(collect("-"), output="-").tasks[0].target is None
    with pytest.raises(UsageProblem, match="-o and -d"):
        plan(collect(a), output="x.png", output_dir=tmp_path)


def test_the_stats_file_is_never_an_input_or_an_output(tmp_path: Path):
    a = touch(tmp_path / "a.png")
    with pytest.raises(OutputIsInput, match="would overwrite the input"):
        plan(collect(a), stats_path=a)
    with pytest.raises(OutputIsInput, match="is also the output of"):
        plan(collect(a), stats_path=tmp_path / "a_gray.png")
    with pytest.raises(BadTarget, match="is a directory"):
        plan(collect(a), stats_path=tmp_path)
    assert plan(collect(a), stats_path=tmp_path / "stats.json").tasks


def test_an_output_folder_that_is_a_file_fails_only_its_entries(tmp_path: Path):
    touch(tmp_path / "in" / "sub" / "a.png")
    touch(tmp_path / "in" / "b.png")
    touch(tmp_path / "out" / "sub")  # a file where a folder must go
    result = plan(
        collect(tmp_path / "in", recursive=True), rule=IN_DIR, output_dir=tmp_path / "out"
    )
    make_output_folders(result)
    assert targets(result) == [str(tmp_path / "out" / "b.png")]
    assert result.problems[0].label == str(tmp_path / "in" / "sub" / "a.png")
    assert "is a file" in result.problems[0].reason


def test_planner_errors_are_plain_exceptions():
    import click

    for error in (UsageProblem, OutputCollision, OutputIsInput, BadTarget):
        assert issubclass(error, PlanError) and not issubclass(error, click.ClickException)


# ----------------------------------------------------------------------------- properties

_stems = st.text(alphabet=string.ascii_lowercase[:3] + "_", min_size=1, max_size=3)
_names = st.lists(
    st.tuples(_stems, st.sampled_from([".png", ".jpg"]), st.sampled_from(["", "s/"])),
    min_size=1,
    max_size=8,
    unique=True,
)


@given(names=_names, into_dir=st.booleans(), template=st.sampled_from(["gray", "dir", "suffix"]))
def test_a_plan_never_writes_an_input_or_one_file_twice(names, into_dir, template):
    rule = {
        "gray": GRAY,
        "dir": IN_DIR,
        "suffix": NameRule("{stem}_{suffix}.{ext}", "png"),
    }[template]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "in"
        for stem, suffix, sub in names:
            touch(root / f"{sub}{stem}{suffix}")
        out = Path(tmp) / "out" if into_dir else None
        try:
            result = plan(collect(root, recursive=True), rule=rule, output_dir=out)
        except (OutputCollision, OutputIsInput):
            return  # refused as a whole: nothing would be written
        inputs = {os.path.realpath(p) for p in root.rglob("*") if p.is_file()}
        written = [os.path.realpath(t.target) for t in result.tasks]
        assert len(written) == len(set(written))
        assert not inputs & set(written)
        done = {str(t.source.path) for t in result.tasks} | {p.label for p in result.left_out}
        assert done | {p.label for p in result.problems} == {
            str(p) for p in root.rglob("*") if p.is_file()
        }


# ----------------------------------------------------------------------------- symlinks, '..'


def test_an_input_folder_named_directly_and_through_a_link_is_done_once(tree: Path):
    link = tree.parent / "link"
    link.symlink_to(tree)
    assert paths(collect(tree, link)) == [str(tree / "a.png"), str(tree / "b.jpg")]
    assert paths(collect(link, tree)) == [str(link / "a.png"), str(link / "b.jpg")]
    # a link found in a folder is the file it names: done once, where it came first
    touch(tree.parent / "other" / "x.png")
    (tree / "x_link.png").symlink_to(tree.parent / "other" / "x.png")
    assert paths(collect(tree, tree.parent / "other")) == [
        str(tree / n) for n in ("a.png", "b.jpg", "x_link.png")
    ]
    (tree / "x_link.png").unlink()
    # a file that is a link into the folder is the file it names: done once, where it came first
    (tree.parent / "a_link.png").symlink_to(tree / "a.png")
    assert paths(collect(tree.parent / "a_link.png", tree)) == [
        str(tree.parent / "a_link.png"),
        str(tree / "b.jpg"),
    ]


def test_a_folder_of_the_working_folder_and_dot_give_the_paths_as_named(
    tree: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(tree)
    assert paths(collect(".")) == ["a.png", "b.jpg"]
    assert paths(collect("sub", recursive=True)) == ["sub/c.png", "sub/deep/d.jpg"]
    assert paths(collect("sub/..")) == ["sub/../a.png", "sub/../b.jpg"]
    result = plan(collect(".", "sub/c.png"), rule=IN_DIR, output_dir=Path("new/out"))
    assert targets(result) == ["new/out/a.png", "new/out/b.png", "new/out/c.png"]


def test_an_output_folder_that_is_a_link_to_the_input_folder_is_refused(tree: Path):
    link = tree.parent / "out"
    link.symlink_to(tree)
    with pytest.raises(OutputIsInput, match="would overwrite an input"):
        plan(collect(tree), rule=IN_DIR, output_dir=link, overwrite=True)
    # and through '..' after a link: physically the input folder, not lexically
    (tree.parent / "deep").mkdir()
    (tree.parent / "deep" / "to_sub").symlink_to(tree / "sub")
    with pytest.raises(OutputIsInput, match="would overwrite an input"):
        plan(
            collect(tree / "sub" / "c.png"),
            rule=IN_DIR,
            output_dir=tree.parent / "deep" / "to_sub" / ".." / "sub",
            overwrite=True,
        )


def test_an_output_that_is_a_link_to_an_input_is_refused(tree: Path, tmp_path: Path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "a.png").symlink_to(tree / "a.png")
    with pytest.raises(OutputIsInput, match="would overwrite an input"):
        plan(collect(tree), rule=IN_DIR, output_dir=out, overwrite=True)
    # an input that is a link: its output in the folder of the file it names is that file
    (tmp_path / "named").mkdir()
    (tmp_path / "named" / "c.png").symlink_to(tree / "sub" / "c.png")
    with pytest.raises(OutputIsInput, match="would overwrite an input"):
        plan(collect(tmp_path / "named"), rule=IN_DIR, output_dir=tree / "sub", overwrite=True)


def test_a_dangling_link_where_an_output_goes_is_an_existing_output(tree: Path, tmp_path: Path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "a.png").symlink_to(tmp_path / "nowhere.png")
    refused = plan(collect(tree), rule=IN_DIR, output_dir=out)
    assert targets(refused) == [str(out / "b.png")]
    assert [p.reason for p in refused.problems] == [
        f"output {out / 'a.png'} exists (use --overwrite)"
    ]
    assert [
        s.reason
        for s in plan(collect(tree), rule=IN_DIR, output_dir=out, skip_existing=True).skipped
    ] == [f"skipped, {out / 'a.png'} exists"]
    assert len(plan(collect(tree), rule=IN_DIR, output_dir=out, overwrite=True).tasks) == 2


def test_the_stats_file_linked_to_an_input_or_an_output_is_refused(tree: Path, tmp_path: Path):
    (tmp_path / "stats.json").symlink_to(tree / "a.png")
    with pytest.raises(OutputIsInput, match="would overwrite the input"):
        plan(collect(tree), stats_path=tmp_path / "stats.json")
    out = tmp_path / "out"
    out.mkdir()
    touch(out / "b.png")
    (tmp_path / "stats2.json").symlink_to(out / "b.png")
    with pytest.raises(OutputIsInput, match="is also the output of"):
        plan(
            collect(tree),
            rule=IN_DIR,
            output_dir=out,
            overwrite=True,
            stats_path=tmp_path / "stats2.json",
        )


def _key_tree(root: Path) -> list[str]:
    """Paths of every kind the planner compares, relative to `root`."""
    touch(root / "in" / "a.png")
    touch(root / "in" / "sub" / "c.png")
    touch(root / "top.png")
    (root / "in" / "link.png").symlink_to("a.png")
    (root / "in" / "broken.png").symlink_to(root / "gone.png")
    (root / "in" / "self.png").symlink_to("self.png")
    os.mkfifo(root / "in" / "fifo.png")
    (root / "in" / "to_fifo.png").symlink_to("fifo.png")
    (root / "in" / "sub" / "up").symlink_to("..")
    (root / "deep").mkdir()
    (root / "deep" / "to_sub").symlink_to(root / "in" / "sub")
    (root / "to_in").symlink_to("in")
    (root / "dangling_dir").symlink_to(root / "nowhere")
    return [
        "top.png",
        "in/a.png",
        "in//a.png",
        "in/./a.png",
        "in/link.png",
        "in/broken.png",
        "in/self.png",
        "in/fifo.png",
        "in/to_fifo.png",
        "in/new.png",
        "in/sub",
        "in/sub/",
        "in/sub/..",
        "in/sub/.",
        "in/sub/up/a.png",
        "in/sub/up/../top.png",
        "deep/to_sub/../a.png",
        "deep/to_sub/c.png",
        "to_in/a.png",
        "to_in/sub/up/link.png",
        "in/a.png/x.png",
        "missing/a.png",
        "missing/deeper/a.png",
        "dangling_dir/a.png",
        "in/self.png/x.png",
        ".",
        "..",
        "",
    ]


@pytest.mark.parametrize("relative", [False, True], ids=["absolute", "relative"])
def test_the_keys_of_one_plan_are_the_planners_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, relative: bool
):
    """plan_outputs computes each path's keys once, with short cuts (a folder resolved once for
    all its names, one lstat for a stat, readdir's word that a name is no link): each must give
    what the plain functions give, on links, '..' after a link, loops, missing folders, files
    where a folder should be and relative names."""
    from imgops.planner import _file_key, _Keys, _path_key, _real_key, _target_problem

    root = tmp_path / "root"
    names = _key_tree(root)
    if relative:
        monkeypatch.chdir(root)
    else:
        names = [str(root / name) if name else name for name in names]
    for order in (names, names[::-1]):  # each memo filled first by either kind of name
        keys = _Keys()
        for text in order:
            if not text:
                continue
            assert keys.path_key(text) == _path_key(text), text
            assert keys.real_key(text) == _real_key(text), text
            assert keys.file_key(text) == _file_key(text), text
            assert keys.target_problem(text) == _target_problem(text), text
            assert keys.exists(text) == os.path.lexists(text), text
        keys = _Keys()  # stat first, then the keys
        for text in order:
            if text:
                assert keys.exists(text) == os.path.lexists(text), text
                assert keys.file_key(text) == _file_key(text), text
                assert keys.real_key(text) == _real_key(text), text
    for folder in (".", "in", "to_in", "deep/to_sub", "in/sub/up", "in/sub/up/.."):
        folder = folder if relative else str(root / folder)
        keys = _Keys()
        with os.scandir(folder) as listing:
            for entry in listing:
                if not entry.is_symlink():  # what collect_inputs tells real_key
                    text = str(Path(entry.path))  # a Path's str, as collect_inputs has it
                    assert keys.real_key(text, not_link=True) == _real_key(text), text


def test_files_found_in_a_folder_are_the_paths_scandir_names(tree: Path, monkeypatch):
    """collect_inputs makes the Path of each entry from its folder's (pathlib's own short
    cut): the same Path as Path(entry.path), for absolute, relative and '.' folders."""
    from imgops.planner import _child

    monkeypatch.chdir(tree)
    for folder in (tree, Path("."), Path("sub"), Path("sub/deep/.."), Path("/")):
        with os.scandir(folder) as listing:
            for entry in listing:
                child = _child(folder, entry)
                assert child == Path(entry.path) and str(child) == str(Path(entry.path))
                assert child.parts == Path(entry.path).parts and type(child) is type(
                    Path(entry.path)
                )
