// The row deflate of png_deflate_parallel.h across thread blocks: the CPU encoder's exact zlib
// stream (png_encode.h's zlib_rows) made on the GPU, so that only the PNG chunk framing is left
// to the CPU (png_finish_zlib). Five launches on one stream, over one image's workspace
// (parallel::layout(row, height), zeroed before the first):
//
// imgops_png_deflate_breaks  one block per deflate block, a thread per 64-byte chunk: which
//                            chunks hold a byte unequal to the one before (Unit::breaks: a
//                            run's end is found by skipping chunks). kBlockThreads threads.
// imgops_png_deflate_sample  one block per sampled row (grid-stride): the row's symbol counts
//                            into its stripe's histogram; the block that adds a stripe's last
//                            row fits the stripe's Huffman table (the package-merge's levels
//                            merged by the whole block in shared memory, the rest of the table
//                            by one thread). kSampleThreads threads.
// imgops_png_deflate_count   one block per deflate block (grid-stride), a thread per 64-byte
//                            chunk in rounds: each chunk's bits, the block's dynamic size and
//                            its Adler-32 sums. kBlockThreads threads.
// imgops_png_deflate_plan    one thread: stored or dynamic per block, every block's first bit,
//                            the zlib header, the Adler-32 trailer and the stream's length.
// imgops_png_deflate_write   one block per deflate block: a scan of the chunks' bits gives each
//                            chunk's first bit; every chunk writes its tokens. A word written
//                            whole by one chunk is stored, the shared first and last words of a
//                            chunk are atomicOr-ed (png_deflate_emulated.h checks this split).
//                            kBlockThreads threads.
//
// All five take (rows, row, height, workspace): height filtered rows of `row` bytes (the filter
// byte included), contiguous. 64-bit offsets throughout.
#pragma once

#include <cstdint>

#include "../standalone/png_deflate_parallel.h"

namespace imgops {
namespace png_deflate_device {

namespace p = imgops::png::parallel;

constexpr int kSampleThreads = 128;
constexpr int kBlockThreads = 512;
constexpr int kWarps = kBlockThreads / 32;

// The workspace's regions (p::Layout) at `base`.
struct Workspace {
  p::Layout l;
  uint8_t* base;
  __device__ uint32_t* words() const { return reinterpret_cast<uint32_t*>(base + l.out); }
  __device__ uint32_t* histogram(int64_t s) const {
    return reinterpret_cast<uint32_t*>(base + l.histograms) + s * p::kSymbols;
  }
  __device__ uint32_t* counters() const { return reinterpret_cast<uint32_t*>(base + l.counters); }
  __device__ p::Table* tables() const { return reinterpret_cast<p::Table*>(base + l.tables); }
  __device__ p::BlockInfo* blocks() const {
    return reinterpret_cast<p::BlockInfo*>(base + l.blocks);
  }
  __device__ uint32_t* chunk_bits() const {
    return reinterpret_cast<uint32_t*>(base + l.chunk_bits);
  }
  __device__ uint64_t* size() const { return reinterpret_cast<uint64_t*>(base + l.size); }
  __device__ uint32_t* breaks(int64_t k) const {
    return reinterpret_cast<uint32_t*>(base + l.breaks) + k * l.g.break_words;
  }
};

// Block k as a unit, with its break bits.
__device__ inline p::Unit block_unit(const Workspace& ws, const uint8_t* rows, int64_t k) {
  const p::Geometry& g = ws.l.g;
  const int64_t first = p::block_first_row(g, k);
  return p::Unit{rows, first * g.row, (first + p::block_row_count(g, k)) * g.row, ws.breaks(k),
                 first * g.row};
}

// A table copied by the whole block, e.g. a stripe's into shared memory (Table is made of
// 32-bit words' worth of members: sizeof is a multiple of 4).
__device__ inline void copy_table(const p::Table& from, p::Table& to) {
  static_assert(sizeof(p::Table) % 4 == 0, "Table copies as words");
  const auto* src = reinterpret_cast<const uint32_t*>(&from);
  auto* dst = reinterpret_cast<uint32_t*>(&to);
  for (int i = threadIdx.x; i < static_cast<int>(sizeof(p::Table) / 4); i += blockDim.x) {
    dst[i] = src[i];
  }
}

// Exclusive prefix sums of `value` over a kBlockThreads-thread block; *total gets the sum.
// Every thread of the block must call it.
__device__ inline uint64_t block_exclusive_scan(uint64_t value, uint64_t* total) {
  __shared__ uint64_t warp_sums[kWarps];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  uint64_t inclusive = value;
  for (int d = 1; d < 32; d <<= 1) {
    const uint64_t other = __shfl_up_sync(0xffffffffu, inclusive, d);
    if (lane >= d) inclusive += other;
  }
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  uint64_t before = 0;
  uint64_t sum = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) before += warp_sums[w];
    sum += warp_sums[w];
  }
  __syncthreads();  // warp_sums is reused by the next call
  *total = sum;
  return before + inclusive - value;
}

