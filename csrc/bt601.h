// BT.601 luma, the same on every device.
// Integer luma is the exact weighting rounded half up:
//   Y = (299 R + 587 G + 114 B + 500) / 1000        (fits in uint32 for 16-bit input)
// Float luma is 0.299 R + 0.587 G + 0.114 B, evaluated in float32 (float64 for float64 images)
// as ((0.299 R + 0.587 G) + 0.114 B) with every product and sum rounded separately (no fused
// multiply-add), which is exactly what eager PyTorch computes.
#pragma once

#include <cstdint>

#include "rounding.h"

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

// BT.601 luma of one float pixel in precision Acc (float, or double for float64 images),
// rounded like eager PyTorch: ((0.299 R + 0.587 G) + 0.114 B).
template <typename Acc>
IMGOPS_HOST_DEVICE Acc luma_float(Acc r, Acc g, Acc b) {
  const Acc wr = static_cast<Acc>(0.299);
  const Acc wg = static_cast<Acc>(0.587);
  const Acc wb = static_cast<Acc>(0.114);
  return add_rn(add_rn(mul_rn(wr, r), mul_rn(wg, g)), mul_rn(wb, b));
}

}  // namespace imgops
