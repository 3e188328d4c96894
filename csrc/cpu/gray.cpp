// rgb_to_gray on the CPU: at::parallel_for over pixels, each task running the loop of
// gray_span.h that suits this CPU.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include "../checks.h"
#include "../bt601.h"
#include "gray_span.h"

namespace imgops {
namespace {

template <typename T, bool kBgr>
void gray_cpu_typed(const at::Tensor& in, at::Tensor& out) {
  const T* src = in.const_data_ptr<T>();
  T* dst = out.mutable_data_ptr<T>();
  const int64_t n = out.numel();
  const GraySpanFn<T> span = best_gray_span<T, kBgr>();
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
