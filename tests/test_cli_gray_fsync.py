"""`imgops gray --fsync/--no-fsync` and `gray_file(fsync=...)`: the same bytes, with or without
the flush to disk (counted by wrapping os.fsync in this process, plus the native writers' count)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import imgops
from imgops.cli import cli
from imgops.native import cli_kernels

SAMPLES = Path(__file__).resolve().parent.parent / "samples"


class _Fsyncs:
    """Counts fsync calls in this process: os.fsync's (wrapped), plus those of
    imgops._cli_kernels' native writers, which write, sync and commit a file in one call."""

    def __init__(self) -> None:
        self.python = 0
        self._native = getattr(cli_kernels(), "fsync_count", lambda: 0)
        self._start = self._native()

    def count(self) -> int:
        return self.python + self._native() - self._start

    def clear(self) -> None:
        self.python, self._start = 0, self._native()


@pytest.fixture
def fsyncs(monkeypatch) -> _Fsyncs:
    counter = _Fsyncs()
    real = os.fsync

    def counting(fd: int) -> None:
        counter.python += 1
        real(fd)

    monkeypatch.setattr(os, "fsync", counting)
    return counter


def _photos(folder: Path) -> Path:
    folder.mkdir()
    for name in ("coffee_rgb.png", "flower_progressive_3mp.jpg"):
        shutil.copy(SAMPLES / name, folder / name)
    return folder


def test_no_fsync_writes_the_same_bytes_without_flushing(tmp_path: Path, fsyncs: _Fsyncs):
    photos = _photos(tmp_path / "in")
    synced = CliRunner().invoke(
        cli, ["gray", str(photos), "-d", str(tmp_path / "a"), "--device", "cpu", "-q"]
    )
    assert synced.exit_code == 0, synced.output
    assert fsyncs.count() >= 2  # at least one flush per output by default
    fsyncs.clear()
    fast = CliRunner().invoke(
        cli,
        ["gray", str(photos), "-d", str(tmp_path / "b"), "--device", "cpu", "-q", "--no-fsync"],
    )
    assert fast.exit_code == 0, fast.output
    assert fsyncs.count() == 0
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "b").iterdir()) and len(names) == 2
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert not [p for p in (tmp_path / "b").iterdir() if "imgops-tmp" in p.name]


def test_gray_file_fsync_false(tmp_path: Path, fsyncs: _Fsyncs):
    imgops.gray_file(SAMPLES / "coffee_rgb.png", tmp_path / "a.png", device="cpu")
    assert fsyncs.count() > 0
    fsyncs.clear()
    imgops.gray_file(SAMPLES / "coffee_rgb.png", tmp_path / "b.png", device="cpu", fsync=False)
    assert fsyncs.count() == 0
    assert (tmp_path / "a.png").read_bytes() == (tmp_path / "b.png").read_bytes()


def test_help_explains_the_trade():
    text = CliRunner().invoke(cli, ["gray", "--help"]).output
    assert "--fsync / --no-fsync" in text and "power loss" in text
