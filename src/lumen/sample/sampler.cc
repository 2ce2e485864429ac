#include "lumen/sample/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "lumen/core/check.h"
#include "lumen/sample/hlg.h"

namespace lumen::sample {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kFloatMax = std::numeric_limits<float>::max();

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

// Median-pivot histogram: 16 bins per nat over [-64, 0], then one catch-all.
// Mass below e^-64 relative to the top token cannot move a 50% boundary.
constexpr double kBinsPerNat = 16.0;
constexpr int kBins = 64 * 16 + 1;

}  // namespace

Sampler::Sampler(SamplerConfig config) : config_(std::move(config)) {
  const Status st = Validate(config_);
  if (!st.ok()) std::fprintf(stderr, "Sampler: invalid config: %s\n", st.message().c_str());
  LUMEN_CHECK(st.ok());
  seed_ = config_.seed ? *config_.seed
                       : (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
  gain_ = config_.temperature > 0 ? 1.0 / config_.temperature : 0.0;
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

// --- candidate collection ----------------------------------------------------

void Sampler::CollectAll(std::span<const float> logits) {
  float x_max = kNegInf;
  for (float x : logits) x_max = std::max(x_max, Clean(x));
  cands_.clear();
  if (x_max == kNegInf) return;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float x = Clean(logits[i]);
    if (x == kNegInf) continue;
    cands_.push_back({x - x_max, static_cast<int32_t>(i)});
  }
}

// The k best (value desc, id asc) finite logits, sorted, as raw values in .lp.
// One pass with a size-k heap whose worst element is the running threshold:
// almost every logit fails the single compare.
void Sampler::CollectTopK(std::span<const float> logits, size_t k, std::vector<Cand>& out) {
  out.clear();
  if (k == 0) return;
  auto worse_first = [](const Cand& a, const Cand& b) { return Better(a, b); };
  size_t i = 0;
  for (; i < logits.size() && out.size() < k; ++i) {
    const float x = Clean(logits[i]);
    if (x == kNegInf) continue;
    out.push_back({x, static_cast<int32_t>(i)});
    std::push_heap(out.begin(), out.end(), worse_first);
  }
  if (out.size() == k) {
    float thresh = out.front().lp;
    for (; i < logits.size(); ++i) {
      const float x = logits[i];
      if (!(x > thresh)) continue;  // also skips NaN; equal values keep the lower id
      std::pop_heap(out.begin(), out.end(), worse_first);
      out.back() = {std::min(x, kFloatMax), static_cast<int32_t>(i)};
      std::push_heap(out.begin(), out.end(), worse_first);
      thresh = out.front().lp;
    }
  }
  std::sort_heap(out.begin(), out.end(), worse_first);
}

float Sampler::CandMax() const {
  float m = kNegInf;
  for (const Cand& c : cands_) m = std::max(m, c.lp);
  return m;
}

double Sampler::T1Probs() {
  const float m = CandMax();
  p_.resize(cands_.size());
  double z = 0;
  for (size_t i = 0; i < cands_.size(); ++i) {
    p_[i] = std::exp(static_cast<double>(cands_[i].lp - m));
    z += p_[i];
  }
  for (double& p : p_) p /= z;
  return std::log(z) + m;
}

// --- final softmax and draw ------------------------------------------------

void Sampler::ScoreAll(double gain) {
  s_.resize(cands_.size());
  for (size_t i = 0; i < cands_.size(); ++i) s_[i] = Score(cands_[i].lp, gain, 0.0);
}

void Sampler::Finalize() {
  const size_t n = s_.size();
  float m = kNegInf;
  for (size_t i = 0; i < n; ++i) m = std::max(m, s_[i]);
  s_max_ = m;
  e_.resize(n);
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    e_[i] = std::exp(s_[i] - m);
    sum += e_[i];
  }
  sum_ = sum;
}

size_t Sampler::Draw(double u) const {
  const double target = u * sum_;
  double cum = 0;
  size_t last_positive = 0;
  for (size_t i = 0; i < e_.size(); ++i) {
    if (e_[i] <= 0) continue;
    cum += e_[i];
    last_positive = i;
    if (cum > target) return i;
  }
  return last_positive;  // rounding left the target just above the total
}

// --- routes ------------------------------------------------------------------

