"""The command line's thread switch interval during a batch (imgops.engine.switching)."""

from __future__ import annotations

import sys

import pytest

from imgops.engine.switching import BATCH_SWITCH_INTERVAL, batch_switch_interval


@pytest.fixture(autouse=True)
def _restore_interval():
    before = sys.getswitchinterval()
    yield
    sys.setswitchinterval(before)


def test_the_batch_interval_holds_inside_and_the_old_one_returns(monkeypatch):
    monkeypatch.delenv("IMGOPS_SWITCH_INTERVAL", raising=False)
    sys.setswitchinterval(0.005)
    with batch_switch_interval() as interval:
        assert interval == BATCH_SWITCH_INTERVAL == 0.001
        assert sys.getswitchinterval() == pytest.approx(0.001)
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_the_interval_is_restored_after_an_error(monkeypatch):
    monkeypatch.delenv("IMGOPS_SWITCH_INTERVAL", raising=False)
    sys.setswitchinterval(0.004)
    with pytest.raises(KeyError), batch_switch_interval():
        raise KeyError("x")
    assert sys.getswitchinterval() == pytest.approx(0.004)


@pytest.mark.parametrize(("raw", "expected"), [("0.005", 0.005), ("junk", 0.001), ("-1", 0.001)])
def test_the_environment_overrides_it(monkeypatch, raw, expected):
    monkeypatch.setenv("IMGOPS_SWITCH_INTERVAL", raw)
    with batch_switch_interval() as interval:
        assert interval == expected
        assert sys.getswitchinterval() == pytest.approx(expected)


def test_gray_runs_its_batch_under_the_batch_interval(monkeypatch, tmp_path):
    """The CLI's gray command runs the engine inside the block (the engine sees 1 ms)."""
    from click.testing import CliRunner

    import imgops.commands.gray as gray
    from imgops.cli import cli

    monkeypatch.delenv("IMGOPS_SWITCH_INTERVAL", raising=False)
    seen = []
    real = gray.run_plan

    def spy(*args, **kwargs):
        seen.append(sys.getswitchinterval())
        return real(*args, **kwargs)

    monkeypatch.setattr(gray, "run_plan", spy)
    source = tmp_path / "a.png"
    import numpy as np
    from PIL import Image

    Image.fromarray(np.zeros((4, 5, 3), np.uint8)).save(source)
    sys.setswitchinterval(0.005)
    result = CliRunner().invoke(cli, ["gray", str(source), "-q", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert seen == [pytest.approx(0.001)]
    assert sys.getswitchinterval() == pytest.approx(0.005)
