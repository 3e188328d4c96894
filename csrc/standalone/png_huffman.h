// Length-limited canonical Huffman codes for deflate (RFC 1951, 3.2.2), by package-merge: the
// optimal code lengths under a maximum length, always a complete code (every decoder, zlib's
// included, refuses incomplete literal/length codes).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "png_codes.h"

namespace imgops {
namespace png {

// Code lengths (0 = unused) for n symbols of the given frequencies, none longer than max_bits.
// Fewer than two used symbols get two codes of one bit (the used one and a neighbour).
inline void huffman_lengths(const uint32_t* freq, int n, int max_bits, uint8_t* lengths) {
  std::vector<int> used;
  for (int s = 0; s < n; ++s) {
    lengths[s] = 0;
    if (freq[s] > 0) used.push_back(s);
  }
  if (used.size() < 2) {
    const int a = used.empty() ? 0 : used[0];
    lengths[a] = 1;
    lengths[a == 0 ? 1 : 0] = 1;
    return;
  }
  std::stable_sort(used.begin(), used.end(), [&](int a, int b) { return freq[a] < freq[b]; });
  const size_t leaves = used.size();
  // Package-merge: level max_bits holds the leaves; each level above merges the leaves with the
  // pairs ("packages") of the level below. Only the kind of each item (leaf or package) in
  // merged order is kept: the first m items of a level always hold a prefix of the sorted
  // leaves and a prefix of the packages.
  std::vector<std::vector<uint8_t>> is_leaf(max_bits);
  std::vector<uint64_t> below;
  for (size_t i = 0; i < leaves; ++i) below.push_back(freq[used[i]]);
  is_leaf[max_bits - 1].assign(leaves, 1);
  for (int level = max_bits - 2; level >= 0; --level) {
    std::vector<uint64_t> merged;
    std::vector<uint8_t>& kinds = is_leaf[level];
    size_t leaf = 0;
    size_t pair = 0;
    const size_t pairs = below.size() / 2;
    while (leaf < leaves || pair < pairs) {
      const uint64_t package = pair < pairs ? below[2 * pair] + below[2 * pair + 1] : 0;
      if (pair >= pairs || (leaf < leaves && freq[used[leaf]] <= package)) {
        merged.push_back(freq[used[leaf++]]);
        kinds.push_back(1);
      } else {
        merged.push_back(package);
        kinds.push_back(0);
        ++pair;
      }
    }
    below.swap(merged);
  }
  // The first 2 * leaves - 2 items of the top level; every leaf among the first m items of a
  // level gains one bit, and the packages among them are the first 2 * packages of the next.
  std::vector<int> bits(leaves, 0);
  size_t take = 2 * leaves - 2;
  for (int level = 0; level < max_bits && take > 0; ++level) {
    size_t leaf_count = 0;
    for (size_t i = 0; i < take; ++i) leaf_count += is_leaf[level][i];
    for (size_t i = 0; i < leaf_count; ++i) ++bits[i];
    take = 2 * (take - leaf_count);
  }
  for (size_t i = 0; i < leaves; ++i) lengths[used[i]] = static_cast<uint8_t>(bits[i]);
}

}  // namespace png
}  // namespace imgops
