// AVX2 versions of the fixed PNG row filters of png_filter.h (Sub, Up, Average, Paeth), 32
// bytes a step, for the encoder's own filtering; the same bytes as filter_row by definition
// (every residual depends only on the unfiltered rows, so there is no carried dependency), and
// tests hold them to png_filter_rows. The adaptive choice and CPUs without AVX2 take
// png_filter.h's loops.
#pragma once

#include <cstdint>

#include "png_checksum.h"
#include "png_filter.h"

namespace imgops {
namespace png {

#ifdef IMGOPS_PNG_X86
__attribute__((target("avx2"))) inline __m256i load32(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// Paeth predictions of 32 bytes in 8-bit lanes: pa = |b - c| and pb = |a - c| exactly;
// pc = |(b - c) + (a - c)| is pa + pb where both differences have the same sign (saturated at
// 255: pc is then >= pa and >= pb either way, so every comparison below comes out the same),
// else |pa - pb|. Where b == c or a == c both forms agree.
__attribute__((target("avx2"))) inline __m256i paeth8(__m256i a, __m256i b, __m256i c) {
  const __m256i zero = _mm256_setzero_si256();
  const __m256i c_over_b = _mm256_subs_epu8(c, b);  // c - b where c > b, else 0
  const __m256i c_over_a = _mm256_subs_epu8(c, a);
  const __m256i pa = _mm256_or_si256(_mm256_subs_epu8(b, c), c_over_b);
  const __m256i pb = _mm256_or_si256(_mm256_subs_epu8(a, c), c_over_a);
  // same sign: (b >= c) == (a >= c)
  const __m256i same = _mm256_cmpeq_epi8(_mm256_cmpeq_epi8(c_over_b, zero),
                                         _mm256_cmpeq_epi8(c_over_a, zero));
  const __m256i pc = _mm256_blendv_epi8(
      _mm256_or_si256(_mm256_subs_epu8(pa, pb), _mm256_subs_epu8(pb, pa)),
      _mm256_adds_epu8(pa, pb), same);
  const __m256i pa_least = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_min_epu8(pa, pb), pa),
                                            _mm256_cmpeq_epi8(_mm256_min_epu8(pa, pc), pa));
  const __m256i pb_le_pc = _mm256_cmpeq_epi8(_mm256_min_epu8(pb, pc), pb);
  return _mm256_blendv_epi8(_mm256_blendv_epi8(c, b, pb_le_pc), a, pa_least);
}

// filter_row for Sub, Up, Average and Paeth with AVX2 (None and unknown codes: memcpy).
__attribute__((target("avx2"))) inline void filter_row_avx2(int filter, const uint8_t* cur,
                                                            const uint8_t* up, uint8_t* out,
                                                            int64_t row_bytes, int64_t bpp) {
  const int64_t head = bpp < row_bytes ? bpp : row_bytes;
  int64_t i = head;
  switch (filter) {
    case kSub:
      for (int64_t j = 0; j < head; ++j) out[j] = cur[j];
      for (; i + 32 <= row_bytes; i += 32) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                            _mm256_sub_epi8(load32(cur + i), load32(cur + i - bpp)));
      }
      for (; i < row_bytes; ++i) out[i] = static_cast<uint8_t>(cur[i] - cur[i - bpp]);
      return;
    case kUp:
      i = 0;
      for (; i + 32 <= row_bytes; i += 32) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                            _mm256_sub_epi8(load32(cur + i), load32(up + i)));
      }
      for (; i < row_bytes; ++i) out[i] = static_cast<uint8_t>(cur[i] - up[i]);
      return;
    case kAverage: {
      for (int64_t j = 0; j < head; ++j) out[j] = static_cast<uint8_t>(cur[j] - (up[j] >> 1));
      const __m256i one = _mm256_set1_epi8(1);
      for (; i + 32 <= row_bytes; i += 32) {
        const __m256i left = load32(cur + i - bpp);
        const __m256i above = load32(up + i);
        // floor((left + above) / 2) = rounded-up average minus the dropped low bit
        const __m256i mean = _mm256_sub_epi8(
            _mm256_avg_epu8(left, above), _mm256_and_si256(_mm256_xor_si256(left, above), one));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                            _mm256_sub_epi8(load32(cur + i), mean));
      }
      for (; i < row_bytes; ++i) {
        out[i] = static_cast<uint8_t>(cur[i] - ((cur[i - bpp] + up[i]) >> 1));
      }
      return;
    }
    case kPaeth:
      for (int64_t j = 0; j < head; ++j) out[j] = static_cast<uint8_t>(cur[j] - up[j]);
      for (; i + 32 <= row_bytes; i += 32) {
        const __m256i predicted =
            paeth8(load32(cur + i - bpp), load32(up + i), load32(up + i - bpp));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                            _mm256_sub_epi8(load32(cur + i), predicted));
      }
      for (; i < row_bytes; ++i) {
        out[i] = static_cast<uint8_t>(cur[i] - paeth_predictor(cur[i - bpp], up[i], up[i - bpp]));
      }
      return;
    default:
      for (int64_t j = 0; j < row_bytes; ++j) out[j] = cur[j];
  }
}
#endif

// filter_one_row with the AVX2 loops for the fixed filters where the CPU has AVX2.
inline void filter_one_row_fast(const uint8_t* up, const uint8_t* cur, uint8_t* dst,
                                int64_t row_bytes, int64_t bpp, int filter) {
#ifdef IMGOPS_PNG_X86
  if (filter > kNone && cpu_has_avx2_bmi2()) {
    dst[0] = static_cast<uint8_t>(filter);
    filter_row_avx2(filter, cur, up, dst + 1, row_bytes, bpp);
    return;
  }
#endif
  filter_one_row(up, cur, dst, row_bytes, bpp, filter);
}

}  // namespace png
}  // namespace imgops
