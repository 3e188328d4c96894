"""A CPU gray batch on a local Dask cluster never imports torch: not in the client, not in the
forkserver the workers fork from, not in the workers (issue 14: the gray path is torch-free by
design, and torch + the extension cost seconds per process to import).

Runs in fresh interpreters (this test process may already hold torch, and a forkserver, once
started, is shared by every later cluster of its process): 2 worker processes, bounded in time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("distributed")

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"
PHOTOS = ["coffee_rgb.png", "rocket_baseline_rgb.jpg", "tulips_rgba.png", "camera_gray.png"]
#: What a CPU gray batch must not load: torch, the torch extension and what imports them.
HEAVY = ("torch", "imgops._C", "imgops.ops", "imgops.registry")
TIME_LIMIT_S = 120

# Run as a file in a fresh interpreter; its workers re-import it as __mp_main__ (hence the guard).
SCRIPT = """
import json, sys
from pathlib import Path

HEAVY = {heavy!r}


def loaded():
    import sys

    return sorted(name for name in HEAVY if name in sys.modules)


def main(photos, out):
    import imgops.dask.batch as batch
    from imgops.dask.run import run_gray_with_scheduler
    from imgops.pipeline import GrayJob, PipelineSettings

    seen = {{}}
    real = batch.run_batch_distributed

    def spy(jobs, op, settings, on_result=None, client=None, **options):
        seen["workers_before"] = client.run(loaded)
        summary = real(jobs, op, settings, on_result, client, **options)
        seen["workers"] = client.run(loaded)
        return summary

    batch.run_batch_distributed = spy
    jobs = [GrayJob(Path(p), Path(out) / (Path(p).stem + ".png"), p) for p in photos]
    summary = run_gray_with_scheduler("local:2", jobs, PipelineSettings())
    seen["written"] = summary.written
    seen["device"] = summary.device
    seen["client"] = loaded()
    print("RESULT " + json.dumps(seen))


if __name__ == "__main__":
    main(sys.argv[2:], sys.argv[1])
"""


def _python(args: list[str], cwd) -> subprocess.CompletedProcess:
    """This Python with `args` and this checkout's src first on the path; must exit 0."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=TIME_LIMIT_S,
        env=env,
        cwd=cwd,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_cpu_gray_batch_on_local_cluster_imports_no_torch_anywhere(tmp_path):
    script = tmp_path / "gray_on_cluster.py"
    script.write_text(SCRIPT.format(heavy=HEAVY))
    out = tmp_path / "out"
    out.mkdir()
    proc = _python([str(script), str(out), *(str(SAMPLES / p) for p in PHOTOS)], tmp_path)
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    seen = json.loads(line[len("RESULT ") :])
    assert seen["written"] == len(PHOTOS)
    assert seen["device"] == "cpu"
    assert len(seen["workers"]) == 2
    assert seen["client"] == [], f"the client imported {seen['client']}"
    for worker, modules in {**seen["workers_before"], **seen["workers"]}.items():
        assert modules == [], f"worker {worker} imported {modules}"


def test_cli_gray_with_scheduler_imports_no_torch_in_any_process(tmp_path):
    """The command as a user runs it, under -X importtime: every process it starts (client with
    scheduler and nannies, the forkserver, the workers) reports its imports on stderr."""
    photos = [str(SAMPLES / p) for p in PHOTOS]
    args = ["-X", "importtime", "-m", "imgops.cli", "gray", *photos]
    proc = _python([*args, "-d", str(tmp_path / "out"), "-q", "--scheduler", "local:2"], tmp_path)
    assert len(list((tmp_path / "out").iterdir())) == len(PHOTOS)
    imported = {
        line.rsplit("|", 1)[-1].strip()
        for line in proc.stderr.splitlines()
        if line.startswith("import time:")
    }
    # more than one process reported (the forkserver and workers import imgops.engine too)
    assert "distributed" in imported and "imgops.engine" in imported
    assert not imported & set(HEAVY), sorted(imported & set(HEAVY))
