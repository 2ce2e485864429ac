// Perplexity of a token sequence under a model, by strided windows (the rule
// of Hugging Face's "Perplexity of fixed-length models" guide), and the
// divergence of a model's next-token distributions from a base model's on the
// same windows (how llama.cpp's --kl-divergence judges a quantization).
//
// Windows: begin = 0, S, 2S, ... (S = stride, default ctx / 2); window k holds
// tokens [begin, end = min(begin + ctx, N)) evaluated from position 0 of a
// fresh KV cache (no BOS is inserted: the sequence's own first token, usually
// BOS, starts only the first window). Window k scores the targets in
// [max(prev_end, begin + 1), end), where prev_end is the previous window's end
// (0 for the first): target t is predicted by the logits at t - 1 of the same
// window. With S < ctx every token except the first is scored exactly once,
// with at least ctx - S tokens of context after the first window; with S = ctx
// the windows are disjoint and the first token of each is context only (as in
// mlx-lm's perplexity, which scores disjoint sequences of ctx tokens). The
// loop stops after the window that reaches N.
//
// Results: nll = mean over scored targets of -log p(target); PPL = exp(nll);
// its standard error by the delta method, as llama.cpp and mlx-lm report it:
// se(nll) = sqrt(var / (n - 1)) with var = mean(nll^2) - nll^2 (the sample
// standard deviation over sqrt(n)), se(PPL) = PPL * se(nll).
//
// With a base model: KL(base || model) = sum_v p_base(v) log(p_base(v) / p(v))
// at every scored position (mean, its standard error, max), the fraction of
// positions whose argmax agrees (ties: the lowest id), and the base's own PPL.
//
// Example (cli/perplexity.cc):
//   auto r = Perplexity(*model, ids, {.ctx = 512}, base.get(), progress);
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "lumen/core/status.h"
#include "lumen/engine/model.h"

namespace lumen::eval {

struct PerplexityOptions {
  int64_t ctx = 0;     // window length; 0: the model's context capped at 512
  int64_t stride = 0;  // 0: ctx / 2 (at least 1); must be in [1, ctx]
  int64_t batch = 0;   // tokens per forward call; 0: model::kMaxChunk
  DType kv_dtype = DType::kF16;
  static constexpr int64_t kDefaultCtx = 512;
};

struct PerplexityResult {
  int64_t ctx = 0, stride = 0, windows = 0;
  int64_t scored = 0;  // targets scored (N - 1 for N tokens)
  double nll = 0, nll_se = 0;
  double ppl = 0, ppl_se = 0;
  // With a base model (has_base):
  bool has_base = false;
  double base_ppl = 0, base_ppl_se = 0;
  double kl_mean = 0, kl_se = 0, kl_max = 0;  // KL(base || model), nats per position
  double top1 = 0;                            // fraction of positions whose argmax agrees
};

// Called after each window: windows done, windows in all, the running result.
using PerplexityProgress =
    std::function<void(int64_t done, int64_t total, const PerplexityResult& running)>;

// `tokens` needs at least 2 ids, each inside the model's vocabulary; `base`
// (optional) must have the same vocabulary size.
Result<PerplexityResult> Perplexity(const engine::Model& model, std::span<const int32_t> tokens,
                                    const PerplexityOptions& opts,
                                    const engine::Model* base = nullptr,
                                    const PerplexityProgress& progress = {});

}  // namespace lumen::eval
