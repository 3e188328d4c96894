// imgops::parallel_for: at::parallel_for's contract (f(begin, end) over chunks of at least
// `grain` items, at most at::get_num_threads() of them) on every build.
//
// Why not at::parallel_for itself: with PyTorch's OpenMP backend it is header-only and keyed on
// _OPENMP, so in a file compiled without -fopenmp it silently runs the whole range on the
// calling thread. That is what left the second thread idle in rgb_to_gray: on 2 threads the
// calling thread did 100 % of the CPU work of a 4K frame, 55 % with this helper. Built with
// OpenMP (-fopenmp; or the native backend) this forwards to at::parallel_for; otherwise it runs
// the chunks on std::threads started per call, the first on the caller.
#pragma once

#include <ATen/Config.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace imgops {

template <typename F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
#if defined(_OPENMP) || AT_PARALLEL_NATIVE
  at::parallel_for(begin, end, grain, f);
#else
  if (begin >= end) {
    return;
  }
  const int64_t n = end - begin;
  const int64_t min_chunk = std::max<int64_t>(grain, 1);
  const int64_t tasks = std::min<int64_t>(at::get_num_threads(), (n + min_chunk - 1) / min_chunk);
  if (tasks <= 1 || at::in_parallel_region()) {
    f(begin, end);
    return;
  }
  const int64_t chunk = (n + tasks - 1) / tasks;
  std::exception_ptr error;
  std::mutex error_lock;
  auto run = [&](int64_t t) {
    const int64_t b = begin + t * chunk;
    if (b >= end) {
      return;
    }
    try {
      f(b, std::min(end, b + chunk));
    } catch (...) {
      const std::lock_guard<std::mutex> hold(error_lock);
      if (!error) {
        error = std::current_exception();
      }
    }
  };
  std::vector<std::thread> workers;
  workers.reserve(tasks - 1);
  for (int64_t t = 1; t < tasks; ++t) {
    workers.emplace_back(run, t);
  }
  run(0);
  for (auto& worker : workers) {
    worker.join();
  }
  if (error) {
    std::rethrow_exception(error);
  }
#endif
}

}  // namespace imgops
