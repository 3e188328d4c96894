// One dtype dispatch for every kernel (CPU and CUDA): a runtime ScalarType to a C++ type out of
// a list the op supports, handed to a generic lambda as a tag, so each op instantiates only the
// types its checks admit.
//   dispatch<VolumeTypes>(in.scalar_type(), "bin", [&](auto tag) {
//     using T = typename decltype(tag)::type;
//     ...
//   });
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <type_traits>

namespace imgops {

template <typename T>
struct TypeTag {
  using type = T;
};

template <typename... Ts>
struct TypeList {};

template <typename T>
constexpr at::ScalarType scalar_type_of();
template <>
constexpr at::ScalarType scalar_type_of<uint8_t>() { return at::kByte; }
template <>
constexpr at::ScalarType scalar_type_of<uint16_t>() { return at::kUInt16; }
template <>
constexpr at::ScalarType scalar_type_of<int16_t>() { return at::kShort; }
template <>
constexpr at::ScalarType scalar_type_of<float>() { return at::kFloat; }
template <>
constexpr at::ScalarType scalar_type_of<double>() { return at::kDouble; }
template <>
constexpr at::ScalarType scalar_type_of<c10::Half>() { return at::kHalf; }
template <>
constexpr at::ScalarType scalar_type_of<c10::BFloat16>() { return at::kBFloat16; }

// The dtypes each op accepts (its checks in checks.cpp say the same in words).
using GrayTypes = TypeList<uint8_t, uint16_t, float, c10::Half, c10::BFloat16, double>;
using VolumeTypes = TypeList<uint8_t, uint16_t, int16_t, float, double>;
using NormalizedTypes = TypeList<float, c10::Half, c10::BFloat16, double>;
using HistogramTypes = TypeList<uint8_t, uint16_t, int16_t>;
using PngTypes = TypeList<uint8_t, uint16_t>;

namespace detail {
template <typename F, typename... Ts>
void dispatch_impl(at::ScalarType t, const char* op, F&& f, TypeList<Ts...> /*types*/) {
  const bool found = ((t == scalar_type_of<Ts>() ? (f(TypeTag<Ts>{}), true) : false) || ...);
  TORCH_CHECK(found, op, ": unreachable: dtype ", t, " passed the checks");
}
}  // namespace detail

// Calls f(TypeTag<T>{}) for the T of List whose dtype is t.
template <typename List, typename F>
void dispatch(at::ScalarType t, const char* op, F&& f) {
  detail::dispatch_impl(t, op, static_cast<F&&>(f), List{});
}

// Calls f(std::true_type{}) or f(std::false_type{}): a runtime flag as a compile-time one.
template <typename F>
void dispatch_bool(bool flag, F&& f) {
  if (flag) {
    f(std::true_type{});
  } else {
    f(std::false_type{});
  }
}

}  // namespace imgops
