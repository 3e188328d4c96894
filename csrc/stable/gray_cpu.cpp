// rgb_to_gray on the CPU through the stable ABI: torch::stable::parallel_for over pixels, each
// task running the same loops as the full extension (../cpu/gray_span.h), so both agree bit for
// bit by construction.
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>

#include "../cpu/gray_span.h"
#include "checks.h"

namespace imgops_stable {
namespace {

using torch::stable::Tensor;

template <typename T, bool kBgr>
void gray_cpu_typed(const Tensor& in, Tensor& out) {
  const T* src = in.const_data_ptr<T>();
  T* dst = out.mutable_data_ptr<T>();
  const imgops::GraySpanFn<T> span = imgops::best_gray_span<T, kBgr>();
  constexpr int64_t kGrain = 1 << 14;  // as csrc/cpu/gray.cpp
  torch::stable::parallel_for(0, out.numel(), kGrain, [&](int64_t begin, int64_t end) {
    span(src + 3 * begin, dst + begin, end - begin);
  });
}

template <typename T>
void gray_cpu_order(const Tensor& in, Tensor& out, bool bgr) {
  if (bgr) {
    gray_cpu_typed<T, true>(in, out);
  } else {
    gray_cpu_typed<T, false>(in, out);
  }
}

Tensor rgb_to_gray_cpu(Tensor image, std::string channel_order) {
  const bool bgr = parse_channel_order(channel_order);
  check_rgb_image(image);
  const Tensor in = torch::stable::contiguous(image);
  const std::vector<int64_t> shape = gray_output_shape(image);
  Tensor out = torch::stable::new_empty(in, shape);
  if (out.numel() == 0) {
    return out;
  }
  switch (in.scalar_type()) {
    case ScalarType::Byte:
      gray_cpu_order<uint8_t>(in, out, bgr);
      break;
    case ScalarType::UInt16:
      gray_cpu_order<uint16_t>(in, out, bgr);
      break;
    case ScalarType::Float:
      gray_cpu_order<float>(in, out, bgr);
      break;
    case ScalarType::Half:
      gray_cpu_order<c10::Half>(in, out, bgr);
      break;
    case ScalarType::BFloat16:
      gray_cpu_order<c10::BFloat16>(in, out, bgr);
      break;
    case ScalarType::Double:
      gray_cpu_order<double>(in, out, bgr);
      break;
    default:
      STD_TORCH_CHECK(false, "unreachable: dtype checked above");
  }
  return out;
}

}  // namespace
}  // namespace imgops_stable

STABLE_TORCH_LIBRARY_IMPL(imgops_stable, CPU, m) {
  m.impl("rgb_to_gray", TORCH_BOX(&imgops_stable::rgb_to_gray_cpu));
}
