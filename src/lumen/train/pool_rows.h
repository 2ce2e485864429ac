// RowsOnPool: fn(row, thread) for every row in [0, n), spread over the
// pool's threads in contiguous chunks (inline without a pool, one thread or
// one row). For the training code's per-row loops, whose rows are independent.
#pragma once

#include <cstdint>

#include "lumen/core/thread_pool.h"

namespace lumen::train {

template <class Fn>
void RowsOnPool(ThreadPool* pool, int64_t n, Fn&& fn) {
  if (!pool || pool->size() == 1 || n < 2) {
    for (int64_t r = 0; r < n; ++r) fn(r, 0);
    return;
  }
  pool->ParallelFor(n, [&](int64_t r0, int64_t r1, int tid) {
    for (int64_t r = r0; r < r1; ++r) fn(r, tid);
  });
}

}  // namespace lumen::train
