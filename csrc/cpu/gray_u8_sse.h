// rgb_to_gray for uint8 on x86 with SSSE3/SSE4.1: 16 pixels per step, deinterleaved with
// pshufb, summed exactly with pmaddwd (299 R + 587 G + 114 B + 500 fits in 32 bits), and divided
// by 1000 in float32: floor((S + 0.5) * 0.001f) equals S / 1000 for every S < 2^18 (the error
// of the float product is below 2^-14, the distance to the next integer at least 0.0005). The
// exhaustive test over all 2^24 pixels checks it. Included by gray.cpp only.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#include <cstdint>

#include "../luma.h"

namespace imgops {

template <bool kBgr>
__attribute__((target("sse4.1,ssse3"))) void gray_u8_sse(const uint8_t* __restrict in,
                                                         uint8_t* __restrict out, int64_t n) {
  const __m128i m0a = _mm_setr_epi8(0, 3, 6, 9, 12, 15, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m128i m0b = _mm_setr_epi8(-1, -1, -1, -1, -1, -1, 2, 5, 8, 11, 14, -1, -1, -1, -1, -1);
  const __m128i m0c = _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 1, 4, 7, 10, 13);
  const __m128i m1a = _mm_setr_epi8(1, 4, 7, 10, 13, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m128i m1b = _mm_setr_epi8(-1, -1, -1, -1, -1, 0, 3, 6, 9, 12, 15, -1, -1, -1, -1, -1);
  const __m128i m1c = _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 2, 5, 8, 11, 14);
  const __m128i m2a = _mm_setr_epi8(2, 5, 8, 11, 14, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m128i m2b = _mm_setr_epi8(-1, -1, -1, -1, -1, 1, 4, 7, 10, 13, -1, -1, -1, -1, -1, -1);
  const __m128i m2c = _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 3, 6, 9, 12, 15);
  const int wr = kBgr ? 114 : 299, wb = kBgr ? 299 : 114;  // weights of channel 0 and 2
  const __m128i w01 = _mm_set1_epi32((587 << 16) | wr);   // (c0, c1) pairs
  const __m128i w2k = _mm_set1_epi32((1 << 16) | wb);     // (c2, 500) pairs
  const __m128i k500 = _mm_set1_epi16(500);
  const __m128 scale = _mm_set1_ps(0.001f);
  const __m128 half = _mm_set1_ps(0.5f);
  const __m128i zero = _mm_setzero_si128();
  int64_t p = 0;
  for (; p + 16 <= n; p += 16) {
    const __m128i a = _mm_loadu_si128((const __m128i*)(in + 3 * p));
    const __m128i b = _mm_loadu_si128((const __m128i*)(in + 3 * p + 16));
    const __m128i c = _mm_loadu_si128((const __m128i*)(in + 3 * p + 32));
    const __m128i c0 = _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(a, m0a), _mm_shuffle_epi8(b, m0b)), _mm_shuffle_epi8(c, m0c));
    const __m128i c1 = _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(a, m1a), _mm_shuffle_epi8(b, m1b)), _mm_shuffle_epi8(c, m1c));
    const __m128i c2 = _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(a, m2a), _mm_shuffle_epi8(b, m2b)), _mm_shuffle_epi8(c, m2c));
    __m128i y16[2];
    for (int h = 0; h < 2; ++h) {
      const __m128i c0w = h ? _mm_unpackhi_epi8(c0, zero) : _mm_unpacklo_epi8(c0, zero);
      const __m128i c1w = h ? _mm_unpackhi_epi8(c1, zero) : _mm_unpacklo_epi8(c1, zero);
      const __m128i c2w = h ? _mm_unpackhi_epi8(c2, zero) : _mm_unpacklo_epi8(c2, zero);
      __m128i s[2];
      for (int q = 0; q < 2; ++q) {
        const __m128i p01 = q ? _mm_unpackhi_epi16(c0w, c1w) : _mm_unpacklo_epi16(c0w, c1w);
        const __m128i p2 = q ? _mm_unpackhi_epi16(c2w, k500) : _mm_unpacklo_epi16(c2w, k500);
        const __m128i sum = _mm_add_epi32(_mm_madd_epi16(p01, w01), _mm_madd_epi16(p2, w2k));
        s[q] = _mm_cvttps_epi32(_mm_mul_ps(_mm_add_ps(_mm_cvtepi32_ps(sum), half), scale));
      }
      y16[h] = _mm_packs_epi32(s[0], s[1]);
    }
    _mm_storeu_si128((__m128i*)(out + p), _mm_packus_epi16(y16[0], y16[1]));
  }
  for (; p < n; ++p) {
    const uint32_t c0 = in[3 * p], c1 = in[3 * p + 1], c2 = in[3 * p + 2];
    out[p] = static_cast<uint8_t>(luma_int(kBgr ? c2 : c0, c1, kBgr ? c0 : c2));
  }
}

inline bool cpu_has_sse41() {
  static const bool has = __builtin_cpu_supports("sse4.1") && __builtin_cpu_supports("ssse3");
  return has;
}

}  // namespace imgops
#endif
