#!/usr/bin/env python
"""Fuzz imgops' decode paths for a time budget: mutated sample images and TIFF stacks.

    $ python scripts/fuzz_decode.py --seconds 600 --save fuzz-failures/

Each case mutates one real sample file (bit flips, truncation, header byte edits, chunk/segment
length edits, zeroed runs, duplicated runs; see tests/fuzz_cases.py) and judges imgops' decode:
it must either give exactly what OpenCV/tifffile decode (and the exact BT.601 gray), or raise
the project's clean error type with a one-line message. Cases run in a worker process under a
memory limit, so a crash, an abort or a runaway allocation is caught and counted too; a case
that uses --case-timeout seconds of CPU (or ten times that of wall time: a worker starved on a
loaded machine is not a hang) counts as a hang. Prints the number of cases and failures;
exits 1 if any case failed. Every failing input is saved under --save when given.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import fuzz_cases as fc  # noqa: E402


def _draw(rng: random.Random) -> tuple[str, fc.Mutation]:
    volume = rng.random() < 0.3
    name = rng.choice(fc.VOLUME_NAMES if volume else fc.IMAGE_NAMES)
    return name, fc.Mutation(rng.choice(fc.MUTATIONS), rng.random(), rng.getrandbits(32))


def worker(seed: int, deadline: float, status: Path, memory_mb: int) -> None:
    """Runs cases until the deadline, writing the case in progress and the counts to `status`."""
    limit = memory_mb << 20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    fc.quiet_libraries()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)  # libpng/libjpeg warnings go straight to fd 2: keep the report readable
    rng = random.Random(seed)
    scratch = Path(tempfile.mkdtemp(prefix="imgops-fuzz-"))
    counts: Counter[str] = Counter()
    failures: list[dict] = []
    while time.time() < deadline:
        name, mutation = _draw(rng)
        data = fc.mutate(fc.sample_bytes(name), mutation)
        current = {
            "name": name,
            "mutation": mutation.describe(),
            "started": time.time(),
            "cpu_started": _cpu_seconds(os.getpid()),
        }
        status.write_text(json.dumps({"counts": counts, "failures": failures, "current": current}))
        try:
            if name.endswith(".tif"):
                path = scratch / "case.tif"
                path.write_bytes(data)
                outcome = fc.check_volume(path)
            else:
                outcome = fc.check_image(data)
            counts[outcome] += 1
        except fc.OracleFailure as error:
            counts["failed"] += 1
            failures.append({**current, "reason": str(error)[:300]})
    status.write_text(json.dumps({"counts": counts, "failures": failures, "current": None}))


def _cpu_seconds(pid: int) -> float:
    """CPU time (user + system) a process has used, from /proc; 0 where it cannot be read."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _hung(current: dict, pid: int, case_timeout: float) -> bool:
    """A case is a hang when it has used `case_timeout` s of CPU, or ten times that in wall
    time: on a loaded machine a starved worker is slow in wall time, not in CPU time."""
    wall = time.time() - current["started"]
    cpu = _cpu_seconds(pid) - current.get("cpu_started", 0.0)
    return cpu > case_timeout or wall > 10 * case_timeout


def _save(folder: Path | None, name: str, mutation: str, index: int) -> None:
    if folder is None:
        return
    kind, rest = mutation.split("@")
    where, value = rest.split(":")
    data = fc.mutate(fc.sample_bytes(name), fc.Mutation(kind, float(where), int(value, 16)))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{index:04d}-{kind}-{name}").write_bytes(data)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="time budget (default 60)")
    parser.add_argument("--seed", type=int, default=None, help="first seed (default: random)")
    parser.add_argument(
        "--case-timeout", type=float, default=30.0, help="CPU seconds = a hang (10x in wall time)"
    )
    parser.add_argument("--memory-mb", type=int, default=6144, help="worker address space")
    parser.add_argument("--save", type=Path, default=None, help="folder for failing inputs")
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        seed, deadline, status = args.worker
        worker(int(seed), float(deadline), Path(status), args.memory_mb)
        return 0

    seed = first_seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    started = time.time()
    deadline = started + args.seconds
    totals: Counter[str] = Counter()
    failures: list[dict] = []
    status = Path(tempfile.mkdtemp(prefix="imgops-fuzz-status-")) / "status.json"
    restarts = 0
    while time.time() < deadline:
        status.write_text("{}")
        command = [sys.executable, __file__, "--memory-mb", str(args.memory_mb)]
        process = subprocess.Popen([*command, "--worker", str(seed), str(deadline), str(status)])
        hung = None
        while process.poll() is None:
            time.sleep(0.5)
            try:
                current = json.loads(status.read_text() or "{}").get("current")
            except json.JSONDecodeError:
                continue
            if current and _hung(current, process.pid, args.case_timeout):
                hung = current
                process.kill()
                process.wait()
        state = json.loads(status.read_text() or "{}")
        totals.update(state.get("counts", {}))
        failures.extend(state.get("failures", []))
        if process.returncode != 0 or hung is not None:
            current = hung or state.get("current")
            reason = "hang" if hung else f"worker died (exit status {process.returncode})"
            if current:
                totals["failed"] += 1
                failures.append({**current, "reason": reason})
            restarts += 1
        seed += 1
    for index, failure in enumerate(failures):
        print(f"FAIL {failure['name']} {failure['mutation']}: {failure['reason']}")
        _save(args.save, failure["name"], failure["mutation"], index)
    cases = sum(totals.values())
    print(
        f"fuzz_decode: {cases} cases in {time.time() - started:.0f} s "
        f"({totals['ok']} decoded correctly, {totals['error']} clean errors, "
        f"{totals['failed']} failures; {restarts} worker restarts; first seed {first_seed})"
    )
    return 1 if totals["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
