// The numerics shared by the CPU and CUDA kernels, so that both agree bit for bit.
//
// Integer luma is the exact BT.601 weighting rounded half up:
//   Y = (299 R + 587 G + 114 B + 500) / 1000        (fits in uint32 for 16-bit input)
// Float luma is 0.299 R + 0.587 G + 0.114 B, evaluated in float32 as
//   ((0.299 R + 0.587 G) + 0.114 B) with every product and sum rounded separately
// (no fused multiply-add), which is exactly what eager PyTorch computes.
// Volume normalisation is (x - lo) / range in float32 with IEEE division.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define IMGOPS_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define IMGOPS_HOST_DEVICE inline
#endif

namespace imgops {

constexpr uint32_t kLumaWeightR = 299;
constexpr uint32_t kLumaWeightG = 587;
constexpr uint32_t kLumaWeightB = 114;
constexpr uint32_t kLumaWeightSum = 1000;
constexpr float kLumaR = 0.299f;
constexpr float kLumaG = 0.587f;
constexpr float kLumaB = 0.114f;

// Exact BT.601 luma of one integer pixel, rounded half up.
IMGOPS_HOST_DEVICE uint32_t luma_int(uint32_t r, uint32_t g, uint32_t b) {
  return (kLumaWeightR * r + kLumaWeightG * g + kLumaWeightB * b + kLumaWeightSum / 2) /
         kLumaWeightSum;
}

IMGOPS_HOST_DEVICE float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;  // host files are compiled with -ffp-contract=off
#endif
}

IMGOPS_HOST_DEVICE float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

// BT.601 luma of one float pixel, rounded like eager PyTorch (no contraction).
IMGOPS_HOST_DEVICE float luma_float(float r, float g, float b) {
  return add_rn(add_rn(mul_rn(kLumaR, r), mul_rn(kLumaG, g)), mul_rn(kLumaB, b));
}

// (x - lo) / range, clamped to [0, 1] when clip is set (NaN stays NaN).
IMGOPS_HOST_DEVICE float normalize_value(float x, float lo, float range, bool clip) {
#if defined(__CUDA_ARCH__)
  float v = __fdiv_rn(__fsub_rn(x, lo), range);
#else
  float v = (x - lo) / range;
#endif
  if (clip) {
    v = v < 0.0f ? 0.0f : (v > 1.0f ? 1.0f : v);
  }
  return v;
}

}  // namespace imgops
