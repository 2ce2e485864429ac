// PackedBatch: the tokens of one training step, several sequences
// concatenated (padding-free packing). Each token carries its position in its
// own sequence and the key ranges it may attend to (kernels/attention_train.h),
// so block-diagonal packing and, later, a prompt shared by two branches are
// data rather than code paths. A token's target is the next token of its
// sequence when that token is a loss token (the response), else -1.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "lumen/kernels/attention_train.h"

namespace lumen::train {

struct PackedBatch {
  std::vector<int32_t> tokens;              // [M]
  std::vector<int32_t> pos;                 // [M]
  std::vector<kernels::KeyRanges> visible;  // [M]
  std::vector<int32_t> targets;             // [M] next token to score, or -1
  std::vector<int32_t> seq;                 // [M] sequence index of the token
  std::vector<int32_t> seq_loss_tokens;     // [sequences] scored tokens per sequence

  int64_t size() const { return int64_t(tokens.size()); }
  int sequences() const { return int(seq_loss_tokens.size()); }

  // Appends a causal sequence; tokens[i] for i >= loss_begin (>= 1) are
  // scored (predicted from position i - 1). Returns the sequence index.
  int AddSequence(std::span<const int32_t> toks, int64_t loss_begin) {
    const int s = sequences();
    const int32_t start = int32_t(tokens.size());
    const int64_t n = int64_t(toks.size());
    int32_t scored = 0;
    for (int64_t i = 0; i < n; ++i) {
      tokens.push_back(toks[i]);
      pos.push_back(int32_t(i));
      kernels::KeyRanges v;
      v.r[0] = {start, start + int32_t(i) + 1};
      v.n = 1;
      visible.push_back(v);
      const bool scored_next = i + 1 < n && i + 1 >= loss_begin;
      targets.push_back(scored_next ? toks[i + 1] : -1);
      scored += scored_next;
      seq.push_back(s);
    }
    seq_loss_tokens.push_back(scored);
    return s;
  }
};

}  // namespace lumen::train
