// The row deflate of png_deflate.h / png_encode.h cut into independent pieces, so that a GPU can
// run it and give the CPU encoder's exact bytes. The same functions compile for the host
// (png_deflate_emulated.h runs them one after another: the CPU tests of this file) and for the
// device (csrc/device/png_deflate_kernels.cuh runs them across thread blocks).
//
// What the CPU encoder does, restated so that every piece is local:
// - blocks of whole filtered rows (about 64 KiB), stripes of at most 8 blocks' worth of rows;
//   each stripe's Huffman table is fitted to the symbols of every 4th row of the stripe, each
//   row tokenized on its own;
// - tokens: with eq(i) = "byte i equals byte i - 1" (never for the first byte of a block, or of
//   a sampled row), every maximal run of eq positions [a, b) with b - a >= 4 is a match run of
//   length b - a (distance 1, split into 3..258 pieces), every other byte a literal. (The CPU
//   tokenizer finds exactly these runs greedily, left to right.)
// - a block is stored when its dynamic coding would take more bits than stored_bits(n).
// Here each block is cut into 64-byte chunks. A chunk's thread tokenizes its bytes; a run is
// coded by the chunk where it starts (which looks past its end to find the run's length), the
// bytes of a run that started earlier cost nothing. The bits of the chunks, scanned, give each
// chunk's offset in the block; a plan over the blocks (stored blocks align to bytes) gives each
// block's offset in the stream. Every output word is either written whole by one chunk or
// OR-ed in (its first and last, partial words), into a zeroed buffer.
#pragma once

#include <cstddef>
#include <cstdint>

#include "png_codes.h"  // IMGOPS_HD, canonical_codes, code_length_symbols (the CPU's)

