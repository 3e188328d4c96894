"""Runs one imgops command in this process while sampling every thread's Python stack.

    python scripts/profile_batch.py [--interval MS] [--depth N] -- gray photos/ -d out/ ...

Prints, per thread kind (the thread name without its number), the share of samples in each
stack (innermost first) and the command's wall time. A sample is taken whenever the sampler
gets the GIL, so a thread that holds the GIL for long is under-sampled: read this next to
py-spy's --gil profile where py-spy can run. Written for the engine's threads
(imgops-prep, imgops-device, imgops-encode).
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
import threading
import time
import traceback

import click


def main() -> int:
    """Parses the options, runs the command under the sampler, prints the profile."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=5.0, help="ms between samples")
    parser.add_argument("--depth", type=int, default=4, help="frames kept per stack")
    parser.add_argument("--top", type=int, default=12, help="stacks printed per thread kind")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    options = parser.parse_args()
    argv = [a for a in options.command if a != "--"]
    samples: collections.Counter[tuple[str, str]] = collections.Counter()
    stop = threading.Event()

    def sample() -> None:
        me = threading.get_ident()
        while not stop.is_set():
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                kind = re.sub(r"[_-]\d+(_\d+)?$", "", names.get(ident, "?"))
                stack = traceback.extract_stack(frame)[-options.depth :]
                where = " < ".join(f"{f.name}:{f.lineno}" for f in reversed(stack))
                samples[(kind, where)] += 1
            time.sleep(options.interval / 1000)

    from imgops.cli import cli as imgops_main

    threading.Thread(target=sample, name="sampler", daemon=True).start()
    start = time.perf_counter()
    try:
        imgops_main(argv, standalone_mode=False)
    except SystemExit as done:
        print("exit", done.code, file=sys.stderr)
    except click.ClickException as error:
        error.show()
    wall = time.perf_counter() - start
    stop.set()
    totals: collections.Counter[str] = collections.Counter()
    for (kind, _), count in samples.items():
        totals[kind] += count
    print(f"wall {wall:.2f} s, {sum(totals.values())} samples")
    for kind, total in totals.most_common():
        print(f"\n== {kind}: {total} samples")
        ranked = sorted(((c, w) for (k, w), c in samples.items() if k == kind), reverse=True)
        for count, where in ranked[: options.top]:
            print(f"  {100 * count / total:5.1f}%  {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
