// Sampler: the one sampler chain every caller shares (generate, chat, server
// lanes, eval). It works on a span of logits for one position and never sees
// the model.
//
// Chain, in order (each extra step is off by default):
//   1. logit_bias                     (added to the logits)
//   2. repetition / presence / frequency penalties over the last repeat_last_n tokens
//   3. DRY
//   -- greedy: temperature == 0 returns the argmax (lowest id on ties) of the
//      logits after 1-3; nothing below runs.
//   4. one of:
//      a. HLG tone curve (config.hlg.enabled): replaces 5-11 and 12's scaling
//      b. control-point curve (config.curve.enabled): likewise
//      c. mirostat v2 (config.mirostat == 2): temperature, then mirostat's
//         surprise truncation; 5-10 are skipped (as in llama.cpp)
//      d. the standard path:
//          5. top-k   6. typical-p   7. top-p   8. min-p   9. top-n-sigma
//         10. XTC (uses the RNG)   11. temperature
//  12. one seeded categorical draw (one uniform per token).
// The truncation steps 5-10 see the temperature-1 distribution of the
// survivors; temperature is applied last, as llama.cpp does by default.
//
// Exactness: every route produces a score s_i = Score(lp_i, gain, offset_i)
// with lp_i = x_i - x_max and the same final softmax and draw over candidates
// in the same order, so HLG (rolloff off, m = 1/T) and the identity curve are
// bit-identical to plain temperature T / T = 1 (docs/design/sampling.md).
//
// Example:
//   Sampler s(config);                  // config passed Validate()
//   int32_t tok = s.Sample(logits, history, &lp);
//
// Not thread-safe: one Sampler per sequence (it owns the RNG and mirostat mu).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "lumen/core/status.h"
#include "lumen/sample/config.h"
#include "lumen/sample/curve.h"
#include "lumen/sample/penalties.h"
#include "lumen/sample/rng.h"

namespace lumen::sample {

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0.0f;  // natural log; -inf for a token the distribution excludes
};

// Log-probabilities of the chosen token and of the config.top_logprobs most
// likely tokens, taken from the distribution the token was drawn from (after
// every transform and truncation; tokens truncated away are absent). Under
// greedy they come from softmax of the processed logits (after steps 1-3).
struct TokenLogprobs {
  TokenLogprob chosen;
  std::vector<TokenLogprob> top;  // most likely first, ties by lower id
};

// The score every route feeds to the final softmax: gain * lp + offset in
// float, one expression for every route (and the same per SIMD lane; ISO C++
// mode does not contract it into an FMA). Plain temperature passes offset 0.
inline float Score(float lp, float gain, float offset) { return gain * lp + offset; }

class Sampler {
 public:
  // `config` must pass Validate() (checked: a bad config is a caller bug here;
  // use Create to get a Status instead).
  explicit Sampler(SamplerConfig config);
  static Result<Sampler> Create(SamplerConfig config);

  // Picks the next token. `logits` ([V]) is modified in place (bias, penalties,
  // DRY). `history` is the prompt plus the tokens generated so far. If every
  // logit is -inf or NaN, returns 0. `out` is filled when non-null.
  int32_t Sample(std::span<float> logits, std::span<const int32_t> history,
                 TokenLogprobs* out = nullptr);

  // The distribution Sample would draw from, as dense probabilities [V],
  // without drawing: the RNG and mirostat mu are not advanced, and XTC (a
  // random event) is not applied. Greedy gives a one-hot vector.
  void Distribution(std::span<const float> logits, std::span<const int32_t> history,
                    std::vector<float>& probs);

  // Back to the state right after construction: same seed, initial mu.
  void Reset();

  const SamplerConfig& config() const { return config_; }
  uint64_t seed() const { return seed_; }  // the seed in use (chosen if none given)
  double mirostat_mu() const { return mu_; }

 private:
  struct Cand {
    float lp;
    int32_t id;
  };

  // Steps 1-3 then greedy or the route; leaves greedy_ or the candidates ready.
  void Prepare(std::span<float> logits, std::span<const int32_t> history, bool sampling);
  void CollectAll(std::span<const float> logits, bool score);
  void CollectTopK(std::span<const float> logits, size_t k, std::vector<Cand>& out);
  void FromCands(const std::vector<Cand>& c);  // AoS -> id_/lp_
  void ToCands(std::vector<Cand>& c) const;
  void Compact(size_t keep_if_mask_size);
  void StandardPath(std::span<const float> logits, bool sampling);
  void HlgPath();
  void CurvePath();
  void MirostatPath();
  float MedianPivot();
  void ScoreAll(float gain);
  void Finalize();  // e_ = exp(s_ - s_max), block sums, sum_
  float CandMax() const;
  double T1Probs();  // p_ = softmax(lp) over candidates; returns log of the normalizer
  size_t Draw(double u) const;
  void FillLogprobs(size_t chosen, TokenLogprobs& out);
  void FillGreedyLogprobs(std::span<const float> logits, TokenLogprobs& out);

  SamplerConfig config_;
  uint64_t seed_ = 0;
  Rng rng_;
  double mu_ = 0;  // mirostat v2 state
  float gain_ = 1;
  Pchip curve_;

  PenaltyScratch penalty_scratch_;
  int32_t greedy_ = -1;
  // Candidates, structure of arrays [n]: token id, lp = logit - max logit (a
  // log-prob up to a constant; -inf allowed), final score, exp(score - max).
  std::vector<int32_t> id_;
  std::vector<float> lp_;
  std::vector<float> s_;
  std::vector<float> e_;
  std::vector<double> blocks_;  // sums of e_ per kBlock candidates, for Draw
  std::vector<double> p_;       // [n] temperature-1 probabilities for truncation steps
  float s_max_ = 0;
  double sum_ = 0;
  std::vector<float> work_;         // Distribution's copy of the logits
  std::vector<Cand> cands_;         // sorting work (top-k, top-p, typical)
  std::vector<Cand> heap_;          // top-k / top-logprobs selection
  std::vector<double> bins_;        // median pivot mass histogram
  std::vector<Cand> bin_items_;     // median pivot boundary bin
  std::vector<int32_t> bin_idx_;    // median pivot: bin of each binned candidate
  std::vector<uint32_t> near_idx_;  // median pivot: candidates that can hold the boundary
  size_t iota_n_ = 0;               // id_ holds 0..iota_n_-1 (CollectAll skips rewriting it)
  std::vector<size_t> order_;       // top-logprobs selection over candidates
  std::vector<uint8_t> keep_;       // compaction mask
};

}  // namespace lumen::sample
