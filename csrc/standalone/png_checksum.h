// The two checksums of a PNG file: CRC-32 (ISO 3309, every chunk's type and data) and Adler-32
// (RFC 1950, the zlib stream's uncompressed bytes).
// - CRC-32: slicing-by-8 (eight 256-entry tables, eight bytes a step, no carried dependency
//   between the table look-ups of one step).
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

// zlib's crc32(crc, data, n): start with crc = 0, chain by passing the previous result.
inline uint32_t crc32(uint32_t crc, const uint8_t* data, size_t n) {
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
