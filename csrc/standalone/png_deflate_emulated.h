// The GPU's row deflate (png_deflate_parallel.h) run on one CPU thread, kernel by kernel, over
// the same workspace layout the device uses: the CPU tests of the device code. It must give the
// bytes of png_encode.h's zlib_rows, and it checks, as it writes, that no word written whole by
// one chunk is touched by another (what makes the device's plain stores safe). The stand-in
// libcuda of the tests (tests/fake_cuda) runs these stages for the deflate kernels' launches.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#include "png_deflate_parallel.h"
#include "png_encode.h"

namespace imgops {
namespace png {
namespace emulated {

namespace p = parallel;
static_assert(p::kBlockBytes == static_cast<int64_t>(kBlockBytes), "block size");
static_assert(p::kSampleStride == kSampleStride, "sample stride");
static_assert(p::kMaxTables == kMaxTables, "stripes");
static_assert(p::kMaxBits == kLitLenMaxBits, "code length limit");

// One image's workspace (p::Layout) in host memory.
struct Workspace {
  p::Layout l;
  uint8_t* base;
  uint32_t* words() const { return reinterpret_cast<uint32_t*>(base + l.out); }
  uint32_t* histogram(int64_t s) const {
    return reinterpret_cast<uint32_t*>(base + l.histograms) + s * p::kSymbols;
  }
  p::Table* tables() const { return reinterpret_cast<p::Table*>(base + l.tables); }
  p::BlockInfo* blocks() const { return reinterpret_cast<p::BlockInfo*>(base + l.blocks); }
  uint32_t* chunk_bits() const { return reinterpret_cast<uint32_t*>(base + l.chunk_bits); }
  uint32_t* breaks(int64_t k) const {
    return reinterpret_cast<uint32_t*>(base + l.breaks) + k * l.g.break_words;
  }
  uint64_t* size() const { return reinterpret_cast<uint64_t*>(base + l.size); }
};

// How words of the stream are written: OR-ed, or stored whole. With `checked`, a store onto a
// word that holds bits, or an OR into a word stored whole, throws std::logic_error.
struct WordWriters {
  uint32_t* words;
  size_t count;
  std::vector<uint8_t> whole;
  bool checked;
  WordWriters(uint32_t* w, size_t n, bool check) : words(w), count(n), checked(check) {
    if (checked) whole.assign(count, 0);
  }
  void in_bounds(const uint32_t* w) const {
    if (w < words || static_cast<size_t>(w - words) >= count) {
      throw std::logic_error("a word past the stream's room is written");
    }
  }
  void or_word(uint32_t* w, uint32_t v) {
    in_bounds(w);
    if (checked && whole[static_cast<size_t>(w - words)]) {
      throw std::logic_error("a word written whole is OR-ed into");
    }
    *w |= v;
  }
  void store_word(uint32_t* w, uint32_t v) {
    in_bounds(w);
    if (checked) {
      const size_t i = static_cast<size_t>(w - words);
      if (*w != 0 || whole[i]) throw std::logic_error("a word is stored over another's bits");
      whole[i] = 1;
    }
    *w = v;
  }
};

// Block k as a unit, with its break bits.
inline p::Unit block_unit(const Workspace& ws, const uint8_t* rows, int64_t k) {
  const p::Geometry& g = ws.l.g;
  const int64_t first = p::block_first_row(g, k);
  return p::Unit{rows, first * g.row, (first + p::block_row_count(g, k)) * g.row, ws.breaks(k),
                 first * g.row};
}

// Kernel 0: which chunks of each block hold a break (p::Unit::breaks).
inline void find_breaks(const uint8_t* rows, const Workspace& ws) {
  const p::Geometry& g = ws.l.g;
  for (int64_t k = 0; k < g.blocks; ++k) {
    p::Unit unit = block_unit(ws, rows, k);
    unit.breaks = nullptr;
    uint32_t* bits = ws.breaks(k);
    for (int64_t c0 = unit.begin, j = 0; c0 < unit.end; c0 += p::kChunk, ++j) {
      const int64_t c1 = c0 + p::kChunk < unit.end ? c0 + p::kChunk : unit.end;
      if (p::has_break(unit, c0, c1)) bits[j >> 5] |= 1u << (j & 31);
    }
  }
}

// Kernel 1: the sampled rows' symbol counts, then each stripe's table.
inline void sample_and_fit(const uint8_t* rows, const Workspace& ws) {
  const p::Geometry& g = ws.l.g;
  auto scratch = std::make_unique<p::FitScratch>();
  for (int64_t s = 0; s < g.stripes; ++s) {
    uint32_t* hist = ws.histogram(s);
    for (int64_t j = 0; j < p::stripe_samples(g, s); ++j) {
      const int64_t y = p::stripe_first_row(g, s) + p::kSampleStride * j;
      const int64_t k = y / g.block_rows;
      const p::Unit unit{rows, y * g.row, (y + 1) * g.row, ws.breaks(k),
                         p::block_first_row(g, k) * g.row};
      for (int64_t c0 = unit.begin; c0 < unit.end; c0 += p::kChunk) {
        const int64_t c1 = c0 + p::kChunk < unit.end ? c0 + p::kChunk : unit.end;
        p::sample_chunk(unit, c0, c1, [&](int symbol) { ++hist[symbol]; });
      }
    }
    uint32_t freq[p::kSymbols];
    int16_t order[p::kSymbols];
    p::weights(hist, freq);
    p::sort_used(freq, p::kSymbols, order);
    auto each = [](int n, auto&& f) {
      for (int i = 0; i < n; ++i) f(i);
    };
    auto count = [](int n, auto&& pred) {
      int total = 0;
      for (int i = 0; i < n; ++i) total += pred(i) ? 1 : 0;
      return total;
    };
    p::fit_lengths(freq, order, &ws.tables()[s], *scratch, each, count);
    p::finish_table(&ws.tables()[s], *scratch);
  }
}

// Kernel 2: each chunk's bits, each block's dynamic size and Adler-32 sums.
inline void count(const uint8_t* rows, const Workspace& ws) {
  const p::Geometry& g = ws.l.g;
  for (int64_t k = 0; k < g.blocks; ++k) {
    const p::Table& table = ws.tables()[k / g.stripe_blocks];
    const p::Unit unit = block_unit(ws, rows, k);
    const int64_t n = unit.end - unit.begin;
    uint64_t bits = 3 + static_cast<uint64_t>(table.header_bits) + table.lit_len[256];
    uint64_t sum = 0;
    uint64_t weighted = 0;
    for (int64_t c0 = unit.begin, j = 0; c0 < unit.end; c0 += p::kChunk, ++j) {
      const int64_t c1 = c0 + p::kChunk < unit.end ? c0 + p::kChunk : unit.end;
      const p::ChunkCount c = p::count_chunk(unit, c0, c1, table);
      ws.chunk_bits()[k * g.block_chunks + j] = static_cast<uint32_t>(c.bits);
      bits += c.bits;
      sum = (sum + c.sum) % p::kAdlerMod;
      weighted = (weighted + p::chunk_weighted_part(n, c0 - unit.begin, c1 - c0, c)) % p::kAdlerMod;
    }
    p::BlockInfo& info = ws.blocks()[k];
    info.dynamic_bits = bits;
    info.adler_sum = static_cast<uint32_t>(sum);
    info.adler_weighted = static_cast<uint32_t>(weighted);
  }
}

// Kernel 3: the plan (one thread on the device).
inline void plan(const Workspace& ws, WordWriters& writers) {
  auto or_word = [&](uint32_t* w, uint32_t v) { writers.or_word(w, v); };
  auto store_word = [&](uint32_t* w, uint32_t v) { writers.store_word(w, v); };
  *ws.size() = p::plan_stream(ws.l.g, ws.blocks(), ws.words(), or_word, store_word);
}

// Kernel 4: every block written.
inline void write(const uint8_t* rows, const Workspace& ws, WordWriters& writers) {
  auto or_word = [&](uint32_t* w, uint32_t v) { writers.or_word(w, v); };
  auto store_word = [&](uint32_t* w, uint32_t v) { writers.store_word(w, v); };
  const p::Geometry& g = ws.l.g;
  uint32_t* words = ws.words();
  for (int64_t k = 0; k < g.blocks; ++k) {
    const p::Table& table = ws.tables()[k / g.stripe_blocks];
    const p::BlockInfo& info = ws.blocks()[k];
    const bool last = k == g.blocks - 1;
    const p::Unit unit = block_unit(ws, rows, k);
    if (info.stored) {
      for (int64_t c0 = unit.begin; c0 < unit.end; c0 += p::kChunk) {
        const int64_t c1 = c0 + p::kChunk < unit.end ? c0 + p::kChunk : unit.end;
        p::write_stored_chunk(unit, c0, c1, last, words, info.start_bit, or_word, store_word);
      }
      continue;
    }
    p::write_block_header(table, last, words, info, or_word, store_word);
    uint64_t pos = info.start_bit + 3 + static_cast<uint64_t>(table.header_bits);
    for (int64_t c0 = unit.begin, j = 0; c0 < unit.end; c0 += p::kChunk, ++j) {
      const int64_t c1 = c0 + p::kChunk < unit.end ? c0 + p::kChunk : unit.end;
      p::write_chunk(unit, c0, c1, table, words, pos, or_word, store_word);
      pos += ws.chunk_bits()[k * g.block_chunks + j];
    }
    p::write_end_of_block(table, words, info, or_word, store_word);
  }
}

// Compresses height filtered rows of `row` bytes into a zlib stream at out (room for
// png_encode.h's room for zlib_rows); returns its length. std::logic_error when a word would be written by
// two chunks without an OR.
inline size_t zlib_rows(const uint8_t* rows, int64_t row, int64_t height, uint8_t* out) {
  const p::Layout l = p::layout(row, height);
  std::vector<uint64_t> memory(static_cast<size_t>(l.total / 8), 0);
  const Workspace ws{l, reinterpret_cast<uint8_t*>(memory.data())};
  WordWriters writers(ws.words(), static_cast<size_t>(l.out_bytes / 4), true);
  find_breaks(rows, ws);
  sample_and_fit(rows, ws);
  count(rows, ws);
  plan(ws, writers);
  write(rows, ws, writers);
  std::memcpy(out, ws.words(), static_cast<size_t>(*ws.size()));
  return static_cast<size_t>(*ws.size());
}

}  // namespace emulated

// The PNG file of filtered rows, deflated as the GPU does (encode_filtered's bytes).
inline size_t encode_filtered_emulated(const ImageShape& shape, const uint8_t* rows,
                                       uint8_t* out) {
  const size_t zlib =
      emulated::zlib_rows(rows, shape.row_bytes() + 1, shape.height, out + kHeadBytes);
  return finish_png_file(shape, zlib, out);
}

}  // namespace png
}  // namespace imgops
