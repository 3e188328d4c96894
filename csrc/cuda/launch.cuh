// Launch helpers shared by the CUDA kernels: grid sizing, alignment, 16-byte vectors.
#pragma once

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace imgops {
namespace cuda {

constexpr int kThreadsPerBlock = 256;

// The number of multiprocessors of the current device (looked up once per device and thread).
inline int64_t sm_count() {
  static thread_local int cached_device = -1;
  static thread_local int count = 0;
  const int device = c10::cuda::current_device();
  if (device != cached_device) {
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    cached_device = device;
  }
  return count;
}

// Enough resident blocks to fill every SM several times over; grid-stride loops do the rest.
inline int64_t grid_size(int64_t work_items) {
  const int64_t needed = (work_items + kThreadsPerBlock - 1) / kThreadsPerBlock;
  const int64_t resident = sm_count() * 8;
  return needed < resident ? (needed > 0 ? needed : 1) : resident;
}

// One thread per work item: blocks enough to cover all of it (capped at the grid limit, past
// which the kernels' grid-stride loops take over). Measured on the H200 for the streaming
// kernels: 98-101 % of copy bandwidth, against 87-94 % for a few resident blocks that loop
// (benchmarks/kernel_variants.cu).
inline int64_t full_grid_size(int64_t work_items, int64_t threads = kThreadsPerBlock) {
  constexpr int64_t kMaxBlocks = 0x7fffffff;
  const int64_t needed = (work_items + threads - 1) / threads;
  return needed < 1 ? 1 : (needed < kMaxBlocks ? needed : kMaxBlocks);
}

inline bool is_aligned(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// kCount values of T, aligned for the widest memory operation that fits them.
template <typename T, int kCount>
struct alignas(sizeof(T) * kCount >= 16 ? 16 : sizeof(T) * kCount) Vec {
  T v[kCount];
};

// Stores kCount values of T with the widest aligned stores (16 bytes where the size allows).
template <typename T, int kCount>
__device__ __forceinline__ void store_vec(T* dst, const Vec<T, kCount>& src) {
  constexpr int kBytes = sizeof(T) * kCount;
  if constexpr (kBytes % 16 == 0) {
    const uint4* s = reinterpret_cast<const uint4*>(&src);
    uint4* d = reinterpret_cast<uint4*>(dst);
#pragma unroll
    for (int i = 0; i < kBytes / 16; ++i) {
      d[i] = s[i];
    }
  } else if constexpr (kBytes == 8) {
    *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(&src);
  } else {
#pragma unroll
    for (int i = 0; i < kCount; ++i) {
      dst[i] = src.v[i];
    }
  }
}

// store_vec with streaming (evict-first) stores: for outputs the kernel never reads again, so
// they do not push inputs still to be read out of the L2 cache.
template <typename T, int kCount>
__device__ __forceinline__ void store_vec_streaming(T* dst, const Vec<T, kCount>& src) {
  constexpr int kBytes = sizeof(T) * kCount;
  if constexpr (kBytes % 16 == 0) {
    const uint4* s = reinterpret_cast<const uint4*>(&src);
    uint4* d = reinterpret_cast<uint4*>(dst);
#pragma unroll
    for (int i = 0; i < kBytes / 16; ++i) {
      __stcs(d + i, s[i]);
    }
  } else if constexpr (kBytes == 8) {
    __stcs(reinterpret_cast<uint2*>(dst), *reinterpret_cast<const uint2*>(&src));
  } else {
    store_vec<T, kCount>(dst, src);
  }
}

// Loads kCount values of T with the widest loads their size allows: 16-byte loads for whole
// multiples of 16 bytes, else one 8-, 4- or 2-byte load (src must be aligned to that width).
template <typename T, int kCount>
__device__ __forceinline__ Vec<T, kCount> load_vec(const T* src) {
  constexpr int kBytes = sizeof(T) * kCount;
  Vec<T, kCount> out;
  if constexpr (kBytes % 16 == 0) {
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(&out);
#pragma unroll
    for (int i = 0; i < kBytes / 16; ++i) {
      d[i] = __ldg(s + i);
    }
  } else if constexpr (kBytes == 8) {
    *reinterpret_cast<uint2*>(&out) = __ldg(reinterpret_cast<const uint2*>(src));
  } else if constexpr (kBytes == 4) {
    *reinterpret_cast<unsigned int*>(&out) = __ldg(reinterpret_cast<const unsigned int*>(src));
  } else {
#pragma unroll
    for (int i = 0; i < kCount; ++i) {
      out.v[i] = src[i];
    }
  }
  return out;
}

}  // namespace cuda
}  // namespace imgops
