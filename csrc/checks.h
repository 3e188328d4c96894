// Argument checks shared by the CPU and CUDA kernels: one wording for every device.
// Defined once, in checks.cpp (compiled by the host compiler only).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <c10/util/string_view.h>

#include <string>
#include <vector>

namespace imgops {

// "(2, 3)": a shape for an error message. Messages carry only strings (see checks.cpp).
std::string shape_text(c10::IntArrayRef sizes);

// Whether normalize_volume and bin take this dtype: uint8, uint16, int16, float32, float64.
bool is_volume_dtype(at::ScalarType t);

// "rgb" -> false, "bgr" -> true; anything else is a ValueError.
bool parse_channel_order(c10::string_view order);

// (..., H, W, 3) with a supported dtype, else a ValueError/TypeError saying what was received.
void check_rgb_image(const at::Tensor& image);

// The image's shape without the channel dimension.
std::vector<int64_t> gray_output_shape(const at::Tensor& image);

// The constants every device uses: lo = min and range = max - min, kept in double and rounded
// once to the precision of the arithmetic (float32 unless the output is float64).
struct NormalizeParams {
  double lo;
  double range;
  bool clip;
};

// Validates normalize_volume's arguments and returns the output dtype.
at::ScalarType check_volume_args(const at::Tensor& volume, double max, double min,
                                 std::optional<at::ScalarType> dtype);

NormalizeParams make_normalize_params(double max, double min, bool clip,
                                      at::ScalarType out_dtype);

// png_filter's plan, shared by the CPU and CUDA kernels: the image as contiguous rows, its row
// length in bytes (W * C * itemsize, 16-bit samples big-endian), bytes per pixel (C * itemsize),
// the filter code and the output shape (H, 1 + row_bytes).
struct PngFilterPlan {
  at::Tensor image;  // contiguous (H, W[, C]) uint8 or uint16
  int64_t height;
  int64_t row_bytes;
  int64_t bpp;
  int64_t item_bytes;
  int filter;  // -1 adaptive, 0 None, 1 Sub, 2 Up, 3 Average, 4 Paeth
};

// Validates png_filter's arguments (ValueError/TypeError naming what was received).
PngFilterPlan prepare_png_filter(const at::Tensor& image, int64_t filter);

// value_histogram: uint8 -> 256 bins, uint16 -> 65536, int16 -> 65536 (bin = value + 32768).
int64_t histogram_bins(const at::Tensor& values);

}  // namespace imgops
