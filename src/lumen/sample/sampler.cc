#include "lumen/sample/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>

#include "lumen/core/check.h"
#include "lumen/core/route.h"
#include "lumen/kernels/vecmath.h"
#include "lumen/sample/fast_math.h"

namespace lumen::sample {

LUMEN_ROUTE(
    sample_chain,
    {.node = "sample.chain",
     .name = "fused-truncations",
     .tier = Tier::kL1,
     .oracle = "brute-force definitions (sorted full-vocabulary top-k/top-p/min-p/typical/xtc)",
     .bound = "the same kept set and the same probabilities",
     .tests = "Sampler.*;Penalties.*;Dry.*;LogitBias.*;Rng.MatchesReferenceXoshiro256StarStar",
     .priority = 10});
LUMEN_ROUTE(sample_temperature,
            {.node = "sample.tone",
             .name = "temperature",
             .tier = Tier::kL1,
             .oracle = "softmax(logits / T)",
             .bound = "bit-identical",
             .tests = "Sampler.TemperatureScalesLogits;Sampler.DefaultIsSoftmaxAtTemperatureOne",
             .priority = 0});
LUMEN_ROUTE(
    sample_hlg,
    {.node = "sample.tone",
     .name = "hlg",
     .tier = Tier::kL3,
     .oracle = "none (original); in its identity configuration bit-identical to temperature",
     .bound = "identity configs bit-exact; ranking and argmax preserved; KL and diversity measured",
     .tests = "HlgGate.RolloffOffEqualsPlainTemperatureBitExact;HlgGate."
              "WideMidsEqualPlainTemperatureBitExact;"
              "HlgProperty.RankingAndArgmaxPreserved;Hlg.*",
     .measure = "docs/experiments/sampling.md",
     .when = "sampler=hlg",
     .priority = 10});

namespace {

using fastmath::Load;
using fastmath::Splat;
using fastmath::V4;
using fastmath::V4i;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kFloatMax = std::numeric_limits<float>::max();
constexpr size_t kBlock = kernels::kSumBlock;  // Draw's block size

// Finite logit or -inf: NaN counts as -inf, +inf as the largest float.
inline float Clean(float x) {
  if (!(x > kNegInf)) return kNegInf;
  return x > kFloatMax ? kFloatMax : x;
}

// "a ranks above b": higher value, then lower id.
template <typename C>
bool Better(const C& a, const C& b) {
  return a.lp > b.lp || (a.lp == b.lp && a.id < b.id);
}

// Sum of a float array in kBlock blocks (kernels::BlockSum); `blocks`
// receives each block's sum when non-null.
double BlockSum(const float* e, size_t n, std::vector<double>* blocks) {
  if (!blocks) return kernels::BlockSum(e, n, nullptr);
  blocks->resize(kernels::SumBlocks(n));
  return kernels::BlockSum(e, n, blocks->data());
}

// Median-pivot histogram: 16 bins per nat over [-64, 0], then one catch-all.
// Mass below e^-64 relative to the top token cannot move a 50% boundary.
constexpr float kBinsPerNat = 16.0f;
constexpr int kBins = 64 * 16 + 1;

}  // namespace

Sampler::Sampler(SamplerConfig config) : config_(std::move(config)) {
  const Status st = Validate(config_);
  if (!st.ok()) std::fprintf(stderr, "Sampler: invalid config: %s\n", st.message().c_str());
  LUMEN_CHECK(st.ok());
  seed_ = config_.seed ? *config_.seed
                       : (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
  gain_ = config_.temperature > 0 ? static_cast<float>(1.0 / config_.temperature) : 0.0f;
  if (config_.curve.enabled) curve_ = Pchip(config_.curve);
  Reset();
}

Result<Sampler> Sampler::Create(SamplerConfig config) {
  LUMEN_RETURN_IF_ERROR(Validate(config));
  return Sampler(std::move(config));
}

void Sampler::Reset() {
  rng_.Seed(seed_);
  mu_ = 2.0 * config_.mirostat_tau;
}

// --- candidates ----------------------------------------------------------------

// Every token in id order, -inf ones included (they end with probability 0),
// with the plain scores s = Score(lp, gain_, 0) and s_max_ in the same pass
// when `score` (routes that compute their own scores skip that store).
void Sampler::CollectAll(std::span<const float> logits, bool score) {
  const size_t n = logits.size();
  const float x_max = kernels::CleanMax(logits.data(), n);
  if (x_max == kNegInf) {
    id_.clear();
    lp_.clear();
    s_.clear();
    iota_n_ = 0;
    return;
  }
  if (iota_n_ != n) {  // id_ is already 0..n-1 when the last call left it so
    id_.resize(n);
    std::iota(id_.begin(), id_.end(), 0);
    iota_n_ = n;
  }
  lp_.resize(n);
  s_.resize(n);
  if (score) {
    s_max_ = kernels::CleanShiftScore(logits.data(), n, x_max, gain_, lp_.data(), s_.data());
  } else {
    kernels::CleanShift(logits.data(), n, x_max, lp_.data());
  }
}

// The k best (value desc, id asc) finite logits, sorted, raw values in .lp.
// One pass with a size-k heap whose worst element is the running threshold;
// blocks of 16 with no logit above it are skipped with vector compares.
void Sampler::CollectTopK(std::span<const float> logits, size_t k, std::vector<Cand>& out) {
  out.clear();
  if (k == 0) return;
  auto worse_first = [](const Cand& a, const Cand& b) { return Better(a, b); };
  const size_t n = logits.size();
  const float* x = logits.data();
  size_t i = 0;
  for (; i < n && out.size() < k; ++i) {
    const float v = Clean(x[i]);
    if (v == kNegInf) continue;
    out.push_back({v, static_cast<int32_t>(i)});
    std::push_heap(out.begin(), out.end(), worse_first);
  }
  if (out.size() < k) {
    std::sort_heap(out.begin(), out.end(), worse_first);
    return;
  }
  float thresh = out.front().lp;
  auto consider = [&](size_t j) {
    const float v = x[j];
    if (!(v > thresh)) return;  // also skips NaN; equal values keep the lower id
    std::pop_heap(out.begin(), out.end(), worse_first);
    out.back() = {std::min(v, kFloatMax), static_cast<int32_t>(j)};
    std::push_heap(out.begin(), out.end(), worse_first);
    thresh = out.front().lp;
  };
  for (; i < n && i % 4 != 0; ++i) consider(i);
  for (; i + 16 <= n; i += 16) {
    const V4 t = Splat(thresh);
    const V4i hit =
        (Load(x + i) > t) | (Load(x + i + 4) > t) | (Load(x + i + 8) > t) | (Load(x + i + 12) > t);
    if ((hit[0] | hit[1] | hit[2] | hit[3]) == 0) continue;
    for (size_t j = i; j < i + 16; ++j) consider(j);
  }
  for (; i < n; ++i) consider(i);
  std::sort_heap(out.begin(), out.end(), worse_first);
}

void Sampler::FromCands(const std::vector<Cand>& c) {
  iota_n_ = 0;
  id_.resize(c.size());
  lp_.resize(c.size());
  for (size_t i = 0; i < c.size(); ++i) {
    id_[i] = c[i].id;
    lp_[i] = c[i].lp;
  }
}

void Sampler::ToCands(std::vector<Cand>& c) const {
  c.resize(id_.size());
  for (size_t i = 0; i < id_.size(); ++i) c[i] = {lp_[i], id_[i]};
}

// Keeps the candidates whose keep_ flag is set, in order.
void Sampler::Compact(size_t n) {
  iota_n_ = 0;
  size_t w = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!keep_[i]) continue;
    id_[w] = id_[i];
    lp_[w] = lp_[i];
    ++w;
  }
  id_.resize(w);
  lp_.resize(w);
}

