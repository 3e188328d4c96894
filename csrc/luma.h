// The numerics shared by the CPU and CUDA kernels, so that both agree bit for bit.
//
// Integer luma is the exact BT.601 weighting rounded half up:
//   Y = (299 R + 587 G + 114 B + 500) / 1000        (fits in uint32 for 16-bit input)
// Float luma is 0.299 R + 0.587 G + 0.114 B, evaluated in float32 (float64 for float64 images)
// as ((0.299 R + 0.587 G) + 0.114 B) with every product and sum rounded separately (no fused
// multiply-add), which is exactly what eager PyTorch computes.
// Volume normalisation is (x - lo) / range with IEEE division, in float32 (float64 when the
// output is float64).
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

// Exact BT.601 luma of one integer pixel, rounded half up.
IMGOPS_HOST_DEVICE uint32_t luma_int(uint32_t r, uint32_t g, uint32_t b) {
  return (kLumaWeightR * r + kLumaWeightG * g + kLumaWeightB * b + kLumaWeightSum / 2) /
         kLumaWeightSum;
}

// The precision float math runs in: float32, or float64 for float64 data.
template <typename T>
struct AccumulateType {
  using type = float;
};
template <>
struct AccumulateType<double> {
  using type = double;
};

// Products, sums and quotients rounded once each: no fused multiply-add on either device.
IMGOPS_HOST_DEVICE float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;  // host files are compiled with -ffp-contract=off
#endif
}

IMGOPS_HOST_DEVICE double mul_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

IMGOPS_HOST_DEVICE float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

IMGOPS_HOST_DEVICE double add_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}

IMGOPS_HOST_DEVICE float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

IMGOPS_HOST_DEVICE double div_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}

// BT.601 luma of one float pixel in precision Acc (float, or double for float64 images),
// rounded like eager PyTorch: ((0.299 R + 0.587 G) + 0.114 B).
template <typename Acc>
IMGOPS_HOST_DEVICE Acc luma_float(Acc r, Acc g, Acc b) {
  const Acc wr = static_cast<Acc>(0.299);
  const Acc wg = static_cast<Acc>(0.587);
  const Acc wb = static_cast<Acc>(0.114);
  return add_rn(add_rn(mul_rn(wr, r), mul_rn(wg, g)), mul_rn(wb, b));
}

// (x - lo) / range in precision Acc, clamped to [0, 1] when clip is set (NaN stays NaN).
template <typename Acc>
IMGOPS_HOST_DEVICE Acc normalize_value(Acc x, Acc lo, Acc range, bool clip) {
  Acc v = div_rn(add_rn(x, -lo), range);
  if (clip) {
    v = v < Acc(0) ? Acc(0) : (v > Acc(1) ? Acc(1) : v);
  }
  return v;
}

}  // namespace imgops
