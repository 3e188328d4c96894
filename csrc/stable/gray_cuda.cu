// rgb_to_gray on CUDA through the stable ABI: a grid-stride kernel with 64-bit indices,
// launched on the current stream under a device guard, every launch checked.
// The full extension's vectorised kernel (../cuda/gray.cu) needs ../cuda/launch.cuh, which uses
// c10::cuda for the SM count; the prototype keeps to one scalar kernel (the numerics, ../luma.h,
// are shared, so the results are the same bits).
#include <cuda_runtime.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/macros.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>

#include <algorithm>
#include <type_traits>

#include "../luma.h"
#include "checks.h"

namespace imgops_stable {
namespace {

using torch::stable::Tensor;

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 1 << 16;  // grid-stride beyond this

template <typename T, bool kBgr>
__global__ void gray_kernel(const T* __restrict__ in, T* __restrict__ out, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < n;
       p += stride) {
    const T c0 = in[3 * p];
    const T c1 = in[3 * p + 1];
    const T c2 = in[3 * p + 2];
    const T r = kBgr ? c2 : c0;
    const T b = kBgr ? c0 : c2;
    if constexpr (std::is_integral_v<T>) {
      out[p] = static_cast<T>(imgops::luma_int(r, c1, b));
    } else {
      using Acc = typename imgops::AccumulateType<T>::type;
      out[p] = static_cast<T>(imgops::luma_float<Acc>(static_cast<Acc>(r), static_cast<Acc>(c1),
                                                      static_cast<Acc>(b)));
    }
  }
}

// The current CUDA stream of a device. torch::stable::accelerator::Stream::nativeHandle()
// exists from torch 2.13 only; the AOTI C shim call below is in every torch >= 2.10.
cudaStream_t current_stream(int32_t device_index) {
  void* stream = nullptr;
  STD_TORCH_CHECK(aoti_torch_get_current_cuda_stream(device_index, &stream) == AOTI_TORCH_SUCCESS,
                  "rgb_to_gray: cannot get the current CUDA stream");
  return static_cast<cudaStream_t>(stream);
}

template <typename T, bool kBgr>
void launch(const Tensor& in, Tensor& out, cudaStream_t stream) {
  const int64_t n = out.numel();
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, kMaxBlocks);
  gray_kernel<T, kBgr><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      in.const_data_ptr<T>(), out.mutable_data_ptr<T>(), n);
  STD_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T>
void launch_order(const Tensor& in, Tensor& out, bool bgr, cudaStream_t stream) {
  if (bgr) {
    launch<T, true>(in, out, stream);
  } else {
    launch<T, false>(in, out, stream);
  }
}

Tensor rgb_to_gray_cuda(Tensor image, std::string channel_order) {
  const bool bgr = parse_channel_order(channel_order);
  check_rgb_image(image);
  const torch::stable::accelerator::DeviceGuard guard(image.get_device_index());
  const Tensor in = torch::stable::contiguous(image);
  Tensor out = torch::stable::new_empty(in, gray_output_shape(image));
  if (out.numel() == 0) {
    return out;
  }
  const cudaStream_t stream = current_stream(image.get_device_index());
  switch (in.scalar_type()) {
    case ScalarType::Byte:
      launch_order<uint8_t>(in, out, bgr, stream);
      break;
    case ScalarType::UInt16:
      launch_order<uint16_t>(in, out, bgr, stream);
      break;
    case ScalarType::Float:
      launch_order<float>(in, out, bgr, stream);
      break;
    case ScalarType::Half:
      launch_order<c10::Half>(in, out, bgr, stream);
      break;
    case ScalarType::BFloat16:
      launch_order<c10::BFloat16>(in, out, bgr, stream);
      break;
    case ScalarType::Double:
      launch_order<double>(in, out, bgr, stream);
      break;
    default:
      STD_TORCH_CHECK(false, "unreachable: dtype checked above");
  }
  return out;
}

}  // namespace
}  // namespace imgops_stable

STABLE_TORCH_LIBRARY_IMPL(imgops_stable, CUDA, m) {
  m.impl("rgb_to_gray", TORCH_BOX(&imgops_stable::rgb_to_gray_cuda));
}
