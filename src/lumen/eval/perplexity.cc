#include "lumen/eval/perplexity.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "lumen/engine/session.h"
#include "lumen/kernels/vecmath.h"
#include "lumen/model/kv_cache.h"

namespace lumen::eval {
namespace {

// Running sums of a per-position quantity: mean and standard error of the mean.
struct Moments {
  double sum = 0, sum2 = 0;
  int64_t n = 0;
  void Add(double x) {
    sum += x;
    sum2 += x * x;
    ++n;
  }
  double Mean() const { return n ? sum / double(n) : 0; }
  double Se() const {
    if (n < 2) return 0;
    const double m = Mean();
    const double var = std::max(sum2 / double(n) - m * m, 0.0);
    return std::sqrt(var / double(n - 1));
  }
};

int64_t Argmax(const float* x, size_t n) { return std::max_element(x, x + n) - x; }

struct Window {
  int64_t begin, end, first_target;
};

std::vector<Window> Windows(int64_t n, int64_t ctx, int64_t stride) {
  std::vector<Window> w;
  int64_t prev_end = 0;
  for (int64_t begin = 0; begin < n; begin += stride) {
    const int64_t end = std::min(begin + ctx, n);
    w.push_back({begin, end, std::max(prev_end, begin + 1)});
    prev_end = end;
    if (end == n) break;
  }
  return w;
}

}  // namespace

Result<PerplexityResult> Perplexity(const engine::Model& model, std::span<const int32_t> tokens,
                                    const PerplexityOptions& opts, const engine::Model* base,
                                    const PerplexityProgress& progress) {
  const auto& c = model.config();
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n < 2)
    return Errorf("perplexity: the text has {} token(s); at least 2 are needed (one to predict)",
                  n);
  for (int64_t i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= c.vocab_size)
      return Errorf("perplexity: token {} at position {} is outside the vocabulary of {}",
                    tokens[i], i, c.vocab_size);
  if (base && base->config().vocab_size != c.vocab_size)
    return Errorf(
        "perplexity: --base has a vocabulary of {} tokens, the model {}; KL needs the same "
        "vocabulary",
        base->config().vocab_size, c.vocab_size);
  const int64_t ctx =
      opts.ctx > 0 ? opts.ctx : std::min<int64_t>(c.max_ctx, PerplexityOptions::kDefaultCtx);
  if (ctx < 2) return Errorf("perplexity: --ctx must be at least 2, got {}", ctx);
  const int64_t stride = opts.stride > 0 ? opts.stride : std::max<int64_t>(ctx / 2, 1);
  if (stride > ctx)
    return Errorf(
        "perplexity: --stride {} exceeds --ctx {} (tokens between windows would be skipped)",
        stride, ctx);
  const int64_t batch = opts.batch > 0 ? opts.batch : model::kMaxChunk;

  PerplexityResult r;
  r.ctx = ctx;
  r.stride = stride;
  r.has_base = base != nullptr;
  const auto windows = Windows(n, ctx, stride);
  const size_t V = static_cast<size_t>(c.vocab_size);
  Moments nll, base_nll, kl;
  int64_t agree = 0;
  std::vector<float> logits, base_logits, lp(V), lq(V);
  engine::SessionOptions so{.ctx = ctx, .kv_dtype = opts.kv_dtype};

  auto finish = [&] {
    r.scored = nll.n;
    r.nll = nll.Mean();
    r.nll_se = nll.Se();
    r.ppl = std::exp(r.nll);
    r.ppl_se = r.ppl * r.nll_se;
    if (base) {
      r.base_ppl = std::exp(base_nll.Mean());
      r.base_ppl_se = r.base_ppl * base_nll.Se();
      r.kl_mean = kl.Mean();
      r.kl_se = kl.Se();
      r.top1 = kl.n ? double(agree) / double(kl.n) : 0;
    }
  };

  for (size_t k = 0; k < windows.size(); ++k) {
    const Window& w = windows[k];
    LUMEN_ASSIGN_OR_RETURN(auto s, engine::Session::Create(model, so));
    std::unique_ptr<engine::Session> sb;
    if (base) {
      LUMEN_ASSIGN_OR_RETURN(sb, engine::Session::Create(*base, so));
    }
    // Positions whose logits are needed: t - 1 for targets t in [first_target, end).
    const int64_t need_from = w.first_target - 1;
    for (int64_t off = w.begin; off < w.end; off += batch) {
      const int64_t len = std::min(batch, w.end - off);
      const auto piece = tokens.subspan(size_t(off), size_t(len));
      const bool wanted = off + len > need_from;
      LUMEN_RETURN_IF_ERROR(s->Append(piece, wanted ? &logits : nullptr));
      if (base) LUMEN_RETURN_IF_ERROR(sb->Append(piece, wanted ? &base_logits : nullptr));
      if (!wanted) continue;
      for (int64_t p = std::max(off, need_from); p < off + len && p + 1 < w.end; ++p) {
        const float* row = logits.data() + size_t(p - off) * V;
        const int32_t target = tokens[size_t(p + 1)];
        kernels::LogSoftmax(row, V, lq.data());
        nll.Add(-double(lq[size_t(target)]));
        if (!base) continue;
        const float* brow = base_logits.data() + size_t(p - off) * V;
        kernels::LogSoftmax(brow, V, lp.data());
        base_nll.Add(-double(lp[size_t(target)]));
        double d = 0;
        for (size_t v = 0; v < V; ++v) d += std::exp(double(lp[v])) * (double(lp[v]) - lq[v]);
        d = std::max(d, 0.0);  // rounding can leave a tiny negative for equal rows
        kl.Add(d);
        r.kl_max = std::max(r.kl_max, d);
        agree += Argmax(row, V) == Argmax(brow, V);
      }
    }
    r.windows = int64_t(k) + 1;
    finish();
    if (progress) progress(r.windows, int64_t(windows.size()), r);
  }
  return r;
}

}  // namespace lumen::eval
