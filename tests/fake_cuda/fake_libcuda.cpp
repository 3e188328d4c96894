// A stand-in for libcuda for tests/test_cuda_driver.py on machines without a GPU: the driver
// functions imgops.engine.cuda_driver declares, over host memory. "Device" memory is malloc'd,
// copies are memcpy, and cuLaunchKernel runs the engine kernels' CPU equivalents (bt601.h's
// luma_int, png_filter.h's filter, png_deflate_emulated.h's stages) on the launch's own
// parameters, so the tests check what ctypes passes (64-bit pointers, pitches, parameter order
// and types, grid and block sizes) and the Python wrapper's logic. The CUDA kernels
// themselves are tested on a GPU.
//
// Built by the test: c++ -shared -fPIC -std=c++17 -I csrc fake_libcuda.cpp -o libfakecuda.so
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <stdexcept>

#include "bt601.h"
#include "standalone/png_deflate_emulated.h"
#include "standalone/png_filter.h"

namespace {

constexpr int kSuccess = 0;
constexpr int kInvalidValue = 1;
constexpr int kOutOfMemory = 2;
constexpr int kInvalidDevice = 101;
constexpr int kInvalidImage = 200;
constexpr int kInvalidContext = 201;
constexpr int kInvalidHandle = 400;
constexpr int kNotFound = 500;
constexpr int kNotReady = 600;

constexpr uint64_t kTotalMemory = 80ull << 30;
constexpr uint64_t kMaxAlloc = kTotalMemory;  // larger requests fail with out of memory
void* const kContext = reinterpret_cast<void*>(0x7c0000001000ull);
void* const kPool = reinterpret_cast<void*>(0x7c0000002000ull);
void* const kModule = reinterpret_cast<void*>(0x7c0000003000ull);
void* const kGray = reinterpret_cast<void*>(0x7c0000004000ull);
void* const kPngFilter = reinterpret_cast<void*>(0x7c0000005000ull);
// png_deflate_kernels.cuh's five kernels, run as png_deflate_emulated.h's stages
constexpr int kDeflateStages = 5;
const char* const kDeflateNames[kDeflateStages] = {
    "imgops_png_deflate_breaks", "imgops_png_deflate_sample", "imgops_png_deflate_count",
    "imgops_png_deflate_plan", "imgops_png_deflate_write"};
void* const kDeflate[kDeflateStages] = {
    reinterpret_cast<void*>(0x7c0000006000ull), reinterpret_cast<void*>(0x7c0000007000ull),
    reinterpret_cast<void*>(0x7c0000008000ull), reinterpret_cast<void*>(0x7c0000009000ull),
    reinterpret_cast<void*>(0x7c000000a000ull)};

bool g_initialized = false;
void* g_current = nullptr;
int g_retained = 0;

struct Handle {
  int kind;  // 1 stream, 2 event
  int recorded;
};

int check_handle(void* h, int kind) {
  if (h == nullptr || static_cast<Handle*>(h)->kind != kind) return kInvalidHandle;
  return kSuccess;
}

int need_context() {
  if (!g_initialized) return 3;  // CUDA_ERROR_NOT_INITIALIZED
  return g_current == kContext ? kSuccess : kInvalidContext;
}

}  // namespace

