"""Fuzzing the decode paths: mutated real samples either decode exactly or fail cleanly.

Short by default (a few seconds); `IMGOPS_FUZZ_SECONDS=600 pytest tests/test_fuzz_decode.py`
runs each property for that long. scripts/fuzz_decode.py is the standalone runner (time budget,
worker process, crash and hang detection). Mutations and the oracle: tests/fuzz_cases.py.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import fuzz_cases as fc
import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imgops.cli import cli

FUZZ_SECONDS = float(os.environ.get("IMGOPS_FUZZ_SECONDS", "0") or 0)
#: Default: a fixed, derandomised set of examples (a few seconds). With IMGOPS_FUZZ_SECONDS,
#: each property runs random batches of examples until its time budget is spent.
FUZZ = settings(
    max_examples=200 if FUZZ_SECONDS else 40,
    deadline=None,
    database=None,
    derandomize=not FUZZ_SECONDS,
    suppress_health_check=list(HealthCheck),
)

mutations = st.builds(
    fc.Mutation,
    kind=st.sampled_from(fc.MUTATIONS),
    where=st.floats(0.0, 1.0, exclude_max=True),
    value=st.integers(0, 2**32 - 1),
)


def run_for_budget(prop) -> None:
    """Runs a hypothesis property once, or in batches until IMGOPS_FUZZ_SECONDS have passed."""
    end = time.monotonic() + FUZZ_SECONDS
    prop()
    while time.monotonic() < end:
        prop()


@pytest.fixture(scope="module", autouse=True)
def _quiet():
    fc.quiet_libraries()


def test_the_mutations_change_the_bytes_and_stay_deterministic():
    data = fc.sample_bytes("coffee_rgb.png")
    for kind in fc.MUTATIONS:
        mutation = fc.Mutation(kind, 0.37, 0x1234567)
        assert fc.mutate(data, mutation) == fc.mutate(data, mutation)
        assert fc.mutate(data, mutation) != data, kind
    assert fc.mutate(data, fc.Mutation("truncate", 0.5, 0)) == data[: len(data) // 2]


def test_the_oracle_catches_a_wrong_success(monkeypatch):
    """The oracle must be able to fail: a decoder that returns wrong pixels is caught."""
    import imgops.io.images as images

    data = fc.sample_bytes("light_palette_64px.png")
    assert fc.check_image(data) == "ok"
    real = images._normalize

    def off_by_one(pixels):
        decoded = real(pixels)
        return images.DecodedImage(decoded.pixels ^ 1, decoded.channel_order)

    monkeypatch.setattr(images, "_normalize", off_by_one)
    with pytest.raises(fc.OracleFailure, match="differ"):
        fc.check_image(data)


def test_the_oracle_catches_a_foreign_exception(monkeypatch):
    import imgops.io.images as images

    monkeypatch.setattr(images, "_imdecode", lambda data, kind, **options: 1 / 0)
    with pytest.raises(fc.OracleFailure, match="ZeroDivisionError"):
        fc.check_image(fc.sample_bytes("coffee_rgb.png"))


@FUZZ
@given(name=st.sampled_from(fc.IMAGE_NAMES), mutation=mutations)
def _mutated_image(name, mutation):
    fc.check_image(fc.mutate(fc.sample_bytes(name), mutation))


def test_mutated_images_decode_exactly_or_fail_cleanly():
    run_for_budget(_mutated_image)


@FUZZ
@given(name=st.sampled_from(fc.VOLUME_NAMES), mutation=mutations)
def _mutated_stack(name, mutation):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / name
        path.write_bytes(fc.mutate(fc.sample_bytes(name), mutation))
        fc.check_volume(path)


def test_mutated_stacks_read_exactly_or_fail_cleanly():
    run_for_budget(_mutated_stack)


@settings(FUZZ, max_examples=50 if FUZZ_SECONDS else 12)
@given(
    name=st.sampled_from(("coffee_rgb.png", "light_palette_64px.png", "rocket_baseline_rgb.jpg")),
    mutation=mutations,
)
def _mutated_file_through_gray(name, mutation):
    """The whole command: exit 0 with the formula's pixels, or exit 1, one line, no file."""
    import cv2

    data = fc.mutate(fc.sample_bytes(name), mutation)
    with tempfile.TemporaryDirectory() as folder:
        source, target = Path(folder) / name, Path(folder) / "out.png"
        source.write_bytes(data)
        result = CliRunner().invoke(
            cli, ["gray", str(source), "-o", str(target), "--device", "cpu"], catch_exceptions=False
        )
        errors = [line for line in result.stderr.splitlines() if line.startswith("imgops: error")]
        leftovers = [p.name for p in Path(folder).iterdir() if ".imgops-tmp-" in p.name]
        assert leftovers == []
        if result.exit_code == 0:
            expected = fc.expected_pixels(data)
            assert expected is not None, "imgops wrote a file OpenCV cannot decode"
            written = cv2.imread(str(target), cv2.IMREAD_UNCHANGED)
            np.testing.assert_array_equal(written, fc.luma(expected))
        else:
            assert result.exit_code == 1, result.output
            assert len(errors) == 1 and str(source) in errors[0], result.stderr
            assert "Traceback" not in result.stderr
            assert not target.exists()


def test_mutated_files_through_imgops_gray():
    run_for_budget(_mutated_file_through_gray)
