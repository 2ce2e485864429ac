#include "lumen/core/thread_pool.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>

namespace lumen {

int ThreadPool::DefaultThreads() {
  if (const char* e = std::getenv("LUMEN_THREADS")) {
    const int n = std::atoi(e);
    if (n > 0 && n <= 1024) return n;
  }
  const long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

ThreadPool::ThreadPool(int num_threads) {
  const int n = std::max(1, num_threads);
  for (int i = 1; i < n; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  for (;;) {
    const Fn* fn;
    int64_t begin, end;
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      fn = fn_;
      begin = std::min(n_, index * chunk_);
      end = std::min(n_, begin + chunk_);
    }
    if (begin < end) (*fn)(begin, end, index);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
}

void ThreadPool::ParallelFor(int64_t n, const Fn& fn, int64_t grain) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t units = (n + grain - 1) / grain;
  if (workers_.empty() || units == 1) {
    fn(0, n, 0);
    return;
  }
  const int64_t chunk = (units + size() - 1) / size() * grain;
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    n_ = n;
    chunk_ = chunk;
    pending_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  start_cv_.notify_all();
  fn(0, std::min(n, chunk), 0);
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return pending_ == 0; });
}

}  // namespace lumen
