// LoRA at inference: a low-rank update on a frozen product, applied unmerged
// as y += s B (A x) after the base product (A [r, K], B [N, r], f32). The
// buffers belong to whoever loaded the adapter (engine/adapter.h); the
// weights only point at them, so one base model can serve with or without.
#pragma once

#include <cstdint>
#include <utility>

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

// y [T, N] (row stride ldy) += s B (A x) for x [T, K] (row stride ldx).
void ApplyLora(const LoraMatrix& l, const float* x, int64_t T, int64_t ldx, float* y, int64_t ldy,
               ThreadPool* pool);

}  // namespace lumen::model