// Sum of `value` over a kBlockThreads-thread block, mod `mod` when mod != 0 (values < mod).
__device__ inline uint64_t block_sum(uint64_t value, uint64_t mod) {
  __shared__ uint64_t warp_sums[kWarps];
  for (int d = 16; d > 0; d >>= 1) {
    value += __shfl_down_sync(0xffffffffu, value, d);
    if (mod != 0) value %= mod;
  }
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = value;
  __syncthreads();
  uint64_t sum = 0;
  for (int w = 0; w < kWarps; ++w) {
    sum += warp_sums[w];
    if (mod != 0) sum %= mod;
  }
  __syncthreads();
  return sum;
}

struct OrWord {
  __device__ void operator()(uint32_t* word, uint32_t value) const { atomicOr(word, value); }
};

struct StoreWord {
  __device__ void operator()(uint32_t* word, uint32_t value) const { *word = value; }
};

}  // namespace png_deflate_device
}  // namespace imgops

extern "C" __global__ void __launch_bounds__(imgops::png_deflate_device::kBlockThreads)
    imgops_png_deflate_breaks(const uint8_t* __restrict__ rows, long long row, long long height,
                              uint8_t* workspace) {
  namespace d = imgops::png_deflate_device;
  namespace p = imgops::png::parallel;
  const d::Workspace ws{p::layout(row, height), workspace};
  const p::Geometry& g = ws.l.g;
  for (int64_t k = blockIdx.x; k < g.blocks; k += gridDim.x) {
    p::Unit unit = d::block_unit(ws, rows, k);
    unit.breaks = nullptr;
    uint32_t* bits = ws.breaks(k);
    const int64_t chunks = (unit.end - unit.begin + p::kChunk - 1) / p::kChunk;
    for (int64_t round = 0; round < chunks; round += blockDim.x) {  // (the same for all)
      const int64_t j = round + threadIdx.x;
      bool found = false;
      if (j < chunks) {
        const int64_t c0 = unit.begin + j * p::kChunk;
        found = p::has_break(unit, c0, c0 + p::kChunk < unit.end ? c0 + p::kChunk : unit.end);
      }
      // a warp's 32 chunks are one word (rounds and warps start at multiples of 32)
      const uint32_t word = __ballot_sync(0xffffffffu, found);
      if ((threadIdx.x & 31) == 0 && j < chunks) bits[j >> 5] = word;
    }
  }
}

