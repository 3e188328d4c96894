"""The command line's malloc thresholds during a batch (imgops.engine.allocator)."""

from __future__ import annotations

import platform

import pytest

from imgops.engine import allocator


def test_both_thresholds_are_set_and_reported(monkeypatch):
    calls = []
    monkeypatch.delenv("IMGOPS_MALLOC", raising=False)
    monkeypatch.setattr(allocator, "_mallopt", lambda: lambda *a: calls.append(a) or 1)
    assert allocator.retain_freed_memory() is True
    assert calls == [
        (allocator.M_MMAP_THRESHOLD, 32 << 20),
        (allocator.M_TRIM_THRESHOLD, 512 << 20),
    ]


def test_a_refused_setting_is_reported(monkeypatch):
    monkeypatch.delenv("IMGOPS_MALLOC", raising=False)
    monkeypatch.setattr(allocator, "_mallopt", lambda: lambda *a: 0)
    assert allocator.retain_freed_memory() is False


def test_the_environment_keeps_the_defaults(monkeypatch):
    monkeypatch.setenv("IMGOPS_MALLOC", "default")
    monkeypatch.setattr(allocator, "_mallopt", lambda: pytest.fail("mallopt was called"))
    assert allocator.retain_freed_memory() is False


def test_other_c_libraries_are_left_alone(monkeypatch):
    monkeypatch.delenv("IMGOPS_MALLOC", raising=False)
    monkeypatch.setattr(allocator, "_mallopt", lambda: None)
    assert allocator.retain_freed_memory() is False


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_glibc_takes_the_values():
    """The values are inside what this glibc accepts (mallopt says 1)."""
    mallopt = allocator._mallopt()
    assert mallopt is not None
    assert mallopt(allocator.M_MMAP_THRESHOLD, allocator.BATCH_MMAP_THRESHOLD) == 1
    assert mallopt(allocator.M_TRIM_THRESHOLD, allocator.BATCH_TRIM_THRESHOLD) == 1


def test_gray_sets_them_before_its_batch(monkeypatch, tmp_path):
    import numpy as np
    from click.testing import CliRunner
    from PIL import Image

    import imgops.commands.gray as gray
    from imgops.cli import cli

    order = []
    monkeypatch.setattr(allocator, "retain_freed_memory", lambda: order.append("malloc"))
    real = gray.run_plan
    monkeypatch.setattr(gray, "run_plan", lambda *a, **k: order.append("batch") or real(*a, **k))
    source = tmp_path / "a.png"
    Image.fromarray(np.zeros((4, 5, 3), np.uint8)).save(source)
    result = CliRunner().invoke(cli, ["gray", str(source), "-q", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert order == ["malloc", "batch"]