float Sampler::CandMax() const { return kernels::MaxF32(lp_.data(), lp_.size()); }

double Sampler::T1Probs() {
  const float m = CandMax();
  p_.resize(lp_.size());
  double z = 0;
  for (size_t i = 0; i < lp_.size(); ++i) {
    p_[i] = std::exp(static_cast<double>(lp_[i] - m));
    z += p_[i];
  }
  for (double& p : p_) p /= z;
  return std::log(z) + m;
}

// --- final softmax and draw ------------------------------------------------

void Sampler::ScoreAll(float gain) {
  s_.resize(lp_.size());
  s_max_ = kernels::ScaleScore(lp_.data(), lp_.size(), gain, s_.data());
}

// Needs s_ and s_max_ from the route's score kernel.
void Sampler::Finalize() {
  const size_t n = s_.size();
  e_.resize(n);
  blocks_.resize(kernels::SumBlocks(n));
  sum_ = kernels::ExpShiftSum(s_.data(), n, s_max_, e_.data(), blocks_.data());
}

size_t Sampler::Draw(double u) const {
  const double target = u * sum_;
  double cum = 0;
  size_t b = 0;
  for (; b + 1 < blocks_.size(); ++b) {
    if (cum + blocks_[b] > target) break;
    cum += blocks_[b];
  }
  size_t last_positive = 0;
  for (size_t i = b * kBlock; i < e_.size(); ++i) {
    if (e_[i] <= 0) continue;
    cum += e_[i];
    last_positive = i;
    if (cum > target) return i;
  }
  if (e_[last_positive] > 0) return last_positive;  // rounding left the target above the total
  for (size_t i = e_.size(); i-- > 0;) {
    if (e_[i] > 0) return i;
  }
  return 0;
}

