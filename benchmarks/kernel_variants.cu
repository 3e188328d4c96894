// Kernel design experiments for issue #4, outside torch so that each variant builds in seconds:
// RGB uint8 -> gray (8192 x 8192) and uint16 -> float32 normalisation (256 x 1024 x 1024), each
// variant timed with CUDA events (median of 30, inputs rotated beyond L2) next to a device copy,
// and checked bit for bit against a plain one-value-per-thread kernel. Not part of the package:
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 benchmarks/kernel_variants.cu \
//        -o /tmp/kernel_variants && /tmp/kernel_variants
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <type_traits>
#include <vector>

#define CHECK(call)                                                                    \
  do {                                                                                 \
    cudaError_t err_ = (call);                                                         \
    if (err_ != cudaSuccess) {                                                         \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(err_)); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

constexpr int kThreads = 256;

__device__ __forceinline__ uint8_t luma(uint32_t r, uint32_t g, uint32_t b) {
  return static_cast<uint8_t>((299 * r + 587 * g + 114 * b + 500) / 1000);
}

// 16 pixels from 48 bytes held as three uint4.
__device__ __forceinline__ uint4 gray16(const uint4 (&w)[3]) {
  const uint8_t* p = reinterpret_cast<const uint8_t*>(w);
  uint4 y;
  uint8_t* q = reinterpret_cast<uint8_t*>(&y);
#pragma unroll
  for (int i = 0; i < 16; ++i) q[i] = luma(p[3 * i], p[3 * i + 1], p[3 * i + 2]);
  return y;
}

__global__ void gray_naive(const uint8_t* in, uint8_t* out, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = luma(in[3 * i], in[3 * i + 1], in[3 * i + 2]);
}

// A: each thread 48 contiguous bytes (three uint4), unroll U, grid-stride (the shipped kernel).
template <int U, bool kStreaming = false>
__global__ void gray_thread48(const uint4* in, uint4* out, int64_t groups) {
  const int64_t total = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t g0 = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g0 < groups;
       g0 += total * U) {
    uint4 w[U][3];
#pragma unroll
    for (int k = 0; k < U; ++k) {
      const int64_t g = g0 + k * total;
      if (g < groups)
        for (int j = 0; j < 3; ++j) w[k][j] = __ldg(in + 3 * g + j);
    }
#pragma unroll
    for (int k = 0; k < U; ++k) {
      const int64_t g = g0 + k * total;
      if (g < groups) {
        if (kStreaming) {
          __stcs(out + g, gray16(w[k]));
        } else {
          out[g] = gray16(w[k]);
        }
      }
    }
  }
}

// B: a warp loads its 32 groups (1536 bytes) as three fully coalesced uint4 rounds, transposes
// them through shared memory so each lane holds its own 48 bytes, and stores 16 coalesced
// bytes per lane. U tiles per warp in flight; grid-stride over tiles or one pass (kStride).
template <int U, bool kStride>
__global__ void gray_warp_tile(const uint4* in, uint4* out, int64_t tiles) {
  __shared__ uint4 smem[kThreads / 32][96];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int64_t warps_total = static_cast<int64_t>(gridDim.x) * (kThreads / 32);
  const int64_t first = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + warp;
  for (int64_t t0 = first * (kStride ? 1 : U); t0 < tiles;
       t0 += kStride ? warps_total * U : tiles) {
    uint4 w[U][3];
#pragma unroll
    for (int k = 0; k < U; ++k) {
      const int64_t t = kStride ? t0 + k * warps_total : t0 + k;
      if (t < tiles)
        for (int j = 0; j < 3; ++j) w[k][j] = __ldg(in + t * 96 + j * 32 + lane);
    }
#pragma unroll
    for (int k = 0; k < U; ++k) {
      const int64_t t = kStride ? t0 + k * warps_total : t0 + k;
      if (t < tiles) {
        for (int j = 0; j < 3; ++j) smem[warp][j * 32 + lane] = w[k][j];
        __syncwarp();
        uint4 mine[3];
        for (int j = 0; j < 3; ++j) mine[j] = smem[warp][3 * lane + j];
        __syncwarp();
        out[t * 32 + lane] = gray16(mine);
      }
    }
    if (!kStride) break;
  }
}