void Sampler::StandardPath(std::span<const float> logits, bool sampling) {
  const SamplerConfig& c = config_;
  // 5. top-k (the heap pass), else every finite logit in id order.
  bool sorted = false;  // cands_ descending by (lp, -id)
  if (c.top_k > 0 && static_cast<size_t>(c.top_k) < logits.size()) {
    sorted = true;
    CollectTopK(logits, static_cast<size_t>(c.top_k), cands_);
    if (!cands_.empty()) {
      const float x_max = cands_[0].lp;
      for (Cand& cd : cands_) cd.lp -= x_max;
    }
  } else {
    CollectAll(logits);
  }

  // 6. typical-p: keep the tokens whose surprise is closest to the entropy.
  if (c.typical_p < 1.0 && cands_.size() > 1) {
    const double log_z = T1Probs();
    double h = 0;
    for (size_t i = 0; i < cands_.size(); ++i) {
      if (p_[i] > 0) h -= p_[i] * (cands_[i].lp - log_z);
    }
    // Sort candidates by |surprise - H| together with p: reuse heap_ as (score, index).
    heap_.resize(cands_.size());
    for (size_t i = 0; i < cands_.size(); ++i) {
      heap_[i] = {static_cast<float>(std::fabs(-(cands_[i].lp - log_z) - h)),
                  static_cast<int32_t>(i)};
    }
    std::sort(heap_.begin(), heap_.end(), [&](const Cand& a, const Cand& b) {
      return a.lp < b.lp || (a.lp == b.lp && cands_[a.id].id < cands_[b.id].id);
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
    std::vector<Cand>& tmp = bin_items_;
    tmp.clear();
    for (size_t i = 0; i < keep; ++i) tmp.push_back(cands_[heap_[i].id]);
    cands_.swap(tmp);
    sorted = false;
  }

  // 7. top-p: the smallest prefix (by probability) with mass >= top_p. Only the
  // prefix is sorted: nth_element on a growing window.
  if (c.top_p < 1.0 && cands_.size() > 1) {
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
    sorted = true;
  }

  // 8. min-p: p_i >= min_p * p_max, i.e. lp_i >= lp_max + ln(min_p).
  if (c.min_p > 0.0 && cands_.size() > 1) {
    const float thresh = CandMax() + static_cast<float>(std::log(c.min_p));
    std::erase_if(cands_, [&](const Cand& cd) { return cd.lp < thresh; });
  }

  // 9. top-n-sigma: keep logits within n standard deviations of the max.
  if (c.top_n_sigma > 0.0 && cands_.size() > 1) {
    double mean = 0;
    for (const Cand& cd : cands_) mean += cd.lp;
    mean /= static_cast<double>(cands_.size());
    double var = 0;
    for (const Cand& cd : cands_) var += (cd.lp - mean) * (cd.lp - mean);
    const double sd = std::sqrt(var / static_cast<double>(cands_.size()));
    const double thresh = CandMax() - c.top_n_sigma * sd;
    std::erase_if(cands_, [&](const Cand& cd) { return cd.lp < thresh; });
  }

  // 10. XTC: with probability xtc_probability, if two or more tokens have
  // p >= threshold, remove all of them but the least likely.
  if (sampling && c.xtc_probability > 0.0) {
    const double u = rng_.NextDouble();
    if (u < c.xtc_probability && cands_.size() > 1) {
      T1Probs();
      size_t above = 0, least = 0;
      for (size_t i = 0; i < cands_.size(); ++i) {
        if (p_[i] < c.xtc_threshold) continue;
        if (above == 0 || !Better(cands_[i], cands_[least])) least = i;
        ++above;
      }
      if (above >= 2) {
        size_t w = 0;
        for (size_t i = 0; i < cands_.size(); ++i) {
          if (p_[i] >= c.xtc_threshold && i != least) continue;
          cands_[w++] = cands_[i];
        }
        cands_.resize(w);
      }
    }
  }

  // 11. temperature.
  ScoreAll(gain_);
  Finalize();
}

void Sampler::MirostatPath() {
  ScoreAll(gain_);
  Finalize();
  if (cands_.empty()) return;
  // Keep tokens with surprise -log2 p <= mu; the argmax always survives.
  const double log_thresh = -mu_ * std::log(2.0) + std::log(sum_);  // on s - s_max
  size_t w = 0;
  double sum = 0;
  size_t best = 0;
  for (size_t i = 0; i < s_.size(); ++i) {
    if (s_[i] > s_[best]) best = i;
  }
  for (size_t i = 0; i < s_.size(); ++i) {
    if (static_cast<double>(s_[i] - s_max_) < log_thresh && i != best) continue;
    cands_[w] = cands_[i];
    s_[w] = s_[i];
    e_[w] = e_[i];
    sum += e_[i];
    ++w;
  }
  cands_.resize(w);
  s_.resize(w);
  e_.resize(w);
  sum_ = sum;
}

double Sampler::MedianPivot() {
  // e_i = exp(lp_i) and a mass histogram by lp; the 50% boundary's bin is then
  // sorted alone. Ties in lp share a bin, so the boundary value is exact.
  const size_t n = cands_.size();
  e_.resize(n);
  bins_.assign(kBins, 0.0);
  double z = 0;
  for (size_t i = 0; i < n; ++i) {
    const float lp = cands_[i].lp;
    e_[i] = std::exp(lp);
    z += e_[i];
    const double b = -static_cast<double>(lp) * kBinsPerNat;
    bins_[b < kBins - 1 ? static_cast<int>(b) : kBins - 1] += e_[i];
  }
  const double half = 0.5 * z;
  double cum = 0;
  int bin = 0;
  for (; bin < kBins - 1; ++bin) {
    if (cum + bins_[bin] >= half) break;
    cum += bins_[bin];
  }
  bin_items_.clear();
  for (size_t i = 0; i < n; ++i) {
    const double b = -static_cast<double>(cands_[i].lp) * kBinsPerNat;
    if ((b < kBins - 1 ? static_cast<int>(b) : kBins - 1) == bin) bin_items_.push_back(cands_[i]);
  }
  std::sort(bin_items_.begin(), bin_items_.end(),
            [](const Cand& a, const Cand& b) { return Better(a, b); });
  for (const Cand& cd : bin_items_) {
    cum += std::exp(cd.lp);
    if (cum >= half) return cd.lp;
  }
  return bin_items_.empty() ? 0.0 : bin_items_.back().lp;
}

void Sampler::HlgPath() {
  const HlgConfig& h = config_.hlg;
  const size_t n = cands_.size();
  s_.resize(n);
  if (n == 0) return Finalize();
  // Pivot mu in the lp frame (lp = l + const, and z = l - mu is frame-free).
  double mu = 0;
  switch (h.pivot) {
    case HlgPivot::kTop:
      mu = 0.0 - h.pivot_offset;  // lp_max == 0
      break;
    case HlgPivot::kEntropy: {
      double z = 0, zl = 0;
      for (const Cand& cd : cands_) {
        const double e = std::exp(static_cast<double>(cd.lp));
        z += e;
        zl += e * cd.lp;
      }
      mu = zl / z;
      break;
    }
    case HlgPivot::kMedian:
      mu = MedianPivot();
      break;
  }
  const double m = gain_;
  if (!h.rolloff) {
    ScoreAll(m);
  } else {
    for (size_t i = 0; i < n; ++i) {
      const float lp = cands_[i].lp;
      s_[i] = Score(lp, m, HlgOffset(static_cast<double>(lp) - mu, m, h));
    }
  }
  Finalize();
}

void Sampler::CurvePath() {
  const size_t n = cands_.size();
  s_.resize(n);
  double z = 0;
  for (const Cand& cd : cands_) z += std::exp(static_cast<double>(cd.lp));
  const double log_z = std::log(z);
  for (size_t i = 0; i < n; ++i) {
    const float lp = cands_[i].lp;
    s_[i] = Score(lp, 1.0, curve_.Offset(static_cast<double>(lp) - log_z));
  }
  Finalize();
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
    CollectAll(logits);
    HlgPath();
  } else if (config_.curve.enabled) {
    CollectAll(logits);
    CurvePath();
  } else if (config_.mirostat == 2) {
    CollectAll(logits);
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
  if (cands_.empty()) {
    if (out) *out = {{0, kNegInf}, {}};
    return 0;
  }
  const size_t idx = Draw(u);
  if (config_.mirostat == 2 && !config_.hlg.enabled && !config_.curve.enabled) {
    const double surprise = -std::log2(static_cast<double>(e_[idx]) / sum_);
    mu_ -= config_.mirostat_eta * (surprise - config_.mirostat_tau);
  }
  if (out) FillLogprobs(idx, *out);
  return cands_[idx].id;
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
  for (size_t i = 0; i < cands_.size(); ++i) {
    probs[cands_[i].id] = static_cast<float>(e_[i] / sum_);
  }
}

// --- logprobs ----------------------------------------------------------------

void Sampler::FillLogprobs(size_t chosen, TokenLogprobs& out) {
  const double log_sum = std::log(sum_);
  auto lp_of = [&](size_t i) {
    return static_cast<float>(static_cast<double>(s_[i] - s_max_) - log_sum);
  };
  out.chosen = {cands_[chosen].id, lp_of(chosen)};
  out.top.clear();
  const size_t k = std::min<size_t>(config_.top_logprobs, cands_.size());
  if (k == 0) return;
  // Select the k best candidates by score (ids break ties) with a small heap.
  auto better = [&](size_t a, size_t b) {
    return s_[a] > s_[b] || (s_[a] == s_[b] && cands_[a].id < cands_[b].id);
  };
  order_.clear();
  for (size_t i = 0; i < cands_.size(); ++i) {
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
  for (size_t i : order_) out.top.push_back({cands_[i].id, lp_of(i)});
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
