"""`imgops serve ...` with the default memory pool's cross-stream reuse
(CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES) off on every device, whatever
IMGOPS_DECODE_STREAM says. A diagnosis for the wrong pixels that decodes on the stage's stream
wrote (docs/BENCHMARKS.md, 2026-12-07 fourth session): run a server with
IMGOPS_DECODE_STREAM=stage through this script beside a plain "stage" server, relay the same
commands to both and check every output (scripts/gpu-check.d/serve_verify.py). Wrong pixels
from the plain server only would point at the pool's cross-stream reuse.

Run on an H100 host (scripts/gpu-check.d/finish_stress.sh, 2026-12-07 fifth session): this
server wrote wrong outputs in 2 of 14 commands of 800 photos, the plain "stage" server in 1 of
14, so the pool's cross-stream reuse is not the cause (docs/BENCHMARKS.md).

    IMGOPS_DECODE_STREAM=stage python scripts/serve_pool_noreuse.py serve --device cuda ...
"""

from __future__ import annotations

import sys
from typing import Any

from imgops.engine import cuda_driver

_device_init = cuda_driver.Device.__init__


def _init_without_reuse(self: Any, *args: Any, **kwargs: Any) -> None:
    """Device.__init__, then the pool's cross-stream reuse turned off."""
    _device_init(self, *args, **kwargs)
    self.pool_internal_dependencies(False)
    print("serve_pool_noreuse: the pool's cross-stream reuse is off", file=sys.stderr)


if __name__ == "__main__":
    cuda_driver.Device.__init__ = _init_without_reuse  # type: ignore[method-assign]
    from imgops.cli import main

    main(relay=False)
