// Sampler evaluation on a model: free-running diversity (N samples per
// prompt), teacher-forced KL and entropy along fixed continuations, and the
// temperature whose mean output entropy matches a given setting (bisection).
// Used by `lumen eval` (cli/eval.cc); definitions in metrics.h and
// docs/experiments/sampling.md.
//
// Example:
//   auto prompts = EncodePrompts(model, *ReadPrompts("prompts.txt"));
//   auto d = Diversity(model, prompts, hlg_config, {.samples = 8});
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "lumen/core/status.h"
#include "lumen/engine/model.h"
#include "lumen/eval/metrics.h"
#include "lumen/sample/config.h"

namespace lumen::eval {

struct EvalOptions {
  int samples = 8;      // per prompt
  int max_tokens = 48;  // per sample; generation also stops at end-of-generation
  uint64_t seed = 1;    // sample s of prompt p uses a seed derived from (seed, p, s)
};

struct DiversityResult {
  double distinct1 = 0, distinct2 = 0, self_bleu = 0;  // per prompt, mean over prompts
  double nll = 0;      // mean -ln p_base(token) over generated tokens, base model at T = 1
  double entropy = 0;  // mean entropy (nats) of the distribution each token was drawn from
  int64_t tokens = 0;
  std::vector<std::vector<Seq>> samples;  // [prompt][sample] generated ids
};

// Teacher-forced statistics over fixed continuations.
struct ForcedResult {
  double kl = 0;         // mean KL(base T=1 || setting) per position (+inf if any is)
  double kl_finite = 0;  // the mean over positions where it is finite
  int64_t inf_positions = 0;
  double entropy = 0;       // mean entropy of the setting's distribution
  double base_entropy = 0;  // mean entropy of the base T=1 distribution
  int64_t tokens = 0;
};

struct MatchResult {
  double target_entropy = 0;  // the setting's teacher-forced mean entropy
  double temperature = 0;     // plain temperature with (nearly) that entropy
  double entropy = 0;         // its teacher-forced mean entropy
  int iterations = 0;
};

// One prompt per non-empty line; lines starting with '#' are comments. "\n"
// in a line stands for a newline.
Result<std::vector<std::string>> ReadPrompts(const std::string& path);
// Encoded with the tokenizer's special tokens (BOS); an empty encoding is an error.
Result<std::vector<Seq>> EncodePrompts(const engine::Model& model,
                                       std::span<const std::string> prompts);

Result<DiversityResult> Diversity(const engine::Model& model, std::span<const Seq> prompts,
                                  const sample::SamplerConfig& config, const EvalOptions& opts);

// opts.samples continuations per prompt sampled from the base model at T = 1
// (seeded as Diversity's): [prompt][sample].
Result<std::vector<std::vector<Seq>>> BaseContinuations(const engine::Model& model,
                                                        std::span<const Seq> prompts,
                                                        const EvalOptions& opts);

// The logits the base model gives at every position of fixed continuations,
// with the history each row was produced from; computed once, reused by every
// teacher-forced statistic.
struct ForcedRows {
  int64_t vocab = 0;
  std::vector<float> logits;   // [rows, vocab]
  std::vector<int32_t> next;   // [rows] the continuation token at that position
  std::vector<Seq> histories;  // [rows] prompt + continuation before it
};
// Continuations sampled from the base model at T = 1 (opts.samples per prompt,
// seeded as Diversity's) and their teacher-forced logits.
Result<ForcedRows> BaseForcedRows(const engine::Model& model, std::span<const Seq> prompts,
                                  const EvalOptions& opts);

Result<ForcedResult> Forced(const ForcedRows& rows, const sample::SamplerConfig& config);

// Bisection on log T in [t_lo, t_hi] until the teacher-forced mean entropy of
// plain temperature T is within tol nats of `setting`'s.
Result<MatchResult> MatchTemperature(const ForcedRows& rows, const sample::SamplerConfig& setting,
                                     double t_lo = 0.05, double t_hi = 5.0, double tol = 1e-4);

}  // namespace lumen::eval
