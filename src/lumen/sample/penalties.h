// Logit processors that run before every route (and before greedy): logit
// bias, the repetition / presence / frequency penalties, and DRY. They edit the
// logits in place and only touch tokens named by the bias list or the history,
// so their cost is O(history), not O(vocabulary).
//
// Token ids outside [0, logits.size()) in the bias list or the history are
// ignored here; ValidateForVocab (config.h) is where a user-supplied bad id is
// rejected with a message.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "lumen/sample/config.h"

namespace lumen::sample {

// Reusable buffers so the processors allocate nothing once warm.
struct PenaltyScratch {
  std::vector<int32_t> tokens;
  std::vector<std::pair<int32_t, int32_t>> dry_hits;  // (token, repeat length)
};

void ApplyLogitBias(std::span<float> logits, std::span<const std::pair<int32_t, double>> bias);

// llama.cpp semantics over the last `repeat_last_n` tokens of `history`
// (-1: all of it, 0: none): for a token seen `count` > 0 times, first
//   logit = logit > 0 ? logit / repetition_penalty : logit * repetition_penalty
// then logit -= presence_penalty + count * frequency_penalty.
void ApplyPenalties(std::span<float> logits, std::span<const int32_t> history,
                    const SamplerConfig& config, PenaltyScratch& scratch);

// DRY: for each token t, n(t) = the length of the longest suffix of the window
// (the last dry.last_n tokens; -1 all) that contains no sequence breaker and
// occurred earlier in the window immediately followed by t. If n(t) >=
// allowed_length, logit[t] -= multiplier * base^(n(t) - allowed_length).
// A token that is itself a one-token breaker is never penalized.
void ApplyDry(std::span<float> logits, std::span<const int32_t> history, const DryConfig& dry,
              PenaltyScratch& scratch);

}  // namespace lumen::sample
