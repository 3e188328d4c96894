// Argument checks of the stable-ABI prototype (csrc/stable/): the same rules and wording as
// csrc/checks.cpp, written against torch/csrc/stable and torch/headeronly only.
// Gap: the stable API has no TORCH_CHECK_VALUE/TORCH_CHECK_TYPE; STD_TORCH_CHECK throws
// std::runtime_error, which Python sees as RuntimeError (imgops._C raises ValueError/TypeError).
#pragma once

#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include <cstdint>
#include <string>
#include <vector>

namespace imgops_stable {

using torch::headeronly::ScalarType;

// "rgb" -> false, "bgr" -> true; anything else is an error.
inline bool parse_channel_order(const std::string& order) {
  if (order == "rgb") {
    return false;
  }
  if (order == "bgr") {
    return true;
  }
  STD_TORCH_CHECK(false, "rgb_to_gray: channel_order must be \"rgb\" or \"bgr\", got \"", order,
                  "\"");
  return false;
}

// "(4, 3)" like Python's tuple; built from std::to_string (no ostream number formatting).
inline std::string shape_text(const torch::stable::Tensor& t) {
  std::string text = "(";
  for (int64_t i = 0; i < t.dim(); ++i) {
    text += (i ? ", " : "") + std::to_string(t.size(i));
  }
  return text + (t.dim() == 1 ? ",)" : ")");
}

inline bool is_gray_dtype(ScalarType t) {
  return t == ScalarType::Byte || t == ScalarType::UInt16 || t == ScalarType::Float ||
         t == ScalarType::Half || t == ScalarType::BFloat16 || t == ScalarType::Double;
}

// (..., H, W, 3) with a supported dtype, else an error saying what was received.
inline void check_rgb_image(const torch::stable::Tensor& image) {
  STD_TORCH_CHECK(image.dim() >= 3 && image.size(-1) == 3,
                  "rgb_to_gray: expected an image of shape (..., H, W, 3), got shape ",
                  shape_text(image));
  STD_TORCH_CHECK(is_gray_dtype(image.scalar_type()),
                  "rgb_to_gray: expected dtype uint8, uint16, float32, float16, bfloat16 or "
                  "float64, got ",
                  torch::headeronly::toString(image.scalar_type()));
}

// The image's shape without the channel dimension.
inline std::vector<int64_t> gray_output_shape(const torch::stable::Tensor& image) {
  std::vector<int64_t> sizes;
  for (int64_t i = 0; i + 1 < image.dim(); ++i) {
    sizes.push_back(image.size(i));
  }
  return sizes;
}

}  // namespace imgops_stable
