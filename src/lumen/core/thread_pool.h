// ThreadPool: a fixed set of workers for data-parallel loops.
//
// ParallelFor(n, fn) splits [0, n) into one contiguous chunk per thread and calls
// fn(begin, end, thread_index); the caller's thread takes chunk 0, so a pool of
// size 1 runs inline with no synchronization. ParallelForDynamic instead hands
// out grain-sized units first come, first served; ParallelForStealing keeps the
// chunks but lets a thread that is done take units from the end of another's.
// Size defaults to LUMEN_THREADS or the number of online CPUs. Not reentrant:
// fn must not call ParallelFor.
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

  // ParallelFor's chunks, each run from its front in a few long calls (half
  // of what is left, at least kMinPieceUnits units), while a thread done with
  // its own takes single units from the back of one still running. For work
  // that streams memory (a decode step's products: one long run per thread is
  // what the prefetchers want) on a machine where one thread can fall behind
  // the others for a while; the same restriction as ParallelForDynamic.
  void ParallelForStealing(int64_t n, const Fn& fn, int64_t grain);
  static constexpr int64_t kMinPieceUnits = 2;

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
  enum class Split { kStatic, kDynamic, kStealing };
  void Run(int64_t n, const Fn& fn, int64_t grain, Split split);
  // This thread's share of the current call: its chunk, units taken from
  // next_, or its chunk's pieces and then units stolen from the others'.
  void Share(int index);
  void ShareStealing(int index);
  // A chunk's units not yet taken, [front, back) packed as front | back << 32:
  // its owner takes pieces from the front, others single units from the back,
  // each by one compare-exchange, so no unit is taken twice.
  struct alignas(64) Chunk {
    std::atomic<uint64_t> units{0};
  };

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  const Fn* fn_ = nullptr;
  int64_t n_ = 0, chunk_ = 0, grain_ = 1;
  Split split_ = Split::kStatic;  // kDynamic: chunk_ is the unit
  std::atomic<int64_t> next_{0};  // the next unit's first index (dynamic)
  std::vector<Chunk> chunks_;     // one per thread (stealing)
  // Written under mu_ (so sleepers cannot miss a change); read lock-free by
  // spinners. fn_, n_, chunk_, grain_, split_, next_ and chunks_ are published
  // by the release of generation_.
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  Stats stats_;
  std::chrono::steady_clock::time_point last_end_{};  // of the last counted call
};

// fn over [0, n): split across pool by `how` (ParallelFor, ParallelForDynamic
// or ParallelForStealing) in multiples of grain when there is a pool and n
// reaches min_n, else fn(0, n, 0) inline on the caller's thread.
using PoolSplit = void (ThreadPool::*)(int64_t, const ThreadPool::Fn&, int64_t);
inline void ParallelOrInline(ThreadPool* pool, int64_t n, int64_t min_n, int64_t grain,
                             const ThreadPool::Fn& fn, PoolSplit how = &ThreadPool::ParallelFor) {
  if (pool && n >= min_n) return (pool->*how)(n, fn, grain);
  fn(0, n, 0);
}

}  // namespace lumen
