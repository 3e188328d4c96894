"""Where a whole `imgops gray` process spends its wall, outside the engine's own --stats-json:
the interpreter's start, the imports, the planning, the CUDA prestart, the engine, and the way
out, each as milliseconds since the process was created (from /proc/self/stat).

    python scripts/timeline.py [--engine] TIMELINE.txt gray DIR -d OUT -q --device cuda

runs imgops' CLI with those arguments and appends one line per event to TIMELINE.txt (the exit
itself, after os._exit or sys.exit, is timed by the caller: the file's last line is the moment
the process asked to leave). `--engine` also marks the device engine's inside: the CUDA stage's
start and readiness, each decode call and device batch, the 1st and every 100th file the prep
threads have read and checked (1, 100, 101, 200, ...), every 50th file of the CPU path
(it imports the engine's modules, numpy among them, before the CLI runs, so everything before
the prestart moves ~0.1 s later than in a plain run), each nvImageCodec decode call itself,
every 100th file the encode threads finish, and, under `imgops serve`, each relayed command.
Linux only (the process start time comes from /proc). The file's first line gives the
process's start in CLOCK_BOOTTIME seconds, so that the marks of several processes (a server and
its callers: `--caller`) line up:

    python scripts/timeline.py --caller TIMELINE.txt gray DIR -d OUT -q

runs the installed entry point (imgops.entry, which relays to IMGOPS_SERVER) as a child process
and marks its spawn and its end.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time


def _process_start() -> float:
    """When this process was created, in CLOCK_BOOTTIME seconds (Linux /proc; 10 ms ticks)."""
    with open("/proc/self/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    start_ticks = int(fields[19])  # field 22 of stat(5); fields[0] is field 3
    return start_ticks / os.sysconf("SC_CLK_TCK")


def _now() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


_START = _process_start()
_LINES: list[str] = []
_LOCK = threading.Lock()


def mark(event: str) -> None:
    """Records `event` at the current time (ms since the process was created)."""
    with _LOCK:
        _LINES.append(f"{1000 * (_now() - _START):9.1f} ms  {event}")


def _flush(path: str) -> None:
    with _LOCK:
        lines = [f"# pid {os.getpid()} started at {_START:.4f} s (CLOCK_BOOTTIME)", *_LINES]
        _LINES.clear()
    with open(path, "a") as out:
        out.write("\n".join(lines) + "\n")


def _wrap(owner, name: str, label: str | None = None, sized_argument: int | None = None) -> None:
    """Replaces owner.name (a module's function or a class's method) by one that marks its entry
    and exit as `label` (default: the name), with the length of positional argument
    `sized_argument` where given (a method's batch: 1, after self)."""
    inner = getattr(owner, name)
    label = label or name

    def timed(*args, **kwargs):
        size = ""
        if sized_argument is not None and len(args) > sized_argument:
            size = f" {len(args[sized_argument])}"
        mark(f"{label} enter{size}")
        try:
            return inner(*args, **kwargs)
        finally:
            mark(f"{label} return{size}")

    setattr(owner, name, timed)


def _mark_engine() -> None:
    """Marks the device engine's inside (see the module docstring)."""
    from imgops.engine import batched, driver, driver_stage

    _wrap(driver_stage.DriverStage, "_start", "CUDA stage start")
    _wrap(batched.DeviceEngine, "_decode_batch", "decode call", sized_argument=1)
    _wrap(driver.DriverEngine, "_run_batch", "device batch", sized_argument=2)
    from imgops.io import nvimgcodec_c
    from imgops.serve import server

    _wrap(nvimgcodec_c.CDecoder, "_submit", "  nvimgcodecDecoderDecode")
    _wrap(server.Server, "_handle", "relayed command")
    _count(batched.DeviceEngine, "_finish", "encode threads", every=100)
    _count(batched.DeviceEngine, "_finish_on_host", "CPU path", every=50)
    _count(driver.DriverEngine, "_read_and_decode", "prep threads", every=100, first=True)


def _count(owner, name: str, label: str, every: int, first: bool = False) -> None:
    """Replaces owner.name by one that marks every `every`th call as "label: N files" (with
    `first`, the call after each such one too: 1, 101, 201, ...)."""
    inner = getattr(owner, name)
    done = [0]

    def counted(*args, **kwargs):
        inner(*args, **kwargs)
        with _LOCK:
            done[0] += 1
            count = done[0]
        if count % every == 0 or (first and count % every == 1):
            mark(f"{label}: {count} files")

    setattr(owner, name, counted)


def _caller(path: str, args: list[str]) -> None:
    """Runs `python -m imgops.entry ARGS` as a child, marking its spawn and end; exits with
    its status."""
    import subprocess

    mark(f"caller spawn: {' '.join(args[:2])}")
    code = subprocess.call([sys.executable, "-m", "imgops.entry", *args])
    mark(f"caller end, status {code}")
    _flush(path)
    sys.exit(code)


def main() -> None:
    """Runs imgops' CLI with the arguments after TIMELINE.txt, marking its stages into it."""
    if sys.argv[1:2] == ["--caller"]:
        _caller(sys.argv[2], sys.argv[3:])
    engine = sys.argv[1:2] == ["--engine"]
    if engine:
        del sys.argv[1]
    path = sys.argv[1]
    mark("python up (timeline.py runs)")
    if engine:
        _mark_engine()
        mark("engine marks in place")
    import imgops.cli as cli

    mark("imported imgops.cli")
    import imgops.commands.gray as gray

    mark("imported imgops.commands.gray")
    for name in ("_plan", "_prestart_cuda", "run_plan", "_discard_prestarted"):
        _wrap(gray, name)
    real_exit = os._exit

    def leave(code: int) -> None:
        mark(f"os._exit({code})")
        _flush(path)
        real_exit(code)

    os._exit = leave
    atexit.register(lambda: (mark("atexit (sys.exit path)"), _flush(path)))
    sys.argv = ["imgops"] + sys.argv[2:]
    cli.main()


if __name__ == "__main__":
    main()
