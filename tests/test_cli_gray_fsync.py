"""`imgops gray --fsync/--no-fsync` and `gray_file(fsync=...)`: the same bytes, with or without
the flush to disk (counted by wrapping os.fsync in this process)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import imgops
from imgops.cli import cli

SAMPLES = Path(__file__).resolve().parent.parent / "samples"


@pytest.fixture
def fsyncs(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = os.fsync

    def counting(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", counting)
    return calls


def _photos(folder: Path) -> Path:
    folder.mkdir()
    for name in ("coffee_rgb.png", "flower_progressive_3mp.jpg"):
        shutil.copy(SAMPLES / name, folder / name)
    return folder


def test_no_fsync_writes_the_same_bytes_without_flushing(tmp_path: Path, fsyncs: list[int]):
    photos = _photos(tmp_path / "in")
    synced = CliRunner().invoke(
        cli, ["gray", str(photos), "-d", str(tmp_path / "a"), "--device", "cpu", "-q"]
    )
    assert synced.exit_code == 0, synced.output
    assert len(fsyncs) >= 2  # at least one flush per output by default
    fsyncs.clear()
    fast = CliRunner().invoke(
        cli,
        ["gray", str(photos), "-d", str(tmp_path / "b"), "--device", "cpu", "-q", "--no-fsync"],
    )
    assert fast.exit_code == 0, fast.output
    assert fsyncs == []
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "b").iterdir()) and len(names) == 2
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert not [p for p in (tmp_path / "b").iterdir() if "imgops-tmp" in p.name]


def test_gray_file_fsync_false(tmp_path: Path, fsyncs: list[int]):
    imgops.gray_file(SAMPLES / "coffee_rgb.png", tmp_path / "a.png", device="cpu")
    assert fsyncs
    fsyncs.clear()
    imgops.gray_file(SAMPLES / "coffee_rgb.png", tmp_path / "b.png", device="cpu", fsync=False)
    assert fsyncs == []
    assert (tmp_path / "a.png").read_bytes() == (tmp_path / "b.png").read_bytes()


def test_help_explains_the_trade():
    text = CliRunner().invoke(cli, ["gray", "--help"]).output
    assert "--fsync / --no-fsync" in text and "power loss" in text
