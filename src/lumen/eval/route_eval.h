// Quality of a kernel route against the exact one (issue 5's L3 rule: a route
// that breaks the L2 bounds reports its KL to the exact route over a prompt
// set). Continuations are sampled from the exact model at T = 1; the exact
// model then decodes prompt + continuation one token per forward, and the
// next-token distributions are compared at every continuation position with
// the route model's, which comes either
//   - kDecode: from decoding one token per forward too (every product has one
//     activation row: where the int8 route applies), or
//   - kPrefill: from one prefill of the whole sequence, every row's logits
//     kept (products with many rows: where the bf16 route applies).
//
// Example (cli/eval.cc): RouteKl(*exact, *int8, prompts, {.samples = 2}, RouteMode::kDecode).
#pragma once

#include <span>

#include "lumen/core/status.h"
#include "lumen/engine/model.h"
#include "lumen/eval/sampling_eval.h"

namespace lumen::eval {

struct RouteResult {
  double kl_mean = 0;  // mean KL(exact || route) per position, nats
  double kl_max = 0;
  double top1 = 0;  // fraction of positions where both argmaxes agree
  int64_t positions = 0;
};

enum class RouteMode { kDecode, kPrefill };

// `exact` and `route` must be the same weights (loaded with different routes).
Result<RouteResult> RouteKl(const engine::Model& exact, const engine::Model& route,
                            std::span<const Seq> prompts, const EvalOptions& opts,
                            RouteMode mode = RouteMode::kDecode);

}  // namespace lumen::eval
