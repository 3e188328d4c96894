// The two checksums of a PNG file: CRC-32 (ISO 3309, every chunk's type and data) and Adler-32
// (RFC 1950, the zlib stream's uncompressed bytes).
// - CRC-32: carry-less multiplication (PCLMULQDQ) where the CPU has it: four 16-byte
//   accumulators folded forward 64 bytes a step, then into one, whose 16 bytes the table loop
//   finishes (no Barrett reduction needed); elsewhere slicing-by-8 (eight 256-entry tables,
//   eight bytes a step). The fold constants are x^(512+32), x^(512-32), x^(128+32) and
//   x^(128-32) mod P, bit-reflected and shifted left by one, as in Intel's paper on CRC
//   folding (checked against zlib by the tests).
// - Adler-32: an AVX2 loop where the CPU has it (32 bytes a step: the byte sum by SAD, the
//   weighted sum by multiply-add, reduced modulo 65521 every 5,536 bytes), else a scalar loop.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define IMGOPS_PNG_X86 1
#endif

namespace imgops {
namespace png {

struct Crc32Tables {
  uint32_t t[8][256];
  Crc32Tables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[0][i] = c;
    }
    for (int k = 1; k < 8; ++k) {
      for (int i = 0; i < 256; ++i) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFF];
    }
  }
};

inline const Crc32Tables& crc32_tables() {
  static const Crc32Tables tables;
  return tables;
}

// The table loop; zlib's crc32(crc, data, n).
inline uint32_t crc32_tables(uint32_t crc, const uint8_t* data, size_t n) {
  const auto& t = crc32_tables().t;
  crc = ~crc;
  for (; n >= 8; n -= 8, data += 8) {
    uint64_t v;
    std::memcpy(&v, data, 8);  // little-endian hosts only (x86-64, aarch64)
    v ^= crc;
    crc = t[7][v & 0xFF] ^ t[6][(v >> 8) & 0xFF] ^ t[5][(v >> 16) & 0xFF] ^
          t[4][(v >> 24) & 0xFF] ^ t[3][(v >> 32) & 0xFF] ^ t[2][(v >> 40) & 0xFF] ^
          t[1][(v >> 48) & 0xFF] ^ t[0][v >> 56];
  }
  for (; n > 0; --n) crc = t[0][(crc ^ *data++) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

#ifdef IMGOPS_PNG_X86
__attribute__((target("pclmul,sse4.1"))) inline __m128i crc_fold(__m128i x, __m128i k,
                                                                __m128i next) {
  return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00),
                                     _mm_clmulepi64_si128(x, k, 0x11)),
                       next);
}

__attribute__((target("pclmul,sse4.1"))) inline uint32_t crc32_pclmul(uint32_t crc,
                                                                     const uint8_t* data,
                                                                     size_t n) {
  if (n < 64) return crc32_tables(crc, data, n);
  auto load = [](const uint8_t* p) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  };
  const __m128i k512 = _mm_set_epi64x(0x1c6e41596, 0x154442bd4);
  const __m128i k128 = _mm_set_epi64x(0x0ccaa009e, 0x1751997d0);
  __m128i x0 = _mm_xor_si128(load(data), _mm_cvtsi32_si128(static_cast<int>(~crc)));
  __m128i x1 = load(data + 16);
  __m128i x2 = load(data + 32);
  __m128i x3 = load(data + 48);
  size_t done = 64;
  for (; done + 64 <= n; done += 64) {
    x0 = crc_fold(x0, k512, load(data + done));
    x1 = crc_fold(x1, k512, load(data + done + 16));
    x2 = crc_fold(x2, k512, load(data + done + 32));
    x3 = crc_fold(x3, k512, load(data + done + 48));
  }
  __m128i x = crc_fold(crc_fold(crc_fold(x0, k128, x1), k128, x2), k128, x3);
  for (; done + 16 <= n; done += 16) x = crc_fold(x, k128, load(data + done));
  alignas(16) uint8_t folded[16];
  _mm_store_si128(reinterpret_cast<__m128i*>(folded), x);
  // The folded 16 bytes have the message's remainder: CRC them from a zero register.
  const uint32_t head = crc32_tables(0xFFFFFFFFu, folded, 16);
  return crc32_tables(head, data + done, n - done);
}
#endif

