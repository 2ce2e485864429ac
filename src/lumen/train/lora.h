// LoRA parameters: for each adapted (layer, target) a pair A [r, K], B [N, r]
// so that a target's product becomes y = W x + s B (A x) (W frozen, any
// storage). All A and B live in one flat vector (LoraParams::w) described by a
// LoraLayout, so the optimizer, gradient norms, checkpoints and adapter files
// walk one array. Row order of B for q/k follows the base file (GGUF llama
// stores q/k rows interleaved for RoPE; adapter_io.h permutes for PEFT).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "lumen/core/status.h"
#include "lumen/engine/adapter.h"
#include "lumen/model/config.h"

namespace lumen::train {

enum class Target : int { kQ, kK, kV, kO, kGate, kUp, kDown };
inline constexpr int kNumTargets = 7;
inline constexpr std::array<std::string_view, kNumTargets> kTargetNames = {"q",    "k",  "v",   "o",
                                                                           "gate", "up", "down"};
// Hugging Face module names (PEFT's target_modules).
inline constexpr std::array<std::string_view, kNumTargets> kHfModules = {
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};

// "q,k,v" or "all" (or HF names "q_proj,...") -> bit mask over Target.
Result<uint32_t> ParseTargets(std::string_view s);
std::string TargetsString(uint32_t mask);

struct LoraConfig {
  int rank = 8;
  float alpha = 16.0f;
  bool rs_lora = false;  // s = alpha / sqrt(r) instead of alpha / r
  float scale = 0.0f;    // > 0: use this s directly (--scale)
  uint32_t targets = 0x7f;
  int num_layers = 0;    // 0: all; N: the last N layers
  float dropout = 0.0f;  // on the LoRA input, mask from (seed, step, layer, target, row, col)
  float Scale() const;
};

struct LoraSlot {
  int layer = 0;
  Target target = Target::kQ;
  int64_t n = 0, k = 0;          // the frozen W is [n, k]
  int64_t a_off = 0, b_off = 0;  // A [r, k] at a_off, B [n, r] at b_off in the flat vector
};

struct LoraLayout {
  LoraConfig cfg;
  std::vector<LoraSlot> slots;
  std::vector<std::array<int, kNumTargets>> index;  // [L][target] -> slot or -1
  int64_t size = 0;                                 // floats in the flat vector
  int first_layer = 0;                              // lowest adapted layer

  // Errors: rank < 1, no target,
  // num_layers out of range.
  static Result<LoraLayout> Make(const model::ModelConfig& c, const LoraConfig& cfg);
  const LoraSlot* Find(int layer, Target t) const {
    const int i = index[layer][int(t)];
    return i < 0 ? nullptr : &slots[i];
  }
};

template <class Real>
struct LoraParams {
  std::vector<Real> w;  // [layout.size]
};

// PEFT's initialization: A Kaiming-uniform (bound 1 / sqrt(K)) from a
// generator keyed by (seed, slot, index); B zero, so step 0 is the base model.
LoraParams<float> InitLora(const LoraLayout& layout, uint64_t seed);

// The parameters as an adapter (engine/adapter.h) to save or apply. PEFT
// stores alpha, so a --scale override is written as the alpha that gives it.
engine::Adapter ToAdapter(const LoraLayout& layout, const LoraParams<float>& p,
                          const std::string& base_model);

// A stateless hash -> uniform [0, 1): the source of every random draw in
// training (initialization, dropout, shuffling), so a recomputed forward or a
// resumed run draws the same numbers.
inline uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
inline uint64_t HashKey(std::initializer_list<uint64_t> parts) {
  uint64_t h = 0x1234567887654321ull;
  for (uint64_t p : parts) h = Mix64(h ^ p);
  return h;
}
inline double Uniform01(uint64_t h) { return double(h >> 11) * (1.0 / 9007199254740992.0); }

}  // namespace lumen::train