namespace imgops {
namespace png {
namespace parallel {

constexpr int kSymbols = 286;    // literal/length symbols
constexpr int kMaxBits = 13;     // the CPU encoder's limit (png_deflate.h, kLitLenMaxBits)
constexpr int64_t kBlockBytes = int64_t{1} << 16;  // png_encode.h: kBlockBytes
constexpr int64_t kSampleStride = 4;               // png_encode.h: kSampleStride
constexpr int64_t kMaxTables = 8;                  // png_encode.h: kMaxTables
constexpr int64_t kChunk = 64;   // bytes a thread tokenizes
constexpr uint32_t kAdlerMod = 65521;
constexpr int kHeaderWords = 160;  // the dynamic header after BFINAL/BTYPE: < 5,000 bits

// How the filtered rows (height rows of `row` bytes each, filter byte included) are cut.
struct Geometry {
  int64_t row = 0;
  int64_t height = 0;
  int64_t block_rows = 0;     // rows a block (the last block may have fewer)
  int64_t blocks = 0;
  int64_t stripe_blocks = 0;  // blocks a stripe (the last stripe may have fewer)
  int64_t stripes = 0;
  int64_t samples = 0;        // sampled rows of a full stripe (kSampleStride apart)
  int64_t block_chunks = 0;   // chunks of a full block
  int64_t break_words = 0;    // words of a block's break bits (Unit::breaks)
};

IMGOPS_HD inline Geometry geometry(int64_t row, int64_t height) {
  Geometry g;
  g.row = row;
  g.height = height;
  g.block_rows = row > 0 && kBlockBytes / row > 0 ? kBlockBytes / row : 1;
  g.blocks = (height + g.block_rows - 1) / g.block_rows;
  g.stripe_blocks = (g.blocks + kMaxTables - 1) / kMaxTables;
  if (g.stripe_blocks < 1) g.stripe_blocks = 1;
  g.stripes = (g.blocks + g.stripe_blocks - 1) / g.stripe_blocks;
  const int64_t stripe_rows = g.stripe_blocks * g.block_rows;
  g.samples = (stripe_rows + kSampleStride - 1) / kSampleStride;
  g.block_chunks = (g.block_rows * row + kChunk - 1) / kChunk;
  g.break_words = (g.block_chunks + 31) / 32;
  return g;
}

IMGOPS_HD inline int64_t block_first_row(const Geometry& g, int64_t block) {
  return block * g.block_rows;
}

IMGOPS_HD inline int64_t block_row_count(const Geometry& g, int64_t block) {
  const int64_t first = block_first_row(g, block);
  return first + g.block_rows <= g.height ? g.block_rows : g.height - first;
}

IMGOPS_HD inline int64_t stripe_first_row(const Geometry& g, int64_t stripe) {
  return stripe * g.stripe_blocks * g.block_rows;
}

IMGOPS_HD inline int64_t stripe_end_row(const Geometry& g, int64_t stripe) {
  const int64_t end = stripe_first_row(g, stripe + 1);
  return end < g.height ? end : g.height;
}

// Sampled rows of a stripe: stripe_first_row, +4, ... below stripe_end_row.
IMGOPS_HD inline int64_t stripe_samples(const Geometry& g, int64_t stripe) {
  const int64_t rows = stripe_end_row(g, stripe) - stripe_first_row(g, stripe);
  return (rows + kSampleStride - 1) / kSampleStride;
}

// The zlib stream's most bytes. The plan stores a block whose dynamic coding would take more
// than stored_bits(n) = 8 (5 p + n) + 10 bits (p = its 65535-byte pieces), and a stored block
// takes at most p (3 + 7 + 32) + 8 n bits: at most n + 6 p + 2 bytes a block either way, with
// p <= n / 65535 + 1; then the 2-byte zlib header, a padding byte and the 4-byte Adler-32.
IMGOPS_HD inline int64_t max_stream_bytes(const Geometry& g) {
  const int64_t input = g.row * g.height;
  return input + 6 * (input / 65535 + g.blocks) + 2 * g.blocks + 7;
}

// A stripe's code: the literal/length codes, the bits of a whole match by length (length
// code, extra bits, the one-bit distance code 0), and the block header that describes it.
struct Table {
  uint16_t lit_code[kSymbols];
  uint8_t lit_len[kSymbols];
  uint32_t match_bits[259];
  uint8_t match_count[259];
  int32_t header_bits;  // after the three BFINAL/BTYPE bits
  uint32_t header[kHeaderWords];
};

// What the counting pass finds in a block, and where the plan puts it.
struct BlockInfo {
  uint64_t dynamic_bits;  // the whole dynamic block, BFINAL/BTYPE and end of block included
  uint64_t start_bit;     // in the zlib stream (plan)
  uint32_t adler_sum;     // the block's bytes: sum mod 65521
  uint32_t adler_weighted;  // sum of (n - i) * byte_i mod 65521
  uint32_t stored;        // plan: 1 when the block is stored
  uint32_t pad;
};

// One image's scratch memory on the device (or host), zeroed before use: offsets in bytes.
struct Layout {
  Geometry g;
  int64_t out = 0;         // the zlib stream (out_bytes, a multiple of 8)
  int64_t out_bytes = 0;
  int64_t histograms = 0;  // stripes x kSymbols uint32
  int64_t counters = 0;    // stripes + 1 uint32: sampled rows done per stripe, blocks counted
  int64_t tables = 0;      // stripes x Table
  int64_t blocks = 0;      // blocks x BlockInfo
  int64_t chunk_bits = 0;  // blocks x block_chunks uint32: each chunk's bits
  int64_t breaks = 0;      // blocks x break_words uint32: Unit::breaks of each block
  int64_t size = 0;        // uint64: the zlib stream's length in bytes
  int64_t total = 0;
};

IMGOPS_HD inline int64_t align_up(int64_t value, int64_t to) { return (value + to - 1) / to * to; }

IMGOPS_HD inline Layout layout(int64_t row, int64_t height) {
  Layout l;
  l.g = geometry(row, height);
  l.out = 0;
  l.out_bytes = align_up(max_stream_bytes(l.g) + 16, 256);
  l.histograms = l.out + l.out_bytes;
  l.counters = align_up(l.histograms + 4 * kSymbols * l.g.stripes, 256);
  l.tables = align_up(l.counters + 4 * (l.g.stripes + 1), 256);
  l.blocks = align_up(l.tables + static_cast<int64_t>(sizeof(Table)) * l.g.stripes, 256);
  l.chunk_bits = align_up(l.blocks + static_cast<int64_t>(sizeof(BlockInfo)) * l.g.blocks, 256);
  l.breaks = align_up(l.chunk_bits + 4 * l.g.blocks * l.g.block_chunks, 256);
  l.size = align_up(l.breaks + 4 * l.g.blocks * l.g.break_words, 256);
  l.total = align_up(l.size + 8, 256);
  return l;
}

// ------------------------------------------------------------------ lengths and Huffman codes

// Deflate's length symbol (257..285), extra bits and their value for a match of 3..258 bytes.
IMGOPS_HD inline void length_code(int length, int* symbol, int* extra_bits, int* extra) {
  if (length == 258) {
    *symbol = 285, *extra_bits = 0, *extra = 0;
  } else if (length <= 10) {
    *symbol = 257 + length - 3, *extra_bits = 0, *extra = 0;
  } else {
    const int v = length - 3;  // 8..254
    int top = 0;
    while ((v >> (top + 1)) != 0) ++top;
    const int e = top - 2;
    *symbol = 257 + 4 * (e + 1) + ((v >> e) - 4);
    *extra_bits = e;
    *extra = v & ((1 << e) - 1);
  }
}

// png_deflate.h's for_each_match: a run cut into matches of 3..258 bytes.
template <typename Match>
IMGOPS_HD inline void for_each_match(int64_t length, Match&& match) {
  while (length > 0) {
    int64_t piece = length < 258 ? length : 258;
    const int64_t left = length - piece;
    if (left > 0 && left < 3) piece -= 3 - left;
    match(static_cast<int>(piece));
    length -= piece;
  }
}

// `order`: the used symbols (freq > 0) sorted by frequency, ties by symbol (a stable sort);
// returns their count. The device version ranks in parallel (png_deflate_kernels.cuh).
IMGOPS_HD inline int sort_used(const uint32_t* freq, int n, int16_t* order) {
  int used = 0;
  for (int s = 0; s < n; ++s) {
    if (freq[s] == 0) continue;
    int i = used++;
    while (i > 0 && freq[order[i - 1]] > freq[s]) {
      order[i] = order[i - 1];
      --i;
    }
    order[i] = static_cast<int16_t>(s);
  }
  return used;
}

// The package-merge's working memory (~19 KB): the device keeps it in shared memory, since
// a thread's local arrays would be reserved for every thread the GPU can hold.
struct HuffmanScratch {
  uint8_t is_leaf[15][2 * kSymbols];  // item i of a merged level is a leaf (< 2 * leaves items)
  uint64_t below[2 * kSymbols];
  uint64_t merged[2 * kSymbols];
  int32_t bits[kSymbols];
};

// png_huffman.h's huffman_lengths (package-merge, the same lengths), for at most kSymbols
// symbols and 15 bits, given `order` from sort_used.
IMGOPS_HD inline void huffman_lengths_sorted(const uint32_t* freq, int n, int max_bits,
                                             const int16_t* order, int leaves, uint8_t* lengths,
                                             HuffmanScratch& scratch) {
  for (int s = 0; s < n; ++s) lengths[s] = 0;
  if (leaves < 2) {
    const int a = leaves == 0 ? 0 : order[0];
    lengths[a] = 1;
    lengths[a == 0 ? 1 : 0] = 1;
    return;
  }
  auto& is_leaf = scratch.is_leaf;
  uint64_t* below = scratch.below;
  uint64_t* merged = scratch.merged;
  int below_count = leaves;
  for (int i = 0; i < leaves; ++i) {
    below[i] = freq[order[i]];
    is_leaf[max_bits - 1][i] = 1;
  }
  for (int level = max_bits - 2; level >= 0; --level) {
    int leaf = 0;
    int pair = 0;
    int count = 0;
    const int pairs = below_count / 2;
    while (leaf < leaves || pair < pairs) {
      const uint64_t package = pair < pairs ? below[2 * pair] + below[2 * pair + 1] : 0;
      if (pair >= pairs || (leaf < leaves && freq[order[leaf]] <= package)) {
        merged[count] = freq[order[leaf++]];
        is_leaf[level][count++] = 1;
      } else {
        merged[count] = package;
        is_leaf[level][count++] = 0;
        ++pair;
      }
    }
    for (int i = 0; i < count; ++i) below[i] = merged[i];
    below_count = count;
  }
  int32_t* bits = scratch.bits;
  for (int i = 0; i < leaves; ++i) bits[i] = 0;
  int take = 2 * leaves - 2;
  for (int level = 0; level < max_bits && take > 0; ++level) {
    int leaf_count = 0;
    for (int i = 0; i < take; ++i) leaf_count += is_leaf[level][i];
    for (int i = 0; i < leaf_count; ++i) ++bits[i];
    take = 2 * (take - leaf_count);
  }
  for (int i = 0; i < leaves; ++i) lengths[order[i]] = static_cast<uint8_t>(bits[i]);
}

// huffman_lengths_sorted with each level's merge done in parallel, for leaves >= 2 (the same
// lengths). `each(n, f)` calls f(i) for every i < n and returns once all are done; `count(n,
// pred)` returns, to every caller, how many i < n satisfy pred. The device runs both across a
// thread block (with barriers), the host as loops (png_deflate_emulated.h: the CPU tests).
// A merged level holds the leaves (sorted) and the packages (sums of pairs of the level below,
// sorted too); the serial merge takes a leaf first when leaf <= package, so a leaf's place is
// its index plus the packages smaller than it, a package's its index plus the leaves not larger.
template <typename Each, typename Count>
IMGOPS_HD inline void huffman_lengths_parallel(const uint32_t* freq, int n, int max_bits,
                                               const int16_t* order, int leaves,
                                               uint8_t* lengths, HuffmanScratch& scratch,
                                               Each&& each, Count&& count) {
  auto& is_leaf = scratch.is_leaf;
  uint64_t* below = scratch.below;
  uint64_t* merged = scratch.merged;
  each(2 * kSymbols, [&](int i) {
    if (i < n) lengths[i] = 0;
    if (i < leaves) {
      below[i] = freq[order[i]];
      is_leaf[max_bits - 1][i] = 1;
    }
  });
  int below_count = leaves;
  for (int level = max_bits - 2; level >= 0; --level) {
    const int pairs = below_count / 2;
    each(leaves + pairs, [&](int j) {
      if (j < leaves) {
        const uint64_t leaf = freq[order[j]];
        int lo = 0;
        int hi = pairs;  // packages < leaf
        while (lo < hi) {
          const int mid = (lo + hi) / 2;
          if (below[2 * mid] + below[2 * mid + 1] < leaf) {
            lo = mid + 1;
          } else {
            hi = mid;
          }
        }
        merged[j + lo] = leaf;
        is_leaf[level][j + lo] = 1;
      } else {
        const int pair = j - leaves;
        const uint64_t package = below[2 * pair] + below[2 * pair + 1];
        int lo = 0;
        int hi = leaves;  // leaves <= package
        while (lo < hi) {
          const int mid = (lo + hi) / 2;
          if (freq[order[mid]] <= package) {
            lo = mid + 1;
          } else {
            hi = mid;
          }
        }
        merged[pair + lo] = package;
        is_leaf[level][pair + lo] = 0;
      }
    });
    uint64_t* swap = below;
    below = merged;
    merged = swap;
    below_count = leaves + pairs;
  }
  // The active leaves of each level, from the top: a leaf's length is the number of levels
  // whose active leaves include it.
  int32_t leaf_counts[16] = {0};
  int take = 2 * leaves - 2;
  for (int level = 0; level < max_bits && take > 0; ++level) {
    leaf_counts[level] = count(take, [&](int i) { return is_leaf[level][i] != 0; });
    take = 2 * (take - leaf_counts[level]);
  }
  each(leaves, [&](int i) {
    int bits = 0;
    for (int level = 0; level < max_bits; ++level) bits += i < leaf_counts[level] ? 1 : 0;
    lengths[order[i]] = static_cast<uint8_t>(bits);
  });
}

// Appends bits LSB first into words (zeroed beforehand) from bit 0; used for the header.
struct HeaderWriter {
  uint32_t* words;
  int32_t bits = 0;
  // n <= 32; bits of value above n are ignored
  IMGOPS_HD void put(uint32_t value, int n) {
    if (n <= 0) return;
    const uint32_t mask = n == 32 ? ~0u : (1u << n) - 1u;
    const uint64_t shifted = static_cast<uint64_t>(value & mask) << (bits & 31);
    words[bits >> 5] |= static_cast<uint32_t>(shifted);
    if ((bits & 31) + n > 32) words[(bits >> 5) + 1] |= static_cast<uint32_t>(shifted >> 32);
    bits += n;
  }
};

// RowDeflater::fit + build_tables + write_header: the table of a stripe from its sampled
// counts (fit_lengths, then finish_table). `order` must come from sort_used over the weights
// 4 * sample + 1 (every symbol is used, so that is a sort of all kSymbols).
IMGOPS_HD inline void weights(const uint32_t* sample, uint32_t* freq) {
  for (int s = 0; s < kSymbols; ++s) freq[s] = 4 * sample[s] + 1;
  freq[256] = 1;
}

struct FitScratch {
  HuffmanScratch huffman;
  uint8_t symbols[kSymbols + 2];  // the code-length symbols of both trees, with extra bits
  uint8_t extra_bits[kSymbols + 2];
  uint8_t extras[kSymbols + 2];
};

// The lengths of the literal/length code: `order` sorts all kSymbols weights (see above).
template <typename Each, typename Count>
IMGOPS_HD inline void fit_lengths(const uint32_t* freq, const int16_t* order, Table* table,
                                  FitScratch& scratch, Each&& each, Count&& count) {
  huffman_lengths_parallel(freq, kSymbols, kMaxBits, order, kSymbols, table->lit_len,
                           scratch.huffman, each, count);
}

// The rest of the table from its literal/length code lengths (one thread): the codes, the
// block header that describes them, the bits of every match length.
IMGOPS_HD inline void finish_table(Table* table, FitScratch& scratch) {
  canonical_codes(table->lit_len, kSymbols, table->lit_code);
  const uint8_t dist_len[2] = {1, 1};
  int lit_count = kSymbols;
  while (lit_count > 257 && table->lit_len[lit_count - 1] == 0) --lit_count;
  // The code-length symbols of both trees (at most one per length), and their own code.
  uint8_t* symbols = scratch.symbols;
  uint8_t* extra_bits = scratch.extra_bits;
  uint8_t* extras = scratch.extras;
  int count = 0;
  uint32_t cl_freq[19] = {0};
  auto collect = [&](int symbol, int bits, int extra) {
    symbols[count] = static_cast<uint8_t>(symbol);
    extra_bits[count] = static_cast<uint8_t>(bits);
    extras[count++] = static_cast<uint8_t>(extra);
    ++cl_freq[symbol];
  };
  code_length_symbols(table->lit_len, lit_count, collect);
  code_length_symbols(dist_len, 2, collect);
  int16_t cl_order[19];
  const int cl_used = sort_used(cl_freq, 19, cl_order);
  uint8_t cl_len[19];
  uint16_t cl_code[19];
  huffman_lengths_sorted(cl_freq, 19, 7, cl_order, cl_used, cl_len, scratch.huffman);
  canonical_codes(cl_len, 19, cl_code);
  const int cl_index[19] = {16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15};
  int cl_count = 19;
  while (cl_count > 4 && cl_len[cl_index[cl_count - 1]] == 0) --cl_count;
  for (int i = 0; i < kHeaderWords; ++i) table->header[i] = 0;
  HeaderWriter header{table->header};
  header.put(static_cast<uint32_t>(lit_count - 257) | (uint32_t{2 - 1} << 5) |
                 static_cast<uint32_t>(cl_count - 4) << 10,
             14);
  for (int i = 0; i < cl_count; ++i) header.put(cl_len[cl_index[i]], 3);
  for (int i = 0; i < count; ++i) {
    header.put(cl_code[symbols[i]], cl_len[symbols[i]]);
    header.put(extras[i], extra_bits[i]);
  }
  table->header_bits = header.bits;
  for (int length = 3; length <= 258; ++length) {
    int symbol = 0;
    int bits = 0;
    int extra = 0;
    length_code(length, &symbol, &bits, &extra);
    const int code_len = table->lit_len[symbol];
    // distance code 0 is the one-bit code 0: nothing to OR in
    table->match_bits[length] = uint32_t{table->lit_code[symbol]} | uint32_t(extra) << code_len;
    table->match_count[length] = static_cast<uint8_t>(code_len + bits + 1);
  }
}

// ------------------------------------------------------------------ tokens

// Bytes [begin, end) of the filtered rows form one unit (a block, or a sampled row): the first
// byte of a unit never equals "the byte before".
// The lowest set bit of a nonzero word.
IMGOPS_HD inline int lowest_bit(uint32_t word) {
#if defined(__CUDA_ARCH__)
  return __ffs(static_cast<int>(word)) - 1;
#else
  return __builtin_ctz(word);
#endif
}

// The first chunk j in [from, last] whose bit is set in `bits`, or -1.
IMGOPS_HD inline int64_t next_break_chunk(const uint32_t* bits, int64_t from, int64_t last) {
  if (from > last) return -1;
  for (int64_t w = from >> 5; w <= last >> 5; ++w) {
    uint32_t word = bits[w];
    if (w == from >> 5) word &= ~0u << (from & 31);
    if (word != 0) {
      const int64_t j = (w << 5) + lowest_bit(word);
      return j <= last ? j : -1;
    }
  }
  return -1;
}

// A unit lies inside one deflate block; `breaks` (when set) marks the block's 64-byte chunks
// (counted from block_begin) that hold a position that is not eq in the block, a bit each
// (chunk j: bit j % 32 of word j / 32; break_chunks), so that the end of a long run is found by
// skipping whole chunks instead of reading every byte (one thread finds it: a flat block would
// otherwise cost it 64 KiB of reads). For positions past a unit's begin, eq in the unit and in
// its block agree.
struct Unit {
  const uint8_t* data;
  int64_t begin;
  int64_t end;
  const uint32_t* breaks = nullptr;
  int64_t block_begin = 0;
  IMGOPS_HD bool eq(int64_t i) const { return i > begin && data[i] == data[i - 1]; }
  // The first position >= i (and < end) that is not eq, or end.
  IMGOPS_HD int64_t run_end(int64_t i) const {
    if (breaks == nullptr) {
      while (i < end && eq(i)) ++i;
      return i;
    }
    const int64_t chunk = (i - block_begin) / kChunk;
    const int64_t chunk_end = block_begin + (chunk + 1) * kChunk;
    for (const int64_t stop = chunk_end < end ? chunk_end : end; i < stop; ++i) {
      if (!eq(i)) return i;
    }
    if (i >= end) return end;
    const int64_t next = next_break_chunk(breaks, chunk + 1, (end - 1 - block_begin) / kChunk);
    if (next < 0) return end;
    i = block_begin + next * kChunk;
    for (const int64_t stop = i + kChunk < end ? i + kChunk : end; i < stop; ++i) {
      if (!eq(i)) return i;
    }
    return end;
  }
};

// Whether the chunk [c0, c1) of a unit holds a position that is not eq (Unit::breaks).
IMGOPS_HD inline bool has_break(const Unit& unit, int64_t c0, int64_t c1) {
  for (int64_t i = c0; i < c1; ++i) {
    if (!unit.eq(i)) return true;
  }
  return false;
}

// Tokenizes the chunk [c0, c1) of a unit: literal(byte) for each literal byte in it,
// run(length) for each match run that starts in it (whatever its length past c1).
template <typename Literal, typename Run>
IMGOPS_HD inline void chunk_tokens(const Unit& unit, int64_t c0, int64_t c1, Literal&& literal,
                                   Run&& run) {
  int64_t i = c0;
  if (i < c1 && unit.eq(i) && unit.eq(i - 1)) {  // (eq(begin) is false: i - 1 >= begin here)
    // A run of eq positions that started before the chunk: its start chunk codes it when it is
    // long (>= 4); a short one is literals here too.
    int64_t back = 1;
    while (back < 4 && unit.eq(i - 1 - back)) ++back;
    int64_t end = i;
    while (end < c1 && unit.eq(end)) ++end;
    bool long_run = back + (end - i) >= 4;
    if (!long_run && end == c1) {  // goes on past the chunk: look a few bytes further
      int64_t more = end;
      while (more < unit.end && back + (more - i) < 4 && unit.eq(more)) ++more;
      long_run = back + (more - i) >= 4;
    }
    if (!long_run) {
      for (int64_t k = i; k < end; ++k) literal(unit.data[k]);
    }
    i = end;
  }
  while (i < c1) {
    if (!unit.eq(i)) {
      literal(unit.data[i]);
      ++i;
      continue;
    }
    const int64_t end = unit.run_end(i);  // a run starting here (eq(i - 1) is false)
    if (end - i >= 4) {
      run(end - i);
    } else {
      const int64_t stop = end < c1 ? end : c1;
      for (int64_t k = i; k < stop; ++k) literal(unit.data[k]);
    }
    i = end < c1 ? end : c1;
  }
}

// The counts of a chunk of a sampled row towards its stripe's histogram: add(symbol).
template <typename Add>
IMGOPS_HD inline void sample_chunk(const Unit& row, int64_t c0, int64_t c1, Add&& add) {
  chunk_tokens(
      row, c0, c1, [&](uint8_t byte) { add(byte); },
      [&](int64_t length) {
        for_each_match(length, [&](int piece) {
          int symbol = 0;
          int bits = 0;
          int extra = 0;
          length_code(piece, &symbol, &bits, &extra);
          add(symbol);
        });
      });
}

// The bits of a chunk of a block under `table`, and its two Adler-32 partial sums: sum of the
// bytes, and sum of (c1 - i) * byte_i.
struct ChunkCount {
  uint64_t bits = 0;
  uint32_t sum = 0;
  uint32_t weighted = 0;
};

IMGOPS_HD inline ChunkCount count_chunk(const Unit& block, int64_t c0, int64_t c1,
                                        const Table& table) {
  ChunkCount c;
  chunk_tokens(
      block, c0, c1, [&](uint8_t byte) { c.bits += table.lit_len[byte]; },
      [&](int64_t length) {
        for_each_match(length, [&](int piece) { c.bits += table.match_count[piece]; });
      });
  uint32_t sum = 0;
  uint32_t weighted = 0;  // at most 64 * 64 * 255: no overflow
  for (int64_t i = c0; i < c1; ++i) {
    sum += block.data[i];
    weighted += static_cast<uint32_t>(c1 - i) * block.data[i];
  }
  c.sum = sum;
  c.weighted = weighted;
  return c;
}

// The part of a block's Adler-32 weighted sum that a chunk [c0, c1) of an n-byte block at
// block-relative offset p = c0 - begin adds: (n - p - m) * sum + weighted, mod 65521.
IMGOPS_HD inline uint32_t chunk_weighted_part(int64_t n, int64_t p, int64_t m, const ChunkCount& c) {
  const uint64_t factor = static_cast<uint64_t>(n - p - m) % kAdlerMod;
  return static_cast<uint32_t>((factor * c.sum + c.weighted) % kAdlerMod);
}

// ------------------------------------------------------------------ writing bits

// Writes bits LSB first from bit `pos` on into 32-bit words: the first and the last word with
// or_word (they may hold other writers' bits), the words between with store_word.
template <typename OrWord, typename StoreWord>
struct WordSink {
  uint32_t* words;
  OrWord& or_word;
  StoreWord& store_word;
  int64_t word;
  uint64_t acc;
  int count;
  bool first = true;
  bool any = false;

