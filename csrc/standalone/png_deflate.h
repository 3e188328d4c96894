// A deflate (RFC 1951) specialised for PNG-filtered image rows, in the spirit of fpnge:
// - the only matches are runs: a byte repeated from the byte before it (distance 1), which is
//   what flat areas, saturated areas and repeated rows turn into after the row filters;
// - everything else is a literal. There is no hash table and no match search: runs are found
//   64 bytes at a time from a bit mask of "equals the byte before" (AVX2 where available);
// - each block (about 64 KiB of filtered rows) gets its own dynamic Huffman tables, fitted to
//   the exact symbol counts of that block (a first pass counts, the second writes), limited to
//   14 bits so that four literal codes always fit one 64-bit write; a block that would not
//   shrink is stored.
// The output depends only on the bytes given and the block boundaries, so rows filtered here
// and rows filtered elsewhere (the GPU op) compress to the same stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "png_checksum.h"
#include "png_huffman.h"

namespace imgops {
namespace png {

constexpr int kLitLenSymbols = 286;
constexpr int kLitLenMaxBits = 13;  // two codes in 26 bits, four in 52
constexpr int kPairShift = 26;
constexpr int kMinRun = 4;  // shorter runs stay literals: cheaper on photos

// The length symbol (257..285), its extra bits and their value, for match lengths 3..258.
struct LengthCode {
  uint16_t symbol;
  uint8_t extra_bits;
  uint16_t extra;
};

inline const LengthCode* length_codes() {
  static const auto* table = [] {
    static LengthCode codes[259];
    static const int base[29] = {3,  4,  5,  6,  7,  8,  9,  10, 11,  13,  15,  17,  19,  23, 27,
                                 31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
    static const int extra[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2,
                                  2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
    for (int i = 0; i < 29; ++i) {
      const int last = i == 28 ? 258 : (i == 27 ? 257 : base[i + 1] - 1);
      for (int len = base[i]; len <= last; ++len) {
        codes[len] = {static_cast<uint16_t>(257 + i), static_cast<uint8_t>(extra[i]),
                      static_cast<uint16_t>(len - base[i])};
      }
    }
    return codes;
  }();
  return table;
}

// An LSB-first bit writer into a buffer with at least 8 bytes of slack past what is written.
struct BitWriter {
  uint8_t* out;
  uint64_t buffer = 0;
  int count = 0;

  explicit BitWriter(uint8_t* start) : out(start) {}
  // Appends `n` bits; the caller keeps count + n <= 63 between flushes.
  inline void put(uint64_t bits, int n) {
    buffer |= bits << count;
    count += n;
  }
  // Writes the whole bytes out; leaves 0..7 bits pending (count <= 63 on entry).
  inline void flush() {
    std::memcpy(out, &buffer, 8);
    out += count >> 3;
    buffer >>= count & ~7;
    count &= 7;
  }
  inline void put_flush(uint64_t bits, int n) {
    put(bits, n);
    flush();
  }
  // Pads to a byte boundary with zero bits.
  inline void align() {
    if (count & 7) count += 8 - (count & 7);
    flush();
  }
};

// Bit i of mask word k: byte 64k + i equals the byte before it (never for byte 0).
inline void equal_to_previous_scalar(const uint8_t* data, size_t n, uint64_t* words) {
  const size_t count = (n + 63) / 64;
  for (size_t k = 0; k < count; ++k) {
    uint64_t word = 0;
    const size_t start = 64 * k;
    const size_t end = start + 64 < n ? start + 64 : n;
    for (size_t i = start == 0 ? 1 : start; i < end; ++i) {
      word |= static_cast<uint64_t>(data[i] == data[i - 1]) << (i - start);
    }
    words[k] = word;
  }
}

#ifdef IMGOPS_PNG_X86
__attribute__((target("avx2"))) inline void equal_to_previous_avx2(const uint8_t* data, size_t n,
                                                                  uint64_t* words) {
  if (n < 65) {
    equal_to_previous_scalar(data, n, words);
    return;
  }
  size_t k = 0;
  {  // the first word: byte 0 has no byte before it
    uint64_t word = 0;
    for (size_t i = 1; i < 64; ++i) word |= static_cast<uint64_t>(data[i] == data[i - 1]) << i;
    words[k++] = word;
  }
  for (; 64 * k + 64 <= n; ++k) {
    const uint8_t* p = data + 64 * k;
    const __m256i a0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p - 1));
    const __m256i a1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32));
    const __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 31));
    const uint32_t lo = static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_cmpeq_epi8(a0, b0)));
    const uint32_t hi = static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_cmpeq_epi8(a1, b1)));
    words[k] = static_cast<uint64_t>(hi) << 32 | lo;
  }
  if (64 * k < n) {
    uint64_t word = 0;
    for (size_t i = 64 * k; i < n; ++i) {
      word |= static_cast<uint64_t>(data[i] == data[i - 1]) << (i - 64 * k);
    }
    words[k] = word;
  }
}
#endif

