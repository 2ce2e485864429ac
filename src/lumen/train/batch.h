// PackedBatch: the tokens of one training step, several sequences
// concatenated (padding-free packing). Each token carries its position in its
// own sequence and the key ranges it may attend to (kernels/attention_train.h),
// so block-diagonal packing and, later, a prompt shared by two branches are
// data rather than code paths. A token's target is the next token of its
// sequence when that token is a loss token (the response), else -1.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "lumen/kernels/attention_train.h"

namespace lumen::train {

struct PackedBatch {
  std::vector<int32_t> tokens;              // [M]
  std::vector<int32_t> pos;                 // [M]
  std::vector<kernels::KeyRanges> visible;  // [M]
  std::vector<int32_t> targets;             // [M] next token to score, or -1
  std::vector<int32_t> seq;                 // [M] sequence index of the token
  // [M] 1: scored for the NLL term only (prompt tokens under --sft-scope full)
  std::vector<uint8_t> nll_only;
  std::vector<int32_t> seq_loss_tokens;  // [sequences] scored response tokens
  std::vector<int32_t> seq_nll_tokens;   // [sequences] every scored token

  int64_t size() const { return int64_t(tokens.size()); }
  int sequences() const { return int(seq_loss_tokens.size()); }

  // Appends a causal sequence; tokens[i] for i >= loss_begin (>= 1) are
  // scored (predicted from position i - 1), and tokens in [nll_begin,
  // loss_begin) are scored for the NLL term only. Returns the sequence index.
  int AddSequence(std::span<const int32_t> toks, int64_t loss_begin, int64_t nll_begin = -1) {
    if (nll_begin < 1 || nll_begin > loss_begin) nll_begin = loss_begin;
    const int s = sequences();
    const int32_t start = int32_t(tokens.size());
    const int64_t n = int64_t(toks.size());
    int32_t scored = 0, nll = 0;
    for (int64_t i = 0; i < n; ++i) {
      tokens.push_back(toks[i]);
      pos.push_back(int32_t(i));
      kernels::KeyRanges v;
      v.r[0] = {start, start + int32_t(i) + 1};
      v.n = 1;
      visible.push_back(v);
      const bool in_nll = i + 1 < n && i + 1 >= nll_begin;
      const bool in_loss = i + 1 < n && i + 1 >= loss_begin;
      targets.push_back(in_nll ? toks[i + 1] : -1);
      nll_only.push_back(in_nll && !in_loss);
      scored += in_loss;
      nll += in_nll;
      seq.push_back(s);
    }
    seq_loss_tokens.push_back(scored);
    seq_nll_tokens.push_back(nll);
    return s;
  }

  // Appends a preference pair sharing its prompt (prefix sharing): one run of
  // [prompt; chosen; p_last; rejected]. Chosen tokens see the prompt and
  // themselves; the rejected branch starts with a copy of the prompt's last
  // token at its position (it predicts rejected[0], which the prompt's own
  // last token cannot also do) and sees prompt[0, P-1) and itself, never the
  // chosen tokens; positions restart after the prompt. The copy sees exactly
  // the keys the original does, so the rejected branch computes what a
  // separate forward of prompt + rejected would. Returns {chosen, rejected}.
  std::pair<int, int> AddSharedPair(std::span<const int32_t> prompt,
                                    std::span<const int32_t> chosen,
                                    std::span<const int32_t> rejected, int64_t nll_begin = -1) {
    const int32_t P = int32_t(prompt.size());
    std::vector<int32_t> first(prompt.begin(), prompt.end());
    first.insert(first.end(), chosen.begin(), chosen.end());
    const int32_t start = int32_t(tokens.size());
    const int sc = AddSequence(first, P, nll_begin);
    const int sr = sequences();
    const int32_t bstart = int32_t(tokens.size());
    const int64_t n = int64_t(rejected.size()) + 1;
    int32_t scored = 0;
    for (int64_t i = 0; i < n; ++i) {
      tokens.push_back(i == 0 ? prompt[P - 1] : rejected[i - 1]);
      pos.push_back(P - 1 + int32_t(i));
      kernels::KeyRanges v;
      v.r[0] = {start, start + P - 1};
      v.r[1] = {bstart, bstart + int32_t(i) + 1};
      v.n = 2;
      visible.push_back(v);
      const bool has_next = i + 1 < n;
      targets.push_back(has_next ? rejected[i] : -1);
      nll_only.push_back(0);
      scored += has_next;
      seq.push_back(sr);
    }
    seq_loss_tokens.push_back(scored);
    seq_nll_tokens.push_back(scored);
    return {sc, sr};
  }
};

}  // namespace lumen::train