extern "C" {

// Counters the tests read (through ctypes) to see what the wrapper did.
int fake_ctx_set_current_calls = 0;
int fake_launches = 0;
unsigned fake_last_grid[3] = {0, 0, 0};
unsigned fake_last_block[3] = {0, 0, 0};
uint64_t fake_last_threshold = 0;
int fake_internal_dependencies = 1;  // CUDA's default
int fake_live_allocations = 0;

int cuInit(unsigned flags) {
  if (flags != 0) return kInvalidValue;
  g_initialized = true;
  return kSuccess;
}

int cuGetErrorName(int code, const char** out) {
  switch (code) {
    case 0: *out = "CUDA_SUCCESS"; return kSuccess;
    case 1: *out = "CUDA_ERROR_INVALID_VALUE"; return kSuccess;
    case 2: *out = "CUDA_ERROR_OUT_OF_MEMORY"; return kSuccess;
    case 201: *out = "CUDA_ERROR_INVALID_CONTEXT"; return kSuccess;
    case 400: *out = "CUDA_ERROR_INVALID_HANDLE"; return kSuccess;
    case 500: *out = "CUDA_ERROR_NOT_FOUND"; return kSuccess;
    case 600: *out = "CUDA_ERROR_NOT_READY"; return kSuccess;
    default: *out = nullptr; return kInvalidValue;
  }
}

int cuGetErrorString(int code, const char** out) {
  switch (code) {
    case 0: *out = "no error"; return kSuccess;
    case 1: *out = "invalid argument"; return kSuccess;
    case 2: *out = "out of memory"; return kSuccess;
    case 201: *out = "invalid device context"; return kSuccess;
    case 400: *out = "invalid resource handle"; return kSuccess;
    case 500: *out = "named symbol not found"; return kSuccess;
    case 600: *out = "device not ready"; return kSuccess;
    default: *out = nullptr; return kInvalidValue;
  }
}

int cuDeviceGetCount(int* count) {
  if (!g_initialized) return 3;
  *count = 1;
  return kSuccess;
}

int cuDeviceGet(int* device, int ordinal) {
  if (!g_initialized) return 3;
  if (ordinal != 0) return kInvalidDevice;
  *device = 0;
  return kSuccess;
}

int cuDeviceGetName(char* name, int len, int device) {
  if (device != 0) return kInvalidDevice;
  std::strncpy(name, "Fake CUDA Device", static_cast<size_t>(len));
  return kSuccess;
}

int cuDeviceTotalMem_v2(size_t* bytes, int device) {
  if (device != 0) return kInvalidDevice;
  *bytes = kTotalMemory;
  return kSuccess;
}

int cuDeviceGetAttribute(int* value, int attribute, int device) {
  if (device != 0) return kInvalidDevice;
  if (attribute != 16) return kInvalidValue;  // only the multiprocessor count
  *value = 3;
  return kSuccess;
}

int cuDevicePrimaryCtxRetain(void** context, int device) {
  if (device != 0) return kInvalidDevice;
  ++g_retained;
  *context = kContext;
  return kSuccess;
}

int cuDevicePrimaryCtxRelease_v2(int device) {
  if (device != 0 || g_retained == 0) return kInvalidDevice;
  --g_retained;
  return kSuccess;
}

int cuCtxSetCurrent(void* context) {
  ++fake_ctx_set_current_calls;
  if (context != kContext && context != nullptr) return kInvalidContext;
  g_current = context;
  return kSuccess;
}

int cuMemGetInfo_v2(size_t* free_bytes, size_t* total) {
  if (int e = need_context()) return e;
  *free_bytes = kTotalMemory / 2;
  *total = kTotalMemory;
  return kSuccess;
}

int cuStreamCreate(void** stream, unsigned flags) {
  if (int e = need_context()) return e;
  if (flags != 1) return kInvalidValue;  // the wrapper always asks for a non-blocking stream
  *stream = new Handle{1, 0};
  return kSuccess;
}

int cuStreamSynchronize(void* stream) { return check_handle(stream, 1); }

int cuStreamDestroy_v2(void* stream) {
  if (int e = check_handle(stream, 1)) return e;
  static_cast<Handle*>(stream)->kind = 0;
  delete static_cast<Handle*>(stream);
  return kSuccess;
}

int cuEventCreate(void** event, unsigned flags) {
  if (int e = need_context()) return e;
  if ((flags & 2u) == 0) return kInvalidValue;  // timing disabled
  *event = new Handle{2, 0};
  return kSuccess;
}

int cuEventRecord(void* event, void* stream) {
  if (int e = check_handle(event, 2)) return e;
  if (int e = check_handle(stream, 1)) return e;
  static_cast<Handle*>(event)->recorded = 1;
  return kSuccess;
}

int cuEventSynchronize(void* event) { return check_handle(event, 2); }

int cuStreamWaitEvent(void* stream, void* event, unsigned flags) {
  if (int e = check_handle(stream, 1)) return e;
  if (int e = check_handle(event, 2)) return e;
  return flags == 0 ? kSuccess : kInvalidValue;
}

int cuEventQuery(void* event) {
  if (int e = check_handle(event, 2)) return e;
  return static_cast<Handle*>(event)->recorded ? kSuccess : kNotReady;
}

int cuEventDestroy_v2(void* event) {
  if (int e = check_handle(event, 2)) return e;
  static_cast<Handle*>(event)->kind = 0;
  delete static_cast<Handle*>(event);
  return kSuccess;
}

int cuDeviceGetDefaultMemPool(void** pool, int device) {
  if (device != 0) return kInvalidDevice;
  *pool = kPool;
  return kSuccess;
}

int cuMemPoolSetAttribute(void* pool, int attribute, void* value) {
  if (pool != kPool || value == nullptr) return kInvalidValue;
  if (attribute == 3) {  // CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: an int, 0 or 1
    int allowed = *static_cast<int*>(value);
    if (allowed != 0 && allowed != 1) return kInvalidValue;
    fake_internal_dependencies = allowed;
    return kSuccess;
  }
  if (attribute != 4) return kInvalidValue;
  fake_last_threshold = *static_cast<uint64_t*>(value);
  return kSuccess;
}

int cuMemPoolTrimTo(void* pool, size_t /*keep*/) { return pool == kPool ? kSuccess : kInvalidValue; }

int cuMemAllocAsync(unsigned long long* ptr, size_t bytes, void* stream) {
  if (int e = need_context()) return e;
  if (int e = check_handle(stream, 1)) return e;
  if (bytes == 0) return kInvalidValue;
  if (bytes > kMaxAlloc) return kOutOfMemory;
  void* p = std::malloc(bytes);
  if (p == nullptr) return kOutOfMemory;
  ++fake_live_allocations;
  *ptr = reinterpret_cast<uintptr_t>(p);
  return kSuccess;
}

int cuMemFreeAsync(unsigned long long ptr, void* stream) {
  if (int e = check_handle(stream, 1)) return e;
  --fake_live_allocations;
  std::free(reinterpret_cast<void*>(static_cast<uintptr_t>(ptr)));
  return kSuccess;
}

int cuMemHostAlloc(void** ptr, size_t bytes, unsigned flags) {
  if (int e = need_context()) return e;
  if (bytes == 0 || flags != 1) return kInvalidValue;
  *ptr = std::malloc(bytes);
  return *ptr ? kSuccess : kOutOfMemory;
}

int cuMemFreeHost(void* ptr) {
  std::free(ptr);
  return kSuccess;
}

int cuMemcpyDtoHAsync_v2(void* dst, unsigned long long src, size_t bytes, void* stream) {
  if (int e = check_handle(stream, 1)) return e;
  std::memcpy(dst, reinterpret_cast<const void*>(static_cast<uintptr_t>(src)), bytes);
  return kSuccess;
}

int cuMemsetD8Async(unsigned long long dst, unsigned char value, size_t bytes, void* stream) {
  if (int e = check_handle(stream, 1)) return e;
  std::memset(reinterpret_cast<void*>(static_cast<uintptr_t>(dst)), value, bytes);
  return kSuccess;
}

int cuMemcpyHtoDAsync_v2(unsigned long long dst, const void* src, size_t bytes, void* stream) {
  if (int e = check_handle(stream, 1)) return e;
  std::memcpy(reinterpret_cast<void*>(static_cast<uintptr_t>(dst)), src, bytes);
  return kSuccess;
}

int cuModuleLoadData(void** module, const void* image) {
  if (int e = need_context()) return e;
  uint32_t magic = 0;
  std::memcpy(&magic, image, 4);
  if (magic != 0xBA55ED50u) return kInvalidImage;  // a fatbin starts with this
  *module = kModule;
  return kSuccess;
}

int cuModuleGetFunction(void** function, void* module, const char* name) {
  if (module != kModule) return kInvalidHandle;
  if (std::strcmp(name, "imgops_gray_u8") == 0) {
    *function = kGray;
  } else if (std::strcmp(name, "imgops_png_filter_u8") == 0) {
    *function = kPngFilter;
  } else {
    for (int i = 0; i < kDeflateStages; ++i) {
      if (std::strcmp(name, kDeflateNames[i]) == 0) {
        *function = kDeflate[i];
        return kSuccess;
      }
    }
    return kNotFound;
  }
  return kSuccess;
}

int cuModuleUnload(void* module) { return module == kModule ? kSuccess : kInvalidHandle; }

int cuLaunchKernel(void* function, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                   unsigned by, unsigned bz, unsigned shared, void* stream, void** params,
                   void** extra) {
  if (int e = need_context()) return e;
  if (int e = check_handle(stream, 1)) return e;
  if (gx == 0 || gy == 0 || gz != 1 || bx == 0 || bx > 1024 || by != 1 || bz != 1 ||
      shared != 0 || extra != nullptr || params == nullptr) {
    return kInvalidValue;
  }
  if (gy > 65535) return kInvalidValue;
  ++fake_launches;
  fake_last_grid[0] = gx, fake_last_grid[1] = gy, fake_last_grid[2] = gz;
  fake_last_block[0] = bx, fake_last_block[1] = by, fake_last_block[2] = bz;
  if (function == kGray) {
    const auto* src = *static_cast<const uint8_t* const*>(params[0]);
    const long long src_pitch = *static_cast<const long long*>(params[1]);
    auto* dst = *static_cast<uint8_t* const*>(params[2]);
    const long long dst_pitch = *static_cast<const long long*>(params[3]);
    const long long width = *static_cast<const long long*>(params[4]);
    const long long height = *static_cast<const long long*>(params[5]);
    const int bgr = *static_cast<const int*>(params[6]);
    // The grid must cover every pixel once per grid-stride step: a thread per column at least.
    if (static_cast<long long>(gx) * bx < width && gx != 0x7fffffffu) return kInvalidValue;
    for (long long y = 0; y < height; ++y) {
      for (long long x = 0; x < width; ++x) {
        const uint8_t* p = src + y * src_pitch + 3 * x;
        dst[y * dst_pitch + x] = static_cast<uint8_t>(
            imgops::luma_int(p[bgr ? 2 : 0], p[1], p[bgr ? 0 : 2]));
      }
    }
    return kSuccess;
  }
  if (function == kPngFilter) {
    if (bx != 256 || gy != 1) return kInvalidValue;  // the kernel's fixed block shape
    const auto* src = *static_cast<const uint8_t* const*>(params[0]);
    const long long src_pitch = *static_cast<const long long*>(params[1]);
    const long long row_bytes = *static_cast<const long long*>(params[2]);
    const long long height = *static_cast<const long long*>(params[3]);
    const int bpp = *static_cast<const int*>(params[4]);
    const int filter = *static_cast<const int*>(params[5]);
    auto* out = *static_cast<uint8_t* const*>(params[6]);
    std::vector<uint8_t> zeros(static_cast<size_t>(row_bytes), 0);
    for (long long y = 0; y < height; ++y) {
      const uint8_t* up = y == 0 ? zeros.data() : src + (y - 1) * src_pitch;
      imgops::png::filter_one_row(up, src + y * src_pitch, out + y * (row_bytes + 1), row_bytes,
                                  bpp, filter);
    }
    return kSuccess;
  }
  for (int stage = 0; stage < kDeflateStages; ++stage) {
    if (function != kDeflate[stage]) continue;
    // the kernels' block sizes (png_deflate_kernels.cuh)
    const unsigned threads[kDeflateStages] = {512, 128, 512, 1, 512};
    if (bx != threads[stage] || gy != 1) return kInvalidValue;
    const auto* rows = *static_cast<const uint8_t* const*>(params[0]);
    const long long row = *static_cast<const long long*>(params[1]);
    const long long height = *static_cast<const long long*>(params[2]);
    auto* base = *static_cast<uint8_t* const*>(params[3]);
    if (row < 1 || height < 1) return kInvalidValue;
    namespace em = imgops::png::emulated;
    const em::Workspace ws{imgops::png::parallel::layout(row, height), base};
    // (checked per launch: a store over bits an earlier launch wrote still fails)
    em::WordWriters writers(ws.words(), static_cast<size_t>(ws.l.out_bytes / 4), true);
    try {
      if (stage == 0) em::find_breaks(rows, ws);
      if (stage == 1) em::sample_and_fit(rows, ws);
      if (stage == 2) em::count(rows, ws);
      if (stage == 3) em::plan(ws, writers);
      if (stage == 4) em::write(rows, ws, writers);
    } catch (const std::logic_error&) {
      return 719;  // CUDA_ERROR_LAUNCH_FAILED
    }
    return kSuccess;
  }
  return kInvalidHandle;
}

}  // extern "C"
