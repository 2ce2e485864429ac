// Training objectives over per-token log-probs (from the head): each returns
// the loss, its metrics and d loss / d logp per token, and never sees the
// model. Per sequence s: S_s = sum of its scored tokens' log-probs, n_s their
// count, A_s = S_s / n_s. Pairs (chosen w, rejected r) come from the batch.
//   sft:    token-mean NLL over the chosen sequences' scored tokens
//   dpo:    z = beta ((S_w - ref_w) - (S_r - ref_r)),
//           -(1 - ls) log sigmoid(z) - ls log sigmoid(-z)
//   orpo:   nll + lambda * -log sigmoid((A_w - A_r) - (log1mexp(A_w) - log1mexp(A_r)))
//   simpo:  -log sigmoid(beta (A_w - A_r) - gamma)
//   ipo:    ((A_w - refA_w) - (A_r - refA_r) - 1 / (2 beta))^2   (length-normalized, as TRL)
//   hinge:  max(0, 1 - beta ((S_w - ref_w) - (S_r - ref_r)))
// Pair losses are means over the batch's pairs. ref_* come from the base
// model (the adapter off), computed once per row by the trainer.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lumen/core/status.h"
#include "lumen/train/batch.h"

namespace lumen::train {

enum class Method { kSft, kDpo, kOrpo, kSimpo, kIpo, kHinge };
Result<Method> ParseMethod(std::string_view s);
std::string_view MethodName(Method m);
bool IsPreference(Method m);
bool NeedsReference(Method m);  // dpo, ipo, hinge

struct ObjectiveParams {
  double beta = 0.1;             // dpo, ipo, hinge; simpo's beta
  double gamma = 0.5;            // simpo
  double lambda = 0.1;           // orpo
  double label_smoothing = 0.0;  // dpo
};

// A preference pair of sequence indices in the batch, with the reference
// model's summed log-probs (used by dpo, ipo, hinge).
struct Pair {
  int chosen = -1, rejected = -1;
  double ref_chosen = 0, ref_rejected = 0;
};

struct ObjectiveResult {
  double loss = 0;
  double nll = 0;       // token-mean NLL of the chosen (or only) sequences
  double l_w = 0;       // mean over pairs of A_w (per-token mean log-prob)
  double l_r = 0;       // mean of A_r (preference methods)
  double margin = 0;    // mean of A_w - A_r
  double accuracy = 0;  // fraction of pairs the policy prefers correctly
  int pairs = 0;
  int tokens = 0;  // scored tokens
};

// numerically stable log(1 - exp(x)) for x < 0.
double Log1mExp(double x);

// sft: `pairs` lists the sequences in .chosen (rejected -1). dlogp [M] is
// overwritten.
template <class Real>
ObjectiveResult Objective(Method m, const ObjectiveParams& p, const PackedBatch& b,
                          const std::vector<Real>& logp, const std::vector<Pair>& pairs,
                          std::vector<Real>& dlogp);

}  // namespace lumen::train