extern "C" __global__ void __launch_bounds__(imgops::png_deflate_device::kSampleThreads)
    imgops_png_deflate_sample(const uint8_t* __restrict__ rows, long long row, long long height,
                              uint8_t* workspace) {
  namespace d = imgops::png_deflate_device;
  namespace p = imgops::png::parallel;
  __shared__ uint32_t counts[p::kSymbols];
  __shared__ uint32_t freq[p::kSymbols];
  __shared__ int16_t order[p::kSymbols];
  __shared__ p::FitScratch scratch;
  __shared__ p::Table fitted;
  __shared__ int fits;
  __shared__ int counted;  // the fit's count()
  const d::Workspace ws{p::layout(row, height), workspace};
  const p::Geometry& g = ws.l.g;
  const int64_t jobs = g.stripes * g.samples;
  for (int64_t job = blockIdx.x; job < jobs; job += gridDim.x) {
    const int64_t s = job / g.samples;
    const int64_t i = job % g.samples;
    if (i >= p::stripe_samples(g, s)) continue;  // (the same for the whole block)
    for (int t = threadIdx.x; t < p::kSymbols; t += blockDim.x) counts[t] = 0;
    __syncthreads();
    const int64_t y = p::stripe_first_row(g, s) + p::kSampleStride * i;
    const int64_t k = y / g.block_rows;
    const p::Unit unit{rows, y * g.row, (y + 1) * g.row, ws.breaks(k),
                       p::block_first_row(g, k) * g.row};
    for (int64_t c0 = unit.begin + int64_t{threadIdx.x} * p::kChunk; c0 < unit.end;
         c0 += int64_t{blockDim.x} * p::kChunk) {
      const int64_t c1 = c0 + p::kChunk < unit.end ? c0 + p::kChunk : unit.end;
      p::sample_chunk(unit, c0, c1, [&](int symbol) { atomicAdd(&counts[symbol], 1u); });
    }
    __syncthreads();
    uint32_t* histogram = ws.histogram(s);
    for (int t = threadIdx.x; t < p::kSymbols; t += blockDim.x) {
      if (counts[t] != 0) atomicAdd(&histogram[t], counts[t]);
    }
    __threadfence();  // the adds are visible before the count of rows done says so
    __syncthreads();
    if (threadIdx.x == 0) {
      const uint32_t done = atomicAdd(&ws.counters()[s], 1u) + 1;
      fits = done == static_cast<uint32_t>(p::stripe_samples(g, s)) ? 1 : 0;
    }
    __syncthreads();
    if (fits) {  // every row of the stripe is counted: fit its table (p::weights, p::sort_used)
      __threadfence();
      for (int t = threadIdx.x; t < p::kSymbols; t += blockDim.x) {
        freq[t] = t == 256 ? 1u : 4u * __ldcg(&histogram[t]) + 1u;
      }
      __syncthreads();
      for (int t = threadIdx.x; t < p::kSymbols; t += blockDim.x) {
        int rank = 0;  // a stable sort by frequency: ties by symbol
        for (int u = 0; u < p::kSymbols; ++u) {
          rank += freq[u] < freq[t] || (freq[u] == freq[t] && u < t);
        }
        order[rank] = static_cast<int16_t>(t);
      }
      __syncthreads();
      auto each = [](int n, auto&& f) {
        for (int i = threadIdx.x; i < n; i += blockDim.x) f(i);
        __syncthreads();
      };
      auto count = [](int n, auto&& pred) {
        if (threadIdx.x == 0) counted = 0;
        __syncthreads();
        int mine = 0;
        for (int i = threadIdx.x; i < n; i += blockDim.x) mine += pred(i) ? 1 : 0;
        if (mine != 0) atomicAdd(&counted, mine);
        __syncthreads();
        const int all = counted;
        __syncthreads();  // (counted is reset by the next call)
        return all;
      };
      p::fit_lengths(freq, order, &fitted, scratch, each, count);
      if (threadIdx.x == 0) p::finish_table(&fitted, scratch);
      __syncthreads();
      d::copy_table(fitted, ws.tables()[s]);  // built in shared memory, stored whole
    }
    __syncthreads();
  }
}