inline void equal_to_previous(const uint8_t* data, size_t n, uint64_t* words) {
#ifdef IMGOPS_PNG_X86
  if (cpu_has_avx2_bmi2()) {
    equal_to_previous_avx2(data, n, words);
    return;
  }
#endif
  equal_to_previous_scalar(data, n, words);
}

// Splits data[0..n) into literal spans and runs (each byte of a run equals the one before
// it; a run is at least kMinRun long), greedily, left to right. words: the mask of
// equal_to_previous, with one more zero word past the end. Calls literals(start, end) and
// run(length) in order.
template <typename Literals, typename Run>
inline void tokenize(size_t n, const uint64_t* words, Literals&& literals, Run&& run) {
  static_assert(kMinRun == 4, "the run test below checks four bits");
  const size_t word_count = (n + 63) / 64;
  size_t pos = 0;  // the first byte not yet given out
  size_t k = 0;
  while (k < word_count) {
    const uint64_t next = words[k + 1];
    uint64_t m = words[k];
    const size_t base = 64 * k;
    if (pos > base) m &= ~uint64_t{0} << (pos - base);  // pos - base < 64 here
    const uint64_t m1 = (m >> 1) | (next << 63);
    const uint64_t m2 = (m >> 2) | (next << 62);
    const uint64_t m3 = (m >> 3) | (next << 61);
    const uint64_t starts = m & m1 & m2 & m3;
    if (starts == 0) {
      ++k;
      continue;
    }
    const size_t start = base + static_cast<size_t>(__builtin_ctzll(starts));
    // The run goes on to the first byte that differs from the one before it.
    size_t end_word = start / 64;
    uint64_t rest = ~words[end_word] & (~uint64_t{0} << (start % 64));
    while (rest == 0) rest = ~words[++end_word];
    size_t end = 64 * end_word + static_cast<size_t>(__builtin_ctzll(rest));
    if (end > n) end = n;
    if (start > pos) literals(pos, start);
    run(end - start);
    pos = end;
    k = end / 64;
  }
  if (pos < n) literals(pos, n);
}

// Splits a run into matches of 3..258 bytes (never leaving a remainder of 1 or 2).
template <typename Match>
inline void for_each_match(size_t length, Match&& match) {
  while (length > 0) {
    size_t piece = length < 258 ? length : 258;
    const size_t left = length - piece;
    if (left > 0 && left < 3) piece -= 3 - left;
    match(static_cast<int>(piece));
    length -= piece;
  }
}

// Codes of two literals at once (the first in the low byte of the index): code bits 0..25,
// the summed length from bit kPairShift (codes are at most 13 bits).
__attribute__((always_inline)) inline void build_pairs_body(const uint16_t* codes,
                                                            const uint8_t* lengths,
                                                            uint32_t* pairs) {
  uint32_t code1[256];
  uint32_t len1[256];
  for (int s = 0; s < 256; ++s) code1[s] = codes[s], len1[s] = lengths[s];
  for (int second = 0; second < 256; ++second) {
    const uint32_t code2 = codes[second];
    const uint32_t len2 = lengths[second];
    uint32_t* row = pairs + (second << 8);
    for (int first = 0; first < 256; ++first) {  // vectorised: a variable shift per lane
      row[first] = (code1[first] | code2 << len1[first]) | (len1[first] + len2) << kPairShift;
    }
  }
}

inline void build_pairs_baseline(const uint16_t* codes, const uint8_t* lengths, uint32_t* pairs) {
  build_pairs_body(codes, lengths, pairs);
}

#ifdef IMGOPS_PNG_X86
__attribute__((target("avx2"))) inline void build_pairs_avx2(const uint16_t* codes,
                                                            const uint8_t* lengths,
                                                            uint32_t* pairs) {
  build_pairs_body(codes, lengths, pairs);
}
#endif

inline void build_pairs(const uint16_t* codes, const uint8_t* lengths, uint32_t* pairs) {
#ifdef IMGOPS_PNG_X86
  if (cpu_has_avx2_bmi2()) {
    build_pairs_avx2(codes, lengths, pairs);
    return;
  }
#endif
  build_pairs_baseline(codes, lengths, pairs);
}