// --- routes ------------------------------------------------------------------

void Sampler::StandardPath(std::span<const float> logits, bool sampling) {
  const SamplerConfig& c = config_;
  // 5. top-k (the heap pass), else every token in id order.
  bool sorted = false;      // candidates descending by (lp, -id)
  bool scored_all = false;  // s_ holds CollectAll's scores of the current candidates
  if (c.top_k > 0 && static_cast<size_t>(c.top_k) < logits.size()) {
    CollectTopK(logits, static_cast<size_t>(c.top_k), cands_);
    if (!cands_.empty()) {
      const float x_max = cands_[0].lp;
      for (Cand& cd : cands_) cd.lp -= x_max;
    }
    FromCands(cands_);
    sorted = true;
  } else {
    CollectAll(logits, /*score=*/true);
    scored_all = true;
  }
  // A step that runs may change the candidates: then they are scored again.
  if (c.typical_p < 1.0 || c.top_p < 1.0 || c.min_p > 0.0 || c.top_n_sigma > 0.0 ||
      (sampling && c.xtc_probability > 0.0)) {
    scored_all = false;
  }

  // 6. typical-p: keep the tokens whose surprise is closest to the entropy.
  if (c.typical_p < 1.0 && lp_.size() > 1) {
    const double log_z = T1Probs();
    double h = 0;
    for (size_t i = 0; i < lp_.size(); ++i) {
      if (p_[i] > 0) h -= p_[i] * (lp_[i] - log_z);
    }
    // (|surprise - H|, index) pairs, ordered by score then token id.
    heap_.resize(lp_.size());
    for (size_t i = 0; i < lp_.size(); ++i) {
      const double surprise = p_[i] > 0 ? -(lp_[i] - log_z) : INFINITY;
      heap_[i] = {static_cast<float>(std::fabs(surprise - h)), static_cast<int32_t>(i)};
    }
    std::sort(heap_.begin(), heap_.end(), [&](const Cand& a, const Cand& b) {
      return a.lp < b.lp || (a.lp == b.lp && id_[a.id] < id_[b.id]);
    });
    double cum = 0;
    size_t keep = heap_.size();
    for (size_t i = 0; i < heap_.size(); ++i) {
      cum += p_[heap_[i].id];
      if (cum >= c.typical_p) {
        keep = i + 1;
        break;
      }
    }
    cands_.clear();
    for (size_t i = 0; i < keep; ++i) cands_.push_back({lp_[heap_[i].id], id_[heap_[i].id]});
    FromCands(cands_);
    sorted = false;
  }

  // 7. top-p: the smallest prefix (by probability) with mass >= top_p. Only the
  // prefix is sorted: nth_element on a growing window.
  if (c.top_p < 1.0 && lp_.size() > 1) {
    ToCands(cands_);
    const float m = CandMax();
    double z = 0;
    for (const Cand& cd : cands_) z += std::exp(static_cast<double>(cd.lp - m));
    const double target = c.top_p * z;
    auto better = [](const Cand& a, const Cand& b) { return Better(a, b); };
    const size_t n = cands_.size();
    size_t done = sorted ? n : 0;  // cands_[0, done) is sorted and above the rest
    size_t window = std::min<size_t>(n, 256);
    double cum = 0;
    size_t keep = n;
    size_t i = 0;
    while (true) {
      if (done < window) {
        std::nth_element(cands_.begin() + done, cands_.begin() + window - 1, cands_.end(), better);
        std::sort(cands_.begin() + done, cands_.begin() + window, better);
        done = window;
      }
      for (; i < done; ++i) {
        cum += std::exp(static_cast<double>(cands_[i].lp - m));
        if (cum >= target) break;
      }
      if (i < done) {
        keep = i + 1;
        break;
      }
      if (done == n) break;
      window = std::min(n, window * 8);
    }
    cands_.resize(keep);
    FromCands(cands_);
    sorted = true;
  }

  // 8. min-p: p_i >= min_p * p_max, i.e. lp_i >= lp_max + ln(min_p).
  if (c.min_p > 0.0 && lp_.size() > 1) {
    const float thresh = CandMax() + static_cast<float>(std::log(c.min_p));
    keep_.resize(lp_.size());
    for (size_t i = 0; i < lp_.size(); ++i) keep_[i] = lp_[i] >= thresh;
    Compact(lp_.size());
  }

  // 9. top-n-sigma: keep logits within n standard deviations of the max (the
  // mean and deviation over the finite logits).
  if (c.top_n_sigma > 0.0 && lp_.size() > 1) {
    double mean = 0, count = 0;
    for (float v : lp_) {
      if (v != kNegInf) mean += v, count += 1;
    }
    mean /= count;
    double var = 0;
    for (float v : lp_) {
      if (v != kNegInf) var += (v - mean) * (v - mean);
    }
    const double thresh = CandMax() - c.top_n_sigma * std::sqrt(var / count);
    keep_.resize(lp_.size());
    for (size_t i = 0; i < lp_.size(); ++i) keep_[i] = lp_[i] != kNegInf && lp_[i] >= thresh;
    Compact(lp_.size());
  }

  // 10. XTC: with probability xtc_probability, if two or more tokens have
  // p >= threshold, remove all of them but the least likely.
  if (sampling && c.xtc_probability > 0.0) {
    const double u = rng_.NextDouble();
    if (u < c.xtc_probability && lp_.size() > 1) {
      T1Probs();
      size_t above = 0, least = 0;
      for (size_t i = 0; i < lp_.size(); ++i) {
        if (p_[i] < c.xtc_threshold) continue;
        const Cand ci{lp_[i], id_[i]}, cl{lp_[least], id_[least]};
        if (above == 0 || !Better(ci, cl)) least = i;
        ++above;
      }
      if (above >= 2) {
        keep_.resize(lp_.size());
        for (size_t i = 0; i < lp_.size(); ++i) {
          keep_[i] = p_[i] < c.xtc_threshold || i == least;
        }
        Compact(lp_.size());
      }
    }
  }

  // 11. temperature. CollectAll already scored an untruncated candidate set
  // (the same kernel expression ScaleScore uses).
  if (lp_.size() != s_.size() || !scored_all) ScoreAll(gain_);
  Finalize();
}

