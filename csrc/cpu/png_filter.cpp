// png_filter on the CPU: the row filters of standalone/png_filter.h (the definition the
// torch-free encoder uses), split over rows with imgops::parallel_for (parallel.h). 16-bit
// images are first copied to big-endian bytes; uint8 rows are filtered straight from the input,
// the first row (whose row above is zeros) from a small padded copy.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <vector>

#include "../checks.h"
#include "../standalone/png_filter.h"
#include "parallel.h"

namespace imgops {
namespace {

// Rows [begin, end) of `rows` (height rows of row_bytes) filtered into out.
void filter_row_range(const uint8_t* rows, uint8_t* out, int64_t begin, int64_t end,
                      const PngFilterPlan& plan) {
  const int64_t rb = plan.row_bytes;
  if (begin == 0 && end > 0) {
    std::vector<uint8_t> first(2 * rb, 0);  // the zero row above, then row 0
    std::copy(rows, rows + rb, first.begin() + rb);
    png::filter_rows(first.data(), out, 1, rb, plan.bpp, plan.filter);
    begin = 1;
  }
  if (begin < end) {
    png::filter_rows(rows + (begin - 1) * rb, out + begin * (rb + 1), end - begin, rb, plan.bpp,
                     plan.filter);
  }
}

at::Tensor png_filter_cpu(const at::Tensor& image, int64_t filter) {
  const PngFilterPlan plan = prepare_png_filter(image, filter);
  const int64_t rb = plan.row_bytes;
  at::Tensor out = at::empty({plan.height, rb + 1}, image.options().dtype(at::kByte));
  if (plan.height == 0) {
    return out;
  }
  // About 256 KiB of rows per task.
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 18) / rb);
  const uint8_t* rows = nullptr;
  at::Tensor big_endian;
  if (plan.item_bytes == 1) {
    rows = plan.image.const_data_ptr<uint8_t>();
  } else {
    big_endian = at::empty({plan.height * rb}, out.options());
    const uint16_t* src = plan.image.const_data_ptr<uint16_t>();
    uint8_t* dst = big_endian.mutable_data_ptr<uint8_t>();
    imgops::parallel_for(0, plan.height * rb / 2, grain * rb / 2, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        dst[2 * i] = static_cast<uint8_t>(src[i] >> 8);
        dst[2 * i + 1] = static_cast<uint8_t>(src[i] & 0xff);
      }
    });
    rows = dst;
  }
  uint8_t* dst = out.mutable_data_ptr<uint8_t>();
  imgops::parallel_for(0, plan.height, grain, [&](int64_t begin, int64_t end) {
    filter_row_range(rows, dst, begin, end, plan);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(imgops, CPU, m) { m.impl("png_filter", &png_filter_cpu); }

}  // namespace imgops
