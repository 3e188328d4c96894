"""How much a call lets other Python threads run: a pure-Python thread ticks while it runs."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

_T = TypeVar("_T")


def ticks_while(call: Callable[[], _T]) -> tuple[int, _T, float]:
    """(ticks, call's result, seconds): how often a thread that sleeps 0.5 ms between ticks
    ran while `call` did. A thread that gets the GIL ticks hundreds of times a second; one
    starved by a call that holds the GIL ticks about once."""
    ticks = 0
    stop = threading.Event()

    def tick() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            time.sleep(0.0005)

    runner = threading.Thread(target=tick)
    runner.start()
    try:
        ticks = 0
        start = time.perf_counter()
        result = call()
        took = time.perf_counter() - start
    finally:
        stop.set()
        runner.join()
    return ticks, result, took
