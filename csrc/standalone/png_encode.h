// A whole PNG file (signature, IHDR, IDAT, IEND) from an image or from rows already filtered,
// with the row deflate of png_deflate.h. Both paths cut the filtered rows into the same blocks
// (whole rows, about kBlockBytes each), so they give the same bytes for the same filtered rows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <cstdlib>
#include <vector>

#include "png_checksum.h"
#include "png_deflate.h"
#include "png_filter.h"
#include "png_filter_simd.h"

namespace imgops {
namespace png {

constexpr size_t kBlockBytes = 1 << 16;  // filtered bytes a deflate block, rounded to rows
constexpr size_t kIdatMax = size_t{1} << 30;  // bytes an IDAT chunk at most

struct ImageShape {
  int64_t width;
  int64_t height;
  int channels;  // 1..4
  int itemsize;  // 1 or 2
  int64_t row_bytes() const { return width * channels * itemsize; }
  int64_t bpp() const { return static_cast<int64_t>(channels) * itemsize; }
};

inline int64_t rows_per_block(const ImageShape& shape) {
  const int64_t filtered_row = shape.row_bytes() + 1;
  const int64_t rows = static_cast<int64_t>(kBlockBytes) / filtered_row;
  return rows < 1 ? 1 : rows;
}

inline void put_be32(uint8_t* p, uint32_t v) {
  p[0] = static_cast<uint8_t>(v >> 24);
  p[1] = static_cast<uint8_t>(v >> 16);
  p[2] = static_cast<uint8_t>(v >> 8);
  p[3] = static_cast<uint8_t>(v);
}

// The PNG file is written in place into one buffer of max_png_bytes(shape): the signature and
// IHDR, then the zlib stream straight after the first IDAT header (no copy), then the chunk
// CRCs and IEND; streams longer than one IDAT chunk may hold are split by moving the tail.
constexpr size_t kHeadBytes = 8 + 25 + 8;  // signature, IHDR, the first IDAT's length and type

inline size_t filtered_bytes(const ImageShape& shape) {
  return (static_cast<size_t>(shape.row_bytes()) + 1) * static_cast<size_t>(shape.height);
}

// The image is cut into at most kMaxTables stripes of whole blocks, each with its own Huffman
// table fitted to every kSampleStride-th row of the stripe: small images get a table every
// block or two (they have distinct regions: sky, ground), large ones a table every few MB
// (a table costs ~50 us: package-merge and the pair table). Both encode paths see the same
// filtered rows, so they fit the same tables.
constexpr int64_t kSampleStride = 4;
constexpr int64_t kMaxTables = 8;

// Bytes of a PNG file around a zlib stream of `zlib` bytes: the head, the stream, 12 bytes of
// framing per IDAT chunk, IEND.
inline size_t png_file_bytes(size_t zlib) {
  return kHeadBytes + zlib + 12 * (zlib / kIdatMax + 1) + 12;
}

inline size_t max_png_bytes(const ImageShape& shape) {
  const size_t largest_block =
      static_cast<size_t>(rows_per_block(shape)) * (static_cast<size_t>(shape.row_bytes()) + 1);
  const size_t blocks = static_cast<size_t>((shape.height + rows_per_block(shape) - 1) /
                                            rows_per_block(shape));
  const size_t zlib = RowDeflater::max_zlib_bytes(filtered_bytes(shape), largest_block, blocks);
  return png_file_bytes(zlib);
}

// Compresses the filtered rows into out + kHeadBytes; returns the zlib stream's size.
// `sample_row(y)` returns row y filtered; `next_rows(first, count)` rows first..first+count-1,
// filtered and contiguous.
template <typename SampleRow, typename NextRows>
size_t zlib_rows(const ImageShape& shape, SampleRow&& sample_row, NextRows&& next_rows,
                 uint8_t* out) {
  const size_t filtered_row = static_cast<size_t>(shape.row_bytes()) + 1;
  RowDeflater deflater(out + kHeadBytes);
  const int64_t step = rows_per_block(shape);
  const int64_t blocks = (shape.height + step - 1) / step;
  const int64_t stripe = step * ((blocks + kMaxTables - 1) / kMaxTables);
  for (int64_t top = 0; top < shape.height; top += stripe) {
    const int64_t bottom = top + stripe < shape.height ? top + stripe : shape.height;
    for (int64_t y = top; y < bottom; y += kSampleStride) {
      deflater.sample(sample_row(y), filtered_row);
    }
    deflater.fit();
    for (int64_t first = top; first < bottom; first += step) {
      const int64_t count = first + step <= bottom ? step : bottom - first;
      const uint8_t* rows = next_rows(first, count);
      deflater.block(rows, filtered_row * static_cast<size_t>(count),
                     first + count == shape.height);
    }
  }
  return deflater.size();
}

// Writes the chunks around the zlib stream at out + kHeadBytes; returns the file's size.
inline size_t finish_png_file(const ImageShape& shape, size_t zlib_bytes, uint8_t* out) {
  static const uint8_t signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  static const uint8_t color_types[5] = {0, 0, 4, 2, 6};
  std::memcpy(out, signature, 8);
  uint8_t* ihdr = out + 8;
  put_be32(ihdr, 13);
  std::memcpy(ihdr + 4, "IHDR", 4);
  put_be32(ihdr + 8, static_cast<uint32_t>(shape.width));
  put_be32(ihdr + 12, static_cast<uint32_t>(shape.height));
  ihdr[16] = static_cast<uint8_t>(8 * shape.itemsize);
  ihdr[17] = color_types[shape.channels];
  ihdr[18] = ihdr[19] = ihdr[20] = 0;  // deflate, adaptive filtering, no interlace
  put_be32(ihdr + 21, crc32(0, ihdr + 4, 17));
  // IDAT chunks of at most kIdatMax bytes: the pieces after the first move back 12 bytes per
  // chunk before them, the last one first.
  const size_t chunks = zlib_bytes == 0 ? 1 : (zlib_bytes + kIdatMax - 1) / kIdatMax;
  uint8_t* data = out + kHeadBytes;
  for (size_t c = chunks; c-- > 1;) {
    const size_t begin = c * kIdatMax;
    const size_t piece = zlib_bytes - begin < kIdatMax ? zlib_bytes - begin : kIdatMax;
    std::memmove(data + begin + 12 * c, data + begin, piece);
  }
  uint8_t* p = out + kHeadBytes - 8;
  for (size_t c = 0; c < chunks; ++c) {
    const size_t begin = c * kIdatMax;
    const size_t piece = zlib_bytes - begin < kIdatMax ? zlib_bytes - begin : kIdatMax;
    put_be32(p, static_cast<uint32_t>(piece));
    std::memcpy(p + 4, "IDAT", 4);
    put_be32(p + 8 + piece, crc32(0, p + 4, piece + 4));
    p += 12 + piece;
  }
  static const uint8_t iend[12] = {0, 0, 0, 0, 'I', 'E', 'N', 'D', 0xAE, 0x42, 0x60, 0x82};
  std::memcpy(p, iend, 12);
  return static_cast<size_t>(p + 12 - out);
}

// The PNG file of an image into out (max_png_bytes(shape)); returns its size. Rows are
// filtered here, a block at a time, with `filter` (-1..4). pixels: height rows of row_stride
// bytes; 16-bit samples in native (little-endian) order.
inline size_t encode_image(const ImageShape& shape, const uint8_t* pixels, int64_t row_stride,
                           int filter, uint8_t* out) {
  const int64_t row_bytes = shape.row_bytes();
  const int64_t step = rows_per_block(shape);
  std::vector<uint8_t> filtered(static_cast<size_t>(step * (row_bytes + 1)));
  // Big-endian copies of the current and previous rows for 16-bit images; zeros above row 0.
  std::vector<uint8_t> swapped(static_cast<size_t>(2 * row_bytes), 0);
  std::vector<uint8_t> zeros(static_cast<size_t>(row_bytes), 0);
  std::vector<uint8_t> sampled(static_cast<size_t>(3 * row_bytes + 1));
  auto sample_row = [&](int64_t y) {  // row y filtered on its own (16-bit: both rows swapped)
    const uint8_t* cur = pixels + y * row_stride;
    const uint8_t* up = y == 0 ? zeros.data() : pixels + (y - 1) * row_stride;
    if (shape.itemsize == 2) {
      uint8_t* cur16 = sampled.data() + row_bytes + 1;
      uint8_t* up16 = cur16 + row_bytes;
      for (int64_t i = 0; i < row_bytes; i += 2) {
        cur16[i] = cur[i + 1];
        cur16[i + 1] = cur[i];
        up16[i] = up[i + 1];
        up16[i + 1] = up[i];
      }
      cur = cur16;
      up = up16;
    }
    filter_one_row_fast(up, cur, sampled.data(), row_bytes, shape.bpp(), filter);
    return static_cast<const uint8_t*>(sampled.data());
  };
  auto next_rows = [&](int64_t first, int64_t count) {
    for (int64_t r = 0; r < count; ++r) {
      const int64_t y = first + r;
      const uint8_t* cur = pixels + y * row_stride;
      const uint8_t* up = y == 0 ? zeros.data() : pixels + (y - 1) * row_stride;
      if (shape.itemsize == 2) {
        uint8_t* now = swapped.data() + (y & 1) * row_bytes;
        for (int64_t i = 0; i < row_bytes; i += 2) {
          now[i] = cur[i + 1];
          now[i + 1] = cur[i];
        }
        cur = now;
        up = y == 0 ? zeros.data() : swapped.data() + ((y + 1) & 1) * row_bytes;
      }
      filter_one_row_fast(up, cur, filtered.data() + r * (row_bytes + 1), row_bytes, shape.bpp(),
                          filter);
    }
    return static_cast<const uint8_t*>(filtered.data());
  };
  return finish_png_file(shape, zlib_rows(shape, sample_row, next_rows, out), out);
}

// The PNG file of rows already filtered (height rows of 1 + row_bytes bytes) into out.
inline size_t encode_filtered(const ImageShape& shape, const uint8_t* rows, uint8_t* out) {
  const int64_t filtered_row = shape.row_bytes() + 1;
  auto sample_row = [&](int64_t y) { return rows + y * filtered_row; };
  auto next_rows = [&](int64_t first, int64_t) { return rows + first * filtered_row; };
  return finish_png_file(shape, zlib_rows(shape, sample_row, next_rows, out), out);
}

}  // namespace png
}  // namespace imgops