__global__ void norm_naive(const uint16_t* in, float* out, int64_t n, float lo, float range) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __fdiv_rn(__fadd_rn(static_cast<float>(in[i]), -lo), range);
}

struct Div {
  float lo, range, inv;
  __device__ __forceinline__ float operator()(uint16_t x, bool recip) const {
    const float d = __fadd_rn(static_cast<float>(x), -lo);
    if (!recip) return __fdiv_rn(d, range);
    const float q = __fmul_rn(d, inv);           // within 1 ulp of d / range
    const float r = __fmaf_rn(-q, range, d);      // exact remainder
    return __fmaf_rn(r, inv, q);                  // Markstein: correctly rounded
  }
};

// Normalise V values per thread per step (V = 4: 8-byte loads; V = 8: 16-byte loads), U steps in
// flight, grid-stride or one pass.
template <int V, int U, bool kStride, bool kRecip, bool kStreaming = false>
__global__ void norm_vec(const uint16_t* in, float* out, int64_t groups, Div div) {
  using Load = typename std::conditional<V == 4, uint2, uint4>::type;
  const int64_t total = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t start = kStride ? static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x
                                : static_cast<int64_t>(blockIdx.x) * blockDim.x * U + threadIdx.x;
  const int64_t step = kStride ? total : blockDim.x;
  for (int64_t g0 = start; g0 < groups; g0 += kStride ? total * U : groups) {
    Load w[U];
#pragma unroll
    for (int k = 0; k < U; ++k) {
      const int64_t g = g0 + k * step;
      if (g < groups) w[k] = __ldg(reinterpret_cast<const Load*>(in) + g);
    }
#pragma unroll
    for (int k = 0; k < U; ++k) {
      const int64_t g = g0 + k * step;
      if (g < groups) {
        const uint16_t* x = reinterpret_cast<const uint16_t*>(&w[k]);
        float4* o = reinterpret_cast<float4*>(out) + g * (V / 4);
#pragma unroll
        for (int h = 0; h < V / 4; ++h) {
          const float4 v = make_float4(div(x[4 * h], kRecip), div(x[4 * h + 1], kRecip),
                                       div(x[4 * h + 2], kRecip), div(x[4 * h + 3], kRecip));
          if (kStreaming) {
            __stcs(o + h, v);  // evict-first: the output is not read again
          } else {
            o[h] = v;
          }
        }
      }
    }
    if (!kStride) break;
  }
}

__global__ void copy_vec(const uint4* in, uint4* out, int64_t n) {
  const int64_t total = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += total)
    out[i] = __ldg(in + i);
}

static float median_ms(const std::function<void(int)>& fn, int rotate) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) fn(i % rotate);
  CHECK(cudaDeviceSynchronize());
  std::vector<float> t;
  for (int i = 0; i < 30; ++i) {
    CHECK(cudaEventRecord(a));
    fn(i % rotate);
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  CHECK(cudaGetLastError());
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

static int sms() {
  int n;
  CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, 0));
  return n;
}

static int64_t grid(int64_t items, int per_sm) {
  return std::max<int64_t>(1, std::min<int64_t>((items + kThreads - 1) / kThreads,
                                                static_cast<int64_t>(sms()) * per_sm));
}

static void row(const char* name, float ms, double bytes, double copy_gbs, bool exact) {
  const double gbs = bytes / ms / 1e6;
  std::printf("%-44s %8.3f ms %8.1f GB/s %6.1f%% of copy %s\n", name, ms, gbs,
              copy_gbs > 0 ? 100 * gbs / copy_gbs : 100.0, exact ? "exact" : "MISMATCH");
}

