// bin on the CPU: imgops::parallel_for (parallel.h) over output rows (batch, oz, oy); each row
// sums its fz * fy input rows into one accumulator per output value, in the order bin_math.h fixes.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <vector>

#include "../bin.h"
#include "../checks.h"
#include "../dispatch.h"
#include "parallel.h"

namespace imgops {
namespace {

template <typename T>
void bin_cpu_typed(const BinPlan& p, at::Tensor& out) {
  const T* src = p.input.const_data_ptr<T>();
  T* dst = out.mutable_data_ptr<T>();
  const int64_t rows = p.batch * p.oz * p.oy;
  // About 64 KiB of input per task.
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / (p.fz * p.fy * p.x * sizeof(T)));
  const int64_t count = p.fz * p.fy * p.fx;
  imgops::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    std::vector<BinSum<T>> acc(p.ox);
    for (int64_t r = begin; r < end; ++r) {
      const int64_t oy = r % p.oy;
      const int64_t oz = (r / p.oy) % p.oz;
      const int64_t b = r / (p.oy * p.oz);
      std::fill(acc.begin(), acc.end(), BinSum<T>(0));
      for (int64_t dz = 0; dz < p.fz; ++dz) {
        for (int64_t dy = 0; dy < p.fy; ++dy) {
          const T* row = src + ((b * p.z + oz * p.fz + dz) * p.y + oy * p.fy + dy) * p.x;
          for (int64_t ox = 0; ox < p.ox; ++ox) {
            BinSum<T> s = acc[ox];
            for (int64_t dx = 0; dx < p.fx; ++dx) {
              s += static_cast<BinSum<T>>(row[ox * p.fx + dx]);
            }
            acc[ox] = s;
          }
        }
      }
      T* out_row = dst + r * p.ox;
      for (int64_t ox = 0; ox < p.ox; ++ox) {
        out_row[ox] = bin_mean<T>(acc[ox], count);
      }
    }
  });
}

at::Tensor bin_cpu(const at::Tensor& input, c10::IntArrayRef factors) {
  const BinPlan plan = prepare_bin(input, factors);
  at::Tensor out = at::empty(plan.out_shape, input.options());
  if (out.numel() == 0) {
    return out;
  }
  dispatch<VolumeTypes>(plan.input.scalar_type(), "bin", [&](auto tag) {
    bin_cpu_typed<typename decltype(tag)::type>(plan, out);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(imgops, CPU, m) { m.impl("bin", &bin_cpu); }

}  // namespace imgops
