// Weights: every tensor the forward reads, bound by canonical (GGUF-style)
// name from whichever file holds them. Views point into the model file's
// mapping; only small 1-D tensors (norms, biases) stored in f16/bf16 are
// converted to f32 at load, into `small_f32`. Absent optional tensors
// (biases, q/k norms, post norms) have null data.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "lumen/core/buffer.h"
#include "lumen/core/status.h"
#include "lumen/kernels/matrix.h"
#include "lumen/model/config.h"
#include "lumen/model/lora.h"

namespace lumen::model {

using kernels::Matrix;

struct LayerWeights {
  const float* attn_norm = nullptr;       // [D]
  Matrix wq, wk, wv;                      // [H*Dh, D], [Hkv*Dh, D], [Hkv*Dh, D]
  Matrix wqkv;                            // Phi3 fused [(H + 2 Hkv) Dh, D]
  const float* bq = nullptr;              // [H*Dh]   (Qwen2)
  const float* bk = nullptr;              // [Hkv*Dh]
  const float* bv = nullptr;              // [Hkv*Dh]
  const float* q_norm = nullptr;          // [Dh]     (Qwen3, Gemma3)
  const float* k_norm = nullptr;          // [Dh]
  Matrix wo;                              // [D, H*Dh]
  const float* bo = nullptr;              // [D]      (attention_bias)
  const float* post_attn_norm = nullptr;  // [D]      (Gemma2/3)
  const float* ffn_norm = nullptr;        // [D]
  Matrix w_gate, w_up;                    // [F, D] (Phi3: w_up is [2F, D], gate first)
  Matrix w_down;                          // [D, F]
  const float* post_ffn_norm = nullptr;   // [D]      (Gemma2/3)
  LoraMatrix lora[kLoraTargets];          // an adapter applied at load (--adapter), else empty
};

struct Weights {
  Matrix tok_embd;                     // [V, D]
  const float* output_norm = nullptr;  // [D]
  Matrix output;                       // [V, D] (tok_embd when tied)
  std::vector<LayerWeights> layers;    // [L]
  // GGUF Llama 3.1+: llama.cpp stores the llama3 rope scaling as per-pair
  // frequency divisors [rope_dim / 2] (inv_i = base_i / ff_i) instead of keys.
  const float* rope_freqs = nullptr;
  AlignedBuffer small_f32;  // owns converted norms/biases
};

// Calls fn on every weight matrix a forward multiplies by (the layers', then
// the LM head); W is Weights or const Weights.
template <class W, class Fn>
void ForEachMatrix(W& w, Fn&& fn) {
  for (auto& L : w.layers)
    for (auto* m : {&L.wq, &L.wk, &L.wv, &L.wqkv, &L.wo, &L.w_gate, &L.w_up, &L.w_down})
      if (m->valid()) fn(*m);
  if (w.output.valid()) fn(w.output);
}

// A source of named tensors: returns the matrix for a canonical name or an
// invalid Matrix when absent. Implemented over GGUF, HF (name-mapped, MLX
// aware) and llama2.c files by the loader.
using TensorLookup = std::function<Result<Matrix>(const std::string& canonical_name)>;

// Binds and shape-checks every tensor the config needs. Errors name the tensor.
Result<Weights> BindWeights(const ModelConfig& c, const TensorLookup& lookup);

// Canonical name -> Hugging Face name for a family ("blk.3.attn_q.weight" ->
// "model.layers.3.self_attn.q_proj.weight"); used by the HF loader and converter.
std::string HfName(Family f, const std::string& canonical);

}  // namespace lumen::model

namespace lumen::model {

// Every canonical tensor name a config can use (required and optional), in
// file order: token_embd, per layer blk.N.*, output_norm, output.
std::vector<std::string> CanonicalTensorNames(const ModelConfig& c);

// Row order of q/k projections. GGUF llama/mistral/minicpm store them for
// adjacent-pair RoPE; HF for rotate_half. Permuting rows converts: row
// h*Dh + 2i + j (interleaved) <-> h*Dh + j*Dh/2 + i (half).
// Returns the source row for each destination row.
std::vector<int64_t> RopeRowPermutation(int n_heads, int head_dim, bool to_interleaved);

}  // namespace lumen::model
