// value_histogram on CUDA. Each block counts into shared memory and flushes the non-zero bins
// to the global int64 counts with atomics. For 16-bit data the 65,536 bins are packed two per
// 32-bit word (16-bit counters, 128 KiB); a block flushes after every slice of fewer than 65,536
// values, so no counter can overflow.
#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <type_traits>

#include "../checks.h"
#include "../dispatch.h"
#include "launch.cuh"

namespace imgops {
namespace cuda {
namespace {

constexpr int kHistogramThreads = 1024;
// Fewer than 65,536 values per slice, so a 16-bit counter never overflows.
constexpr int64_t kSliceValues = 63 * kHistogramThreads;

__global__ void histogram_u8_kernel(const uint8_t* __restrict__ in, int64_t n,
                                    unsigned long long* __restrict__ counts) {
  __shared__ unsigned int bins[256];
  for (int b = threadIdx.x; b < 256; b += blockDim.x) {
    bins[b] = 0;
  }
  __syncthreads();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    atomicAdd(&bins[in[i]], 1u);
  }
  __syncthreads();
  for (int b = threadIdx.x; b < 256; b += blockDim.x) {
    if (bins[b] != 0) {
      atomicAdd(&counts[b], static_cast<unsigned long long>(bins[b]));
    }
  }
}

template <typename T>
__global__ void histogram_u16_kernel(const T* __restrict__ in, int64_t n, int offset,
                                     unsigned long long* __restrict__ counts) {
  extern __shared__ unsigned int packed[];  // 32,768 words: bin k is half (k & 1) of word k / 2
  constexpr int kWords = 65536 / 2;
  for (int w = threadIdx.x; w < kWords; w += blockDim.x) {
    packed[w] = 0;
  }
  __syncthreads();
  const int64_t slices = (n + kSliceValues - 1) / kSliceValues;
  for (int64_t s = blockIdx.x; s < slices; s += gridDim.x) {
    const int64_t begin = s * kSliceValues;
    const int64_t end = begin + kSliceValues < n ? begin + kSliceValues : n;
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
      const int bin = static_cast<int>(in[i]) + offset;
      atomicAdd(&packed[bin >> 1], 1u << ((bin & 1) * 16));
    }
    __syncthreads();
    for (int w = threadIdx.x; w < kWords; w += blockDim.x) {
      const unsigned int word = packed[w];
      if (word != 0) {
        packed[w] = 0;
        if (word & 0xffffu) {
          atomicAdd(&counts[2 * w], static_cast<unsigned long long>(word & 0xffffu));
        }
        if (word >> 16) {
          atomicAdd(&counts[2 * w + 1], static_cast<unsigned long long>(word >> 16));
        }
      }
    }
    __syncthreads();
  }
}

template <typename T>
void launch_histogram_u16(const at::Tensor& in, at::Tensor& counts, int offset,
                          cudaStream_t stream) {
  constexpr int kSharedBytes = 65536 / 2 * sizeof(unsigned int);
  C10_CUDA_CHECK(cudaFuncSetAttribute(histogram_u16_kernel<T>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes));
  const int64_t n = in.numel();
  const int64_t slices = (n + kSliceValues - 1) / kSliceValues;
  // 128 KiB of shared memory each: one block per SM.
  const int64_t blocks = std::min<int64_t>(slices, sm_count());
  histogram_u16_kernel<T><<<blocks, kHistogramThreads, kSharedBytes, stream>>>(
      in.const_data_ptr<T>(), n, offset,
      reinterpret_cast<unsigned long long*>(counts.mutable_data_ptr<int64_t>()));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

at::Tensor value_histogram_cuda(const at::Tensor& values) {
  const int64_t bins = histogram_bins(values);
  const c10::cuda::CUDAGuard guard(values.device());
  at::Tensor counts = at::zeros({bins}, values.options().dtype(at::kLong));
  if (values.numel() == 0) {
    return counts;
  }
  const at::Tensor in = values.contiguous();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  dispatch<HistogramTypes>(in.scalar_type(), "value_histogram", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, uint8_t>) {
      const int64_t n = in.numel();
      histogram_u8_kernel<<<grid_size(n), kThreadsPerBlock, 0, stream>>>(
          in.const_data_ptr<uint8_t>(), n,
          reinterpret_cast<unsigned long long*>(counts.mutable_data_ptr<int64_t>()));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    } else {
      launch_histogram_u16<T>(in, counts, std::is_signed_v<T> ? 32768 : 0, stream);
    }
  });
  return counts;
}

}  // namespace
}  // namespace cuda

TORCH_LIBRARY_IMPL(imgops, CUDA, m) { m.impl("value_histogram", &cuda::value_histogram_cuda); }

}  // namespace imgops
