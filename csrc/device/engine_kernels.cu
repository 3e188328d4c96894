// The torch-free engine's kernels, built into imgops/_device_kernels.fatbin (setup.py) and
// launched through the CUDA driver API (src/imgops/engine/cuda_driver.py): no torch, no CUDA
// runtime calls. Every kernel has C linkage so the driver finds it by its plain name, takes
// 64-bit sizes and pitches, and loops grid-stride, so any grid covers any image.
//
// imgops_gray_u8        BT.601 luma (bt601.h's luma_int) of interleaved 3-channel uint8 rows.
//                       Launch with a 2-D grid: x over columns (blockDim.x threads per block),
//                       y over rows (at most 65535 blocks; rows past that loop).
// imgops_png_filter_u8  the PNG row filter of uint8 rows (png_filter_kernel.cuh, the same code
//                       as the torch op png_filter). Launch with blockDim.x == 256, one block
//                       per row up to any grid size.
// imgops_png_deflate_*  the zlib stream of filtered rows, the CPU encoder's exact bytes
//                       (png_deflate_kernels.cuh: five launches per image, in order).
#include <cstdint>

#include "../bt601.h"
#include "../cuda/png_filter_kernel.cuh"
#include "png_deflate_kernels.cuh"

// Gray rows dst (dst_pitch bytes apart) from RGB (bgr == 0) or BGR (bgr != 0) rows src
// (src_pitch bytes apart, 3 bytes per pixel): (299 R + 587 G + 114 B + 500) / 1000.
extern "C" __global__ void imgops_gray_u8(const uint8_t* __restrict__ src, long long src_pitch,
                                          uint8_t* __restrict__ dst, long long dst_pitch,
                                          long long width, long long height, int bgr) {
  const int64_t x0 = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t x_step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int r_offset = bgr ? 2 : 0;
  const int b_offset = bgr ? 0 : 2;
  for (int64_t y = blockIdx.y; y < height; y += gridDim.y) {
    const uint8_t* __restrict__ row = src + y * src_pitch;
    uint8_t* __restrict__ out = dst + y * dst_pitch;
    for (int64_t x = x0; x < width; x += x_step) {
      const uint8_t* pixel = row + 3 * x;
      out[x] = static_cast<uint8_t>(imgops::luma_int(pixel[r_offset], pixel[1], pixel[b_offset]));
    }
  }
}

// PNG-filtered rows out (height rows of 1 + row_bytes bytes: the filter type, then the
// residuals; contiguous) of the uint8 rows src (src_pitch bytes apart). filter 0..4 uses that
// filter on every row, -1 picks per row the first of Sub, Up, Average with the smallest sum of
// |residual| (png_filter.h's rule). bpp: bytes per complete pixel (1..8).
extern "C" __global__ void __launch_bounds__(imgops::png_device::kRowThreads)
    imgops_png_filter_u8(const uint8_t* __restrict__ src, long long src_pitch,
                         long long row_bytes, long long height, int bpp, int filter,
                         uint8_t* __restrict__ out) {
  imgops::png_device::png_filter_rows<uint8_t>(src, src_pitch, out, height, row_bytes, bpp,
                                               filter);
}
