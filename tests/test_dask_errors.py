"""imgops.dask failures that are not one file's: one clear line, the right exit status."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from imgops.cli_common import ImgopsCommand, scheduler_option
from imgops.dask.run import run_gray_with_scheduler
from imgops.errors import ImgopsError

SRC = Path(__file__).resolve().parent.parent / "src"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens here once the socket is closed


@click.command(cls=ImgopsCommand)  # how every imgops command reports ImgopsError
@click.argument("photo", type=click.Path(path_type=Path))
@scheduler_option
def _gray_on(photo: Path, scheduler: str | None) -> None:
    """A stand-in for `imgops gray PHOTO --scheduler SPEC` (the lead wires the real one)."""
    from imgops.pipeline import GrayJob, PipelineSettings

    jobs = [GrayJob(photo, photo.with_name("out.png"), photo.name)]
    run_gray_with_scheduler(scheduler, jobs, PipelineSettings())


def test_unreachable_scheduler_is_one_clear_error_and_exit_1(tmp_path):
    pytest.importorskip("distributed")
    address = f"tcp://127.0.0.1:{_free_port()}"
    started = time.monotonic()
    result = CliRunner().invoke(
        _gray_on, [str(tmp_path / "a.jpg"), "--scheduler", address], catch_exceptions=False
    )
    assert time.monotonic() - started < 30  # a short connect timeout, no endless retries
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines == [
        f"imgops: error: cannot reach the Dask scheduler at {address} (no answer within 5 s; "
        "is it running, and is the address right?)"
    ]


def test_connect_raises_scheduler_error_quickly():
    pytest.importorskip("distributed")
    from imgops.dask.cluster import SchedulerError, connect

    started = time.monotonic()
    address = f"tcp://127.0.0.1:{_free_port()}"
    expected = pytest.raises(SchedulerError, match="cannot reach the Dask scheduler")
    with expected, connect(address, timeout=1):
        pass
    assert time.monotonic() - started < 15


@pytest.mark.parametrize("spec", ["local:0", "local:two", "remote", "tcp://nohost", "tcp://h:p"])
def test_bad_scheduler_spec_is_a_usage_error(spec, tmp_path):
    result = CliRunner().invoke(_gray_on, [str(tmp_path / "a.jpg"), "--scheduler", spec])
    assert result.exit_code == 2
    assert "--scheduler" in result.output and spec in result.output


def test_stdin_jobs_are_refused_with_a_usage_error():
    pytest.importorskip("distributed")
    from imgops.dask.batch import run_batch_distributed
    from imgops.pipeline import GrayJob, PipelineSettings

    with pytest.raises(ValueError, match="needs files in and out"):
        run_batch_distributed(
            [GrayJob(None, None, "-", data=b"x")], None, PipelineSettings(), None, client=object()
        )


_BLOCKED = textwrap.dedent(
    """
    import importlib.abc, json, sys

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("dask", "distributed", "zarr", "dask_cuda"):
                raise ImportError(f"No module named {name!r} (blocked by the test)")
            return None

    sys.meta_path.insert(0, Block())
    out = {}
    import imgops, imgops.dask, imgops.dask.run, imgops.cli_common  # must not need dask
    out["imported"] = sorted(m for m in sys.modules if m.split(".")[0] in ("dask", "distributed"))
    from imgops.errors import ImgopsError
    for name, call in [
        ("normalize", lambda: imgops.dask.normalize(None, max=1)),
        ("connect", lambda: imgops.dask.connect("local:2").__enter__()),
        ("volume", lambda: __import__("imgops.dask.volume").dask.volume.open_zarr("x.zarr")),
    ]:
        try:
            call()
            out[name] = "no error"
        except ImportError as error:
            out[name] = [str(error), isinstance(error, ImgopsError)]
    print(json.dumps(out))
    """
)


def test_missing_extra_names_imgops_dask():
    env = dict(os.environ, PYTHONPATH=str(SRC))
    proc = subprocess.run(
        [sys.executable, "-c", _BLOCKED], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["imported"] == []  # importing the package and the option costs nothing
    for name in ("normalize", "connect", "volume"):
        message, is_cli_error = out[name]
        assert "imgops[dask]" in message and "pip install 'imgops[dask]'" in message, name
        assert is_cli_error  # an ImgopsError: one line, exit 1 in the CLI


def test_missing_dask_cuda_is_a_clear_error():
    pytest.importorskip("distributed")
    from imgops.dask.cluster import SchedulerError, connect

    try:
        import dask_cuda  # noqa: F401

        pytest.skip("dask-cuda is installed here")
    except ImportError:
        pass
    with pytest.raises(SchedulerError, match="local-cuda needs dask-cuda"), connect("local-cuda"):
        pass


def test_errors_are_imgops_errors():
    from imgops.dask import MissingDaskExtra
    from imgops.dask.cluster import SchedulerError

    assert issubclass(MissingDaskExtra, ImgopsError) and issubclass(MissingDaskExtra, ImportError)
    assert issubclass(SchedulerError, ImgopsError)


def test_broken_dask_install_says_why_not_missing(tmp_path):
    """An installed but broken `distributed` (a missing dependency of its own) is named as
    broken, with the import error, not as "not installed" (seen on the GPU host: a PYTHONPATH
    without msgspec, a zarr dependency, was reported as distributed missing)."""
    fake = tmp_path / "distributed"
    fake.mkdir()
    (fake / "__init__.py").write_text("import imgops_no_such_dependency_xyz\n")
    code = (
        "from imgops.dask._extra import require_dask\n"
        "try:\n    require_dask('distributed')\n"
        "except ImportError as error:\n    print(error)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(SRC)]))
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "distributed is installed but does not import" in proc.stdout
    assert "imgops_no_such_dependency_xyz" in proc.stdout
    assert "not installed" not in proc.stdout


def test_local_cuda_cluster_gets_options_it_accepts(monkeypatch):
    """dask_cuda.LocalCUDACluster passes processes=True to LocalCluster itself: giving it again
    is a TypeError (local-cuda had never started). A stand-in with the same rule; no torch."""
    pytest.importorskip("distributed")
    import types

    from imgops.dask import cluster

    seen = {}

    def local_cuda_cluster(*, CUDA_VISIBLE_DEVICES=None, **kwargs):
        if "processes" in kwargs:
            raise TypeError("got multiple values for keyword argument 'processes'")
        seen.update(kwargs, CUDA_VISIBLE_DEVICES=CUDA_VISIBLE_DEVICES)
        return "cluster"

    monkeypatch.setitem(
        sys.modules, "dask_cuda", types.SimpleNamespace(LocalCUDACluster=local_cuda_cluster)
    )
    monkeypatch.setattr("imgops.engine.device.cuda_device_count", lambda: 1)
    spec = cluster.SchedulerSpec("local-cuda")
    assert cluster._start_local(None, spec, 1, "auto", True) == "cluster"
    assert seen["threads_per_worker"] == 1 and seen["dashboard_address"] is None
    monkeypatch.setattr("imgops.engine.device.cuda_device_count", lambda: 0)
    with pytest.raises(cluster.SchedulerError, match="no CUDA GPU is visible"):
        cluster._start_local(None, spec, 1, "auto", True)
