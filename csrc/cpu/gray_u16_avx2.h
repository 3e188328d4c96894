// rgb_to_gray for uint16 on x86 with AVX2: 16 pixels per step. Lane 0 holds pixels 0-7 (input
// bytes 0-47), lane 1 pixels 8-15 (bytes 48-95); shuffles gather each channel's 16-bit samples,
// pmaddwd forms the exact sums S = 299 R + 587 G + 114 B + 500 in 32 bits (on the samples minus
// 32768, as pmaddwd multiplies signed words; the offset 1000 * 32768 is added back), and
// Y = S / 1000 is a 32 x 32 -> 64-bit multiply by a reciprocal and a shift (avx2_div1000).
// Included through gray_span.h; the tests check random and extreme pixels against the formula.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#include <cstdint>

#include "../bt601.h"
#include "gray_u8_avx2.h"

namespace imgops {

// Byte shuffle that moves 16-bit words `from[i]` (0-7, or -1 for none) to word i.
inline __m128i word_gather_mask(const int (&from)[8]) {
  alignas(16) int8_t bytes[16];
  for (int i = 0; i < 8; ++i) {
    bytes[2 * i] = static_cast<int8_t>(from[i] < 0 ? -1 : 2 * from[i]);
    bytes[2 * i + 1] = static_cast<int8_t>(from[i] < 0 ? -1 : 2 * from[i] + 1);
  }
  return _mm_load_si128(reinterpret_cast<const __m128i*>(bytes));
}

// S / 1000 of 8 uint32 sums below 2^26: (S * 2199023256) >> 41, exact for every S below 2^26
// (2199023256 = ceil(2^41 / 1000); its excess times 2^26 stays under 2^41; checked over the
// whole range). mul_epu32 multiplies the even lanes; the odd ones are shifted down first.
constexpr uint32_t kDiv1000 = 2199023256u;
constexpr int kDiv1000Shift = 41;

__attribute__((target("avx2"))) inline __m256i avx2_div1000(__m256i sums) {
  const __m256i m = _mm256_set1_epi64x(kDiv1000);
  const __m256i even = _mm256_srli_epi64(_mm256_mul_epu32(sums, m), kDiv1000Shift);
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(sums, 32), m);
  // odd >> 41 belongs in the upper 32 bits of each 64: odd >> 9 puts it there.
  return _mm256_blend_epi32(even, _mm256_srli_epi64(odd, kDiv1000Shift - 32), 0xAA);
}

template <bool kBgr>
__attribute__((target("avx2"))) void gray_u16_avx2(const uint16_t* __restrict in,
                                                  uint16_t* __restrict out, int64_t n) {
  // Channel k of the lane's 8 pixels: words 3i + k of the 24 words held in (a, b, c).
  const __m256i m0a = avx2_both_lanes(word_gather_mask({0, 3, 6, -1, -1, -1, -1, -1}));
  const __m256i m0b = avx2_both_lanes(word_gather_mask({-1, -1, -1, 1, 4, 7, -1, -1}));
  const __m256i m0c = avx2_both_lanes(word_gather_mask({-1, -1, -1, -1, -1, -1, 2, 5}));
  const __m256i m1a = avx2_both_lanes(word_gather_mask({1, 4, 7, -1, -1, -1, -1, -1}));
  const __m256i m1b = avx2_both_lanes(word_gather_mask({-1, -1, -1, 2, 5, -1, -1, -1}));
  const __m256i m1c = avx2_both_lanes(word_gather_mask({-1, -1, -1, -1, -1, 0, 3, 6}));
  const __m256i m2a = avx2_both_lanes(word_gather_mask({2, 5, -1, -1, -1, -1, -1, -1}));
  const __m256i m2b = avx2_both_lanes(word_gather_mask({-1, -1, 0, 3, 6, -1, -1, -1}));
  const __m256i m2c = avx2_both_lanes(word_gather_mask({-1, -1, -1, -1, -1, 1, 4, 7}));
  const __m256i sign = _mm256_set1_epi16(static_cast<short>(0x8000));
  const __m256i w_rg = _mm256_set1_epi32((587 << 16) | 299);  // (R, G) word pairs
  const __m256i w_b0 = _mm256_set1_epi32(114);                // (B, 0) word pairs
  const __m256i offset = _mm256_set1_epi32(1000 * 32768 + 500);
  const __m256i zero = _mm256_setzero_si256();
  const uint8_t* bytes = reinterpret_cast<const uint8_t*>(in);
  int64_t p = 0;
  for (; p + 16 <= n; p += 16) {
    const uint8_t* src = bytes + 6 * p;
    const __m256i a = avx2_load_lanes(src);
    const __m256i b = avx2_load_lanes(src + 16);
    const __m256i c = avx2_load_lanes(src + 32);
    const __m256i c0 = _mm256_xor_si256(avx2_pick(a, b, c, m0a, m0b, m0c), sign);
    const __m256i c1 = _mm256_xor_si256(avx2_pick(a, b, c, m1a, m1b, m1c), sign);
    const __m256i c2 = _mm256_xor_si256(avx2_pick(a, b, c, m2a, m2b, m2c), sign);
    const __m256i r = kBgr ? c2 : c0;
    const __m256i bl = kBgr ? c0 : c2;
    __m256i y[2];
    for (int h = 0; h < 2; ++h) {
      const __m256i rg = h ? _mm256_unpackhi_epi16(r, c1) : _mm256_unpacklo_epi16(r, c1);
      const __m256i b0 = h ? _mm256_unpackhi_epi16(bl, zero) : _mm256_unpacklo_epi16(bl, zero);
      const __m256i sums = _mm256_add_epi32(
          _mm256_add_epi32(_mm256_madd_epi16(rg, w_rg), _mm256_madd_epi16(b0, w_b0)), offset);
      y[h] = avx2_div1000(sums);
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + p), _mm256_packus_epi32(y[0], y[1]));
  }
  for (; p < n; ++p) {
    const uint32_t c0 = in[3 * p], c1 = in[3 * p + 1], c2 = in[3 * p + 2];
    out[p] = static_cast<uint16_t>(luma_int(kBgr ? c2 : c0, c1, kBgr ? c0 : c2));
  }
}

}  // namespace imgops
#endif
