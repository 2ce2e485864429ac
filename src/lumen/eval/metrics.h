// Sampling-quality metrics on token sequences and distributions: distinct-n,
// self-BLEU, entropy, KL. Pure functions, no model; eval/sampling_eval.h runs
// them over generated text. Logs are natural (nats).
//
// Definitions (docs/experiments/sampling.md):
// - distinct-n: distinct n-grams / total n-grams over a set of sequences
//   (Li et al. 2016); 0 when the set has no n-gram.
// - self-BLEU: the mean, over each sequence i of a set, of BLEU-4 of i against
//   all the others as references: clipped n-gram precisions p_1..p_4 (counts
//   clipped by the maximum count in any one reference), p_n for n >= 2 smoothed
//   as (matches + 1) / (total + 1) (Lin & Och 2004, "add-one"), p_1 unsmoothed;
//   geometric mean with weights 1/4; brevity penalty exp(1 - r/c) when the
//   candidate length c is shorter than the closest reference length r (the
//   shorter on ties). An empty candidate scores 0. Needs >= 2 sequences
//   (otherwise 0).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace lumen::eval {

using Seq = std::vector<int32_t>;

double DistinctN(std::span<const Seq> seqs, int n);
double Bleu4(const Seq& candidate, std::span<const Seq> refs);
double SelfBleu(std::span<const Seq> seqs);

// -sum p ln p over p > 0.
double Entropy(std::span<const float> p);
// sum_{p_i > 0} p_i ln(p_i / q_i); +inf when some q_i == 0 where p_i > 0.
double Kl(std::span<const float> p, std::span<const float> q);

}  // namespace lumen::eval
