"""Prototype a kernel with torch.utils.cpp_extension.load_inline, check it, then move it to csrc/.

The third way to build imgops kernels (after setup.py and the just-in-time loader): write the
kernel as a string, compile it in seconds, and compare it against a pure-torch reference before it
earns a file in csrc/. The example op converts 16-bit images to 8 bits with exact rounding,
y = (255 x + 32767) // 65535, a conversion microscopy users ask for.

    $ python examples/prototype_inline.py            # CPU kernel (and CUDA when a GPU is there)
    $ python examples/prototype_inline.py --build-dir /tmp/proto

Moving it into the project: put the schema in csrc/ops.cpp, the loop in csrc/cpu/<op>.cpp (and a
CUDA twin in csrc/cuda/<op>.cu), the wrapper and fake kernel in src/imgops/ops.py, the reference in
src/imgops/reference.py, and this script's checks in tests/.
"""

from __future__ import annotations

import argparse
import sys
import tempfile

import torch
from torch.utils.cpp_extension import load_inline

CPU_SOURCE = r"""
#include <ATen/Parallel.h>
#include <torch/library.h>

namespace {

at::Tensor u16_to_u8_cpu(const at::Tensor& image) {
  TORCH_CHECK_TYPE(image.scalar_type() == at::kUInt16, "u16_to_u8: expected uint16, got ",
                   image.scalar_type());
  const at::Tensor in = image.contiguous();
  at::Tensor out = at::empty(in.sizes(), in.options().dtype(at::kByte));
  const uint16_t* src = in.const_data_ptr<uint16_t>();
  uint8_t* dst = out.mutable_data_ptr<uint8_t>();
  at::parallel_for(0, in.numel(), 1 << 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      dst[i] = static_cast<uint8_t>((255u * src[i] + 32767u) / 65535u);
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(imgops_proto, m) { m.def("u16_to_u8(Tensor image) -> Tensor"); }
TORCH_LIBRARY_IMPL(imgops_proto, CPU, m) { m.impl("u16_to_u8", &u16_to_u8_cpu); }
"""


def reference(image: torch.Tensor) -> torch.Tensor:
    """The definition, in plain torch integer arithmetic."""
    return ((image.to(torch.int64) * 255 + 32767) // 65535).to(torch.uint8)


def main() -> int:
    """Compiles the prototype, checks it against the reference, prints the verdict."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-dir", default=None, help="where to compile (default: a temp dir)")
    args = parser.parse_args()
    build_dir = args.build_dir or tempfile.mkdtemp(prefix="imgops-proto-")
    load_inline(
        name="imgops_proto",
        cpp_sources=[CPU_SOURCE],
        extra_cflags=["-O3"],
        build_directory=build_dir,
        is_python_module=False,
        verbose=False,
    )
    op = torch.ops.imgops_proto.u16_to_u8
    every_value = torch.arange(65536, dtype=torch.int32).to(torch.uint16)
    random_image = torch.randint(0, 65536, (3, 257, 131), dtype=torch.int32).to(torch.uint16)
    for name, image in (("all 65536 values", every_value), ("random image", random_image)):
        got, want = op(image), reference(image)
        if not torch.equal(got, want):
            bad = (got != want).nonzero()[0].tolist()
            print(f"MISMATCH on {name} at {bad}: {got[tuple(bad)]} != {want[tuple(bad)]}")
            return 1
        print(f"ok: {name} ({image.numel()} values) match the reference")
    print("prototype verified: move it into csrc/ (see this file's docstring)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