extern "C" __global__ void __launch_bounds__(imgops::png_deflate_device::kBlockThreads)
    imgops_png_deflate_count(const uint8_t* __restrict__ rows, long long row, long long height,
                             uint8_t* workspace) {
  namespace d = imgops::png_deflate_device;
  namespace p = imgops::png::parallel;
  __shared__ p::Table table;
  const d::Workspace ws{p::layout(row, height), workspace};
  const p::Geometry& g = ws.l.g;
  for (int64_t k = blockIdx.x; k < g.blocks; k += gridDim.x) {
    d::copy_table(ws.tables()[k / g.stripe_blocks], table);
    __syncthreads();
    const p::Unit unit = d::block_unit(ws, rows, k);
    const int64_t n = unit.end - unit.begin;
    const int64_t chunks = (n + p::kChunk - 1) / p::kChunk;
    uint64_t bits = 0;
    uint64_t sum = 0;
    uint64_t weighted = 0;
    for (int64_t j = threadIdx.x; j < chunks; j += blockDim.x) {
      const int64_t c0 = unit.begin + j * p::kChunk;
      const int64_t c1 = c0 + p::kChunk < unit.end ? c0 + p::kChunk : unit.end;
      const p::ChunkCount c = p::count_chunk(unit, c0, c1, table);
      ws.chunk_bits()[k * g.block_chunks + j] = static_cast<uint32_t>(c.bits);
      bits += c.bits;
      sum = (sum + c.sum) % p::kAdlerMod;
      weighted = (weighted + p::chunk_weighted_part(n, c0 - unit.begin, c1 - c0, c)) % p::kAdlerMod;
    }
    bits = d::block_sum(bits, 0);
    sum = d::block_sum(sum, p::kAdlerMod);
    weighted = d::block_sum(weighted, p::kAdlerMod);
    if (threadIdx.x == 0) {
      p::BlockInfo& info = ws.blocks()[k];
      info.dynamic_bits = 3 + static_cast<uint64_t>(table.header_bits) + table.lit_len[256] + bits;
      info.adler_sum = static_cast<uint32_t>(sum);
      info.adler_weighted = static_cast<uint32_t>(weighted);
    }
    __syncthreads();  // the table is reloaded for the next block
  }
}

extern "C" __global__ void imgops_png_deflate_plan(const uint8_t* __restrict__ /*rows*/,
                                                   long long row, long long height,
                                                   uint8_t* workspace) {
  namespace d = imgops::png_deflate_device;
  namespace p = imgops::png::parallel;
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const d::Workspace ws{p::layout(row, height), workspace};
  d::OrWord or_word;
  d::StoreWord store_word;
  *ws.size() = p::plan_stream(ws.l.g, ws.blocks(), ws.words(), or_word, store_word);
}

extern "C" __global__ void __launch_bounds__(imgops::png_deflate_device::kBlockThreads)
    imgops_png_deflate_write(const uint8_t* __restrict__ rows, long long row, long long height,
                             uint8_t* workspace) {
  namespace d = imgops::png_deflate_device;
  namespace p = imgops::png::parallel;
  __shared__ p::Table table;
  const d::Workspace ws{p::layout(row, height), workspace};
  const p::Geometry& g = ws.l.g;
  uint32_t* words = ws.words();
  d::OrWord or_word;
  d::StoreWord store_word;
  for (int64_t k = blockIdx.x; k < g.blocks; k += gridDim.x) {
    const p::BlockInfo info = ws.blocks()[k];
    const bool last = k == g.blocks - 1;
    const p::Unit unit = d::block_unit(ws, rows, k);
    const int64_t chunks = (unit.end - unit.begin + p::kChunk - 1) / p::kChunk;
    if (info.stored) {
      for (int64_t j = threadIdx.x; j < chunks; j += blockDim.x) {
        const int64_t c0 = unit.begin + j * p::kChunk;
        const int64_t c1 = c0 + p::kChunk < unit.end ? c0 + p::kChunk : unit.end;
        p::write_stored_chunk(unit, c0, c1, last, words, info.start_bit, or_word, store_word);
      }
    } else {
      d::copy_table(ws.tables()[k / g.stripe_blocks], table);
      __syncthreads();
      if (threadIdx.x == 0) {
        p::write_block_header(table, last, words, info, or_word, store_word);
        p::write_end_of_block(table, words, info, or_word, store_word);
      }
      uint64_t base = info.start_bit + 3 + static_cast<uint64_t>(table.header_bits);
      for (int64_t round = 0; round < chunks; round += blockDim.x) {  // (the same for all)
        const int64_t j = round + threadIdx.x;
        const uint64_t bits = j < chunks ? ws.chunk_bits()[k * g.block_chunks + j] : 0;
        uint64_t total = 0;
        const uint64_t before = d::block_exclusive_scan(bits, &total);
        if (j < chunks) {
          const int64_t c0 = unit.begin + j * p::kChunk;
          const int64_t c1 = c0 + p::kChunk < unit.end ? c0 + p::kChunk : unit.end;
          p::write_chunk(unit, c0, c1, table, words, base + before, or_word, store_word);
        }
        base += total;
      }
    }
    __syncthreads();  // the table is reloaded for the next block
  }
}
