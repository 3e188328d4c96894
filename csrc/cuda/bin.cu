// bin on CUDA: one thread per output value over a grid that covers them all (grid-stride past
// the grid limit), 64-bit indices, summing its block in the order bin_math.h fixes, so the
// result equals the CPU kernel's bit for bit. Launched on the current stream under a guard.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "../bin.h"
#include "../checks.h"
#include "../dispatch.h"
#include "launch.cuh"

namespace imgops {
namespace cuda {
namespace {

struct BinShape {
  int64_t z, y, x;
  int64_t fz, fy, fx;
  int64_t oz, oy, ox;
};

template <typename T>
__global__ void bin_kernel(const T* __restrict__ in, T* __restrict__ out, int64_t n, BinShape s) {
  const int64_t count = s.fz * s.fy * s.fx;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const int64_t ox = i % s.ox;
    const int64_t oy = (i / s.ox) % s.oy;
    const int64_t oz = (i / (s.ox * s.oy)) % s.oz;
    const int64_t b = i / (s.ox * s.oy * s.oz);
    BinSum<T> sum = 0;
    for (int64_t dz = 0; dz < s.fz; ++dz) {
      for (int64_t dy = 0; dy < s.fy; ++dy) {
        const T* row = in + ((b * s.z + oz * s.fz + dz) * s.y + oy * s.fy + dy) * s.x + ox * s.fx;
        for (int64_t dx = 0; dx < s.fx; ++dx) {
          sum += static_cast<BinSum<T>>(row[dx]);
        }
      }
    }
    out[i] = bin_mean<T>(sum, count);
  }
}

at::Tensor bin_cuda(const at::Tensor& input, c10::IntArrayRef factors) {
  const c10::cuda::CUDAGuard guard(input.device());
  const BinPlan p = prepare_bin(input, factors);
  at::Tensor out = at::empty(p.out_shape, input.options());
  const int64_t n = out.numel();
  if (n == 0) {
    return out;
  }
  const BinShape shape{p.z, p.y, p.x, p.fz, p.fy, p.fx, p.oz, p.oy, p.ox};
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  dispatch<VolumeTypes>(p.input.scalar_type(), "bin", [&](auto tag) {
    using T = typename decltype(tag)::type;
    bin_kernel<T><<<full_grid_size(n), kThreadsPerBlock, 0, stream>>>(
        p.input.const_data_ptr<T>(), out.mutable_data_ptr<T>(), n, shape);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

}  // namespace
}  // namespace cuda

TORCH_LIBRARY_IMPL(imgops, CUDA, m) { m.impl("bin", &cuda::bin_cuda); }

}  // namespace imgops
