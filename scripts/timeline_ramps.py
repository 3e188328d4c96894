"""Where a warm server's relayed commands spend their wall: one line per command of a
`scripts/timeline.py --engine ... serve` timeline (the server's own file), in milliseconds
from the command's start: the first file read and checked, the first decode call, the last
decode call's end, the last device batch's end, the last encode, and the command's end; and
the decode calls' count, files and busy time, and the device batches' busy time.

    python scripts/timeline_ramps.py SERVER_TIMELINE.txt
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field

LINE = re.compile(r"^\s*([0-9.]+) ms  (.*)$")


@dataclass
class Command:
    """The marks of one relayed command, in ms since the server process started."""

    start: float
    end: float | None = None
    events: list[tuple[float, str]] = field(default_factory=list)

    def first(self, prefix: str) -> float | None:
        """When the first event starting with `prefix` happened."""
        return next((t for t, e in self.events if e.startswith(prefix)), None)

    def last(self, prefix: str) -> float | None:
        """When the last event starting with `prefix` happened."""
        return next((t for t, e in reversed(self.events) if e.startswith(prefix)), None)

    def spans(self, label: str) -> list[tuple[float, float, int]]:
        """(enter, return, files) of each `label enter N` / `label return N` pair."""
        out, opened = [], None
        for t, event in self.events:
            if event.startswith(f"{label} enter"):
                opened = (t, int(event.split()[-1]) if event.split()[-1].isdigit() else 0)
            elif event.startswith(f"{label} return") and opened is not None:
                out.append((opened[0], t, opened[1]))
                opened = None
        return out


def commands(path: str) -> list[Command]:
    """The relayed commands of a server timeline, each with the marks inside it."""
    found: list[Command] = []
    current: Command | None = None
    with open(path) as lines:
        text = lines.read().splitlines()
    for line in text:
        match = LINE.match(line)
        if not match:
            continue
        t, event = float(match.group(1)), match.group(2)
        if event == "relayed command enter":
            current = Command(t)
            found.append(current)
        elif event == "relayed command return" and current is not None:
            current.end = t
            current = None
        elif current is not None:
            current.events.append((t, event))
    return [c for c in found if c.end is not None]


def describe(command: Command) -> str:
    """One line: the command's milestones and busy times."""

    def at(value: float | None) -> str:
        return "-" if value is None else f"{value - command.start:.0f}"

    decodes = command.spans("decode call")
    batches = command.spans("device batch")
    decode_busy = sum(b - a for a, b, _ in decodes)
    device_busy = sum(b - a for a, b, _ in batches)
    files = sum(n for _, _, n in decodes)
    return (
        f"wall {command.end - command.start:.0f} | first read {at(command.first('prep threads'))}"
        f" | first decode {at(decodes[0][0] if decodes else None)}"
        f" | last decode end {at(decodes[-1][1] if decodes else None)}"
        f" | last batch end {at(batches[-1][1] if batches else None)}"
        f" | last encode {at(command.last('encode threads'))}"
        f" | decode calls {len(decodes)} ({files} files, busy {decode_busy:.0f})"
        f" | device batches {len(batches)} (busy {device_busy:.0f})"
    )


def main() -> int:
    """Prints one line per relayed command."""
    for number, command in enumerate(commands(sys.argv[1]), 1):
        print(f"command {number}: {describe(command)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
