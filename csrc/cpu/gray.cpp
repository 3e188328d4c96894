// rgb_to_gray on the CPU: imgops::parallel_for (parallel.h) over pixels, each task running the
// loop of gray_span.h that suits this CPU.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "../bt601.h"
#include "../checks.h"
#include "../dispatch.h"
#include "gray_span.h"
#include "parallel.h"

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
  imgops::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    span(src + 3 * begin, dst + begin, end - begin);
  });
}

at::Tensor rgb_to_gray_cpu(const at::Tensor& image, c10::string_view channel_order) {
  const bool bgr = parse_channel_order(channel_order);
  check_rgb_image(image);
  const at::Tensor in = image.contiguous();
  at::Tensor out = at::empty(gray_output_shape(image), image.options());
  if (out.numel() == 0) {
    return out;
  }
  dispatch<GrayTypes>(in.scalar_type(), "rgb_to_gray", [&](auto tag) {
    dispatch_bool(bgr, [&](auto order) {
      gray_cpu_typed<typename decltype(tag)::type, decltype(order)::value>(in, out);
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(imgops, CPU, m) { m.impl("rgb_to_gray", &rgb_to_gray_cpu); }

}  // namespace imgops
