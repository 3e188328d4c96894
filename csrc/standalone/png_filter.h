// PNG row filters (PNG specification, section 9) for imgops' PNG encoder, in one pass over each
// row instead of numpy's dozen: None, Sub, Up, Average, Paeth, and the adaptive choice among Sub, Up
// and Average by the smallest sum of |residual| (residuals read as signed bytes), scored on every
// kScoreStride-th byte of rows of at least 16 * kScoreStride bytes, ties to the earlier filter.
// The same rules as imgops/io/png.py's numpy path, which tests hold it to byte for byte.
#pragma once

#include <cstdint>
#include <cstring>
#include <initializer_list>

namespace imgops {
namespace png {

enum Filter : int { kNone = 0, kSub = 1, kUp = 2, kAverage = 3, kPaeth = 4, kAdaptive = -1 };
constexpr int64_t kScoreStride = 4;

// The Paeth predictor (PNG specification 9.4): of left a, above b and upper-left c, the one
// nearest to a + b - c, ties to a, then b.
inline uint8_t paeth_predictor(int a, int b, int c) {
  const int pa = b > c ? b - c : c - b;  // |p - a|
  const int pb = a > c ? a - c : c - a;  // |p - b|
  const int pc = a + b - c - c > 0 ? a + b - c - c : c + c - a - b;  // |p - c|
  if (pa <= pb && pa <= pc) return static_cast<uint8_t>(a);
  return static_cast<uint8_t>(pb <= pc ? b : c);
}

inline uint8_t residual(int filter, const uint8_t* cur, const uint8_t* up, int64_t i,
                        int64_t bpp) {
  const uint8_t left = i >= bpp ? cur[i - bpp] : 0;
  switch (filter) {
    case kSub:
      return static_cast<uint8_t>(cur[i] - left);
    case kUp:
      return static_cast<uint8_t>(cur[i] - up[i]);
    case kAverage:
      return static_cast<uint8_t>(cur[i] - ((left + up[i]) >> 1));
    case kPaeth:
      return static_cast<uint8_t>(
          cur[i] - paeth_predictor(left, up[i], i >= bpp ? up[i - bpp] : 0));
    default:
      return cur[i];
  }
}

// One row's residuals under one filter (loops the compiler vectorises).
inline void filter_row(int filter, const uint8_t* __restrict cur, const uint8_t* __restrict up,
                       uint8_t* __restrict out, int64_t row_bytes, int64_t bpp) {
  const int64_t head = bpp < row_bytes ? bpp : row_bytes;
  switch (filter) {
    case kSub:
      std::memcpy(out, cur, head);
      for (int64_t i = head; i < row_bytes; ++i) {
        out[i] = static_cast<uint8_t>(cur[i] - cur[i - bpp]);
      }
      break;
    case kUp:
      for (int64_t i = 0; i < row_bytes; ++i) {
        out[i] = static_cast<uint8_t>(cur[i] - up[i]);
      }
      break;
    case kAverage:
      for (int64_t i = 0; i < head; ++i) {
        out[i] = static_cast<uint8_t>(cur[i] - (up[i] >> 1));
      }
      for (int64_t i = head; i < row_bytes; ++i) {
        out[i] = static_cast<uint8_t>(cur[i] - ((cur[i - bpp] + up[i]) >> 1));
      }
      break;
    case kPaeth:  // left and upper-left are 0 in the first pixel: the predictor is `up`
      for (int64_t i = 0; i < head; ++i) {
        out[i] = static_cast<uint8_t>(cur[i] - up[i]);
      }
      for (int64_t i = head; i < row_bytes; ++i) {
        out[i] = static_cast<uint8_t>(cur[i] - paeth_predictor(cur[i - bpp], up[i], up[i - bpp]));
      }
      break;
    default:
      std::memcpy(out, cur, row_bytes);
  }
}

// The sum of |residual| of one row under one filter, over every `stride`-th byte.
inline uint64_t filter_score(int filter, const uint8_t* cur, const uint8_t* up, int64_t row_bytes,
                             int64_t bpp, int64_t stride) {
  uint64_t sum = 0;
  for (int64_t i = 0; i < row_bytes; i += stride) {
    const uint8_t r = residual(filter, cur, up, i, bpp);
    const uint8_t negated = static_cast<uint8_t>(-r);
    sum += r < negated ? r : negated;
  }
  return sum;
}

// One row: the filter type byte, then the residuals of `cur` (the row above: `up`) in dst.
inline void filter_one_row(const uint8_t* up, const uint8_t* cur, uint8_t* dst, int64_t row_bytes,
                           int64_t bpp, int filter) {
  const int64_t stride = row_bytes >= 16 * kScoreStride ? kScoreStride : 1;
  int chosen = filter;
  if (filter == kAdaptive) {
    chosen = kSub;
    uint64_t best = filter_score(kSub, cur, up, row_bytes, bpp, stride);
    for (int candidate : {kUp, kAverage}) {
      const uint64_t score = filter_score(candidate, cur, up, row_bytes, bpp, stride);
      if (score < best) {
        best = score;
        chosen = candidate;
      }
    }
  }
  dst[0] = static_cast<uint8_t>(chosen);
  filter_row(chosen, cur, up, dst + 1, row_bytes, bpp);
}

// Filters `count` rows: rows[0] is the row above the first (zeros at the top of the image),
// rows[1..count] the rows to filter, each row_bytes long; out receives count rows of
// 1 + row_bytes bytes (the filter type, then the residuals).
inline void filter_rows(const uint8_t* rows, uint8_t* out, int64_t count, int64_t row_bytes,
                        int64_t bpp, int filter) {
  for (int64_t y = 0; y < count; ++y) {
    const uint8_t* up = rows + y * row_bytes;
    filter_one_row(up, up + row_bytes, out + y * (row_bytes + 1), row_bytes, bpp, filter);
  }
}

}  // namespace png
}  // namespace imgops
