// png_filter on CUDA: the torch op around png_filter_kernel.cuh's device code (shared with the
// torch-free engine kernels, csrc/device/engine_kernels.cu): one 256-thread block per row
// (grid-stride over rows), the adaptive choice scored exactly like png_filter.h. 16-bit samples
// are read as big-endian bytes. 64-bit indices; launched on the current stream under a device
// guard.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "../checks.h"
#include "../dispatch.h"
#include "launch.cuh"
#include "png_filter_kernel.cuh"

namespace imgops {
namespace cuda {
namespace {

using png_device::kRowThreads;

template <typename T>
__global__ void png_filter_kernel(const T* __restrict__ rows, uint8_t* __restrict__ out,
                                  int64_t height, int64_t row_bytes, int64_t bpp, int filter) {
  // Contiguous rows: the pitch is the row length.
  png_device::png_filter_rows<T>(reinterpret_cast<const uint8_t*>(rows), row_bytes, out, height,
                                 row_bytes, bpp, filter);
}

template <typename T>
void launch_png_filter(const PngFilterPlan& plan, at::Tensor& out) {
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const int64_t blocks = std::min<int64_t>(plan.height, sm_count() * 16);
  png_filter_kernel<T><<<blocks, kRowThreads, 0, stream>>>(
      plan.image.const_data_ptr<T>(), out.mutable_data_ptr<uint8_t>(), plan.height,
      plan.row_bytes, plan.bpp, plan.filter);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

at::Tensor png_filter_cuda(const at::Tensor& image, int64_t filter) {
  const c10::cuda::CUDAGuard guard(image.device());
  const PngFilterPlan plan = prepare_png_filter(image, filter);
  at::Tensor out = at::empty({plan.height, plan.row_bytes + 1}, image.options().dtype(at::kByte));
  if (plan.height == 0) {
    return out;
  }
  dispatch<PngTypes>(plan.image.scalar_type(), "png_filter", [&](auto tag) {
    launch_png_filter<typename decltype(tag)::type>(plan, out);
  });
  return out;
}

}  // namespace
}  // namespace cuda

TORCH_LIBRARY_IMPL(imgops, CUDA, m) { m.impl("png_filter", &cuda::png_filter_cuda); }

}  // namespace imgops
