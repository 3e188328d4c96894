"""One module per imgops subcommand. None of them imports torch at import time."""
