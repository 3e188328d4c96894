"""Issue 16 friction: libpng/libjpeg's own lines leaked into stderr with no file name.

With imgops.io.decoder_warnings installed (the CLI does it), each warning is captured and
attributed to the decode that printed it, even when many threads decode at once, and is
returned on the DecodedImage (`warnings`, `note`) for the report. Runs in a subprocess: the
capture moves file descriptor 2, which pytest's own capture must not see.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

SAMPLES = Path(__file__).resolve().parent.parent / "samples"

SCRIPT = textwrap.dedent(
    """
    import json, struct, sys, zlib
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    from imgops.io import decoder_warnings
    from imgops.io.images import decode_image

    samples = Path(sys.argv[1])
    install = sys.argv[2] == "install"
    png = (samples / "coffee_rgb.png").read_bytes()
    body = b"tEXt" + b"Comment\\x00hi"
    bad_png = png[:33] + struct.pack(">I", 10) + body + b"\\x00\\x00\\x00\\x01" + png[33:]
    jpeg = (samples / "rocket_baseline_rgb.jpg").read_bytes()
    end = 4 + struct.unpack(">H", jpeg[4:6])[0]
    bad_jpeg = jpeg[:end] + b"\\x00garbage" + jpeg[end:]
    kinds = {"png": png, "bad_png": bad_png, "jpeg": jpeg, "bad_jpeg": bad_jpeg}
    if install:
        assert decoder_warnings.install()
    names = [name for _ in range(6) for name in kinds]
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda name: decode_image(kinds[name]).warnings, names))
    print("python's own line", file=sys.stderr)
    json.dump([[n, list(w)] for n, w in zip(names, results)], sys.stdout)
    """
)


def _run(mode: str) -> tuple[list, str]:
    process = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(SAMPLES), mode],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OPENCV_LOG_LEVEL": "SILENT"},
    )
    assert process.returncode == 0, process.stderr
    return json.loads(process.stdout), process.stderr


def test_decoder_warnings_are_attributed_to_their_file_under_threads():
    results, stderr = _run("install")
    for name, warnings in results:
        if name == "bad_png":
            assert warnings == ["libpng warning: tEXt: CRC error"], (name, warnings)
        elif name == "bad_jpeg":
            assert warnings == ["Corrupt JPEG data: 8 extraneous bytes before marker 0xe2"]
        else:
            assert warnings == [], (name, warnings)
    assert "libpng" not in stderr and "Corrupt JPEG" not in stderr, stderr
    assert "python's own line" in stderr  # imgops' own messages still reach stderr


def test_without_the_capture_the_warnings_reach_stderr_as_before():
    """The control: the same decodes print the library lines on stderr, unattributed."""
    results, stderr = _run("plain")
    assert all(warnings == [] for _, warnings in results)
    assert "libpng warning: tEXt: CRC error" in stderr
    assert "Corrupt JPEG data" in stderr


def test_install_leaves_a_test_runners_stderr_alone(monkeypatch):
    """In-process runs (click's CliRunner, pytest) swap sys.stderr for a capture stream:
    installing then would send imgops' messages past it, so install() declines."""
    import io

    from imgops.io import decoder_warnings

    monkeypatch.setattr("sys.stderr", io.StringIO())
    assert decoder_warnings.install() is False
    assert not decoder_warnings.installed()
