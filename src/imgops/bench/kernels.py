"""Kernel timings: the extension next to the torch reference (eager, torch.compile) and OpenCV.

Every input is fresh random data (never zeros), rotated among several buffers so caches do not
flatter; CUDA is timed with events after a warm-up; each result is the median of many repetitions
and is set against a plain copy measured in the same run. Each implementation's output is checked
against the reference once before it is timed: a wrong kernel is reported, never timed.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from .. import ops, registry  # noqa: F401  (ops: the module the registry calls into)

_GIB = 1 << 30


# One workload: an op (a name in imgops.registry) on inputs of one shape and dtype.
Case = registry.BenchCase


@dataclass
class Result:
    """The timing of one implementation on one case."""

    device: str
    op: str
    case: str
    impl: str
    shape: list[int]
    dtype: str
    bytes_moved: int
    median_ms: float | None = None
    gbps: float | None = None
    pct_of_copy: float | None = None
    vs_imgops: float | None = None  # this implementation's time / the extension's time
    reps: int = 0
    verified: str = ""
    error: str | None = None


@dataclass
class Settings:
    """How hard to measure."""

    quick: bool = False
    compile: bool = True
    reps: int = 0  # 0: the default for the device and mode
    seconds_per_case: float = 3.0
    threads: int = 0  # 0: torch's default

    def repetitions(self, device: torch.device) -> int:
        if self.reps:
            return self.reps
        if self.quick:
            return 5
        return 50 if device.type == "cuda" else 15


@dataclass
class KernelReport:
    """Everything one kernel run measured."""

    environment: dict[str, Any]
    copy: dict[str, dict[str, float]] = field(default_factory=dict)
    results: list[Result] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "environment": self.environment,
            "copy": self.copy,
            "results": [asdict(r) for r in self.results],
        }


def cases(device: torch.device, quick: bool) -> list[Case]:
    """Every registered op's workloads for a device: modest on CPU, large on CUDA, tiny with
    --quick (imgops.registry)."""
    return [
        case
        for info in registry.OPS
        if device.type in info.devices
        for case in info.bench(device.type, quick)
    ]


def _random(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, seed: int):
    """Fresh random values over the dtype's whole range (seeded per buffer, never zeros)."""
    return registry.random_tensor(shape, dtype, seed).to(device)


