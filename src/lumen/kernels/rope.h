// Rotary position embeddings.
//
// Two pairings exist in the wild: kInterleaved rotates (x[2i], x[2i+1]) (llama2.c,
// GGUF llama/mistral after llama.cpp's q/k permutation); kHalf rotates
// (x[i], x[i + R/2]) (Hugging Face rotate_half, GGUF qwen/gemma/phi "NEOX").
// Only the first R = rope_dim dims of each head rotate (partial rotary).
// The inverse frequencies and the attention magnitude factor come from the
// scaling rule (docs/design/families.md): none, linear, dynamic NTK, llama3, yarn.
#pragma once

#include <cstdint>
#include <vector>

namespace lumen::kernels {

enum class RopeStyle { kInterleaved, kHalf };

struct RopeScaling {
  enum class Type { kNone, kLinear, kDynamic, kLlama3, kYarn } type = Type::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3
  int64_t original_max_pos = 0;                          // llama3, yarn, dynamic
  double beta_fast = 32.0, beta_slow = 1.0;              // yarn
  double attention_factor = 0.0;                         // yarn; 0 = derive from factor
};

struct RopeTable {
  std::vector<double> inv_freq;  // [R/2]
  float mscale = 1.0f;           // multiplies cos and sin (yarn)
};

// inv_freq for head rotary dim R, base theta; seq_len only matters for dynamic.
RopeTable MakeRopeTable(int rope_dim, double theta, const RopeScaling& s, int64_t max_pos,
                        int64_t seq_len);

// Rotates n_heads heads of size head_dim stored contiguously in x at position pos.
void ApplyRope(float* x, int n_heads, int head_dim, int rope_dim, const RopeTable& t, int64_t pos,
               RopeStyle style);

}  // namespace lumen::kernels
