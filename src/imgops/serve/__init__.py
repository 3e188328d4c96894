"""`imgops serve` and the command line's relay to it: a warm process that runs later commands
(imgops.serve.server), the socket's protocol (imgops.serve.protocol), the caller's side
(imgops.serve.client). Nothing here imports click or the command line; this module imports
nothing heavier than os, so the command line asks `wanted()` before it imports the client
(socket and the rest)."""

from __future__ import annotations

import os

#: The environment variable that sends commands to a server: unset, "", "0", "off", "no" or
#: "false": none; "1", "on", "yes", "true" or "auto": the default socket; else a socket path.
SERVER_VARIABLE = "IMGOPS_SERVER"
OFF_VALUES = ("", "0", "off", "no", "false")


def wanted() -> bool:
    """Whether IMGOPS_SERVER asks for a server (nothing is imported or connected)."""
    return os.environ.get(SERVER_VARIABLE, "").strip().lower() not in OFF_VALUES