inline bool cpu_has_pclmul() {
#ifdef IMGOPS_PNG_X86
  static const bool has = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
  return has;
#else
  return false;
#endif
}

// zlib's crc32(crc, data, n): start with crc = 0, chain by passing the previous result.
inline uint32_t crc32(uint32_t crc, const uint8_t* data, size_t n) {
#ifdef IMGOPS_PNG_X86
  if (cpu_has_pclmul()) return crc32_pclmul(crc, data, n);
#endif
  return crc32_tables(crc, data, n);
}

constexpr uint32_t kAdlerMod = 65521;
constexpr size_t kAdlerMax = 5552;  // the most bytes before the sums can overflow 32 bits

inline uint32_t adler32_scalar(uint32_t adler, const uint8_t* data, size_t n) {
  uint32_t s1 = adler & 0xFFFF;
  uint32_t s2 = adler >> 16;
  while (n > 0) {
    const size_t len = n < kAdlerMax ? n : kAdlerMax;
    n -= len;
    for (size_t i = 0; i < len; ++i) {
      s1 += data[i];
      s2 += s1;
    }
    data += len;
    s1 %= kAdlerMod;
    s2 %= kAdlerMod;
  }
  return (s2 << 16) | s1;
}

#ifdef IMGOPS_PNG_X86
__attribute__((target("avx2"))) inline uint32_t adler32_avx2(uint32_t adler, const uint8_t* data,
                                                             size_t n) {
  uint64_t s1 = adler & 0xFFFF;
  uint64_t s2 = adler >> 16;
  const __m256i weights = _mm256_setr_epi8(32, 31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19,
                                           18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4,
                                           3, 2, 1);
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i zero = _mm256_setzero_si256();
  constexpr size_t kMaxSteps = kAdlerMax / 32;
  while (n >= 32) {
    size_t steps = n / 32;
    if (steps > kMaxSteps) steps = kMaxSteps;
    __m256i sums = zero;      // byte sums of the steps so far, four 64-bit lanes
    __m256i prefix = zero;    // the running total of `sums` before each step
    __m256i weighted = zero;  // sum of (32 - i) * byte i of each step, eight 32-bit lanes
    for (size_t k = 0; k < steps; ++k) {
      const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(data));
      data += 32;
      prefix = _mm256_add_epi64(prefix, sums);
      sums = _mm256_add_epi64(sums, _mm256_sad_epu8(bytes, zero));
      weighted =
          _mm256_add_epi32(weighted, _mm256_madd_epi16(_mm256_maddubs_epi16(bytes, weights), ones));
    }
    alignas(32) uint64_t lanes_sums[4];
    alignas(32) uint64_t lanes_prefix[4];
    alignas(32) uint32_t lanes_weighted[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes_sums), sums);
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes_prefix), prefix);
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes_weighted), weighted);
    uint64_t total = 0;
    uint64_t total_prefix = 0;
    uint64_t total_weighted = 0;
    for (int i = 0; i < 4; ++i) total += lanes_sums[i], total_prefix += lanes_prefix[i];
    for (int i = 0; i < 8; ++i) total_weighted += lanes_weighted[i];
    s2 += 32 * steps * s1 + 32 * total_prefix + total_weighted;
    s1 += total;
    s1 %= kAdlerMod;
    s2 %= kAdlerMod;
    n -= steps * 32;
  }
  return adler32_scalar(static_cast<uint32_t>((s2 << 16) | s1), data, n);
}
#endif

inline bool cpu_has_avx2_bmi2() {
#ifdef IMGOPS_PNG_X86
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2");
  return has;
#else
  return false;
#endif
}

// zlib's adler32(adler, data, n): start with adler = 1.
inline uint32_t adler32(uint32_t adler, const uint8_t* data, size_t n) {
#ifdef IMGOPS_PNG_X86
  if (cpu_has_avx2_bmi2()) return adler32_avx2(adler, data, n);
#endif
  return adler32_scalar(adler, data, n);
}

}  // namespace png
}  // namespace imgops
