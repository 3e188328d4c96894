"""The batch engine's public names, re-exported from imgops.engine (where the engine lives).

`run_batch(jobs, op, settings, on_result)` runs any `ImageOp`; `run_gray` is it with `GRAY`.
"""

from .engine import *  # noqa: F403  (exactly imgops.engine.__all__)
from .engine import __all__  # noqa: F401