def _buffer_count(nbytes: int, device: torch.device, quick: bool) -> int:
    """Enough input buffers that the working set is well beyond the last-level cache."""
    if quick:
        return 2
    working_set = 512 << 20 if device.type == "cuda" else 256 << 20
    budget = 4 * _GIB if device.type == "cuda" else _GIB
    return max(2, min(8, math.ceil(working_set / nbytes), budget // max(nbytes, 1)))


def _time(fn: Callable[[Any], Any], inputs: list, device: torch.device, reps: int, budget_s: float):
    """Median milliseconds of fn over `reps` calls (fewer if it runs past budget_s; at least 3)."""
    warmup = 3 if device.type == "cuda" else 1
    for i in range(warmup):
        fn(inputs[i % len(inputs)])
    times: list[float] = []
    started = time.perf_counter()
    if device.type == "cuda":
        stream = torch.cuda.current_stream(device)
        events = []
        for i in range(reps):
            begin = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            begin.record(stream)
            fn(inputs[i % len(inputs)])
            end.record(stream)
            events.append((begin, end))
            if i >= 2 and time.perf_counter() - started > budget_s:
                break
        torch.cuda.synchronize(device)
        times = [begin.elapsed_time(end) for begin, end in events]
    else:
        for i in range(reps):
            t0 = time.perf_counter()
            fn(inputs[i % len(inputs)])
            times.append((time.perf_counter() - t0) * 1e3)
            if i >= 2 and time.perf_counter() - started > budget_s:
                break
    return statistics.median(times), len(times)


def copy_bandwidth(device: torch.device, settings: Settings) -> dict[str, float]:
    """GB/s of a plain copy (bytes read + written): device-to-device on CUDA, `copy_` on CPU."""
    nbytes = (64 << 20) if settings.quick else (_GIB if device.type == "cuda" else 256 << 20)
    src = _random((nbytes,), torch.uint8, device, seed=1)
    dst = torch.empty_like(src)
    median_ms, reps = _time(
        lambda x: dst.copy_(x),
        [src],
        device,
        settings.repetitions(device),
        settings.seconds_per_case,
    )
    return {"bytes": float(nbytes), "median_ms": median_ms, "gbps": 2 * nbytes / median_ms / 1e6}


def _implementations(case: Case, device: torch.device, settings: Settings) -> dict[str, Callable]:
    """name -> callable(input) for every implementation that applies to this case and device."""
    info = registry.BY_NAME[case.op]

    def imgops_op(x):
        return info.fn(x, *case.args, **case.kwargs)

    impls: dict[str, Callable] = {"imgops": imgops_op}
    baseline = info.baseline
    if baseline is not None:

        def eager(x):
            return baseline(x, *case.args, **case.kwargs)

        impls["torch eager"] = eager
        if settings.compile:
            impls["torch.compile"] = torch.compile(eager, dynamic=False)
    if case.op == "rgb_to_gray" and device.type == "cpu" and len(case.shape) == 3:
        impls["opencv"] = _opencv_gray
    return impls


def _expected(case: Case, x: torch.Tensor) -> torch.Tensor:
    """The reference result: the pure-torch baseline on the device, else the CPU reference."""
    info = registry.BY_NAME[case.op]
    if info.baseline is not None:
        return info.baseline(x, *case.args, **case.kwargs)
    return info.reference(x.cpu(), *case.args, **case.kwargs)


def _opencv_gray(image: torch.Tensor) -> torch.Tensor:
    import cv2

    return torch.from_numpy(cv2.cvtColor(image.numpy(), cv2.COLOR_RGB2GRAY))


def _verify(impl: str, output: torch.Tensor, expected: torch.Tensor) -> str:
    """'exact', or the largest difference when tolerated; raises AssertionError when wrong."""
    if output.shape != expected.shape or output.dtype != expected.dtype:
        raise AssertionError(
            f"{impl}: got {tuple(output.shape)} {output.dtype}, "
            f"expected {tuple(expected.shape)} {expected.dtype}"
        )
    output, expected = output.cpu(), expected.cpu()
    if torch.equal(output, expected):
        return "exact"
    if expected.dtype.is_floating_point:
        diff = (output.double() - expected.double()).abs().max().item()
        if torch.allclose(output, expected, rtol=1e-6, atol=1e-7):
            return f"max diff {diff:.1e}"
        raise AssertionError(f"{impl}: differs from the reference by up to {diff:.3g}")
    diff = int((output.long() - expected.long()).abs().max().item())
    # OpenCV's fixed-point luma is an approximation: within 1 for 8-bit, 2 for 16-bit samples.
    if impl == "opencv" and diff <= (1 if expected.dtype == torch.uint8 else 2):
        return f"max diff {diff}"
    raise AssertionError(f"{impl}: differs from the reference by up to {diff}")


def run_case(
    case: Case, device: torch.device, settings: Settings, copy_gbps: float
) -> list[Result]:
    """Times every implementation of one case; the extension's result comes first."""
    nbytes_in = math.prod(case.shape) * case.dtype.itemsize
    count = _buffer_count(nbytes_in, device, settings.quick)
    inputs = [_random(case.shape, case.dtype, device, seed=100 + i) for i in range(count)]
    expected = _expected(case, inputs[0])
    moved = nbytes_in + expected.numel() * expected.element_size()
    results = []
    for impl, fn in _implementations(case, device, settings).items():
        result = Result(
            device.type, case.op, case.label, impl, list(case.shape), str(case.dtype)[6:], moved
        )
        try:
            result.verified = _verify(impl, fn(inputs[0]), expected)
            median_ms, reps = _time(
                fn, inputs, device, settings.repetitions(device), settings.seconds_per_case
            )
        except Exception as error:  # a failing or wrong implementation is reported, not timed
            result.error = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
            results.append(result)
            continue
        result.median_ms, result.reps = median_ms, reps
        result.gbps = moved / median_ms / 1e6
        result.pct_of_copy = 100.0 * result.gbps / copy_gbps
        results.append(result)
    base = results[0].median_ms if results and results[0].impl == "imgops" else None
    for result in results:
        if base and result.median_ms:
            result.vs_imgops = result.median_ms / base
    del inputs
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return results


def environment(devices: list[torch.device], threads: int = 0) -> dict[str, Any]:
    """Versions, threads and devices for the report; sets torch's and OpenCV's threads."""
    import platform

    import cv2

    from .. import __version__

    if threads:
        torch.set_num_threads(threads)
    threads = torch.get_num_threads()
    cv2.setNumThreads(threads)
    env: dict[str, Any] = {
        "imgops": __version__,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "opencv": cv2.__version__,
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_threads": threads,
        "opencv_threads": cv2.getNumThreads(),
    }
    for device in devices:
        if device.type == "cuda":
            env["gpu"] = torch.cuda.get_device_name(device)
    return env


def run_kernels(
    devices: list[torch.device], settings: Settings, progress: Callable[[str], None] | None = None
) -> KernelReport:
    """Measures the copy bandwidth and every case on each device."""
    report = KernelReport(environment(devices, settings.threads))
    for device in devices:
        if progress:
            progress(f"{device.type}: copy bandwidth")
        report.copy[device.type] = copy_bandwidth(device, settings)
        for case in cases(device, settings.quick):
            if progress:
                progress(f"{device.type}: {case.op} {case.label}")
            report.results.extend(
                run_case(case, device, settings, report.copy[device.type]["gbps"])
            )
    return report
