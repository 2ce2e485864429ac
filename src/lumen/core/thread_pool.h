// ThreadPool: a fixed set of workers for data-parallel loops.
//
// ParallelFor(n, fn) splits [0, n) into one contiguous chunk per thread and calls
// fn(begin, end, thread_index); the caller's thread takes chunk 0, so a pool of
// size 1 runs inline with no synchronization. ParallelForDynamic instead hands
// out grain-sized units first come, first served. Size defaults to LUMEN_THREADS or
// the number of online CPUs. Not reentrant: fn must not call ParallelFor.
// A decode step makes ~100 ParallelFor calls a few hundred microseconds apart,
// so workers and the caller spin briefly (bounded, a few hundred microseconds)
// before sleeping on a condition variable: a futex wake-up per call was a fixed
// cost per token.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace lumen {

class ThreadPool {
 public:
  using Fn = std::function<void(int64_t begin, int64_t end, int thread)>;

  explicit ThreadPool(int num_threads = DefaultThreads());
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn over [0, n) in up to size() chunks; chunk boundaries are multiples
  // of `grain` (except the last) so SIMD kernels keep aligned tiles.
  void ParallelFor(int64_t n, const Fn& fn, int64_t grain = 1);

  // Calls fn over [0, n) in units of `grain` (the last may be shorter) that the
  // threads take first come, first served, so a thread slowed by the machine
  // (a busy sibling, a stolen vCPU) takes fewer. Which thread runs which unit
  // varies between calls: only for work whose results do not depend on it
  // (thread indexes per-thread scratch only).
  void ParallelForDynamic(int64_t n, const Fn& fn, int64_t grain);

  // LUMEN_THREADS if set and valid, else the online CPU count.
  static int DefaultThreads();

  // Where the calling thread's time went in the ParallelFor calls that
  // reached the workers, since construction or ResetStats: in its own chunk,
  // waiting for the workers to finish theirs, and between one call's end and
  // the next one's start (its serial work). For `lumen bench`; read and reset
  // from the thread that calls ParallelFor.
  struct Stats {
    int64_t calls = 0;
    double own_s = 0, wait_s = 0, between_s = 0;
  };
  const Stats& stats() const { return stats_; }
  void ResetStats() {
    stats_ = {};
    last_end_ = {};
  }

 private:
  void WorkerLoop(int index);
  void Run(int64_t n, const Fn& fn, int64_t grain, bool dynamic);
  // This thread's share of the current call: its chunk, or units taken from next_.
  void Share(int index);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  const Fn* fn_ = nullptr;
  int64_t n_ = 0, chunk_ = 0;
  bool dynamic_ = false;          // chunk_ is then the unit
  std::atomic<int64_t> next_{0};  // the next unit's first index (dynamic)
  // Written under mu_ (so sleepers cannot miss a change); read lock-free by
  // spinners. fn_, n_, chunk_, dynamic_ and next_ are published by the release of
  // generation_.
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  Stats stats_;
  std::chrono::steady_clock::time_point last_end_{};  // of the last counted call
};

}  // namespace lumen
