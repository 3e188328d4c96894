// bin's shared part, used by the CPU (cpu/bin.cpp) and CUDA (cuda/bin.cu) kernels alike:
// - prepare_bin: the argument checks (one wording for every device) and the plan, the input as
//   contiguous (batch, Z, Y, X) with factors (fz, fy, fx) (missing leading factors are 1) and the
//   output shape (leading dims, then each binned dim // its factor: partial blocks dropped);
// - bin_mean: the block's values summed in order (Z, then Y, then X) into an exact int64 for
//   integer types or a double for float types; integers rounded half up
//   (floor((2 * sum + count) / (2 * count)), exact), floats the double mean cast once.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "checks.h"
#include "rounding.h"

namespace imgops {

struct BinPlan {
  at::Tensor input;  // contiguous
  int64_t batch, z, y, x;
  int64_t fz, fy, fx;
  int64_t oz, oy, ox;
  std::vector<int64_t> out_shape;
};

// Validates bin's arguments (1 to 3 factors, each >= 1, no more than the input's dims; dtype
// uint8, uint16, int16, float32 or float64) and plans the kernel.
inline BinPlan prepare_bin(const at::Tensor& input, c10::IntArrayRef factors) {
  const int64_t k = static_cast<int64_t>(factors.size());
  TORCH_CHECK_VALUE(k >= 1 && k <= 3, "bin: expected 1 to 3 factors (Z, Y, X), got ",
                    std::to_string(k));
  TORCH_CHECK_VALUE(input.dim() >= k, "bin: ", std::to_string(k),
                    " factors need at least as many dimensions, got shape ",
                    shape_text(input.sizes()));
  for (const int64_t f : factors) {
    TORCH_CHECK_VALUE(f >= 1, "bin: factors must be >= 1, got ", shape_text(factors));
  }
  TORCH_CHECK_TYPE(is_volume_dtype(input.scalar_type()),
                   "bin: expected dtype uint8, uint16, int16, float32 or float64, got ",
                   input.scalar_type());
  BinPlan plan;
  plan.input = input.contiguous();
  int64_t dims[3] = {1, 1, 1};
  int64_t f[3] = {1, 1, 1};
  for (int64_t i = 0; i < k; ++i) {
    dims[3 - k + i] = input.size(input.dim() - k + i);
    f[3 - k + i] = factors[i];
  }
  plan.batch = 1;
  for (int64_t d = 0; d < input.dim() - k; ++d) {
    plan.batch *= input.size(d);
    plan.out_shape.push_back(input.size(d));
  }
  plan.z = dims[0], plan.y = dims[1], plan.x = dims[2];
  plan.fz = f[0], plan.fy = f[1], plan.fx = f[2];
  plan.oz = plan.z / plan.fz, plan.oy = plan.y / plan.fy, plan.ox = plan.x / plan.fx;
  for (int64_t i = 0; i < k; ++i) {
    plan.out_shape.push_back(input.size(input.dim() - k + i) / factors[i]);
  }
  return plan;
}

// The sum a block accumulates into.
template <typename T>
using BinSum = std::conditional_t<std::is_integral_v<T>, int64_t, double>;

// The block mean of `count` values summing to `sum`, as a T.
template <typename T>
IMGOPS_HOST_DEVICE T bin_mean(BinSum<T> sum, int64_t count) {
  if constexpr (std::is_integral_v<T>) {
    const int64_t num = 2 * sum + count;
    const int64_t den = 2 * count;
    const int64_t q = num / den;  // truncates toward zero; floor for negative sums
    return static_cast<T>(q - ((num % den != 0) && (num < 0) ? 1 : 0));
  } else {
    return static_cast<T>(div_rn(sum, static_cast<double>(count)));
  }
}

}  // namespace imgops
