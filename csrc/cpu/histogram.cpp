// value_histogram on the CPU: one private histogram per task, summed at the end.
#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "../checks.h"
#include "../dispatch.h"
#include "parallel.h"

namespace imgops {
namespace {

template <typename T>
void histogram_cpu_typed(const at::Tensor& in, at::Tensor& counts, int64_t offset) {
  const T* src = in.const_data_ptr<T>();
  const int64_t bins = counts.numel();
  const int64_t n = in.numel();
  const int64_t tasks = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(),
                                                                 (n + (1 << 20) - 1) >> 20));
  std::vector<std::vector<int64_t>> partial(tasks, std::vector<int64_t>(bins, 0));
  imgops::parallel_for(0, tasks, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t begin = n * t / tasks;
      const int64_t end = n * (t + 1) / tasks;
      int64_t* h = partial[t].data();
      for (int64_t i = begin; i < end; ++i) {
        ++h[static_cast<int64_t>(src[i]) + offset];
      }
    }
  });
  int64_t* dst = counts.mutable_data_ptr<int64_t>();
  for (const auto& h : partial) {
    for (int64_t b = 0; b < bins; ++b) {
      dst[b] += h[b];
    }
  }
}

at::Tensor value_histogram_cpu(const at::Tensor& values) {
  const int64_t bins = histogram_bins(values);
  at::Tensor counts = at::zeros({bins}, values.options().dtype(at::kLong));
  if (values.numel() == 0) {
    return counts;
  }
  const at::Tensor in = values.contiguous();
  dispatch<HistogramTypes>(in.scalar_type(), "value_histogram", [&](auto tag) {
    using T = typename decltype(tag)::type;
    histogram_cpu_typed<T>(in, counts, std::is_signed_v<T> ? 32768 : 0);
  });
  return counts;
}

}  // namespace

TORCH_LIBRARY_IMPL(imgops, CPU, m) { m.impl("value_histogram", &value_histogram_cpu); }

}  // namespace imgops