// Compresses blocks of filtered rows into one zlib stream (header, deflate blocks, Adler-32)
// with Huffman tables fitted to samples of the rows: sample() some rows, fit(), then block()
// the blocks that table serves, in order; then the next stripe.
class RowDeflater {
 public:
  // `out` has room for max_zlib_bytes(total input, largest block, blocks) bytes.
  explicit RowDeflater(uint8_t* out) : writer_(out), start_(out), pairs_(65536) {
    writer_.put_flush(0x78 | (0x01 << 8), 16);  // CMF 0x78 (deflate, 32K window), FLG 0x01
    std::memset(sample_, 0, sizeof(sample_));
  }

  static size_t max_zlib_bytes(size_t input, size_t largest_block, size_t blocks) {
    // stored blocks at worst: 6 bytes a piece of at most 65535 bytes (LEN, NLEN, the 3-bit
    // header and its padding), and a block of n bytes has at most n / 65535 + 1 pieces: rows
    // wider than 65535 bytes make a piece of every block's tail. Plus the header, the trailer,
    // the writer's 8 bytes of slack, and room for one dynamic block that came out larger than
    // stored (13 bits a byte at most, plus its header) before it is rewound.
    return input + 6 * (input / 65535 + blocks + 1) + 64 + largest_block * 13 / 8 + 1024;
  }

  // Counts the symbols of data[0..n) (a sampled row) towards the table.
  void sample(const uint8_t* data, size_t n) {
    words_.assign((n + 63) / 64 + 1, 0);
    equal_to_previous(data, n, words_.data());
    const LengthCode* lengths = length_codes();
    tokenize(
        n, words_.data(),
        [&](size_t begin, size_t end) {
          for (size_t i = begin; i < end; ++i) ++sample_[data[i]];
        },
        [&](size_t length) {
          for_each_match(length, [&](int piece) { ++sample_[lengths[piece].symbol]; });
        });
  }

  // Builds the table from the sample: every literal and length symbol gets a code (the rows
  // not sampled may use any), weighted by 4 * its sampled count + 1.
  void fit() {
    for (int s = 0; s < kLitLenSymbols; ++s) lit_freq_[s] = 4 * sample_[s] + 1;
    lit_freq_[256] = 1;  // end of block
    build_tables();
    std::memset(sample_, 0, sizeof(sample_));
  }

  // Compresses data[0..n) as one deflate block (stored where that is smaller); `last` ends the
  // stream.
  void block(const uint8_t* data, size_t n, bool last) {
    adler_ = adler32(adler_, data, n);
    const uint64_t stored_bits = 8 * (5 * ((n + 65534) / 65535) + n) + 10;
    const BitWriter before = writer_;
    bool stored = n == 0;
    if (!stored) {
      words_.assign((n + 63) / 64 + 1, 0);
      equal_to_previous(data, n, words_.data());
      write_dynamic(data, n, last);
      const uint64_t bits = 8 * static_cast<uint64_t>(writer_.out - before.out) + writer_.count -
                            before.count;
      stored = bits > stored_bits;
    }
    if (stored) {
      writer_ = before;  // drops the dynamic block: every byte it wrote is past `out`
      write_stored(data, n, last);
    }
    if (last) {
      writer_.align();
      const uint32_t a = adler_;
      const uint8_t trailer[4] = {static_cast<uint8_t>(a >> 24), static_cast<uint8_t>(a >> 16),
                                  static_cast<uint8_t>(a >> 8), static_cast<uint8_t>(a)};
      for (uint8_t byte : trailer) writer_.put_flush(byte, 8);
    }
  }

  size_t size() const { return static_cast<size_t>(writer_.out - start_); }

 private:
  void build_tables() {
    huffman_lengths(lit_freq_, kLitLenSymbols, kLitLenMaxBits, lit_len_);
    canonical_codes(lit_len_, kLitLenSymbols, lit_code_);
    // One distance (1, code 0) is ever used; two one-bit codes make a complete tree.
    dist_len_[0] = dist_len_[1] = 1;
    dist_code_[0] = 0;
    dist_code_[1] = 1;
    build_pairs(lit_code_, lit_len_, pairs_.data());
    // Code lengths of both trees, as code-length symbols.
    lit_count_ = kLitLenSymbols;
    while (lit_count_ > 257 && lit_len_[lit_count_ - 1] == 0) --lit_count_;
    cl_symbols_.clear();
    uint32_t cl_freq[19] = {0};
    auto collect = [&](int symbol, int extra_bits, int extra) {
      cl_symbols_.push_back({static_cast<uint8_t>(symbol), static_cast<uint8_t>(extra_bits),
                             static_cast<uint8_t>(extra)});
      ++cl_freq[symbol];
    };
    code_length_symbols(lit_len_, lit_count_, collect);
    code_length_symbols(dist_len_, 2, collect);
    huffman_lengths(cl_freq, 19, 7, cl_len_);
    canonical_codes(cl_len_, 19, cl_code_);
    static const int order[19] = {16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15};
    cl_count_ = 19;
    while (cl_count_ > 4 && cl_len_[order[cl_count_ - 1]] == 0) --cl_count_;
  }

