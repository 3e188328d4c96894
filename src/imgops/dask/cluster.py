"""`connect(spec)`: a Dask client for "local:N", "local-cuda" or "tcp://HOST:PORT".

- "local:N" starts a `distributed.LocalCluster` of N worker processes (1 thread each unless
  `threads_per_worker` says otherwise); "local" uses one worker per usable CPU.
- "local-cuda" starts a `dask_cuda.LocalCUDACluster`: one worker per GPU, each pinned to its
  device through CUDA_VISIBLE_DEVICES (so inside a worker the GPU is "cuda"/"cuda:0").
- "tcp://HOST:PORT" (also tls:// and ucx://) joins a running scheduler; one that does not answer
  within `timeout` seconds is a `SchedulerError` (one line, exit 1 in the CLI).

Local worker processes fork from a multiprocessing forkserver that has imported distributed,
numpy and the modules the command names (`preload`: the batch engine for gray, torch and the ops
for normvol) once, instead of each worker spawning a fresh interpreter and importing them
itself: on the 2-core machine a local:2 cluster starts in ~1.7 s instead of ~3.0-3.6 s and
closes in ~0.05 s instead of ~2 s. (Not for local-cuda: dask-cuda keeps its own start-up.)
`start_forkserver` starts that server before this process imports distributed (the commands
call it before planning), so the two import side by side. A CPU gray batch imports no torch
in any of these processes (tests/test_dask_torch_free.py); LOCAL_WORKER_CONFIG says what else
local workers run without.

Every process started here gets NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and
NVSHMEM_DISABLE_NVLS=1 (NVLink multicast stays off), inherited from this process and passed to
the workers explicitly. Leaving the context closes the client and any cluster it started.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import ImgopsError
from ._extra import _installed, require_dask

if TYPE_CHECKING:
    import distributed

__all__ = ["NO_MULTICAST_ENV", "SchedulerError", "SchedulerSpec", "connect", "parse_spec"]

NO_MULTICAST_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
DEFAULT_TIMEOUT_S = 5.0
_ADDRESS_SCHEMES = ("tcp://", "tls://", "ucx://")
SPEC_HELP = "local:N (N worker processes here), local-cuda (one worker per GPU) or tcp://HOST:PORT"


class SchedulerError(ImgopsError):
    """The scheduler cannot be reached or the cluster cannot start (one line, exit 1)."""


@dataclass(frozen=True)
class SchedulerSpec:
    """A parsed --scheduler value: kind "local", "local-cuda" or "address"."""

    kind: str
    workers: int | None = None
    address: str | None = None

    def describe(self) -> str:
        """Human-readable form for messages."""
        if self.kind == "local":
            return f"local:{self.workers}" if self.workers else "local"
        return self.address if self.kind == "address" else self.kind


def parse_spec(spec: str) -> SchedulerSpec:
    """Parses "local", "local:N", "local-cuda" or "tcp://HOST:PORT"; ValueError otherwise."""
    text = spec.strip()
    if text == "local":
        return SchedulerSpec("local")
    if text.startswith("local:"):
        count = text[len("local:") :]
        if not count.isdigit() or int(count) < 1:
            raise ValueError(f"expected local:N with N >= 1 workers, got {spec!r}")
        return SchedulerSpec("local", workers=int(count))
    if text == "local-cuda":
        return SchedulerSpec("local-cuda")
    if text.startswith(_ADDRESS_SCHEMES):
        host_port = text.split("://", 1)[1]
        host, _, port = host_port.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"expected tcp://HOST:PORT, got {spec!r}")
        return SchedulerSpec("address", address=text)
    raise ValueError(f"unknown scheduler {spec!r}: use {SPEC_HELP}")


def keep_multicast_off() -> None:
    """Sets the no-NVLink-multicast variables in this process (so every child inherits them)."""
    for name, value in NO_MULTICAST_ENV.items():
        os.environ[name] = value


def _quiet_distributed() -> None:
    # distributed logs every failed connection attempt and worker restart at WARNING; the user
    # gets one line from us instead.
    for name in ("distributed", "distributed.comm", "distributed.core", "distributed.nanny"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    # ... and its UserWarnings (a busy port, a large graph) are not the user's to act on.
    warnings.filterwarnings("ignore", category=UserWarning, module=r"distributed(\.|$)")


def _local_workers() -> int:
    from ..pipeline import default_jobs

    return default_jobs()


@contextlib.contextmanager
def connect(
    spec: str | SchedulerSpec,
    *,
    threads_per_worker: int = 1,
    timeout: float = DEFAULT_TIMEOUT_S,
    memory_limit: str | int = "auto",
    quiet: bool = True,
    preload: Sequence[str] = (),
) -> Iterator[distributed.Client]:
    """A `distributed.Client` for `spec`, the default scheduler of dask while the context is open.

    `preload`: modules local workers should have imported before their first task (through
    the forkserver they fork from); ignored when joining a running scheduler.

    Example:
        >>> with connect("local:2") as client:
        ...     arrays.normalize(volume, max=4095).to_zarr("out.zarr")
    """
    parsed = parse_spec(spec) if isinstance(spec, str) else spec
    keep_multicast_off()
    if parsed.kind == "local":  # first: it imports distributed while this process does too
        start_forkserver(preload)
    (distributed,) = require_dask("distributed")
    if quiet:
        _quiet_distributed()
    if parsed.kind == "address":
        client = _join(distributed, parsed.address, timeout)
        with client:
            yield client
        return
    with _worker_start_method(parsed, preload):
        cluster = _start_local(distributed, parsed, threads_per_worker, memory_limit, quiet)
    with cluster, distributed.Client(cluster, timeout=timeout) as client:
        # Every worker of the spec registered before the first task (local-cuda's cluster
        # returned before its worker had: a check right after saw 0 workers on the H200 host).
        expected = len(getattr(cluster, "worker_spec", None) or {})
        if expected:
            client.wait_for_workers(expected, timeout=timeout)
        yield client


#: Imported by the forkserver whatever the command (what every worker needs).
BASE_PRELOAD = ("distributed", "numpy", "imgops.dask.batch", "imgops.dask._blocks")


#: distributed's nanny sets MALLOC_TRIM_THRESHOLD_=65536 for its workers; setting it turns off
#: glibc's dynamic mmap threshold, so every multi-MB image buffer is mmapped, page-faulted and
#: unmapped again: measured +4 CPU s of system time per 800 3-MP photos on local:2 (11.0 s vs
#: 6.9 s). imgops workers hold a few images at a time, so local ones run without it.
#:
#: The other two switch off what only distributed's dashboard (which local clusters do not serve)
#: reads: the statistical profiler, a thread in every worker walking every task thread's stack
#: each 10 ms, and the NVML GPU metrics, which make the scheduler and every worker initialise
#: NVML at start and poll it every 500 ms wherever nvidia-ml-py is installed (GPU hosts).
#: Not for local-cuda: dask-cuda reads NVML itself (GPU count, CPU affinity).
LOCAL_WORKER_CONFIG = {
    "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None,
    "distributed.worker.profile.enabled": False,
    "distributed.diagnostics.nvml": False,
}
#: What local-cuda workers run with (dask-cuda's own start-up; NVML stays on for it).
LOCAL_CUDA_WORKER_CONFIG = {
    "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None,
    "distributed.worker.profile.enabled": False,
}


def _uses_forkserver() -> bool:
    return "forkserver" in multiprocessing.get_all_start_methods()


def start_forkserver(preload: Sequence[str] = ()) -> bool:
    """Starts the forkserver local workers fork from, with BASE_PRELOAD + `preload` imported;
    returns whether one runs. Returns at once: the server imports the modules in its own
    process, so calling this before anything heavy (`import distributed` in this process, the
    planner) overlaps the two. A forkserver already running is kept as it is (one per process:
    its modules are those of the first call)."""
    if not _uses_forkserver() or not _installed("distributed"):
        return False
    from multiprocessing import forkserver

    keep_multicast_off()  # the server and every worker it forks inherit them
    modules = list(dict.fromkeys([*BASE_PRELOAD, *preload]))
    context = multiprocessing.get_context("forkserver")
    if getattr(forkserver._forkserver, "_forkserver_pid", None) is None:
        context.set_forkserver_preload(modules)
    forkserver.ensure_running()
    return True


@contextlib.contextmanager
def _worker_start_method(spec: SchedulerSpec, preload: Sequence[str]) -> Iterator[None]:
    """Local workers: no malloc trimming (LOCAL_WORKER_CONFIG) and, for "local:N", forked
    from a forkserver holding `preload` imported (see the module)."""
    import dask

    if spec.kind != "local":
        config: dict = dict(LOCAL_CUDA_WORKER_CONFIG)
    else:
        config = dict(LOCAL_WORKER_CONFIG)
    if spec.kind == "local" and start_forkserver(preload):
        import distributed.utils

        # distributed sets its own preload list (importing pandas, lz4 here to do so) the
        # first time it makes a forkserver context unless this flag says it was done.
        distributed.utils._forkserver_preload_set = True
        config["distributed.worker.multiprocessing-method"] = "forkserver"
    with dask.config.set(config):
        yield


def _join(distributed, address: str, timeout: float):
    try:
        return distributed.Client(address, timeout=timeout)
    except (OSError, TimeoutError) as error:
        raise SchedulerError(
            f"cannot reach the Dask scheduler at {address} (no answer within {timeout:g} s; "
            "is it running, and is the address right?)"
        ) from error


def _start_local(distributed, spec: SchedulerSpec, threads: int, memory_limit, quiet: bool):
    options = {
        "threads_per_worker": threads,
        "processes": True,
        "dashboard_address": None,
        # The scheduler serves its health routes over HTTP even without a dashboard, on 8787
        # unless told otherwise, warning on stderr when another cluster holds that port.
        "scheduler_kwargs": {"dashboard": False, "dashboard_address": ":0"},
        "memory_limit": memory_limit,
        "silence_logs": logging.CRITICAL if quiet else logging.WARNING,
    }
    if spec.kind == "local-cuda":
        return _start_cuda(options)
    try:
        return distributed.LocalCluster(
            n_workers=spec.workers or _local_workers(), env=dict(NO_MULTICAST_ENV), **options
        )
    except Exception as error:  # ports, spawn failures: one line
        raise SchedulerError(f"cannot start a local Dask cluster ({error})") from error


def _start_cuda(options: dict):
    """A dask_cuda.LocalCUDACluster: one worker per visible GPU."""
    try:
        import dask_cuda
    except ImportError as error:
        raise SchedulerError(
            "--scheduler local-cuda needs dask-cuda (pip install dask-cuda; CUDA hosts only)"
        ) from error
    from ..engine.device import cuda_device_count  # the driver, asked without torch

    if cuda_device_count() == 0:
        raise SchedulerError("--scheduler local-cuda: no CUDA GPU is visible")
    # LocalCUDACluster passes processes=True itself (twice is a TypeError); its workers inherit
    # this process's environment (it sets their "env" to CUDA_VISIBLE_DEVICES alone).
    options = {key: value for key, value in options.items() if key != "processes"}
    try:
        # CUDA_VISIBLE_DEVICES=None: every visible GPU, one worker each, each pinned to its GPU.
        return dask_cuda.LocalCUDACluster(CUDA_VISIBLE_DEVICES=None, **options)
    except Exception as error:
        raise SchedulerError(f"cannot start the CUDA cluster ({error})") from error


def worker_count(client: distributed.Client) -> int:
    """Number of workers the scheduler knows now."""
    return len(client.scheduler_info().get("workers", {}))


def _executing_keys(dask_worker) -> list:
    """On a worker: keys of the tasks its threads are running now (cancelled ones included)."""
    return [ts.key for ts in list(dask_worker.state.executing)]


def wait_until_not_running(client, keys: set, timeout_s: float = 30.0) -> None:
    """Waits until no worker thread still runs one of `keys`.

    The scheduler forgets a cancelled task at once, but a worker thread that had started it
    runs it to the end; so this asks the workers themselves.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            running = {k for ks in client.run(_executing_keys).values() for k in ks}
        except Exception:  # the cluster is gone: nothing runs any more
            return
        if not running & keys:
            return
        time.sleep(0.05)