void Sampler::MirostatPath() {
  Finalize();  // on CollectAll's scores
  if (id_.empty()) return;
  // Keep tokens with surprise -log2 p <= mu; the argmax always survives.
  const double log_thresh = -mu_ * std::log(2.0) + std::log(sum_);  // on s - s_max
  size_t best = 0;
  for (size_t i = 0; i < s_.size(); ++i) {
    if (s_[i] > s_[best]) best = i;
  }
  iota_n_ = 0;
  size_t w = 0;
  for (size_t i = 0; i < s_.size(); ++i) {
    if (static_cast<double>(s_[i] - s_max_) < log_thresh && i != best) continue;
    id_[w] = id_[i];
    lp_[w] = lp_[i];
    s_[w] = s_[i];
    e_[w] = e_[i];
    ++w;
  }
  id_.resize(w);
  lp_.resize(w);
  s_.resize(w);
  e_.resize(w);
  sum_ = BlockSum(e_.data(), w, &blocks_);
}

float Sampler::MedianPivot() {
  // e_i = exp(lp_i) and their total z; then a mass histogram by lp over the
  // tokens that can hold the 50% boundary, and only the crossing bin sorted.
  // Ties in lp share a bin, so the boundary value is exact. The boundary token
  // b has every later token (at most n of them, each <= e_b) carry more than
  // z/2, so e_b > z/(2n): tokens with lp below ln(z/(2n)) (minus a nat for
  // rounding) are never reached and are not binned.
  const size_t n = lp_.size();
  e_.resize(n);
  const float* lp = lp_.data();
  const float* e = e_.data();
  const double z = kernels::ExpShiftSum(lp, n, 0.0f, e_.data(), nullptr);
  const double half = 0.5 * z;
  const float lo = static_cast<float>(std::log(z / (2.0 * static_cast<double>(n)))) - 1.0f;
  near_idx_.resize(n);
  const size_t k = kernels::IndicesAtLeast(lp, n, lo, near_idx_.data());
  bin_idx_.resize(k);
  bins_.assign(kBins, 0.0);
  for (size_t j = 0; j < k; ++j) {
    const uint32_t i = near_idx_[j];
    const float b = lp[i] * -kBinsPerNat;
    bin_idx_[j] = b < kBins - 1 ? static_cast<int32_t>(b) : kBins - 1;
    bins_[bin_idx_[j]] += e[i];
  }
  double cum = 0;
  int bin = 0;
  for (; bin < kBins - 1; ++bin) {
    if (cum + bins_[bin] >= half) break;
    cum += bins_[bin];
  }
  bin_items_.clear();
  for (size_t j = 0; j < k; ++j) {
    if (bin_idx_[j] == bin) bin_items_.push_back({lp[near_idx_[j]], id_[near_idx_[j]]});
  }
  std::sort(bin_items_.begin(), bin_items_.end(),
            [](const Cand& a, const Cand& b) { return Better(a, b); });
  for (const Cand& cd : bin_items_) {
    cum += kernels::ExpShiftSum(&cd.lp, 1, 0.0f, nullptr, nullptr);  // the same e as binned
    if (cum >= half) return cd.lp;
  }
  return bin_items_.empty() ? 0.0f : bin_items_.back().lp;
}

