// normalize_volume on the CPU: imgops::parallel_for (parallel.h) over elements, a vectorisable
// inner loop compiled for baseline x86-64 and AVX2.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "../checks.h"
#include "../dispatch.h"
#include "../normalize_math.h"
#include "parallel.h"

namespace imgops {
namespace {

template <typename In, typename Out>
__attribute__((always_inline)) inline void normalize_span(const In* __restrict in,
                                                          Out* __restrict out, int64_t n,
                                                          NormalizeParams p) {
  using Acc = typename AccumulateType<Out>::type;
  const Acc lo = static_cast<Acc>(p.lo);
  const Acc range = static_cast<Acc>(p.range);
  if (p.clip) {
    for (int64_t i = 0; i < n; ++i) {
      out[i] = static_cast<Out>(normalize_value<Acc>(static_cast<Acc>(in[i]), lo, range, true));
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      out[i] = static_cast<Out>(normalize_value<Acc>(static_cast<Acc>(in[i]), lo, range, false));
    }
  }
}

template <typename In, typename Out>
void normalize_span_baseline(const In* in, Out* out, int64_t n, NormalizeParams p) {
  normalize_span<In, Out>(in, out, n, p);
}

#if defined(__x86_64__) && defined(__GNUC__)
template <typename In, typename Out>
__attribute__((target("avx2"))) void normalize_span_avx2(const In* in, Out* out, int64_t n,
                                                         NormalizeParams p) {
  normalize_span<In, Out>(in, out, n, p);
}
#endif

template <typename In, typename Out>
void normalize_cpu_typed(const at::Tensor& in, at::Tensor& out, NormalizeParams p) {
  const In* src = in.const_data_ptr<In>();
  Out* dst = out.mutable_data_ptr<Out>();
  auto span = &normalize_span_baseline<In, Out>;
#if defined(__x86_64__) && defined(__GNUC__)
  if (__builtin_cpu_supports("avx2")) {
    span = &normalize_span_avx2<In, Out>;
  }
#endif
  constexpr int64_t kGrain = 1 << 15;
  imgops::parallel_for(0, in.numel(), kGrain, [&](int64_t begin, int64_t end) {
    span(src + begin, dst + begin, end - begin, p);
  });
}

at::Tensor normalize_volume_cpu(const at::Tensor& volume, double max, double min,
                                std::optional<at::ScalarType> dtype, bool clip) {
  const at::ScalarType out_dtype = check_volume_args(volume, max, min, dtype);
  const NormalizeParams params = make_normalize_params(max, min, clip, out_dtype);
  const at::Tensor in = volume.contiguous();
  at::Tensor out = at::empty(volume.sizes(), volume.options().dtype(out_dtype));
  if (out.numel() == 0) {
    return out;
  }
  dispatch<VolumeTypes>(in.scalar_type(), "normalize_volume", [&](auto in_tag) {
    dispatch<NormalizedTypes>(out_dtype, "normalize_volume", [&](auto out_tag) {
      using In = typename decltype(in_tag)::type;
      using Out = typename decltype(out_tag)::type;
      normalize_cpu_typed<In, Out>(in, out, params);
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(imgops, CPU, m) {
  m.impl("normalize_volume", &normalize_volume_cpu);
}

}  // namespace imgops
