// rgb_to_gray on the CPU: at::parallel_for over pixels, an inner loop the compiler vectorises,
// compiled twice (baseline x86-64 and AVX2) and picked at run time; uint8 on x86 uses the
// hand-vectorised SSE4.1 loop of gray_u8_sse.h.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include "../checks.h"
#include "../luma.h"
#include "gray_u8_sse.h"

namespace imgops {
namespace {

// Luma of n interleaved 3-channel pixels. kBgr swaps the weights of channels 0 and 2.
template <typename T, bool kBgr>
__attribute__((always_inline)) inline void gray_span(const T* __restrict in, T* __restrict out,
                                                     int64_t n) {
  for (int64_t p = 0; p < n; ++p) {
    const T c0 = in[3 * p];
    const T c1 = in[3 * p + 1];
    const T c2 = in[3 * p + 2];
    const T r = kBgr ? c2 : c0;
    const T b = kBgr ? c0 : c2;
    if constexpr (std::is_integral_v<T>) {
      out[p] = static_cast<T>(luma_int(r, c1, b));
    } else {
      using Acc = typename AccumulateType<T>::type;
      out[p] = static_cast<T>(
          luma_float<Acc>(static_cast<Acc>(r), static_cast<Acc>(c1), static_cast<Acc>(b)));
    }
  }
}

template <typename T, bool kBgr>
void gray_span_baseline(const T* in, T* out, int64_t n) {
  gray_span<T, kBgr>(in, out, n);
}

#if defined(__x86_64__) && defined(__GNUC__)
template <typename T, bool kBgr>
__attribute__((target("avx2"))) void gray_span_avx2(const T* in, T* out, int64_t n) {
  gray_span<T, kBgr>(in, out, n);
}
#endif

bool cpu_has_avx2() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
#else
  return false;
#endif
}

template <typename T, bool kBgr>
void gray_cpu_typed(const at::Tensor& in, at::Tensor& out) {
  const T* src = in.const_data_ptr<T>();
  T* dst = out.mutable_data_ptr<T>();
  const int64_t n = out.numel();
  auto span = &gray_span_baseline<T, kBgr>;
#if defined(__x86_64__) && defined(__GNUC__)
  if (cpu_has_avx2()) {
    span = &gray_span_avx2<T, kBgr>;
  }
  if constexpr (std::is_same_v<T, uint8_t>) {
    if (cpu_has_sse41()) {
      span = &gray_u8_sse<kBgr>;  // hand-vectorised: about 1.6x the compiler's AVX2 loop
    }
  }
#endif
  // About 64 KiB of input per task keeps the threads busy without scheduling overhead.
  constexpr int64_t kGrain = 1 << 14;
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    span(src + 3 * begin, dst + begin, end - begin);
  });
}

template <typename T>
void gray_cpu_dispatch_order(const at::Tensor& in, at::Tensor& out, bool bgr) {
  if (bgr) {
    gray_cpu_typed<T, true>(in, out);
  } else {
    gray_cpu_typed<T, false>(in, out);
  }
}

at::Tensor rgb_to_gray_cpu(const at::Tensor& image, c10::string_view channel_order) {
  const bool bgr = parse_channel_order(channel_order);
  check_rgb_image(image);
  const at::Tensor in = image.contiguous();
  at::Tensor out = at::empty(gray_output_shape(image), image.options());
  if (out.numel() == 0) {
    return out;
  }
  switch (in.scalar_type()) {
    case at::kByte:
      gray_cpu_dispatch_order<uint8_t>(in, out, bgr);
      break;
    case at::kUInt16:
      gray_cpu_dispatch_order<uint16_t>(in, out, bgr);
      break;
    case at::kFloat:
      gray_cpu_dispatch_order<float>(in, out, bgr);
      break;
    case at::kHalf:
      gray_cpu_dispatch_order<c10::Half>(in, out, bgr);
      break;
    case at::kBFloat16:
      gray_cpu_dispatch_order<c10::BFloat16>(in, out, bgr);
      break;
    case at::kDouble:
      gray_cpu_dispatch_order<double>(in, out, bgr);
      break;
    default:
      TORCH_CHECK(false, "unreachable: dtype checked above");
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(imgops, CPU, m) { m.impl("rgb_to_gray", &rgb_to_gray_cpu); }

}  // namespace imgops