void Sampler::HlgPath() {
  const HlgConfig& h = config_.hlg;
  const size_t n = lp_.size();
  if (n == 0) return Finalize();
  // Pivot mu in the lp frame (lp = l + const, and z = l - mu is frame-free).
  float mu = 0;
  switch (h.pivot) {
    case HlgPivot::kTop:
      mu = static_cast<float>(0.0 - h.pivot_offset);  // lp_max == 0
      break;
    case HlgPivot::kEntropy: {
      // mu = sum p l = (sum e lp) / (sum e), e = exp(lp); -inf terms are 0.
      double se = 0, selp = 0;
      kernels::ExpMoments(lp_.data(), n, &se, &selp);
      mu = static_cast<float>(selp / se);
      break;
    }
    case HlgPivot::kMedian:
      mu = MedianPivot();
      break;
  }
  // Rolloff off: CollectAll's scores Score(lp, m, 0) are the HLG scores, the
  // very floats plain temperature uses (the bit-exact gate).
  if (!h.rolloff) return Finalize();
  // s = m lp + offset, offset = g(z) - m z (hlg.h), exactly +0.0 in the mids
  // (kernels::HlgSpan), so there s == Score(lp, m, 0) too.
  kernels::HlgSpan p;
  p.mu = mu;
  p.m = gain_;
  p.width = static_cast<float>(h.width);
  p.toe = static_cast<float>(h.toe);
  p.shoulder = static_cast<float>(h.shoulder);
  p.inv_toe = 1.0f / p.toe;
  p.inv_shoulder = 1.0f / p.shoulder;
  // g is monotone and lp_max == 0, so the top token's score is the maximum
  // (up to float rounding, harmless here): score, exp and sums in one pass.
  s_max_ = kernels::HlgScoreAt(0.0f, p);
  e_.resize(n);
  blocks_.resize(kernels::SumBlocks(n));
  sum_ = kernels::HlgScoreExp(lp_.data(), n, p, s_max_, s_.data(), e_.data(), blocks_.data());
}

