#include "lumen/core/thread_pool.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>

namespace lumen {
namespace {

// Polls pred up to kSpinIters times (a few hundred microseconds on x86) with
// a CPU pause between polls, yielding every kYieldEvery polls so an
// oversubscribed pool (more threads than free cores) hands the core to the
// thread it waits for. 1024 polls (~25 us) let the workers fall asleep
// between some of a decode step's calls: 16384 made 2-thread Q4_0 decode of a
// Llama-3.2-1B 11-14% faster on the 2-core Xeon KVM guest (21.0-22.0 against
// 23.9-24.5 tok/s, interleaved; docs/reference/performance.md, session 7).
constexpr int kSpinIters = 16384;
constexpr int kYieldEvery = 64;

template <class Pred>
bool Spin(Pred pred) {
  for (int i = 1; i <= kSpinIters; ++i) {
    if (pred()) return true;
    if (i % kYieldEvery == 0) {
      std::this_thread::yield();
    } else {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
  }
  return pred();
}

}  // namespace

int ThreadPool::DefaultThreads() {
  if (const char* e = std::getenv("LUMEN_THREADS")) {
    const int n = std::atoi(e);
    if (n > 0 && n <= 1024) return n;
  }
  const long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

ThreadPool::ThreadPool(int num_threads) : chunks_(std::max(1, num_threads)) {
  const int n = std::max(1, num_threads);
  for (int i = 1; i < n; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true, std::memory_order_release);
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  for (;;) {
    auto ready = [&] {
      return stop_.load(std::memory_order_acquire) ||
             generation_.load(std::memory_order_acquire) != seen;
    };
    if (!Spin(ready)) {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, ready);
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = generation_.load(std::memory_order_acquire);
    Share(index);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mu_);
      done_cv_.notify_one();
    }
  }
}

void ThreadPool::Share(int index) {
  if (split_ == Split::kStealing) return ShareStealing(index);
  if (split_ == Split::kStatic) {
    const int64_t begin = std::min(n_, index * chunk_);
    const int64_t end = std::min(n_, begin + chunk_);
    if (begin < end) (*fn_)(begin, end, index);
    return;
  }
  for (;;) {
    const int64_t begin = next_.fetch_add(chunk_, std::memory_order_relaxed);
    if (begin >= n_) return;
    (*fn_)(begin, std::min(n_, begin + chunk_), index);
  }
}

namespace {

constexpr uint64_t Pack(uint64_t front, uint64_t back) { return front | back << 32; }
constexpr uint64_t Front(uint64_t u) { return u & 0xffffffffu; }
constexpr uint64_t Back(uint64_t u) { return u >> 32; }

}  // namespace

void ThreadPool::ShareStealing(int index) {
  auto run = [&](uint64_t u0, uint64_t u1) {
    (*fn_)(int64_t(u0) * grain_, std::min(n_, int64_t(u1) * grain_), index);
  };
  std::atomic<uint64_t>& mine = chunks_[index].units;
  uint64_t cur = mine.load(std::memory_order_relaxed);
  while (Front(cur) < Back(cur)) {
    const uint64_t left = Back(cur) - Front(cur);
    const uint64_t take = std::min<uint64_t>(
        left, std::max<uint64_t>(left / 2, static_cast<uint64_t>(kMinPieceUnits)));
    if (!mine.compare_exchange_weak(cur, Pack(Front(cur) + take, Back(cur)),
                                    std::memory_order_relaxed))
      continue;  // cur reloaded: another thread took a unit from the back
    run(Front(cur), Front(cur) + take);
    cur = mine.load(std::memory_order_relaxed);
  }
  for (int v = 1; v < size(); ++v) {
    std::atomic<uint64_t>& theirs = chunks_[(index + v) % size()].units;
    uint64_t t = theirs.load(std::memory_order_relaxed);
    while (Front(t) < Back(t)) {
      if (!theirs.compare_exchange_weak(t, Pack(Front(t), Back(t) - 1), std::memory_order_relaxed))
        continue;
      run(Back(t) - 1, Back(t));
      t = theirs.load(std::memory_order_relaxed);
    }
  }
}

void ThreadPool::ParallelFor(int64_t n, const Fn& fn, int64_t grain) {
  Run(n, fn, grain, Split::kStatic);
}

void ThreadPool::ParallelForDynamic(int64_t n, const Fn& fn, int64_t grain) {
  Run(n, fn, grain, Split::kDynamic);
}

void ThreadPool::ParallelForStealing(int64_t n, const Fn& fn, int64_t grain) {
  Run(n, fn, grain, Split::kStealing);
}

void ThreadPool::Run(int64_t n, const Fn& fn, int64_t grain, Split split) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t units = (n + grain - 1) / grain;
  if (workers_.empty() || units == 1) {
    fn(0, n, 0);
    return;
  }
  if (split == Split::kStealing && units >= (int64_t{1} << 32)) split = Split::kStatic;
  const int64_t per = (units + size() - 1) / size();  // units per chunk
  const int64_t chunk = split == Split::kDynamic ? grain : per * grain;
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t0 = Clock::now();
  if (last_end_ != Clock::time_point{})
    stats_.between_s += std::chrono::duration<double>(t0 - last_end_).count();
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    n_ = n;
    chunk_ = chunk;
    grain_ = grain;
    split_ = split;
    next_.store(0, std::memory_order_relaxed);
    if (split == Split::kStealing)
      for (int i = 0; i < size(); ++i)
        chunks_[i].units.store(Pack(std::min(units, i * per), std::min(units, (i + 1) * per)),
                               std::memory_order_relaxed);
    pending_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
  }
  start_cv_.notify_all();
  Share(0);
  const Clock::time_point t1 = Clock::now();
  auto done = [&] { return pending_.load(std::memory_order_acquire) == 0; };
  if (!Spin(done)) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, done);
  }
  last_end_ = Clock::now();
  ++stats_.calls;
  stats_.own_s += std::chrono::duration<double>(t1 - t0).count();
  stats_.wait_s += std::chrono::duration<double>(last_end_ - t1).count();
}

}  // namespace lumen
