// png_filter on CUDA: one 256-thread block per row (grid-stride over rows). For the adaptive
// filter the block first scores every candidate over the same bytes as png_filter.h (every
// kScoreStride-th byte of rows of at least 16 * kScoreStride bytes, every byte otherwise), sums
// the scores exactly in 64-bit integers, and keeps the first filter with the smallest sum; then
// it writes the filter byte and the residuals. 16-bit samples are read as big-endian bytes.
// 64-bit indices; launched on the current stream under a device guard.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "../checks.h"
#include "../dispatch.h"
#include "launch.cuh"

namespace imgops {
namespace cuda {
namespace {

constexpr int kRowThreads = 256;
constexpr int64_t kScoreStride = 4;  // png_filter.h's kScoreStride
// The adaptive candidates in png_filter.h's order (ties go to the earlier one): the codes
// kFirstCandidate .. kFirstCandidate + kCandidateCount - 1, i.e. Sub (1), Up (2), Average (3).
constexpr int kFirstCandidate = 1;
constexpr int kCandidateCount = 3;

// Byte i of row y (row -1 and bytes left of the row are zeros): uint8 as is, uint16 big-endian.
template <typename T>
__device__ __forceinline__ int row_byte(const T* __restrict__ rows, int64_t samples_per_row,
                                        int64_t y, int64_t i) {
  if (y < 0 || i < 0) {
    return 0;
  }
  if constexpr (sizeof(T) == 1) {
    return rows[y * samples_per_row + i];
  } else {
    const unsigned v = rows[y * samples_per_row + (i >> 1)];
    return (i & 1) ? static_cast<int>(v & 0xffu) : static_cast<int>(v >> 8);
  }
}

// The residual byte of filter f (PNG specification, section 9) from the byte, its left, up and
// upper-left neighbours.
__device__ __forceinline__ uint8_t residual(int f, int x, int a, int b, int c) {
  switch (f) {
    case 1:
      return static_cast<uint8_t>(x - a);
    case 2:
      return static_cast<uint8_t>(x - b);
    case 3:
      return static_cast<uint8_t>(x - ((a + b) >> 1));
    case 4: {
      const int p = a + b - c;
      const int pa = abs(p - a);
      const int pb = abs(p - b);
      const int pc = abs(p - c);
      const int predictor = (pa <= pb && pa <= pc) ? a : (pb <= pc ? b : c);
      return static_cast<uint8_t>(x - predictor);
    }
    default:
      return static_cast<uint8_t>(x);
  }
}

// |residual| read as a signed byte (128 stays 128).
__device__ __forceinline__ unsigned score_of(uint8_t r) {
  const uint8_t negated = static_cast<uint8_t>(-r);
  return r < negated ? r : negated;
}

template <typename T>
__global__ void png_filter_kernel(const T* __restrict__ rows, uint8_t* __restrict__ out,
                                  int64_t height, int64_t row_bytes, int64_t bpp, int filter) {
  __shared__ unsigned long long warp_sums[kCandidateCount][kRowThreads / 32];
  __shared__ int chosen_filter;
  const int64_t samples_per_row = row_bytes / static_cast<int64_t>(sizeof(T));
  const int64_t stride = row_bytes >= 16 * kScoreStride ? kScoreStride : 1;
  for (int64_t y = blockIdx.x; y < height; y += gridDim.x) {
    int chosen = filter;
    if (filter < 0) {
      unsigned long long sums[kCandidateCount] = {0, 0, 0};
      for (int64_t i = threadIdx.x * stride; i < row_bytes; i += kRowThreads * stride) {
        const int x = row_byte(rows, samples_per_row, y, i);
        const int a = row_byte(rows, samples_per_row, y, i - bpp);
        const int b = row_byte(rows, samples_per_row, y - 1, i);
        const int c = row_byte(rows, samples_per_row, y - 1, i - bpp);
#pragma unroll
        for (int k = 0; k < kCandidateCount; ++k) {
          sums[k] += score_of(residual(kFirstCandidate + k, x, a, b, c));
        }
      }
#pragma unroll
      for (int k = 0; k < kCandidateCount; ++k) {
        for (int offset = 16; offset > 0; offset >>= 1) {
          sums[k] += __shfl_down_sync(0xffffffffu, sums[k], offset);
        }
      }
      if ((threadIdx.x & 31) == 0) {
#pragma unroll
        for (int k = 0; k < kCandidateCount; ++k) {
          warp_sums[k][threadIdx.x >> 5] = sums[k];
        }
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        int best_k = 0;
        unsigned long long best = 0;
        for (int k = 0; k < kCandidateCount; ++k) {
          unsigned long long total = 0;
          for (int w = 0; w < kRowThreads / 32; ++w) {
            total += warp_sums[k][w];
          }
          if (k == 0 || total < best) {
            best = total;
            best_k = k;
          }
        }
        chosen_filter = kFirstCandidate + best_k;
      }
      __syncthreads();
      chosen = chosen_filter;
    }
    uint8_t* dst = out + y * (row_bytes + 1);
    if (threadIdx.x == 0) {
      dst[0] = static_cast<uint8_t>(chosen);
    }
    for (int64_t i = threadIdx.x; i < row_bytes; i += kRowThreads) {
      const int x = row_byte(rows, samples_per_row, y, i);
      const int a = row_byte(rows, samples_per_row, y, i - bpp);
      const int b = row_byte(rows, samples_per_row, y - 1, i);
      const int c = row_byte(rows, samples_per_row, y - 1, i - bpp);
      dst[1 + i] = residual(chosen, x, a, b, c);
    }
    // The shared choice is rewritten for the next row only after every thread has read it.
    __syncthreads();
  }
}

template <typename T>
void launch_png_filter(const PngFilterPlan& plan, at::Tensor& out) {
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const int64_t blocks = std::min<int64_t>(plan.height, sm_count() * 16);
  png_filter_kernel<T><<<blocks, kRowThreads, 0, stream>>>(
      plan.image.const_data_ptr<T>(), out.mutable_data_ptr<uint8_t>(), plan.height,
      plan.row_bytes, plan.bpp, plan.filter);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

at::Tensor png_filter_cuda(const at::Tensor& image, int64_t filter) {
  const c10::cuda::CUDAGuard guard(image.device());
  const PngFilterPlan plan = prepare_png_filter(image, filter);
  at::Tensor out = at::empty({plan.height, plan.row_bytes + 1}, image.options().dtype(at::kByte));
  if (plan.height == 0) {
    return out;
  }
  dispatch<PngTypes>(plan.image.scalar_type(), "png_filter", [&](auto tag) {
    launch_png_filter<typename decltype(tag)::type>(plan, out);
  });
  return out;
}

}  // namespace
}  // namespace cuda

TORCH_LIBRARY_IMPL(imgops, CUDA, m) { m.impl("png_filter", &cuda::png_filter_cuda); }

}  // namespace imgops
