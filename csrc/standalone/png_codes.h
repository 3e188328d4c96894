// The pieces of a dynamic Huffman block's description that the CPU encoder (png_huffman.h,
// png_deflate.h) and the GPU's deflate (png_deflate_parallel.h) share: one definition, so that
// both give the same bytes. Host and device code (IMGOPS_HD under nvcc).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define IMGOPS_HD __host__ __device__
#else
#define IMGOPS_HD
#endif

namespace imgops {
namespace png {

// Canonical codes for the lengths, bit-reversed for an LSB-first bit writer.
IMGOPS_HD inline void canonical_codes(const uint8_t* lengths, int n, uint16_t* codes) {
  int count[16] = {0};
  for (int s = 0; s < n; ++s) ++count[lengths[s]];
  count[0] = 0;
  int next[16] = {0};
  int code = 0;
  for (int bits = 1; bits < 16; ++bits) {
    code = (code + count[bits - 1]) << 1;
    next[bits] = code;
  }
  for (int s = 0; s < n; ++s) {
    const int len = lengths[s];
    if (len == 0) {
      codes[s] = 0;
      continue;
    }
    int value = next[len]++;
    int reversed = 0;
    for (int b = 0; b < len; ++b, value >>= 1) reversed = (reversed << 1) | (value & 1);
    codes[s] = static_cast<uint16_t>(reversed);
  }
}

// Writes the code lengths of one tree as code-length symbols (0..18) with their extra bits:
// calls emit(symbol, extra_bits, extra_value).
template <typename Emit>
IMGOPS_HD inline void code_length_symbols(const uint8_t* lengths, int n, Emit&& emit) {
  int i = 0;
  while (i < n) {
    const int value = lengths[i];
    int run = 1;
    while (i + run < n && lengths[i + run] == value) ++run;
    i += run;
    if (value == 0) {
      while (run >= 11) {
        const int piece = run < 138 ? run : 138;
        emit(18, 7, piece - 11);
        run -= piece;
      }
      if (run >= 3) {
        emit(17, 3, run - 3);
        run = 0;
      }
    } else {
      emit(value, 0, 0);
      --run;
      while (run >= 3) {
        const int piece = run < 6 ? run : 6;
        emit(16, 2, piece - 3);
        run -= piece;
      }
    }
    for (; run > 0; --run) emit(value, 0, 0);
  }
}

}  // namespace png
}  // namespace imgops
