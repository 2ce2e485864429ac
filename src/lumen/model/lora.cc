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

}  // namespace lumen::model
