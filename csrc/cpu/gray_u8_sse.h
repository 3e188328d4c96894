// rgb_to_gray for uint8 on x86 with SSSE3/SSE4.1: 16 pixels per step, deinterleaved with
// pshufb, then the exact integer formula in 16-bit lanes (see gray_u8_math below). Included
// through gray_span.h; the exhaustive test over all 2^24 pixels checks every loop.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#include <cstdint>

#include "../bt601.h"

namespace imgops {

// Y = (299 R + 587 G + 114 B + 500) / 1000 exactly, in 16-bit lanes. With
//   H = 2 R + 4 G                          (<= 1530)
//   L = 43 R + 75 G + 114 B + 4 * 125      (<= 59660: unsigned 16-bit)
// S = 299 R + 587 G + 114 B + 500 = 128 H + L, so S / 8 = 16 H + L / 8 (floor) <= 31937, and
// Y = (S / 8) / 125 = mulhi_u16(S / 8, 33555) >> 6, exact for every value below 32768 (the
// multiplier's error times 32768 stays under 2^22). pmaddubsw forms every sum of two byte
// products without saturating (43 R + 75 G <= 30090, 114 B + 500 <= 29570).
constexpr int8_t kLumaH0 = 2, kLumaH1 = 4;      // H weights of (R, G)
constexpr int8_t kLumaL0 = 43, kLumaL1 = 75;    // L weights of (R, G)
constexpr int8_t kLumaLB = 114, kLumaLK = 4;    // L weights of (B, 125)
constexpr uint8_t kLumaK = 125;
constexpr uint16_t kDiv125 = 33555;
constexpr int kDiv125Shift = 6;

inline __m128i sse_pair_weights(int8_t first, int8_t second) {
  return _mm_set1_epi16(static_cast<int16_t>((static_cast<uint8_t>(second) << 8) |
                                             static_cast<uint8_t>(first)));
}

// Luma of 8 pixels given as (R, G) byte pairs and (B, 125) byte pairs.
__attribute__((target("sse4.1,ssse3"))) inline __m128i sse_luma8(__m128i rg, __m128i bk) {
  const __m128i h = _mm_maddubs_epi16(rg, sse_pair_weights(kLumaH0, kLumaH1));
  const __m128i l = _mm_add_epi16(_mm_maddubs_epi16(rg, sse_pair_weights(kLumaL0, kLumaL1)),
                                  _mm_maddubs_epi16(bk, sse_pair_weights(kLumaLB, kLumaLK)));
  const __m128i s8 = _mm_add_epi16(_mm_slli_epi16(h, 4), _mm_srli_epi16(l, 3));
  return _mm_srli_epi16(_mm_mulhi_epu16(s8, _mm_set1_epi16(static_cast<int16_t>(kDiv125))),
                        kDiv125Shift);
}

// pshufb masks gathering channel k of 16 interleaved 8-bit pixels from the three 16-byte
// pieces (a, b, c) that hold them: kU8ChannelMasks[k][piece], -1 where another piece supplies.
alignas(16) constexpr int8_t kU8ChannelMasks[3][3][16] = {
    {{0, 3, 6, 9, 12, 15, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1},
     {-1, -1, -1, -1, -1, -1, 2, 5, 8, 11, 14, -1, -1, -1, -1, -1},
     {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 1, 4, 7, 10, 13}},
    {{1, 4, 7, 10, 13, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1},
     {-1, -1, -1, -1, -1, 0, 3, 6, 9, 12, 15, -1, -1, -1, -1, -1},
     {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 2, 5, 8, 11, 14}},
    {{2, 5, 8, 11, 14, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1},
     {-1, -1, -1, -1, -1, 1, 4, 7, 10, 13, -1, -1, -1, -1, -1, -1},
     {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 3, 6, 9, 12, 15}},
};

inline __m128i u8_channel_mask(int channel, int piece) {
  return _mm_load_si128(reinterpret_cast<const __m128i*>(kU8ChannelMasks[channel][piece]));
}

// One channel of 16 pixels gathered from the three pieces of interleaved bytes.
__attribute__((target("sse4.1,ssse3"))) inline __m128i sse_pick(__m128i a, __m128i b, __m128i c,
                                                               __m128i ma, __m128i mb,
                                                               __m128i mc) {
  return _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(a, ma), _mm_shuffle_epi8(b, mb)),
                      _mm_shuffle_epi8(c, mc));
}

template <bool kBgr>
__attribute__((target("sse4.1,ssse3"))) void gray_u8_sse(const uint8_t* __restrict in,
                                                         uint8_t* __restrict out, int64_t n) {
  const __m128i m0a = u8_channel_mask(0, 0), m0b = u8_channel_mask(0, 1);
  const __m128i m0c = u8_channel_mask(0, 2), m1a = u8_channel_mask(1, 0);
  const __m128i m1b = u8_channel_mask(1, 1), m1c = u8_channel_mask(1, 2);
  const __m128i m2a = u8_channel_mask(2, 0), m2b = u8_channel_mask(2, 1);
  const __m128i m2c = u8_channel_mask(2, 2);
  const __m128i k125 = _mm_set1_epi8(static_cast<char>(kLumaK));
  int64_t p = 0;
  for (; p + 16 <= n; p += 16) {
    const __m128i a = _mm_loadu_si128((const __m128i*)(in + 3 * p));
    const __m128i b = _mm_loadu_si128((const __m128i*)(in + 3 * p + 16));
    const __m128i c = _mm_loadu_si128((const __m128i*)(in + 3 * p + 32));
    const __m128i c0 = sse_pick(a, b, c, m0a, m0b, m0c);
    const __m128i c1 = sse_pick(a, b, c, m1a, m1b, m1c);
    const __m128i c2 = sse_pick(a, b, c, m2a, m2b, m2c);
    const __m128i r = kBgr ? c2 : c0;
    const __m128i bl = kBgr ? c0 : c2;
    const __m128i lo = sse_luma8(_mm_unpacklo_epi8(r, c1), _mm_unpacklo_epi8(bl, k125));
    const __m128i hi = sse_luma8(_mm_unpackhi_epi8(r, c1), _mm_unpackhi_epi8(bl, k125));
    _mm_storeu_si128((__m128i*)(out + p), _mm_packus_epi16(lo, hi));
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