  void write_header(bool last) {
    static const int order[19] = {16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15};
    writer_.put_flush((last ? 1 : 0) | (2 << 1), 3);
    writer_.put_flush(static_cast<uint64_t>(lit_count_ - 257) | (uint64_t{2 - 1} << 5) |
                          static_cast<uint64_t>(cl_count_ - 4) << 10,
                      14);
    for (int i = 0; i < cl_count_; ++i) writer_.put_flush(cl_len_[order[i]], 3);
    for (const auto& s : cl_symbols_) {
      writer_.put(cl_code_[s.symbol], cl_len_[s.symbol]);
      writer_.put_flush(s.extra, s.extra_bits);
    }
  }

  void write_dynamic(const uint8_t* data, size_t n, bool last) {
    write_header(last);
    const LengthCode* lengths = length_codes();
    // The bits of a whole match (length code, extra bits, distance code 0) by length.
    uint64_t match_bits[259];
    uint8_t match_count[259];
    for (int len = 3; len <= 258; ++len) {
      const LengthCode& c = lengths[len];
      const int code_len = lit_len_[c.symbol];
      match_bits[len] = uint64_t{lit_code_[c.symbol]} | uint64_t{c.extra} << code_len |
                        uint64_t{dist_code_[0]} << (code_len + c.extra_bits);
      match_count[len] = static_cast<uint8_t>(code_len + c.extra_bits + dist_len_[0]);
    }
    BitWriter w = writer_;
    const uint32_t* pairs = pairs_.data();
    constexpr uint32_t kCodeMask = (1u << kPairShift) - 1;
    tokenize(
        n, words_.data(),
        [&](size_t begin, size_t end) {
          size_t i = begin;
          for (; i + 4 <= end; i += 4) {  // four codes of <= 13 bits fit the 57 free bits
            uint32_t four;
            std::memcpy(&four, data + i, 4);
            const uint32_t p0 = pairs[four & 0xFFFF];
            const uint32_t p1 = pairs[four >> 16];
            const int l0 = static_cast<int>(p0 >> kPairShift);
            const uint64_t bits = uint64_t{p0 & kCodeMask} | uint64_t{p1 & kCodeMask} << l0;
            w.put_flush(bits, l0 + static_cast<int>(p1 >> kPairShift));
          }
          for (; i < end; ++i) w.put_flush(lit_code_[data[i]], lit_len_[data[i]]);
        },
        [&](size_t length) {
          for_each_match(length, [&](int piece) {
            w.put_flush(match_bits[piece], match_count[piece]);
          });
        });
    w.put_flush(lit_code_[256], lit_len_[256]);
    writer_ = w;
  }

  void write_stored(const uint8_t* data, size_t n, bool last) {
    size_t done = 0;
    do {
      const size_t piece = n - done < 65535 ? n - done : 65535;
      const bool final_piece = last && done + piece == n;
      writer_.put_flush(final_piece ? 1 : 0, 3);  // BTYPE 00
      writer_.align();
      const uint32_t len = static_cast<uint32_t>(piece);
      writer_.put_flush(len | (~len & 0xFFFF) << 16, 32);
      std::memcpy(writer_.out, data + done, piece);
      writer_.out += piece;
      done += piece;
    } while (done < n);
  }

  struct ClSymbol {
    uint8_t symbol;
    uint8_t extra_bits;
    uint8_t extra;
  };

  BitWriter writer_;
  uint8_t* start_;
  uint32_t adler_ = 1;
  std::vector<uint64_t> words_;
  uint32_t lit_freq_[kLitLenSymbols];
  uint8_t lit_len_[kLitLenSymbols];
  uint16_t lit_code_[kLitLenSymbols];
  uint32_t sample_[kLitLenSymbols];
  std::vector<uint32_t> pairs_;
  uint8_t dist_len_[2];
  uint16_t dist_code_[2];
  uint8_t cl_len_[19];
  uint16_t cl_code_[19];
  int lit_count_ = 257;
  int cl_count_ = 19;
  std::vector<ClSymbol> cl_symbols_;
};

}  // namespace png
}  // namespace imgops
