// Argument checks shared by the CPU and CUDA kernels (declared in checks.h).
#include "checks.h"

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <string>

namespace imgops {
namespace {

bool is_gray_dtype(at::ScalarType t) {
  return t == at::kByte || t == at::kUInt16 || t == at::kFloat || t == at::kHalf ||
         t == at::kBFloat16 || t == at::kDouble;
}

bool is_normalized_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16 || t == at::kDouble;
}

// Numbers in messages are formatted here, not streamed: on the GPU machine (torch 2.11, g++ 13)
// a TORCH_CHECK message that streamed a double or an IntArrayRef crashed the process while
// strings and dtypes did not (root cause not established), so messages carry only strings.
std::string number_text(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.15g", value);
  return buffer;
}

}  // namespace

bool is_volume_dtype(at::ScalarType t) {
  return t == at::kByte || t == at::kUInt16 || t == at::kShort || t == at::kFloat ||
         t == at::kDouble;
}

std::string shape_text(c10::IntArrayRef sizes) {
  std::string text = "(";
  for (size_t i = 0; i < sizes.size(); ++i) {
    text += (i ? ", " : "") + std::to_string(sizes[i]);
  }
  return text + (sizes.size() == 1 ? ",)" : ")");
}

// "rgb" -> false, "bgr" -> true; anything else is an error.
bool parse_channel_order(c10::string_view order) {
  if (order == "rgb") {
    return false;
  }
  if (order == "bgr") {
    return true;
  }
  TORCH_CHECK_VALUE(false, "rgb_to_gray: channel_order must be \"rgb\" or \"bgr\", got \"",
                    std::string(order.data(), order.size()), "\"");
}

void check_rgb_image(const at::Tensor& image) {
  TORCH_CHECK_VALUE(image.dim() >= 3 && image.size(-1) == 3,
                    "rgb_to_gray: expected an image of shape (..., H, W, 3), got shape ",
                    shape_text(image.sizes()));
  TORCH_CHECK_TYPE(is_gray_dtype(image.scalar_type()),
                   "rgb_to_gray: expected dtype uint8, uint16, float32, float16, bfloat16 or "
                   "float64, got ",
                   image.scalar_type());
}

std::vector<int64_t> gray_output_shape(const at::Tensor& image) {
  auto sizes = image.sizes().vec();
  sizes.pop_back();
  return sizes;
}

// Validates normalize_volume's arguments and returns the output dtype.
at::ScalarType check_volume_args(const at::Tensor& volume, double max, double min,
                                 std::optional<at::ScalarType> dtype) {
  TORCH_CHECK_TYPE(is_volume_dtype(volume.scalar_type()),
                   "normalize_volume: expected dtype uint8, uint16, int16, float32 or float64, "
                   "got ",
                   volume.scalar_type());
  TORCH_CHECK_VALUE(std::isfinite(max) && std::isfinite(min),
                    "normalize_volume: max and min must be finite, got max=", number_text(max),
                    " min=", number_text(min));
  TORCH_CHECK_VALUE(max > min, "normalize_volume: max must be greater than min, got max=",
                    number_text(max), " min=", number_text(min));
  const at::ScalarType out = dtype.value_or(at::kFloat);
  TORCH_CHECK_TYPE(is_normalized_dtype(out),
                   "normalize_volume: dtype must be float32, float16, bfloat16 or float64, got ",
                   out);
  return out;
}

NormalizeParams make_normalize_params(double max, double min, bool clip,
                                      at::ScalarType out_dtype) {
  const double range = max - min;
  if (out_dtype != at::kDouble) {
    const float range32 = static_cast<float>(range);
    TORCH_CHECK_VALUE(range32 > 0.0f && std::isfinite(range32),
                      "normalize_volume: max - min must be a positive finite float32, got ",
                      number_text(range));
  }
  return {min, range, clip};
}

PngFilterPlan prepare_png_filter(const at::Tensor& image, int64_t filter) {
  TORCH_CHECK_VALUE(image.dim() == 2 || (image.dim() == 3 && image.size(2) >= 1 &&
                                         image.size(2) <= 4),
                    "png_filter: expected an image of shape (H, W) or (H, W, C) with C in 1..4, "
                    "got shape ",
                    shape_text(image.sizes()));
  TORCH_CHECK_TYPE(image.scalar_type() == at::kByte || image.scalar_type() == at::kUInt16,
                   "png_filter: expected dtype uint8 or uint16, got ", image.scalar_type());
  TORCH_CHECK_VALUE(image.size(1) >= 1, "png_filter: rows must hold at least one pixel, got shape ",
                    shape_text(image.sizes()));
  TORCH_CHECK_VALUE(filter >= -1 && filter <= 4,
                    "png_filter: filter must be -1 (adaptive), 0 (None), 1 (Sub), 2 (Up), "
                    "3 (Average) or 4 (Paeth), got ",
                    std::to_string(filter));
  const int64_t channels = image.dim() == 3 ? image.size(2) : 1;
  const int64_t item_bytes = image.scalar_type() == at::kUInt16 ? 2 : 1;
  return {image.contiguous(),     image.size(0),        image.size(1) * channels * item_bytes,
          channels * item_bytes, item_bytes, static_cast<int>(filter)};
}

// value_histogram: uint8 -> 256 bins, uint16 -> 65536, int16 -> 65536 (bin = value + 32768).
int64_t histogram_bins(const at::Tensor& values) {
  switch (values.scalar_type()) {
    case at::kByte:
      return 256;
    case at::kUInt16:
    case at::kShort:
      return 65536;
    default:
      TORCH_CHECK_TYPE(false, "value_histogram: expected dtype uint8, uint16 or int16, got ",
                       values.scalar_type());
  }
}

}  // namespace imgops
