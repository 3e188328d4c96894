// Volume normalisation, the same on every device: (x - lo) / range with IEEE division, in
// float32 (float64 when the output is float64), clamped to [0, 1] when asked.
#pragma once

#include "rounding.h"

namespace imgops {

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