int main() {
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs\n", prop.name, prop.multiProcessorCount);
  const int R = 3;
  const int64_t pixels = 8192LL * 8192;
  const int64_t rgb_bytes = 3 * pixels;
  std::vector<uint8_t*> rgb(R);
  uint8_t *gray_ref, *gray_out;
  std::vector<uint8_t> host(rgb_bytes);
  srand(1);
  for (auto& v : host) v = static_cast<uint8_t>(rand());
  for (auto& p : rgb) {
    CHECK(cudaMalloc(&p, rgb_bytes));
    CHECK(cudaMemcpy(p, host.data(), rgb_bytes, cudaMemcpyHostToDevice));
  }
  CHECK(cudaMalloc(&gray_ref, pixels));
  CHECK(cudaMalloc(&gray_out, pixels));
  uint8_t* copy_dst;
  CHECK(cudaMalloc(&copy_dst, rgb_bytes));

  const float memcpy_ms = median_ms(
      [&](int r) { CHECK(cudaMemcpyAsync(copy_dst, rgb[r], rgb_bytes, cudaMemcpyDeviceToDevice)); },
      R);
  const double copy_gbs = 2.0 * rgb_bytes / memcpy_ms / 1e6;
  row("cudaMemcpy D2D 192 MiB", memcpy_ms, 2.0 * rgb_bytes, copy_gbs, true);
  for (int per_sm : {8, 16, 32}) {
    char name[64];
    std::snprintf(name, sizeof name, "copy kernel uint4, %d blocks/SM", per_sm);
    const int64_t n = rgb_bytes / 16;
    row(name, median_ms([&](int r) {
          copy_vec<<<grid(n, per_sm), kThreads>>>(reinterpret_cast<const uint4*>(rgb[r]),
                                                   reinterpret_cast<uint4*>(copy_dst), n);
        }, R),
        2.0 * rgb_bytes, copy_gbs, true);
  }

  gray_naive<<<(pixels + kThreads - 1) / kThreads, kThreads>>>(rgb[0], gray_ref, pixels);
  std::vector<uint8_t> ref(pixels), got(pixels);
  CHECK(cudaMemcpy(ref.data(), gray_ref, pixels, cudaMemcpyDeviceToHost));
  const double gray_bytes = rgb_bytes + pixels;
  auto check_gray = [&]() {
    CHECK(cudaMemset(gray_out, 0, pixels));
    return [&]() {
      CHECK(cudaMemcpy(got.data(), gray_out, pixels, cudaMemcpyDeviceToHost));
      return got == ref;
    };
  };
  auto gray_case = [&](const char* name, const std::function<void(int)>& launch) {
    auto verify = check_gray();
    launch(0);
    const bool exact = verify();
    row(name, median_ms(launch, R), gray_bytes, copy_gbs, exact);
  };
  const int64_t groups = pixels / 16;
  const int64_t tiles = groups / 32;
  gray_case("gray naive 1 px/thread", [&](int r) {
    gray_naive<<<(pixels + kThreads - 1) / kThreads, kThreads>>>(rgb[r], gray_out, pixels);
  });
  auto in4 = [&](int r) { return reinterpret_cast<const uint4*>(rgb[r]); };
  auto out4 = reinterpret_cast<uint4*>(gray_out);
  for (int per_sm : {8, 16}) {
    char name[64];
    std::snprintf(name, sizeof name, "gray thread48 U2 stride %d/SM (shipped)", per_sm);
    gray_case(name, [&](int r) {
      gray_thread48<2><<<grid(groups, per_sm), kThreads>>>(in4(r), out4, groups);
    });
  }
  gray_case("gray thread48 U1 one pass", [&](int r) {
    gray_thread48<1><<<(groups + kThreads - 1) / kThreads, kThreads>>>(in4(r), out4, groups);
  });
  gray_case("gray thread48 U1 one pass, streaming stores", [&](int r) {
    gray_thread48<1, true><<<(groups + kThreads - 1) / kThreads, kThreads>>>(in4(r), out4, groups);
  });
  for (int threads : {128, 512}) {
    char name[64];
    std::snprintf(name, sizeof name, "gray thread48 U1 one pass, %d threads/block", threads);
    gray_case(name, [&](int r) {
      gray_thread48<1><<<(groups + threads - 1) / threads, threads>>>(in4(r), out4, groups);
    });
  }
  const int64_t warps_per_block = kThreads / 32;
  for (int per_sm : {8, 16}) {
    char name[64];
    std::snprintf(name, sizeof name, "gray warp-tile U1 stride %d/SM", per_sm);
    gray_case(name, [&](int r) {
      gray_warp_tile<1, true><<<grid(groups, per_sm), kThreads>>>(in4(r), out4, tiles);
    });
    std::snprintf(name, sizeof name, "gray warp-tile U2 stride %d/SM", per_sm);
    gray_case(name, [&](int r) {
      gray_warp_tile<2, true><<<grid(groups, per_sm), kThreads>>>(in4(r), out4, tiles);
    });
  }
  gray_case("gray warp-tile U1 one pass", [&](int r) {
    gray_warp_tile<1, false>
        <<<(tiles + warps_per_block - 1) / warps_per_block, kThreads>>>(in4(r), out4, tiles);
  });
  gray_case("gray warp-tile U2 one pass", [&](int r) {
    gray_warp_tile<2, false>
        <<<(tiles + 2 * warps_per_block - 1) / (2 * warps_per_block), kThreads>>>(in4(r), out4,
                                                                                   tiles);
  });
  gray_case("gray warp-tile U4 one pass", [&](int r) {
    gray_warp_tile<4, false>
        <<<(tiles + 4 * warps_per_block - 1) / (4 * warps_per_block), kThreads>>>(in4(r), out4,
                                                                                   tiles);
  });
  for (auto& p : rgb) CHECK(cudaFree(p));
  CHECK(cudaFree(copy_dst));

  // uint16 -> float32
  const int64_t n = 256LL * 1024 * 1024;
  std::vector<uint16_t*> vol(2);
  std::vector<uint16_t> hv(n);
  for (auto& v : hv) v = static_cast<uint16_t>(rand() & 4095);
  for (auto& p : vol) {
    CHECK(cudaMalloc(&p, n * 2));
    CHECK(cudaMemcpy(p, hv.data(), n * 2, cudaMemcpyHostToDevice));
  }
  float *nref, *nout;
  CHECK(cudaMalloc(&nref, n * 4));
  CHECK(cudaMalloc(&nout, n * 4));
  std::vector<float> nr(n), ng(n);
  const double norm_bytes = 6.0 * n;
  bool all_recip_exact = true;
  for (float range : {4095.0f, 1000.0f, 3.0f, 4094.5f, 65535.0f, 7.0f, 1234.5678f}) {
    Div div{0.5f, range, 1.0f / range};
    norm_naive<<<(n + kThreads - 1) / kThreads, kThreads>>>(vol[0], nref, n, div.lo, range);
    CHECK(cudaMemcpy(nr.data(), nref, n * 4, cudaMemcpyDeviceToHost));
    norm_vec<8, 2, false, true><<<(n / 8 + 2 * kThreads - 1) / (2 * kThreads), kThreads>>>(
        vol[0], nout, n / 8, div);
    CHECK(cudaMemcpy(ng.data(), nout, n * 4, cudaMemcpyDeviceToHost));
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += std::memcmp(&nr[i], &ng[i], 4) != 0;
    std::printf("reciprocal+fma vs division, range %.4f: %lld of %lld differ\n", range,
                static_cast<long long>(bad), static_cast<long long>(n));
    all_recip_exact = all_recip_exact && bad == 0;
  }
  Div div{0.5f, 4095.0f, 1.0f / 4095.0f};
  norm_naive<<<(n + kThreads - 1) / kThreads, kThreads>>>(vol[0], nref, n, div.lo, div.range);
  CHECK(cudaMemcpy(nr.data(), nref, n * 4, cudaMemcpyDeviceToHost));
  auto norm_case = [&](const char* name, const std::function<void(int)>& launch) {
    CHECK(cudaMemset(nout, 0, n * 4));
    launch(0);
    CHECK(cudaMemcpy(ng.data(), nout, n * 4, cudaMemcpyDeviceToHost));
    const bool exact = std::memcmp(nr.data(), ng.data(), n * 4) == 0;
    row(name, median_ms(launch, 2), norm_bytes, copy_gbs, exact);
  };
  norm_case("norm naive 1 value/thread", [&](int r) {
    norm_naive<<<(n + kThreads - 1) / kThreads, kThreads>>>(vol[r], nout, n, div.lo, div.range);
  });
  norm_case("norm V4 U4 stride 8/SM div (shipped)", [&](int r) {
    norm_vec<4, 4, true, false><<<grid(n / 4, 8), kThreads>>>(vol[r], nout, n / 4, div);
  });
  norm_case("norm V4 U4 stride 8/SM recip", [&](int r) {
    norm_vec<4, 4, true, true><<<grid(n / 4, 8), kThreads>>>(vol[r], nout, n / 4, div);
  });
  norm_case("norm V8 U2 stride 8/SM div", [&](int r) {
    norm_vec<8, 2, true, false><<<grid(n / 8, 8), kThreads>>>(vol[r], nout, n / 8, div);
  });
  norm_case("norm V8 U2 stride 16/SM recip", [&](int r) {
    norm_vec<8, 2, true, true><<<grid(n / 8, 16), kThreads>>>(vol[r], nout, n / 8, div);
  });
  norm_case("norm V4 U1 one pass div", [&](int r) {
    norm_vec<4, 1, false, false>
        <<<(n / 4 + kThreads - 1) / kThreads, kThreads>>>(vol[r], nout, n / 4, div);
  });
  norm_case("norm V4 U4 one pass div", [&](int r) {
    norm_vec<4, 4, false, false>
        <<<(n / 4 + 4 * kThreads - 1) / (4 * kThreads), kThreads>>>(vol[r], nout, n / 4, div);
  });
  norm_case("norm V8 U1 one pass div", [&](int r) {
    norm_vec<8, 1, false, false>
        <<<(n / 8 + kThreads - 1) / kThreads, kThreads>>>(vol[r], nout, n / 8, div);
  });
  norm_case("norm V8 U2 one pass div", [&](int r) {
    norm_vec<8, 2, false, false>
        <<<(n / 8 + 2 * kThreads - 1) / (2 * kThreads), kThreads>>>(vol[r], nout, n / 8, div);
  });
  norm_case("norm V8 U2 one pass recip", [&](int r) {
    norm_vec<8, 2, false, true>
        <<<(n / 8 + 2 * kThreads - 1) / (2 * kThreads), kThreads>>>(vol[r], nout, n / 8, div);
  });
  norm_case("norm V4 U4 one pass recip", [&](int r) {
    norm_vec<4, 4, false, true>
        <<<(n / 4 + 4 * kThreads - 1) / (4 * kThreads), kThreads>>>(vol[r], nout, n / 4, div);
  });
  norm_case("norm V4 U1 one pass div, streaming stores", [&](int r) {
    norm_vec<4, 1, false, false, true>
        <<<(n / 4 + kThreads - 1) / kThreads, kThreads>>>(vol[r], nout, n / 4, div);
  });
  for (int threads : {128, 512, 1024}) {
    char name[64];
    std::snprintf(name, sizeof name, "norm V4 U1 one pass div, %d threads/block", threads);
    norm_case(name, [&](int r) {
      norm_vec<4, 1, false, false>
          <<<(n / 4 + threads - 1) / threads, threads>>>(vol[r], nout, n / 4, div);
    });
  }
  norm_case("norm V4 U2 one pass div, streaming stores", [&](int r) {
    norm_vec<4, 2, false, false, true>
        <<<(n / 4 + 2 * kThreads - 1) / (2 * kThreads), kThreads>>>(vol[r], nout, n / 4, div);
  });
  std::printf("reciprocal+fma exact on all ranges tried: %s\n", all_recip_exact ? "yes" : "NO");
  return 0;
}