void Sampler::CurvePath() {
  const size_t n = lp_.size();
  if (n == 0) return Finalize();
  const double log_z = std::log(kernels::ExpShiftSum(lp_.data(), n, 0.0f, nullptr, nullptr));
  // One rounding, from double: a flat piece of the curve then gives equal
  // scores rather than float noise. For the identity curve the offset is
  // exactly 0.0, so the score is lp itself, as Score(lp, 1, 0) is.
  const kernels::PchipSpan span = curve_.span();
  if (config_.curve.allow_nonmonotone) {
    s_max_ = kernels::PchipScore(lp_.data(), n, log_z, span, s_.data());
    return Finalize();
  }
  // A monotone curve peaks at the top token (lp == 0): one fused pass.
  s_max_ = kernels::PchipScoreAt(0.0f, log_z, span);
  e_.resize(n);
  blocks_.resize(kernels::SumBlocks(n));
  sum_ = kernels::PchipScoreExp(lp_.data(), n, log_z, span, s_max_, s_.data(), e_.data(),
                                blocks_.data());
}

// --- driver ------------------------------------------------------------------

void Sampler::Prepare(std::span<float> logits, std::span<const int32_t> history, bool sampling) {
  ApplyLogitBias(logits, config_.logit_bias);
  ApplyPenalties(logits, history, config_, penalty_scratch_);
  ApplyDry(logits, history, config_.dry, penalty_scratch_);
  greedy_ = -1;
  if (config_.temperature <= 0.0) {
    int32_t best = 0;
    float best_x = kNegInf;
    for (size_t i = 0; i < logits.size(); ++i) {
      if (logits[i] > best_x) {
        best_x = logits[i];
        best = static_cast<int32_t>(i);
      }
    }
    greedy_ = best;
    return;
  }
  if (config_.hlg.enabled) {
    CollectAll(logits, /*score=*/!config_.hlg.rolloff);
    HlgPath();
  } else if (config_.curve.enabled) {
    CollectAll(logits, /*score=*/false);
    CurvePath();
  } else if (config_.mirostat == 2) {
    CollectAll(logits, /*score=*/true);
    MirostatPath();
  } else {
    StandardPath(logits, sampling);
  }
}