  IMGOPS_HD WordSink(uint32_t* w, int64_t pos, OrWord& o, StoreWord& s)
      : words(w), or_word(o), store_word(s), word(pos >> 5), acc(0), count(static_cast<int>(pos & 31)) {}

  // n <= 32
  IMGOPS_HD void put(uint64_t bits, int n) {
    any = true;
    acc |= bits << count;
    count += n;
    if (count >= 32) {
      const uint32_t low = static_cast<uint32_t>(acc);
      if (first) {
        or_word(words + word, low);
        first = false;
      } else {
        store_word(words + word, low);
      }
      ++word;
      acc >>= 32;
      count -= 32;
    }
  }
  IMGOPS_HD void finish() {
    if (any && count > 0) or_word(words + word, static_cast<uint32_t>(acc));
  }
};

template <typename OrWord, typename StoreWord>
IMGOPS_HD inline WordSink<OrWord, StoreWord> make_sink(uint32_t* words, int64_t pos, OrWord& o,
                                                        StoreWord& s) {
  return WordSink<OrWord, StoreWord>(words, pos, o, s);
}

// The bits a stored block of n bytes at bit `pos` takes (pieces of at most 65535 bytes, each
// with its 3-bit header, padding to a byte, and LEN/NLEN).
IMGOPS_HD inline uint64_t stored_block_end(uint64_t pos, int64_t n) {
  int64_t done = 0;
  do {
    const int64_t piece = n - done < 65535 ? n - done : 65535;
    pos += 3;
    pos = (pos + 7) & ~uint64_t{7};
    pos += 32 + 8 * static_cast<uint64_t>(piece);
    done += piece;
  } while (done < n);
  return pos;
}

// RowDeflater::block's test: stored when dynamic bits exceed this.
IMGOPS_HD inline uint64_t stored_bits(int64_t n) {
  return 8 * (5 * static_cast<uint64_t>((n + 65534) / 65535) + static_cast<uint64_t>(n)) + 10;
}

// Writes a dynamic block's first bits: BFINAL, BTYPE 2 and the table's header.
template <typename OrWord, typename StoreWord>
IMGOPS_HD inline void write_block_header(const Table& table, bool last, uint32_t* words,
                                         const BlockInfo& info, OrWord& or_word,
                                         StoreWord& store_word) {
  auto sink = make_sink(words, static_cast<int64_t>(info.start_bit), or_word, store_word);
  sink.put((last ? 1u : 0u) | (2u << 1), 3);
  for (int32_t done = 0; done < table.header_bits; done += 32) {
    const int n = table.header_bits - done < 32 ? table.header_bits - done : 32;
    sink.put(table.header[done >> 5], n);  // (bits past header_bits are zero)
  }
  sink.finish();
}

// Writes a dynamic block's end-of-block code, its last bits.
template <typename OrWord, typename StoreWord>
IMGOPS_HD inline void write_end_of_block(const Table& table, uint32_t* words,
                                         const BlockInfo& info, OrWord& or_word,
                                         StoreWord& store_word) {
  const uint64_t pos = info.start_bit + info.dynamic_bits - table.lit_len[256];
  auto sink = make_sink(words, static_cast<int64_t>(pos), or_word, store_word);
  sink.put(table.lit_code[256], table.lit_len[256]);
  sink.finish();
}

// Writes chunk [c0, c1) of a dynamic block, its tokens from bit `pos`.
template <typename OrWord, typename StoreWord>
IMGOPS_HD inline void write_chunk(const Unit& block, int64_t c0, int64_t c1, const Table& table,
                                  uint32_t* words, uint64_t pos, OrWord& or_word,
                                  StoreWord& store_word) {
  auto sink = make_sink(words, static_cast<int64_t>(pos), or_word, store_word);
  chunk_tokens(
      block, c0, c1, [&](uint8_t byte) { sink.put(table.lit_code[byte], table.lit_len[byte]); },
      [&](int64_t length) {
        for_each_match(length, [&](int piece) {
          sink.put(table.match_bits[piece], table.match_count[piece]);
        });
      });
  sink.finish();
}

// Writes bytes [c0, c1) of a stored block (block-relative offset p = c0 - begin) whose first
// piece starts at bit `start`; a piece's header is written by whoever writes its first byte.
template <typename OrWord, typename StoreWord>
IMGOPS_HD inline void write_stored_chunk(const Unit& block, int64_t c0, int64_t c1, bool last,
                                         uint32_t* words, uint64_t start, OrWord& or_word,
                                         StoreWord& store_word) {
  const int64_t n = block.end - block.begin;
  int64_t i = c0;
  while (i < c1) {
    const int64_t offset = i - block.begin;
    const int64_t piece = offset / 65535;
    const int64_t piece_begin = piece * 65535;
    const int64_t piece_bytes = n - piece_begin < 65535 ? n - piece_begin : 65535;
    // every piece before is whole: 3 bits, padding, LEN/NLEN, bytes
    const uint64_t piece_pos = piece == 0 ? start : stored_block_end(start, piece_begin);
    const uint64_t data_pos = ((piece_pos + 3 + 7) & ~uint64_t{7}) + 32;
    const int64_t stop = block.begin + piece_begin + piece_bytes < c1
                             ? block.begin + piece_begin + piece_bytes
                             : c1;
    if (i == block.begin + piece_begin) {  // this chunk writes the piece's header
      const bool final_piece = last && piece_begin + piece_bytes == n;
      auto head = make_sink(words, static_cast<int64_t>(piece_pos), or_word, store_word);
      head.put(final_piece ? 1 : 0, 3);
      head.finish();
      const uint32_t len = static_cast<uint32_t>(piece_bytes);
      auto size = make_sink(words, static_cast<int64_t>(data_pos - 32), or_word, store_word);
      size.put(len | (~len & 0xFFFFu) << 16, 32);
      size.finish();
    }
    auto sink = make_sink(words, static_cast<int64_t>(data_pos + 8 * (i - block.begin - piece_begin)),
                          or_word, store_word);
    for (; i < stop; ++i) sink.put(block.data[i], 8);
    sink.finish();
  }
}

// ------------------------------------------------------------------ the plan

// Decides stored or dynamic per block, places every block, and writes the zlib header and the
// Adler-32 trailer; returns the stream's length in bytes. One thread, once per image.
template <typename OrWord, typename StoreWord>
IMGOPS_HD inline uint64_t plan_stream(const Geometry& g, BlockInfo* blocks, uint32_t* words,
                                      OrWord& or_word, StoreWord& store_word) {
  uint64_t pos = 16;  // CMF 0x78, FLG 0x01
  uint32_t a = 1;
  uint32_t b = 0;
  for (int64_t k = 0; k < g.blocks; ++k) {
    BlockInfo& info = blocks[k];
    const int64_t n = block_row_count(g, k) * g.row;
    info.start_bit = pos;
    info.stored = info.dynamic_bits > stored_bits(n) ? 1u : 0u;
    pos = info.stored ? stored_block_end(pos, n) : pos + info.dynamic_bits;
    const uint64_t n_mod = static_cast<uint64_t>(n) % kAdlerMod;
    b = static_cast<uint32_t>((b + n_mod * a + info.adler_weighted) % kAdlerMod);
    a = static_cast<uint32_t>((a + info.adler_sum) % kAdlerMod);
  }
  auto head = make_sink(words, 0, or_word, store_word);
  head.put(0x78 | (0x01 << 8), 16);
  head.finish();
  pos = (pos + 7) & ~uint64_t{7};
  const uint32_t adler = (b << 16) | a;
  auto tail = make_sink(words, static_cast<int64_t>(pos), or_word, store_word);
  for (int shift = 24; shift >= 0; shift -= 8) tail.put((adler >> shift) & 0xFF, 8);
  tail.finish();
  return pos / 8 + 4;
}

}  // namespace parallel
}  // namespace png
}  // namespace imgops
