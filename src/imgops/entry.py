"""The `imgops` executable's entry point: a command that a warm `imgops serve` is to run
(IMGOPS_SERVER) is relayed before the command line is even imported (click and the commands:
a relayed single-file call took ~130 ms with that import, ~70 ms without, on the 2-core
machine); everything else goes to imgops.cli.main.
"""

from __future__ import annotations

import sys


def main() -> None:
    """Relays to a server where one is wanted and answers; otherwise runs the command line."""
    from . import serve

    if serve.wanted():
        from .serve import client

        forwarded = client.forward(sys.argv[1:])
        if forwarded is not None:
            sys.exit(forwarded)
    from .cli import main as run_here

    run_here(relay=False)


if __name__ == "__main__":  # python -m imgops.entry: what the installed `imgops` runs
    main()
