#include "lumen/eval/route_eval.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "lumen/engine/session.h"
#include "lumen/kernels/vecmath.h"

namespace lumen::eval {
namespace {

// Appends ids one at a time; logits of every step go to `out` ([n, V]).
Status DecodeOneByOne(engine::Session& s, std::span<const int32_t> ids, std::vector<float>& out) {
  std::vector<float> step;
  for (const int32_t& id : ids) {
    LUMEN_RETURN_IF_ERROR(s.Append(std::span(&id, 1), &step));
    out.insert(out.end(), step.begin(), step.end());
  }
  return Status::Ok();
}

}  // namespace

Result<RouteResult> RouteKl(const engine::Model& exact, const engine::Model& route,
                            std::span<const Seq> prompts, const EvalOptions& opts, RouteMode mode) {
  if (exact.config().vocab_size != route.config().vocab_size)
    return Error("eval route: the two models have different vocabularies");
  LUMEN_ASSIGN_OR_RETURN(auto conts, BaseContinuations(exact, prompts, opts));
  const size_t V = static_cast<size_t>(exact.config().vocab_size);
  RouteResult r;
  std::vector<float> lp(V), lq(V);
  int64_t agree = 0;
  for (size_t p = 0; p < prompts.size(); ++p)
    for (const Seq& cont : conts[p]) {
      if (cont.empty()) continue;
      Seq all = prompts[p];
      all.insert(all.end(), cont.begin(), cont.end() - 1);  // the last token predicts nothing
      std::vector<float> le, lr;
      LUMEN_ASSIGN_OR_RETURN(auto se, engine::Session::Create(exact, {}));
      LUMEN_RETURN_IF_ERROR(DecodeOneByOne(*se, all, le));
      LUMEN_ASSIGN_OR_RETURN(auto sr, engine::Session::Create(route, {}));
      if (mode == RouteMode::kPrefill) {
        LUMEN_RETURN_IF_ERROR(sr->Append(all, &lr));  // every row's logits from one prefill
      } else {
        LUMEN_RETURN_IF_ERROR(DecodeOneByOne(*sr, all, lr));
      }
      // Row i predicts token i + 1; continuation positions start at the last prompt token.
      for (size_t i = prompts[p].size() - 1; i < all.size(); ++i) {
        const float* e = le.data() + i * V;
        const float* q = lr.data() + i * V;
        kernels::LogSoftmax(e, V, lp.data());
        kernels::LogSoftmax(q, V, lq.data());
        double kl = 0;
        for (size_t v = 0; v < V; ++v) kl += std::exp(double(lp[v])) * (double(lp[v]) - lq[v]);
        kl = std::max(kl, 0.0);  // rounding can leave a tiny negative for equal rows
        r.kl_mean += kl;
        r.kl_max = std::max(r.kl_max, kl);
        agree += std::max_element(e, e + V) - e == std::max_element(q, q + V) - q;
        ++r.positions;
      }
    }
  if (r.positions > 0) {
    r.kl_mean /= static_cast<double>(r.positions);
    r.top1 = static_cast<double>(agree) / static_cast<double>(r.positions);
  }
  return r;
}

}  // namespace lumen::eval