int32_t Sampler::Sample(std::span<float> logits, std::span<const int32_t> history,
                        TokenLogprobs* out) {
  LUMEN_CHECK(!logits.empty());
  Prepare(logits, history, /*sampling=*/true);
  if (greedy_ >= 0) {
    if (out) FillGreedyLogprobs(logits, *out);
    return greedy_;
  }
  const double u = rng_.NextDouble();  // exactly one uniform per token for the draw
  if (id_.empty()) {
    if (out) *out = {{0, kNegInf}, {}};
    return 0;
  }
  const size_t idx = Draw(u);
  if (config_.mirostat == 2 && !config_.hlg.enabled && !config_.curve.enabled) {
    const double surprise = -std::log2(static_cast<double>(e_[idx]) / sum_);
    mu_ -= config_.mirostat_eta * (surprise - config_.mirostat_tau);
  }
  if (out) FillLogprobs(idx, *out);
  return id_[idx];
}

void Sampler::Distribution(std::span<const float> logits, std::span<const int32_t> history,
                           std::vector<float>& probs) {
  work_.assign(logits.begin(), logits.end());
  Prepare(work_, history, /*sampling=*/false);
  probs.assign(logits.size(), 0.0f);
  if (greedy_ >= 0) {
    probs[greedy_] = 1.0f;
    return;
  }
  for (size_t i = 0; i < id_.size(); ++i) {
    probs[id_[i]] = static_cast<float>(e_[i] / sum_);
  }
}

// --- logprobs ----------------------------------------------------------------

void Sampler::FillLogprobs(size_t chosen, TokenLogprobs& out) {
  const double log_sum = std::log(sum_);
  auto lp_of = [&](size_t i) {
    return static_cast<float>(static_cast<double>(s_[i] - s_max_) - log_sum);
  };
  out.chosen = {id_[chosen], lp_of(chosen)};
  out.top.clear();
  const size_t k = std::min<size_t>(config_.top_logprobs, id_.size());
  if (k == 0) return;
  // The k best candidates by score (ids break ties) with a small heap;
  // excluded (-inf) tokens are not alternatives.
  auto better = [&](size_t a, size_t b) {
    return s_[a] > s_[b] || (s_[a] == s_[b] && id_[a] < id_[b]);
  };
  order_.clear();
  for (size_t i = 0; i < id_.size(); ++i) {
    if (s_[i] == kNegInf) continue;
    if (order_.size() < k) {
      order_.push_back(i);
      std::push_heap(order_.begin(), order_.end(), better);
    } else if (better(i, order_.front())) {
      std::pop_heap(order_.begin(), order_.end(), better);
      order_.back() = i;
      std::push_heap(order_.begin(), order_.end(), better);
    }
  }
  std::sort_heap(order_.begin(), order_.end(), better);
  for (size_t i : order_) out.top.push_back({id_[i], lp_of(i)});
}

void Sampler::FillGreedyLogprobs(std::span<const float> logits, TokenLogprobs& out) {
  const float x_max = Clean(logits[greedy_]);
  double sum = 0;
  for (float x : logits) {
    const float cx = Clean(x);
    if (cx != kNegInf) sum += std::exp(static_cast<double>(cx - x_max));
  }
  const double log_sum = std::log(sum);
  auto lp_of = [&](float x) {
    return static_cast<float>(static_cast<double>(Clean(x) - x_max) - log_sum);
  };
  out.chosen = {greedy_, x_max == kNegInf ? kNegInf : lp_of(logits[greedy_])};
  CollectTopK(logits, static_cast<size_t>(config_.top_logprobs), heap_);
  out.top.clear();
  for (const Cand& cd : heap_) out.top.push_back({cd.id, lp_of(cd.lp)});
}

}  // namespace lumen::sample
