// The torch-free CUDA engine's device work for many images in one call each (the GIL released,
// so the device thread stops contending for it with the prep and encode threads between every
// launch), the same launches, in the same order, that imgops.engine.driver and the op queue one
// Python call at a time:
// - queue_gray: each colour image's gray output allocated and the luma kernel launched;
// - queue_png_tail: for each image, the PNG row filter kernel, then the device deflate
//   (png_deflate_kernels.cuh's five kernels) on a side stream, and the copies of the zlib
//   stream and of its length into the image's pinned buffer, laid out as the PNG file
//   (png_encode.h's kHeadBytes first);
// - queue_frees: a batch's device memory freed in stream order.
//
// No CUDA header: the driver's functions come as addresses (the libcuda that
// imgops.engine.cuda_driver loaded, or the tests' stand-in), the kernels as CUfunction handles
// from that module's cuModuleGetFunction, the streams and the event as handles. The calling
// thread must have the context current.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "png_deflate_parallel.h"
#include "png_encode.h"

namespace imgops {
namespace device {

using MemAllocAsync = int (*)(unsigned long long*, size_t, void*);
using MemFreeAsync = int (*)(unsigned long long, void*);
using LaunchKernel = int (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, void*, void**, void**);
using MemsetD8Async = int (*)(unsigned long long, unsigned char, size_t, void*);
using MemcpyDtoHAsync = int (*)(void*, unsigned long long, size_t, void*);
using EventRecord = int (*)(void*, void*);
using StreamWaitEvent = int (*)(void*, void*, unsigned);

// The driver functions and the kernels, in the order of imgops.engine.native_batch's table.
struct Driver {
  MemAllocAsync alloc = nullptr;
  MemFreeAsync free = nullptr;
  LaunchKernel launch = nullptr;
  MemsetD8Async memset = nullptr;
  MemcpyDtoHAsync copy_to_host = nullptr;
  EventRecord record = nullptr;
  StreamWaitEvent wait = nullptr;
  void* gray = nullptr;
  void* png_filter = nullptr;
  void* deflate[5] = {nullptr, nullptr, nullptr, nullptr, nullptr};
  int64_t multiprocessors = 1;
};
constexpr int kTableEntries = 15;  // the fields of Driver above, each one int64

// One image: 8-bit rows in device memory, and the pinned buffer its PNG file is laid out in
// (at least png_file_bytes(layout.out_bytes) + 8 bytes).
struct Image {
  uint64_t src = 0;
  int64_t pitch = 0;      // bytes between row starts
  int64_t row_bytes = 0;  // width * channels
  int64_t height = 0;     // >= 1
  int64_t bpp = 0;        // bytes per pixel (channels), 1..8
  uint64_t pinned = 0;    // host address
};
constexpr int kImageFields = 6;

// The first driver call that failed (code 0: none) and the device memory the batch still owns
// (allocated, not yet queued for freeing): the caller synchronizes, then frees it.
struct Outcome {
  int code = 0;
  const char* call = "";
  std::vector<uint64_t> owned;
};

// One colour image for queue_gray: interleaved 3-channel rows in device memory.
struct ColourImage {
  uint64_t src = 0;
  int64_t pitch = 0;  // bytes between row starts, >= 3 * width
  int64_t width = 0;
  int64_t height = 0;
  int64_t bgr = 0;  // 1: the channels are B, G, R
};
constexpr int kColourFields = 5;

// The kernels' block sizes (engine_kernels.cu, png_filter_kernel.cuh, png_deflate_kernels.cuh)
// and their grids, as imgops.engine.cuda_driver.Kernels launches them.
constexpr unsigned kGrayThreads = 256;
constexpr int64_t kMaxGridX = 0x7FFFFFFF;
constexpr int64_t kMaxGridY = 65535;
constexpr unsigned kFilterThreads = 256;
constexpr unsigned kDeflateBlockThreads = 512;
constexpr unsigned kDeflateSampleThreads = 128;

inline unsigned clamp_grid(int64_t wanted, int64_t most) {
  const int64_t grid = wanted < most ? wanted : most;
  return static_cast<unsigned>(grid < 1 ? 1 : grid);
}

// Queues, on `stream`, each image's gray output (width * height bytes, packed, from the
// stream-ordered pool; at least 1 byte) and the luma kernel that fills it. Outcome::owned holds
// every output allocated, in image order: on success one per image, the outputs.
inline Outcome queue_gray(const Driver& d, const ColourImage* images, size_t count,
                          void* stream) {
  Outcome done;
  for (size_t i = 0; i < count; ++i) {
    const ColourImage& image = images[i];
    unsigned long long out = 0;
    const int64_t bytes = image.width * image.height;
    if (int e = d.alloc(&out, static_cast<size_t>(bytes > 0 ? bytes : 1), stream)) {
      done.code = e;
      done.call = "cuMemAllocAsync";
      return done;
    }
    done.owned.push_back(out);
    if (image.width == 0 || image.height == 0) continue;
    // one thread per pixel across (blocks no wider than the row), one block row per image row
    // up to the grid's limit; the kernel's grid-stride loops cover the rest
    const int64_t rounded = (image.width + 31) / 32 * 32;
    const unsigned threads = static_cast<unsigned>(rounded < kGrayThreads ? rounded : kGrayThreads);
    const unsigned grid_x = clamp_grid((image.width + threads - 1) / threads, kMaxGridX);
    const unsigned grid_y = clamp_grid(image.height, kMaxGridY);
    unsigned long long src = image.src, dst = out;
    long long src_pitch = image.pitch, dst_pitch = image.width;
    long long width = image.width, height = image.height;
    int bgr = image.bgr ? 1 : 0;
    void* params[] = {&src, &src_pitch, &dst, &dst_pitch, &width, &height, &bgr};
    if (int e = d.launch(d.gray, grid_x, grid_y, 1, threads, 1, 1, 0, stream, params, nullptr)) {
      done.code = e;
      done.call = "cuLaunchKernel imgops_gray_u8";
      return done;
    }
  }
  return done;
}

// Queues the PNG tail of every image (see the top of this file). `streams[0]` is the stage's
// stream: the filters run there, in image order; image i deflates on
// streams[1 + (first + i) % (stream_count - 1)] (on streams[0] when stream_count is 1) once
// its rows are filtered, and its rows and workspace are freed on that stream after the copies.
// With `join`, streams[0] then waits for every side stream (a batch queued in several calls
// joins in its last). `event` is recorded and waited for as often as needed
// (cuStreamWaitEvent takes the record made before it).
inline Outcome queue_png_tail(const Driver& d, const Image* images, size_t count, int filter,
                              void* const* streams, size_t stream_count, void* event,
                              size_t first, bool join) {
  Outcome done;
  auto fail = [&](int code, const char* call) {
    done.code = code;
    done.call = call;
    return done;
  };
  void* const stage = streams[0];
  const size_t sides = stream_count - 1;
  const int64_t most = d.multiprocessors * 16;
  for (size_t i = 0; i < count; ++i) {
    const Image& image = images[i];
    const int64_t row = image.row_bytes + 1;
    unsigned long long rows = 0;
    if (int e = d.alloc(&rows, static_cast<size_t>(row * image.height), stage)) {
      return fail(e, "cuMemAllocAsync");
    }
    done.owned.push_back(rows);
    {
      unsigned long long src = image.src;
      long long pitch = image.pitch, row_bytes = image.row_bytes, height = image.height;
      int bpp = static_cast<int>(image.bpp), code = filter;
      unsigned long long dst = rows;
      void* params[] = {&src, &pitch, &row_bytes, &height, &bpp, &code, &dst};
      if (int e = d.launch(d.png_filter, clamp_grid(image.height, most), 1, 1, kFilterThreads, 1,
                           1, 0, stage, params, nullptr)) {
        return fail(e, "cuLaunchKernel imgops_png_filter_u8");
      }
    }
    const png::parallel::Layout l = png::parallel::layout(row, image.height);
    unsigned long long work = 0;
    if (int e = d.alloc(&work, static_cast<size_t>(l.total), stage)) {
      return fail(e, "cuMemAllocAsync");
    }
    done.owned.push_back(work);
    void* const stream = streams[sides ? 1 + (first + i) % sides : 0];
    if (stream != stage) {  // the side stream starts once the rows are filtered
      if (int e = d.record(event, stage)) return fail(e, "cuEventRecord");
      if (int e = d.wait(stream, event, 0)) return fail(e, "cuStreamWaitEvent");
    }
    if (int e = d.memset(work, 0, static_cast<size_t>(l.total), stream)) {
      return fail(e, "cuMemsetD8Async");
    }
    unsigned long long rows_arg = rows, work_arg = work;
    long long row_arg = row, height_arg = image.height;
    void* params[] = {&rows_arg, &row_arg, &height_arg, &work_arg};
    const unsigned blocks = clamp_grid(l.g.blocks, most);
    const unsigned grids[5] = {blocks, clamp_grid(image.height / 4 + 9, most), blocks, 1, blocks};
    const unsigned threads[5] = {kDeflateBlockThreads, kDeflateSampleThreads,
                                 kDeflateBlockThreads, 1, kDeflateBlockThreads};
    static const char* const names[5] = {
        "cuLaunchKernel imgops_png_deflate_breaks", "cuLaunchKernel imgops_png_deflate_sample",
        "cuLaunchKernel imgops_png_deflate_count", "cuLaunchKernel imgops_png_deflate_plan",
        "cuLaunchKernel imgops_png_deflate_write"};
    for (int k = 0; k < 5; ++k) {
      if (int e = d.launch(d.deflate[k], grids[k], 1, 1, threads[k], 1, 1, 0, stream, params,
                           nullptr)) {
        return fail(e, names[k]);
      }
    }
    const size_t room = png::png_file_bytes(static_cast<size_t>(l.out_bytes));
    auto* pinned = reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(image.pinned));
    if (int e = d.copy_to_host(pinned + png::kHeadBytes, work + l.out,
                               static_cast<size_t>(l.out_bytes), stream)) {
      return fail(e, "cuMemcpyDtoHAsync_v2");
    }
    if (int e = d.copy_to_host(pinned + room, work + l.size, 8, stream)) {
      return fail(e, "cuMemcpyDtoHAsync_v2");
    }
    // freed in the order of the stream that read them last
    for (unsigned long long ptr : {work, rows}) {
      if (int e = d.free(ptr, stream)) return fail(e, "cuMemFreeAsync");
      done.owned.pop_back();  // (work, then rows: the two pushed last)
    }
  }
  for (size_t s = 1; join && s < stream_count; ++s) {  // the batch's event covers them
    if (int e = d.record(event, streams[s])) return fail(e, "cuEventRecord");
    if (int e = d.wait(stage, event, 0)) return fail(e, "cuStreamWaitEvent");
  }
  return done;
}

// Queues cuMemFreeAsync of each pointer (0: skipped) on `stream`, in order: a batch's memory
// given back in one call instead of one Python call each. A failure stops there; `owned` then
// holds the pointers not freed, the failed one first.
inline Outcome queue_frees(const Driver& d, const uint64_t* ptrs, size_t count, void* stream) {
  Outcome done;
  for (size_t i = 0; i < count; ++i) {
    if (ptrs[i] == 0) continue;
    if (int e = d.free(ptrs[i], stream)) {
      done.code = e;
      done.call = "cuMemFreeAsync";
      done.owned.assign(ptrs + i, ptrs + count);
      return done;
    }
  }
  return done;
}

}  // namespace device
}  // namespace imgops
