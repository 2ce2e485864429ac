// LoRA at inference: a low-rank update on a frozen product, applied unmerged
// as y += s B (A x) after the base product (A [r, K], B [N, r], f32). The
// buffers belong to whoever loaded the adapter (engine/adapter.h); the
// weights only point at them, so one base model can serve with or without.
//
// Two ways in: LayerWeights::lora (one adapter for the whole model, applied
// to every row) and a per-row LoraSet (BatchRow::lora, Forward::Run's lora):
// a list of (adapter, weight) terms whose updates are added after the
// model-wide one, in the set's order. docs/design/per-row-lora.md.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "lumen/core/thread_pool.h"
#include "lumen/model/config.h"

namespace lumen::model {

struct LoraMatrix {
  const float* a = nullptr;  // [r, K]
  const float* b = nullptr;  // [N, r]
  int rank = 0;
  float scale = 0.0f;
  int64_t n = 0, k = 0;
  bool valid() const { return a != nullptr; }
};

// Order of the adapted products in LayerWeights::lora.
enum LoraTarget : int { kLoraQ, kLoraK, kLoraV, kLoraO, kLoraGate, kLoraUp, kLoraDown };
inline constexpr int kLoraTargets = 7;

// The frozen product's [N, K] of a target (the shapes of B's rows and A's columns).
inline std::pair<int64_t, int64_t> LoraTargetShape(const ModelConfig& c, int target) {
  const int64_t D = c.dim, F = c.ffn_dim, Q = c.q_dim(), KV = c.kv_dim();
  const std::pair<int64_t, int64_t> shapes[kLoraTargets] = {{Q, D}, {KV, D}, {KV, D}, {D, Q},
                                                            {F, D}, {F, D},  {D, F}};
  return shapes[target];
}

// One adapter's matrices for every layer: layers[l][target] (invalid: that
// product is not adapted). The buffers belong to the adapter's owner.
struct LoraWeights {
  std::vector<std::array<LoraMatrix, kLoraTargets>> layers;  // [n_layers]
};

// One term of a row's adapter set: y += weight * s B (A x) with the
// adapter's own s (LoraMatrix::scale).
struct LoraTerm {
  const LoraWeights* weights = nullptr;
  float weight = 1.0f;
};

// The adapters one sequence runs with; the terms' updates are added in order.
struct LoraSet {
  std::vector<LoraTerm> terms;
};

// y [T, N] (row stride ldy) += s B (A x) for x [T, K] (row stride ldx).
void ApplyLora(const LoraMatrix& l, const float* x, int64_t T, int64_t ldx, float* y, int64_t ldy,
               ThreadPool* pool);

// The same update on the listed rows only, row rows[i] scaled by
// weights[i] (s * weights[i], rounded to f32, replaces s). u = A x is formed
// once per row and each output element is summed in the same order as
// ApplyLora's, so a row's result does not depend on which other rows are
// listed or how the pool splits the work (L1). u_scratch: [rows, r] floats.
void ApplyLoraRows(const LoraMatrix& l, std::span<const int64_t> rows,
                   std::span<const float> weights, const float* x, int64_t ldx, float* y,
                   int64_t ldy, float* u_scratch, ThreadPool* pool);

}  // namespace lumen::model
