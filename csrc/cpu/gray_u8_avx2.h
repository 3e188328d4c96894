// rgb_to_gray for uint8 on x86 with AVX2: the SSE4.1 loop of gray_u8_sse.h on both 128-bit
// lanes at once, 32 pixels per step. Lane 0 holds pixels 0-15 (input bytes 0-47), lane 1
// pixels 16-31 (bytes 48-95); every shuffle, unpack, multiply-add and pack below stays within
// its lane, so each lane computes exactly what the SSE loop computes for its 16 pixels (the
// exact 16-bit arithmetic explained in gray_u8_sse.h). Included through gray_span.h; the
// exhaustive test over all 2^24 pixels checks it.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#include <cstdint>

#include "../bt601.h"
#include "gray_u8_sse.h"

namespace imgops {

// The same 16 bytes in both lanes (the byte shuffles below).
__attribute__((target("avx2"))) inline __m256i avx2_both_lanes(__m128i m) {
  return _mm256_broadcastsi128_si256(m);
}

// Two 16-byte loads 48 bytes apart (the same place in two groups of 16 pixels) as two lanes.
__attribute__((target("avx2"))) inline __m256i avx2_load_lanes(const uint8_t* p) {
  return _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 48)), 1);
}

// One channel of 16 pixels per lane gathered from the three registers of interleaved bytes.
__attribute__((target("avx2"))) inline __m256i avx2_pick(__m256i a, __m256i b, __m256i c,
                                                       __m256i ma, __m256i mb, __m256i mc) {
  return _mm256_or_si256(_mm256_or_si256(_mm256_shuffle_epi8(a, ma), _mm256_shuffle_epi8(b, mb)),
                         _mm256_shuffle_epi8(c, mc));
}

// Luma of 8 pixels per lane given as (R, G) and (B, 125) byte pairs (see sse_luma8).
__attribute__((target("avx2"))) inline __m256i avx2_luma8(__m256i rg, __m256i bk) {
  auto weights = [](int8_t first, int8_t second) {
    return static_cast<short>((static_cast<uint8_t>(second) << 8) | static_cast<uint8_t>(first));
  };
  const __m256i h = _mm256_maddubs_epi16(rg, _mm256_set1_epi16(weights(kLumaH0, kLumaH1)));
  const __m256i l =
      _mm256_add_epi16(_mm256_maddubs_epi16(rg, _mm256_set1_epi16(weights(kLumaL0, kLumaL1))),
                       _mm256_maddubs_epi16(bk, _mm256_set1_epi16(weights(kLumaLB, kLumaLK))));
  const __m256i s8 = _mm256_add_epi16(_mm256_slli_epi16(h, 4), _mm256_srli_epi16(l, 3));
  return _mm256_srli_epi16(
      _mm256_mulhi_epu16(s8, _mm256_set1_epi16(static_cast<short>(kDiv125))), kDiv125Shift);
}

template <bool kBgr>
__attribute__((target("avx2"))) void gray_u8_avx2(const uint8_t* __restrict in,
                                                 uint8_t* __restrict out, int64_t n) {
  const __m256i m0a = avx2_both_lanes(u8_channel_mask(0, 0));
  const __m256i m0b = avx2_both_lanes(u8_channel_mask(0, 1));
  const __m256i m0c = avx2_both_lanes(u8_channel_mask(0, 2));
  const __m256i m1a = avx2_both_lanes(u8_channel_mask(1, 0));
  const __m256i m1b = avx2_both_lanes(u8_channel_mask(1, 1));
  const __m256i m1c = avx2_both_lanes(u8_channel_mask(1, 2));
  const __m256i m2a = avx2_both_lanes(u8_channel_mask(2, 0));
  const __m256i m2b = avx2_both_lanes(u8_channel_mask(2, 1));
  const __m256i m2c = avx2_both_lanes(u8_channel_mask(2, 2));
  const __m256i k125 = _mm256_set1_epi8(static_cast<char>(kLumaK));
  int64_t p = 0;
  for (; p + 32 <= n; p += 32) {
    const uint8_t* src = in + 3 * p;
    const __m256i a = avx2_load_lanes(src);
    const __m256i b = avx2_load_lanes(src + 16);
    const __m256i c = avx2_load_lanes(src + 32);
    const __m256i c0 = avx2_pick(a, b, c, m0a, m0b, m0c);
    const __m256i c1 = avx2_pick(a, b, c, m1a, m1b, m1c);
    const __m256i c2 = avx2_pick(a, b, c, m2a, m2b, m2c);
    const __m256i r = kBgr ? c2 : c0;
    const __m256i bl = kBgr ? c0 : c2;
    const __m256i lo = avx2_luma8(_mm256_unpacklo_epi8(r, c1), _mm256_unpacklo_epi8(bl, k125));
    const __m256i hi = avx2_luma8(_mm256_unpackhi_epi8(r, c1), _mm256_unpackhi_epi8(bl, k125));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + p), _mm256_packus_epi16(lo, hi));
  }
  for (; p < n; ++p) {
    const uint32_t c0 = in[3 * p], c1 = in[3 * p + 1], c2 = in[3 * p + 2];
    out[p] = static_cast<uint8_t>(luma_int(kBgr ? c2 : c0, c1, kBgr ? c0 : c2));
  }
}

}  // namespace imgops
#endif
