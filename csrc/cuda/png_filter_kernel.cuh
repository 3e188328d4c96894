// The PNG row filter's device code, free of torch and of the CUDA runtime, shared by the torch
// op (csrc/cuda/png_filter.cu) and the torch-free engine kernels (csrc/device/engine_kernels.cu).
//
// One 256-thread block per row (grid-stride over rows). For the adaptive filter the block first
// scores every candidate over the same bytes as png_filter.h (every kScoreStride-th byte of rows
// of at least 16 * kScoreStride bytes, every byte otherwise), sums the scores exactly in 64-bit
// integers, and keeps the first filter with the smallest sum; then it writes the filter byte and
// the residuals. 16-bit samples are read as big-endian bytes. Rows of the source lie `pitch`
// bytes apart; the output is `height` rows of `row_bytes + 1` bytes, contiguous. 64-bit indices.
#pragma once

#include <cstdint>

namespace imgops {
namespace png_device {

// The block size png_filter_rows needs (its reductions assume exactly this many threads).
constexpr int kRowThreads = 256;
constexpr int64_t kScoreStride = 4;  // png_filter.h's kScoreStride
// The adaptive candidates in png_filter.h's order (ties go to the earlier one): the codes
// kFirstCandidate .. kFirstCandidate + kCandidateCount - 1, i.e. Sub (1), Up (2), Average (3).
constexpr int kFirstCandidate = 1;
constexpr int kCandidateCount = 3;

// Byte i of row y (row -1 and bytes left of the row are zeros): uint8 as is, uint16 big-endian.
// Rows start `pitch` bytes apart (a multiple of sizeof(T)).
template <typename T>
__device__ __forceinline__ int row_byte(const uint8_t* __restrict__ rows, int64_t pitch,
                                        int64_t y, int64_t i) {
  if (y < 0 || i < 0) {
    return 0;
  }
  if constexpr (sizeof(T) == 1) {
    return rows[y * pitch + i];
  } else {
    const unsigned v = reinterpret_cast<const T*>(rows + y * pitch)[i >> 1];
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

// The body of a png filter kernel: filters rows blockIdx.x, blockIdx.x + gridDim.x, ... of
// `rows` (samples of type T, rows `pitch` bytes apart, `row_bytes` bytes each) into `out`.
// filter is 0..4, or -1 for the adaptive choice. Launch with blockDim.x == kRowThreads.
template <typename T>
__device__ __forceinline__ void png_filter_rows(const uint8_t* __restrict__ rows, int64_t pitch,
                                                uint8_t* __restrict__ out, int64_t height,
                                                int64_t row_bytes, int64_t bpp, int filter) {
  __shared__ unsigned long long warp_sums[kCandidateCount][kRowThreads / 32];
  __shared__ int chosen_filter;
  const int64_t stride = row_bytes >= 16 * kScoreStride ? kScoreStride : 1;
  for (int64_t y = blockIdx.x; y < height; y += gridDim.x) {
    int chosen = filter;
    if (filter < 0) {
      unsigned long long sums[kCandidateCount] = {0, 0, 0};
      for (int64_t i = threadIdx.x * stride; i < row_bytes; i += kRowThreads * stride) {
        const int x = row_byte<T>(rows, pitch, y, i);
        const int a = row_byte<T>(rows, pitch, y, i - bpp);
        const int b = row_byte<T>(rows, pitch, y - 1, i);
        const int c = row_byte<T>(rows, pitch, y - 1, i - bpp);
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
      const int x = row_byte<T>(rows, pitch, y, i);
      const int a = row_byte<T>(rows, pitch, y, i - bpp);
      const int b = row_byte<T>(rows, pitch, y - 1, i);
      const int c = row_byte<T>(rows, pitch, y - 1, i - bpp);
      dst[1 + i] = residual(chosen, x, a, b, c);
    }
    // The shared choice is rewritten for the next row only after every thread has read it.
    __syncthreads();
  }
}

}  // namespace png_device
}  // namespace imgops
