#include "lumen/engine/convert.h"

#include <cstdio>
#include <filesystem>

#include "lumen/core/repack.h"
#include "lumen/kernels/matrix.h"
#include "lumen/model/forward.h"

namespace lumen::engine {
namespace {

bool IsNorm(const std::string& name) { return name.find("norm.weight") != std::string::npos; }

// The adapter parts attached to the weight a canonical tensor name holds:
// (first row, LoRA) pairs, several for Phi3's fused attn_qkv / ffn_up rows.
struct LoraRows {
  int64_t begin;
  model::LoraMatrix lora;
};
std::vector<LoraRows> AttachedLora(const model::Weights& w, const model::ModelConfig& c,
                                   const std::string& name) {
  static constexpr std::pair<const char*, int> kSuffix[] = {
      {".attn_q.weight", model::kLoraQ},      {".attn_k.weight", model::kLoraK},
      {".attn_v.weight", model::kLoraV},      {".attn_output.weight", model::kLoraO},
      {".ffn_gate.weight", model::kLoraGate}, {".ffn_up.weight", model::kLoraUp},
      {".ffn_down.weight", model::kLoraDown}};
  int layer = -1;
  if (std::sscanf(name.c_str(), "blk.%d.", &layer) != 1 || layer < 0 ||
      layer >= int(w.layers.size()))
    return {};
  const auto& lw = w.layers[layer];
  std::vector<LoraRows> out;
  auto add = [&](int64_t begin, int t) {
    if (lw.lora[t].valid()) out.push_back({begin, lw.lora[t]});
  };
  if (name.ends_with(".attn_qkv.weight")) {
    add(0, model::kLoraQ);
    add(c.q_dim(), model::kLoraK);
    add(c.q_dim() + c.kv_dim(), model::kLoraV);
  } else if (name.ends_with(".ffn_up.weight") && !lw.w_gate.valid()) {
    add(0, model::kLoraGate);
    add(c.ffn_dim, model::kLoraUp);
  } else {
    for (const auto& [suffix, t] : kSuffix)
      if (name.ends_with(suffix)) add(0, t);
  }
  return out;
}

}  // namespace

std::vector<TensorPlan> PlansFor(const Model& m, OutputFormat format, model::ModelConfig& target) {
  const model::ModelConfig& src = m.config();
  target = src;
  using model::Family;
  const bool pairs_family = src.family == Family::kLlama || src.family == Family::kMistral ||
                            src.family == Family::kMiniCpm;
  target.rope_style = format == OutputFormat::kGguf && pairs_family
                          ? kernels::RopeStyle::kInterleaved
                          : kernels::RopeStyle::kHalf;
  const bool gemma = src.family == Family::kGemma2 || src.family == Family::kGemma3;
  // GGUF has no notion of "rounded to the embedding dtype": store the value used.
  if (format == OutputFormat::kGguf && src.embed_scale_in_weight_dtype) {
    target.embed_scale = model::EmbedScale(src, m.weights());
    target.embed_scale_in_weight_dtype = false;
  }
  target.norm_offset = format == OutputFormat::kHf && gemma ? 1.0f : 0.0f;
  const float norm_add = src.norm_offset - target.norm_offset;
  const bool permute = src.rope_style != target.rope_style;
  const bool to_pairs = target.rope_style == kernels::RopeStyle::kInterleaved;

  std::vector<TensorPlan> plans;
  for (const StoredTensor& t : m.tensors()) {
    if (format == OutputFormat::kGguf && t.name == "output.weight" && src.tied_embeddings) continue;
    TensorPlan p;
    p.name = t.name;
    p.shape = t.shape;
    // (Column groups repacked at load are their plain format on disk.)
    p.source_dtype = t.matrix.mlx_bits ? DType::kF16 : PlainOf(t.matrix.w.dtype);
    const kernels::Matrix mat = t.matrix;
    std::vector<int64_t> perm;
    int heads = 0;
    if (permute && (t.name.ends_with("attn_q.weight") || t.name.ends_with("attn_q.bias")))
      heads = src.n_heads;
    if (permute && (t.name.ends_with("attn_k.weight") || t.name.ends_with("attn_k.bias")))
      heads = src.n_kv_heads;
    if (heads) perm = model::RopeRowPermutation(heads, src.head_dim, to_pairs);
    const bool is_bias = t.name.ends_with(".bias");
    const float add = IsNorm(t.name) ? norm_add : 0.0f;
    // An attached adapter is merged: row r gains s * B[r] A (B in the base's row order).
    const std::vector<LoraRows> loras = AttachedLora(m.weights(), src, t.name);
    p.row = [mat, perm, is_bias, add, loras](int64_t r, float* out) {
      if (!perm.empty() && is_bias) {  // a bias is one row; permute its elements
        std::vector<float> tmp(mat.k);
        kernels::DequantizeMatrixRow(mat, r, tmp.data());
        for (size_t i = 0; i < perm.size(); ++i) out[i] = tmp[perm[i]];
        return;
      }
      const int64_t src_row = perm.empty() ? r : perm[r];
      kernels::DequantizeMatrixRow(mat, src_row, out);
      for (const LoraRows& part : loras) {
        const model::LoraMatrix& l = part.lora;
        const int64_t lr = src_row - part.begin;
        if (lr < 0 || lr >= l.n) continue;
        for (int j = 0; j < l.rank; ++j) {
          const float c = l.scale * l.b[lr * l.rank + j];
          const float* a = l.a + int64_t(j) * l.k;
          for (int64_t i = 0; i < mat.k; ++i) out[i] += c * a[i];
        }
      }
      if (add != 0.0f)
        for (int64_t i = 0; i < mat.k; ++i) out[i] += add;
    };
    plans.push_back(std::move(p));
  }
  return plans;
}

Status ConvertModel(const Model& m, OutputFormat format, const std::string& out,
                    std::optional<DType> dtype) {
  const model::ModelConfig& c = m.config();
  if (c.rope_dim != c.head_dim &&
      (c.family == model::Family::kLlama || c.family == model::Family::kMistral))
    return Error("convert: partial rotary llama models are not supported");
  const bool freqs_known = c.rope_freqs_source.type == kernels::RopeScaling::Type::kLlama3;
  if (format == OutputFormat::kHf && m.weights().rope_freqs && !freqs_known)
    return Error(
        "convert: this GGUF's rope_freqs tensor (llama.cpp's Llama 3.1 rope scaling) "
        "has no config.json equivalent here; convert to GGUF instead");
  model::ModelConfig target;
  std::vector<TensorPlan> plans = PlansFor(m, format, target);
  if (format == OutputFormat::kHf && freqs_known) {
    // The table came from this llama3 scaling: config.json states it instead.
    target.rope_scaling = c.rope_freqs_source;
    target.rope_freqs_source = {};
    std::erase_if(plans, [](const TensorPlan& p) { return p.name == "rope_freqs.weight"; });
  }
  WriteOptions opts;
  opts.dtype = dtype;
  opts.chat_template = m.chat_template();
  opts.name = std::filesystem::path(m.name()).stem().string();
  if (format == OutputFormat::kGguf) return WriteGgufModel(target, m.tokenizer(), plans, opts, out);
  return WriteHfModel(target, m.tokenizer(), plans, opts, out);
}

}  // namespace lumen::engine
