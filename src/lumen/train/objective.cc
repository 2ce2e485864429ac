#include "lumen/train/objective.h"
#include "lumen/core/route.h"

#include <cmath>

namespace lumen::train {

LUMEN_ROUTE(
    objective_closed_form,
    {.node = "train.loss",
     .name = "closed-form",
     .tier = Tier::kL2,
     .oracle = "finite differences in double; TRL-style torch float64 losses",
     .bound = "relative error below 1e-6 (double)",
     .tests =
         "Families/GradientCheck.EveryObjectiveMatchesFiniteDifferences/*;Golden/GoldenTrain.*",
     .priority = 10});

namespace {
constexpr std::string_view kNames[] = {"sft", "dpo", "orpo", "simpo", "ipo", "hinge"};

double LogSigmoid(double z) {
  return z >= 0 ? -std::log1p(std::exp(-z)) : z - std::log1p(std::exp(z));
}
double Sigmoid(double z) {
  return z >= 0 ? 1.0 / (1.0 + std::exp(-z)) : std::exp(z) / (1.0 + std::exp(z));
}
}  // namespace

Result<Method> ParseMethod(std::string_view s) {
  for (int i = 0; i < 6; ++i)
    if (s == kNames[i]) return Method(i);
  return Errorf("--method '{}': choose sft, dpo, orpo, simpo, ipo or hinge", s);
}
std::string_view MethodName(Method m) { return kNames[int(m)]; }
bool IsPreference(Method m) { return m != Method::kSft; }
bool NeedsReference(Method m) {
  return m == Method::kDpo || m == Method::kIpo || m == Method::kHinge;
}

double Log1mExp(double x) {
  // log(1 - e^x): log(-expm1(x)) near 0, log1p(-exp(x)) far from it.
  return x > -0.6931471805599453 ? std::log(-std::expm1(x)) : std::log1p(-std::exp(x));
}

template <class Real>
ObjectiveResult Objective(Method m, const ObjectiveParams& p, const PackedBatch& b,
                          const std::vector<Real>& logp, const std::vector<Pair>& pairs,
                          std::vector<Real>& dlogp) {
  const int nseq = b.sequences();
  // S: response tokens; N: every scored token (the NLL term's, which adds
  // prompt tokens under --sft-scope full).
  std::vector<double> S(nseq, 0.0), dS(nseq, 0.0), N(nseq, 0.0);
  for (int64_t i = 0; i < b.size(); ++i) {
    if (b.targets[i] < 0) continue;
    N[b.seq[i]] += double(logp[i]);
    if (!b.nll_only[i]) S[b.seq[i]] += double(logp[i]);
  }
  auto n = [&](int s) { return double(std::max(1, b.seq_loss_tokens[s])); };
  auto A = [&](int s) { return S[s] / n(s); };

  ObjectiveResult r;
  r.pairs = int(pairs.size());
  // NLL over the chosen sequences' tokens (sft, orpo).
  double chosen_tokens = 0, chosen_sum = 0;
  for (const Pair& pr : pairs) {
    chosen_tokens += b.seq_nll_tokens[pr.chosen];
    chosen_sum += N[pr.chosen];
  }
  r.tokens = int(chosen_tokens);
  r.nll = chosen_tokens > 0 ? -chosen_sum / chosen_tokens : 0.0;
  const double np = std::max<size_t>(1, pairs.size());
  std::vector<double> dN(nseq, 0.0);  // d loss / d N_s (every scored token of s)
  if (m == Method::kSft || m == Method::kOrpo) {
    r.loss = r.nll;
    for (const Pair& pr : pairs) dN[pr.chosen] += chosen_tokens > 0 ? -1.0 / chosen_tokens : 0.0;
  }
  for (const Pair& pr : pairs) {
    const int w = pr.chosen;
    r.l_w += A(w) / np;
    if (m == Method::kSft) continue;
    const int l = pr.rejected;
    r.tokens += b.seq_loss_tokens[l];
    r.l_r += A(l) / np;
    r.margin += (A(w) - A(l)) / np;
    double loss = 0, dw = 0, dl = 0;  // d loss / d S_w, d S_l
    bool correct = A(w) > A(l);
    switch (m) {
      case Method::kDpo: {
        const double h = (S[w] - pr.ref_chosen) - (S[l] - pr.ref_rejected);
        const double z = p.beta * h, ls = p.label_smoothing;
        loss = -(1 - ls) * LogSigmoid(z) - ls * LogSigmoid(-z);
        const double dz = -(1 - ls) * Sigmoid(-z) + ls * Sigmoid(z);
        dw = dz * p.beta;
        dl = -dz * p.beta;
        correct = h > 0;
        break;
      }
      case Method::kOrpo: {
        const double lo = (A(w) - A(l)) - (Log1mExp(A(w)) - Log1mExp(A(l)));
        loss = -p.lambda * LogSigmoid(lo);
        const double dlo = -p.lambda * Sigmoid(-lo);
        // d lo / d A = 1 + e^A / (1 - e^A) = 1 / (1 - e^A)
        const double gw = 1.0 / -std::expm1(A(w)), gl = 1.0 / -std::expm1(A(l));
        dw = dlo * gw / n(w);
        dl = -dlo * gl / n(l);
        break;
      }
      case Method::kSimpo: {
        const double z = p.beta * (A(w) - A(l)) - p.gamma;
        loss = -LogSigmoid(z);
        const double dz = -Sigmoid(-z);
        dw = dz * p.beta / n(w);
        dl = -dz * p.beta / n(l);
        break;
      }
      case Method::kIpo: {
        const double h = (A(w) - pr.ref_chosen / n(w)) - (A(l) - pr.ref_rejected / n(l));
        const double e = h - 1.0 / (2.0 * p.beta);
        loss = e * e;
        dw = 2 * e / n(w);
        dl = -2 * e / n(l);
        correct = h > 0;
        break;
      }
      case Method::kHinge: {
        const double h = (S[w] - pr.ref_chosen) - (S[l] - pr.ref_rejected);
        const double z = 1 - p.beta * h;
        loss = z > 0 ? z : 0;
        dw = z > 0 ? -p.beta : 0;
        dl = z > 0 ? p.beta : 0;
        correct = h > 0;
        break;
      }
      case Method::kSft:
        break;
    }
    r.loss += loss / np;
    dS[w] += dw / np;
    dS[l] += dl / np;
    r.accuracy += (correct ? 1.0 : 0.0) / np;
  }
  dlogp.assign(b.size(), Real(0));
  for (int64_t i = 0; i < b.size(); ++i)
    if (b.targets[i] >= 0) dlogp[i] = Real(dN[b.seq[i]] + (b.nll_only[i] ? 0.0 : dS[b.seq[i]]));
  return r;
}

template ObjectiveResult Objective<float>(Method, const ObjectiveParams&, const PackedBatch&,
                                          const std::vector<float>&, const std::vector<Pair>&,
                                          std::vector<float>&);
template ObjectiveResult Objective<double>(Method, const ObjectiveParams&, const PackedBatch&,
                                           const std::vector<double>&, const std::vector<Pair>&,
                                           std::vector<double>&);

}  // namespace lumen::train
