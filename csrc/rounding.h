// Arithmetic the CPU and CUDA kernels share so that both agree bit for bit: the host/device
// qualifier, the precision float math runs in, and products, sums and quotients rounded once
// each (no fused multiply-add on either device; host files are compiled with -ffp-contract=off).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define IMGOPS_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define IMGOPS_HOST_DEVICE inline
#endif

namespace imgops {

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

}  // namespace imgops
