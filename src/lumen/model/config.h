// ModelConfig: one struct that describes every supported dense family.
//
// Filled from HF config.json (FromHfConfig), GGUF metadata (FromGguf) or a
// llama2.c header; the forward reads only this struct, never the family name,
// so a family is a set of switches here (docs/design/families.md). Missing or
// unknown keys are errors naming the key.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lumen/core/status.h"
#include "lumen/formats/gguf.h"
#include "lumen/kernels/activation.h"
#include "lumen/kernels/rope.h"

namespace lumen::model {

enum class Family { kLlama, kMistral, kQwen2, kQwen3, kGemma2, kGemma3, kMiniCpm, kPhi3 };

std::string_view FamilyName(Family f);              // "llama", "qwen3", ...
Result<Family> ParseFamily(std::string_view name);  // HF model_type or GGUF arch

// How an embedding model turns a sequence's final hidden states into one
// vector (llama.cpp's llama_pooling_type values, GGUF "<arch>.pooling_type";
// sentence-transformers' 1_Pooling/config.json). kNone: not an embedding model.
enum class Pooling { kNone = 0, kMean = 1, kCls = 2, kLast = 3 };

std::string_view PoolingName(Pooling p);              // "none", "mean", "cls", "last"
Result<Pooling> ParsePooling(std::string_view name);  // the names above

struct ModelConfig {
  Family family = Family::kLlama;
  int n_layers = 0;
  int dim = 0;         // D
  int n_heads = 0;     // H
  int n_kv_heads = 0;  // Hkv
  int head_dim = 0;    // Dh
  int ffn_dim = 0;     // F
  int vocab_size = 0;  // V
  int64_t max_ctx = 0;

  float norm_eps = 1e-5f;
  float norm_offset = 0.0f;  // 1 for Gemma's (1 + w) weights as stored in HF files
  bool qk_norm = false;      // Qwen3, Gemma3
  bool post_norms = false;   // Gemma2/3: post-attention and post-FFN norms
  kernels::Activation act = kernels::Activation::kSilu;

  float embed_scale = 1.0f;  // sqrt(D) for Gemma, scale_emb for MiniCPM
  // HF Gemma multiplies by sqrt(D) as a tensor of the embedding's dtype, so for
  // bf16/f16 checkpoints the constant is rounded to that dtype (families.md
  // section 6); the forward rounds embed_scale to the bound tok_embd dtype.
  bool embed_scale_in_weight_dtype = false;
  float residual_scale = 1.0f;  // MiniCPM scale_depth / sqrt(L)
  float logit_scale = 1.0f;     // MiniCPM 1 / (D / dim_model_base)
  float attn_scale = 0.0f;      // q.k multiplier (1/sqrt(Dh) unless overridden)
  float attn_softcap = 0.0f;    // Gemma2
  float final_softcap = 0.0f;   // Gemma2

  // Rotary embeddings: global layers use rope_theta + rope_scaling, sliding
  // layers rope_theta_local (Gemma3) with no scaling.
  kernels::RopeStyle rope_style = kernels::RopeStyle::kHalf;
  int rope_dim = 0;  // rotated dims per head (partial rotary when < Dh)
  double rope_theta = 10000.0;
  double rope_theta_local = 0.0;  // 0: same as rope_theta
  kernels::RopeScaling rope_scaling;
  // GGUF with llama.cpp's rope_freqs.weight: the llama3 scaling lumen made it
  // from (lumen-only keys), so `convert` can write config.json's rope_scaling
  // back. The forward uses the tensor, never this.
  kernels::RopeScaling rope_freqs_source;

  int64_t sliding_window = 0;       // 0: none
  std::vector<bool> layer_sliding;  // [L]: true if the layer uses the window

  bool tied_embeddings = false;
  bool fused_qkv = false;      // Phi3: one attn_qkv weight
  bool fused_gate_up = false;  // Phi3: ffn_up holds gate then up

  // Embedding models (engine/embed.h): set from GGUF "<arch>.pooling_type" or,
  // for HF directories, from sentence-transformers' modules.json (engine/model.cc).
  Pooling pooling = Pooling::kNone;

  int64_t q_dim() const { return int64_t(n_heads) * head_dim; }
  int64_t kv_dim() const { return int64_t(n_kv_heads) * head_dim; }

  // Fills derived fields (attn_scale, rope_dim, layer_sliding) and checks sizes.
  Status Finalize();
};

// config.json of a Hugging Face model directory.
Result<ModelConfig> ConfigFromHf(const nlohmann::json& config);
// GGUF metadata ("<arch>.block_count", ...). Norm weights in GGUF already hold
// (1 + w) for Gemma (llama.cpp's converter adds it), so norm_offset stays 0.
Result<ModelConfig> ConfigFromGguf(const formats::GgufFile& gguf);
// Writes the GGUF metadata that ConfigFromGguf reads back to the same config.
void ConfigToGguf(const ModelConfig& c, formats::GgufWriter& w);
// Writes config.json semantics (the inverse of ConfigFromHf).
nlohmann::json ConfigToHf(const ModelConfig& c);

}  // namespace lumen::model
