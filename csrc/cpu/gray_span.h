// The CPU luma loops on raw pointers, free of torch: shared by the torch op (gray.cpp, which
// splits the pixels over at::parallel_for) and the torch-free module the command line uses
// (standalone/module.cpp, imgops._cli_kernels), so both give the same bits by construction.
// Integer and float types go through one loop the compiler vectorises, built twice (baseline
// x86-64 and AVX2) and picked at run time; uint8 and uint16 on x86 take the hand-written loops
// (gray_u8_avx2.h, gray_u8_sse.h, gray_u16_avx2.h).
#pragma once

#include <cstdint>
#include <string_view>
#include <type_traits>

#include "../bt601.h"
#include "gray_u16_avx2.h"
#include "gray_u8_avx2.h"
#include "gray_u8_sse.h"

namespace imgops {

// Luma of n interleaved 3-channel pixels. kBgr swaps the weights of channels 0 and 2.
template <typename T, bool kBgr>
__attribute__((always_inline)) inline void gray_span(const T* __restrict in, T* __restrict out,
                                                     int64_t n) {
  for (int64_t p = 0; p < n; ++p) {
    const T c0 = in[3 * p];
    const T c1 = in[3 * p + 1];
    const T c2 = in[3 * p + 2];
    const T r = kBgr ? c2 : c0;
    const T b = kBgr ? c0 : c2;
    if constexpr (std::is_integral_v<T>) {
      out[p] = static_cast<T>(luma_int(r, c1, b));
    } else {
      using Acc = typename AccumulateType<T>::type;
      out[p] = static_cast<T>(
          luma_float<Acc>(static_cast<Acc>(r), static_cast<Acc>(c1), static_cast<Acc>(b)));
    }
  }
}

template <typename T, bool kBgr>
void gray_span_baseline(const T* in, T* out, int64_t n) {
  gray_span<T, kBgr>(in, out, n);
}

#if defined(__x86_64__) && defined(__GNUC__)
template <typename T, bool kBgr>
__attribute__((target("avx2"))) void gray_span_avx2(const T* in, T* out, int64_t n) {
  gray_span<T, kBgr>(in, out, n);
}
#endif

inline bool cpu_has_avx2() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
#else
  return false;
#endif
}

template <typename T>
using GraySpanFn = void (*)(const T*, T*, int64_t);

// The loop for T, the channel order and an instruction set: "baseline" (the compiler's loop
// for x86-64), "sse4.1" (uint8 only: gray_u8_sse.h), "avx2" (uint8: gray_u8_avx2.h, uint16:
// gray_u16_avx2.h, float types: the compiler's loop for AVX2), or "best" (the fastest this CPU
// runs). nullptr when the CPU or the type lacks that loop. Tests name each loop to check each.
template <typename T, bool kBgr>
GraySpanFn<T> gray_span_for(const char* isa) {
  const std::string_view want(isa);
  const bool best = want == "best";
#if defined(__x86_64__) && defined(__GNUC__)
  if ((best || want == "avx2") && cpu_has_avx2()) {
    if constexpr (std::is_same_v<T, uint8_t>) {
      return &gray_u8_avx2<kBgr>;  // hand-vectorised, 32 pixels a step
    } else if constexpr (std::is_same_v<T, uint16_t>) {
      return &gray_u16_avx2<kBgr>;  // hand-vectorised, 16 pixels a step
    } else {
      return &gray_span_avx2<T, kBgr>;
    }
  }
  if constexpr (std::is_same_v<T, uint8_t>) {
    if ((best || want == "sse4.1") && cpu_has_sse41()) {
      return &gray_u8_sse<kBgr>;  // hand-vectorised: about 1.6x the compiler's AVX2 loop
    }
  }
#endif
  return best || want == "baseline" ? &gray_span_baseline<T, kBgr> : nullptr;
}

// The fastest exact loop this CPU runs for T and the channel order.
template <typename T, bool kBgr>
GraySpanFn<T> best_gray_span() {
  return gray_span_for<T, kBgr>("best");
}

}  // namespace imgops
