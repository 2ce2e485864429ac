#include "lumen/model/lora.h"
#include "lumen/core/route.h"

#include <vector>

namespace lumen::model {

LUMEN_ROUTE(
    lora_unmerged,
    {.node = "lora.apply",
     .name = "unmerged",
     .tier = Tier::kL2,
     .oracle = "PEFT (torch float64) logits of the same adapter",
     .bound = "the logit bound of golden_test.cc",
     .tests =
         "Adapter/AdapterPeft.TorchAdapterGivesGoldenLogits/*;AdapterRoundTrip.HfModelBitIdentical",
     .when = "adapter=on",
     .priority = 10});

void ApplyLora(const LoraMatrix& l, const float* x, int64_t T, int64_t ldx, float* y, int64_t ldy,
               ThreadPool* pool) {
  if (!l.valid() || T == 0) return;
  const int r = l.rank;
  auto rows = [&](int64_t b, int64_t e, int) {
    std::vector<float> u(r);
    for (int64_t t = b; t < e; ++t) {
      const float* xt = x + t * ldx;
      for (int j = 0; j < r; ++j) {
        const float* aj = l.a + int64_t(j) * l.k;
        float acc = 0;
        for (int64_t k = 0; k < l.k; ++k) acc += aj[k] * xt[k];
        u[j] = acc;
      }
      float* yt = y + t * ldy;
      for (int64_t n = 0; n < l.n; ++n) {
        const float* bn = l.b + n * r;
        float acc = 0;
        for (int j = 0; j < r; ++j) acc += bn[j] * u[j];
        yt[n] += l.scale * acc;
      }
    }
  };
  if (pool && T > 1)
    pool->ParallelFor(T, rows);
  else
    rows(0, T, 0);
}

void ApplyLoraRows(const LoraMatrix& l, std::span<const int64_t> rows,
                   std::span<const float> weights, const float* x, int64_t ldx, float* y,
                   int64_t ldy, float* u, ThreadPool* pool) {
  const int64_t R = static_cast<int64_t>(rows.size());
  if (!l.valid() || R == 0) return;
  const int r = l.rank;
  // Decode has few rows: split by (row, rank) for A x and by output column
  // for B u, so every thread has work; neither split changes any sum's order.
  auto down = [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t row = i / r;
      const int j = static_cast<int>(i % r);
      const float* xt = x + rows[row] * ldx;
      const float* aj = l.a + int64_t(j) * l.k;
      float acc = 0;
      for (int64_t k = 0; k < l.k; ++k) acc += aj[k] * xt[k];
      u[row * r + j] = acc;
    }
  };
  auto up = [&](int64_t b, int64_t e, int) {
    for (int64_t i = 0; i < R; ++i) {
      const float s = l.scale * weights[i];
      const float* ui = u + i * r;
      float* yt = y + rows[i] * ldy;
      for (int64_t n = b; n < e; ++n) {
        const float* bn = l.b + n * r;
        float acc = 0;
        for (int j = 0; j < r; ++j) acc += bn[j] * ui[j];
        yt[n] += s * acc;
      }
    }
  };
  // A decode row's update is ~r (K + N) multiply-adds: below a few hundred
  // thousand a thread hand-off costs more than it saves.
  constexpr int64_t kParallelWork = int64_t(1) << 18;
  if (pool && R * r * (l.k + l.n) >= kParallelWork) {
    pool->ParallelFor(R * r, down, 4);
    pool->ParallelFor(l.n, up, 64);
  } else {
    down(0, R * r, 0);
    up(0, l.n, 0);
  }
}

}  // namespace lumen::model
