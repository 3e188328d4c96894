// bin's block mean, the same on every device: the block's values summed in order (Z, then Y,
// then X) into an exact int64 for integer types, or a double for float types; integers rounded
// half up (floor((2 * sum + count) / (2 * count)), exact), floats the double mean cast once.
#pragma once

#include <cstdint>
#include <type_traits>

#include "rounding.h"

namespace imgops {

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
