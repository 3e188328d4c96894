// normalize_volume on CUDA: each group is as many values as fill 16 bytes of the wider of input
// and output (4 for uint16 -> float32: an 8-byte load and a 16-byte store), so every warp-wide
// load and store is fully coalesced; one group per thread, 64-bit indices; a scalar kernel
// takes the tail and unaligned views.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include "../checks.h"
#include "../dispatch.h"
#include "../normalize_math.h"
#include "launch.cuh"

namespace imgops {
namespace cuda {
namespace {

template <typename In, typename Out>
__device__ __forceinline__ Out normalize_one(In x, const NormalizeParams& p) {
  using Acc = typename AccumulateType<Out>::type;
  return static_cast<Out>(normalize_value<Acc>(static_cast<Acc>(x), static_cast<Acc>(p.lo),
                                               static_cast<Acc>(p.range), p.clip));
}

// Values per group: 16 bytes of the wider of the two types.
template <typename In, typename Out>
constexpr int group_values() {
  return 16 / (sizeof(In) > sizeof(Out) ? sizeof(In) : sizeof(Out));
}

// One group per thread over a grid of 128-thread blocks that covers them all, with streaming
// stores (the fastest layout measured on the H200, benchmarks/kernel_variants.cu); the loop
// only runs again past the grid limit.
constexpr int kVectorThreads = 128;

template <typename In, typename Out>
__global__ void normalize_vector_kernel(const In* __restrict__ in, Out* __restrict__ out,
                                        int64_t groups, NormalizeParams p) {
  constexpr int kValues = group_values<In, Out>();
  const int64_t total = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups;
       g += total) {
    const Vec<In, kValues> x = load_vec<In, kValues>(in + g * kValues);
    Vec<Out, kValues> y;
#pragma unroll
    for (int i = 0; i < kValues; ++i) {
      y.v[i] = normalize_one<In, Out>(x.v[i], p);
    }
    store_vec_streaming<Out, kValues>(out + g * kValues, y);
  }
}

template <typename In, typename Out>
__global__ void normalize_scalar_kernel(const In* __restrict__ in, Out* __restrict__ out,
                                        int64_t begin, int64_t end, NormalizeParams p) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = begin + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < end;
       i += stride) {
    out[i] = normalize_one<In, Out>(in[i], p);
  }
}

template <typename In, typename Out>
void launch_normalize(const at::Tensor& in, at::Tensor& out, NormalizeParams p) {
  constexpr int kValues = group_values<In, Out>();
  const In* src = in.const_data_ptr<In>();
  Out* dst = out.mutable_data_ptr<Out>();
  const int64_t n = in.numel();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const bool vectorized =
      is_aligned(src, kValues * sizeof(In)) && is_aligned(dst, kValues * sizeof(Out));
  const int64_t groups = vectorized ? n / kValues : 0;
  if (groups > 0) {
    normalize_vector_kernel<In, Out><<<full_grid_size(groups, kVectorThreads), kVectorThreads, 0,
                                       stream>>>(src, dst, groups, p);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  const int64_t done = groups * kValues;
  if (done < n) {
    normalize_scalar_kernel<In, Out>
        <<<grid_size(n - done), kThreadsPerBlock, 0, stream>>>(src, dst, done, n, p);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

at::Tensor normalize_volume_cuda(const at::Tensor& volume, double max, double min,
                                 std::optional<at::ScalarType> dtype, bool clip) {
  const at::ScalarType out_dtype = check_volume_args(volume, max, min, dtype);
  const NormalizeParams params = make_normalize_params(max, min, clip, out_dtype);
  const c10::cuda::CUDAGuard guard(volume.device());
  const at::Tensor in = volume.contiguous();
  at::Tensor out = at::empty(volume.sizes(), volume.options().dtype(out_dtype));
  if (out.numel() == 0) {
    return out;
  }
  dispatch<VolumeTypes>(in.scalar_type(), "normalize_volume", [&](auto in_tag) {
    dispatch<NormalizedTypes>(out_dtype, "normalize_volume", [&](auto out_tag) {
      using In = typename decltype(in_tag)::type;
      using Out = typename decltype(out_tag)::type;
      launch_normalize<In, Out>(in, out, params);
    });
  });
  return out;
}

}  // namespace
}  // namespace cuda

TORCH_LIBRARY_IMPL(imgops, CUDA, m) { m.impl("normalize_volume", &cuda::normalize_volume_cuda); }

}  // namespace imgops
