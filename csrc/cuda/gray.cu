// rgb_to_gray on CUDA: each thread turns 48 bytes of interleaved pixels (three 16-byte loads)
// into one 16-byte store, one group per thread, 64-bit indices; a scalar kernel takes the
// tail and unaligned views. Launched on the current stream under a device guard.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include "../checks.h"
#include "../dispatch.h"
#include "../bt601.h"
#include "launch.cuh"

namespace imgops {
namespace cuda {
namespace {

template <typename T, bool kBgr>
__device__ __forceinline__ T gray_pixel(T c0, T c1, T c2) {
  const T r = kBgr ? c2 : c0;
  const T b = kBgr ? c0 : c2;
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(luma_int(r, c1, b));
  } else {
    using Acc = typename AccumulateType<T>::type;
    return static_cast<T>(
        luma_float<Acc>(static_cast<Acc>(r), static_cast<Acc>(c1), static_cast<Acc>(b)));
  }
}

// One group = 16 / sizeof(T) pixels: 48 bytes in (three 16-byte loads), 16 bytes out. One
// group per thread over a grid that covers them all: every SM's warps keep their loads in
// flight, which beat fewer threads with more groups each (benchmarks/kernel_variants.cu).
// Streaming stores: the output is not read again.
template <typename T, bool kBgr>
__global__ void gray_vector_kernel(const T* __restrict__ in, T* __restrict__ out,
                                   int64_t groups) {
  constexpr int kPixels = 16 / sizeof(T);
  const int64_t total = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups;
       g += total) {
    const Vec<T, 3 * kPixels> px = load_vec<T, 3 * kPixels>(in + g * 3 * kPixels);
    Vec<T, kPixels> y;
#pragma unroll
    for (int i = 0; i < kPixels; ++i) {
      y.v[i] = gray_pixel<T, kBgr>(px.v[3 * i], px.v[3 * i + 1], px.v[3 * i + 2]);
    }
    store_vec_streaming<T, kPixels>(out + g * kPixels, y);
  }
}

// Pixels [begin, end) one at a time.
template <typename T, bool kBgr>
__global__ void gray_scalar_kernel(const T* __restrict__ in, T* __restrict__ out, int64_t begin,
                                   int64_t end) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = begin + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < end;
       p += stride) {
    out[p] = gray_pixel<T, kBgr>(in[3 * p], in[3 * p + 1], in[3 * p + 2]);
  }
}

template <typename T, bool kBgr>
void launch_gray(const at::Tensor& in, at::Tensor& out) {
  constexpr int kPixels = 16 / sizeof(T);
  const T* src = in.const_data_ptr<T>();
  T* dst = out.mutable_data_ptr<T>();
  const int64_t n = out.numel();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const bool vectorized = is_aligned(src, 16) && is_aligned(dst, 16);
  const int64_t groups = vectorized ? n / kPixels : 0;
  if (groups > 0) {
    gray_vector_kernel<T, kBgr>
        <<<full_grid_size(groups), kThreadsPerBlock, 0, stream>>>(src, dst, groups);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  const int64_t done = groups * kPixels;
  if (done < n) {
    gray_scalar_kernel<T, kBgr>
        <<<grid_size(n - done), kThreadsPerBlock, 0, stream>>>(src, dst, done, n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

at::Tensor rgb_to_gray_cuda(const at::Tensor& image, c10::string_view channel_order) {
  const bool bgr = parse_channel_order(channel_order);
  check_rgb_image(image);
  const c10::cuda::CUDAGuard guard(image.device());
  const at::Tensor in = image.contiguous();
  at::Tensor out = at::empty(gray_output_shape(image), image.options());
  if (out.numel() == 0) {
    return out;
  }
  dispatch<GrayTypes>(in.scalar_type(), "rgb_to_gray", [&](auto tag) {
    dispatch_bool(bgr, [&](auto order) {
      launch_gray<typename decltype(tag)::type, decltype(order)::value>(in, out);
    });
  });
  return out;
}

}  // namespace
}  // namespace cuda

TORCH_LIBRARY_IMPL(imgops, CUDA, m) { m.impl("rgb_to_gray", &cuda::rgb_to_gray_cuda); }

}  // namespace imgops
