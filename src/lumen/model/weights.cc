#include "lumen/model/weights.h"

#include <cstring>

#include "lumen/core/quant.h"

namespace lumen::model {
namespace {

struct SmallTensor {
  const float** dst;
  Matrix m;
  int64_t n;
};

Status CheckShape(const std::string& name, const Matrix& m, int64_t n, int64_t k) {
  if (m.n != n || m.k != k)
    return Errorf("tensor '{}': shape [{}, {}], expected [{}, {}]", name, m.n, m.k, n, k);
  return Status::Ok();
}

}  // namespace

Result<Weights> BindWeights(const ModelConfig& c, const TensorLookup& lookup) {
  Weights w;
  std::vector<SmallTensor> small;
  auto matrix = [&](const std::string& name, Matrix& dst, int64_t n, int64_t k,
                    bool required) -> Status {
    LUMEN_ASSIGN_OR_RETURN(dst, lookup(name));
    if (!dst.valid()) {
      return required ? Errorf("tensor '{}' is missing", name) : Status::Ok();
    }
    return CheckShape(name, dst, n, k);
  };
  auto vec = [&](const std::string& name, const float** dst, int64_t n, bool required) -> Status {
    LUMEN_ASSIGN_OR_RETURN(Matrix m, lookup(name));
    if (!m.valid()) return required ? Errorf("tensor '{}' is missing", name) : Status::Ok();
    if (m.w.numel() != n || m.mlx_bits)
      return Errorf("tensor '{}': {} elements, expected {}", name, m.w.numel(), n);
    small.push_back({dst, m, n});
    return Status::Ok();
  };

  const int64_t D = c.dim, F = c.ffn_dim, V = c.vocab_size, Q = c.q_dim(), KV = c.kv_dim();
  LUMEN_RETURN_IF_ERROR(matrix("token_embd.weight", w.tok_embd, V, D, true));
  LUMEN_RETURN_IF_ERROR(vec("output_norm.weight", &w.output_norm, D, true));
  LUMEN_RETURN_IF_ERROR(matrix("output.weight", w.output, V, D, !c.tied_embeddings));
  if (!w.output.valid()) w.output = w.tok_embd;
  LUMEN_RETURN_IF_ERROR(vec("rope_freqs.weight", &w.rope_freqs, c.rope_dim / 2, false));
  w.layers.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    LayerWeights& L = w.layers[l];
    const std::string p = "blk." + std::to_string(l) + ".";
    LUMEN_RETURN_IF_ERROR(vec(p + "attn_norm.weight", &L.attn_norm, D, true));
    if (c.fused_qkv) {
      LUMEN_RETURN_IF_ERROR(matrix(p + "attn_qkv.weight", L.wqkv, Q + 2 * KV, D, true));
    } else {
      LUMEN_RETURN_IF_ERROR(matrix(p + "attn_q.weight", L.wq, Q, D, true));
      LUMEN_RETURN_IF_ERROR(matrix(p + "attn_k.weight", L.wk, KV, D, true));
      LUMEN_RETURN_IF_ERROR(matrix(p + "attn_v.weight", L.wv, KV, D, true));
      LUMEN_RETURN_IF_ERROR(vec(p + "attn_q.bias", &L.bq, Q, false));
      LUMEN_RETURN_IF_ERROR(vec(p + "attn_k.bias", &L.bk, KV, false));
      LUMEN_RETURN_IF_ERROR(vec(p + "attn_v.bias", &L.bv, KV, false));
    }
    if (c.qk_norm) {
      LUMEN_RETURN_IF_ERROR(vec(p + "attn_q_norm.weight", &L.q_norm, c.head_dim, true));
      LUMEN_RETURN_IF_ERROR(vec(p + "attn_k_norm.weight", &L.k_norm, c.head_dim, true));
    }
    LUMEN_RETURN_IF_ERROR(matrix(p + "attn_output.weight", L.wo, D, Q, true));
    LUMEN_RETURN_IF_ERROR(vec(p + "attn_output.bias", &L.bo, D, false));
    LUMEN_RETURN_IF_ERROR(vec(p + "ffn_norm.weight", &L.ffn_norm, D, true));
    if (c.post_norms) {
      LUMEN_RETURN_IF_ERROR(vec(p + "post_attention_norm.weight", &L.post_attn_norm, D, true));
      LUMEN_RETURN_IF_ERROR(vec(p + "post_ffw_norm.weight", &L.post_ffn_norm, D, true));
    }
    if (c.fused_gate_up) {
      LUMEN_RETURN_IF_ERROR(matrix(p + "ffn_up.weight", L.w_up, 2 * F, D, true));
    } else {
      LUMEN_RETURN_IF_ERROR(matrix(p + "ffn_gate.weight", L.w_gate, F, D, true));
      LUMEN_RETURN_IF_ERROR(matrix(p + "ffn_up.weight", L.w_up, F, D, true));
    }
    LUMEN_RETURN_IF_ERROR(matrix(p + "ffn_down.weight", L.w_down, D, F, true));
  }

  // Small vectors: use f32 in place when contiguous, else convert once.
  int64_t total = 0;
  for (const auto& s : small)
    if (s.m.w.dtype != DType::kF32) total += s.n;
  w.small_f32 = AlignedBuffer(size_t(total) * sizeof(float));
  float* out = w.small_f32.as<float>();
  for (const auto& s : small) {
    if (s.m.w.dtype == DType::kF32) {
      *s.dst = static_cast<const float*>(s.m.w.data);
    } else {
      DequantizeRow(s.m.w.dtype, s.m.w.data, out, s.n);
      *s.dst = out;
      out += s.n;
    }
  }
  return w;
}

std::string HfName(Family f, const std::string& canonical) {
  static const std::pair<const char*, const char*> kGlobal[] = {
      {"token_embd.weight", "model.embed_tokens.weight"},
      {"output_norm.weight", "model.norm.weight"},
      {"output.weight", "lm_head.weight"},
  };
  for (const auto& [g, h] : kGlobal)
    if (canonical == g) return h;
  const bool gemma = f == Family::kGemma2 || f == Family::kGemma3;
  // blk.N.<name>.<weight|bias>
  // Split "blk.<digits>.<part>.<weight|bias>" by hand (std::regex is slow and
  // draws false -Wmaybe-uninitialized from libstdc++ under sanitizers).
  std::string_view rest(canonical);
  if (!rest.starts_with("blk.")) return canonical;
  rest.remove_prefix(4);
  const size_t dot = rest.find('.');
  if (dot == 0 || dot == std::string_view::npos) return canonical;
  const std::string layer(rest.substr(0, dot));
  if (layer.find_first_not_of("0123456789") != std::string::npos) return canonical;
  rest.remove_prefix(dot + 1);
  const size_t last = rest.rfind('.');
  if (last == 0 || last == std::string_view::npos) return canonical;
  const std::string part(rest.substr(0, last)), kind(rest.substr(last + 1));
  if (kind != "weight" && kind != "bias") return canonical;
  if (part.find_first_not_of("abcdefghijklmnopqrstuvwxyz_") != std::string::npos) return canonical;
  std::string hf;
  if (part == "attn_norm")
    hf = "input_layernorm";
  else if (part == "attn_q")
    hf = "self_attn.q_proj";
  else if (part == "attn_k")
    hf = "self_attn.k_proj";
  else if (part == "attn_v")
    hf = "self_attn.v_proj";
  else if (part == "attn_qkv")
    hf = "self_attn.qkv_proj";
  else if (part == "attn_output")
    hf = "self_attn.o_proj";
  else if (part == "attn_q_norm")
    hf = "self_attn.q_norm";
  else if (part == "attn_k_norm")
    hf = "self_attn.k_norm";
  else if (part == "post_attention_norm")
    hf = "post_attention_layernorm";
  else if (part == "ffn_norm")
    hf = gemma ? "pre_feedforward_layernorm" : "post_attention_layernorm";
  else if (part == "post_ffw_norm")
    hf = "post_feedforward_layernorm";
  else if (part == "ffn_gate")
    hf = "mlp.gate_proj";
  else if (part == "ffn_up")
    hf = f == Family::kPhi3 ? "mlp.gate_up_proj" : "mlp.up_proj";
  else if (part == "ffn_down")
    hf = "mlp.down_proj";
  else
    return canonical;
  return "model.layers." + layer + "." + hf + "." + kind;
}

}  // namespace lumen::model

namespace lumen::model {

std::vector<std::string> CanonicalTensorNames(const ModelConfig& c) {
  // Only the names this config can use: several canonical names map to one HF
  // name across families (post_attention_layernorm is the pre-FFN norm of
  // llama-style models but Gemma's sandwich norm), so listing Gemma's names for
  // a llama model would bind its pre-FFN norm under the wrong role.
  std::vector<std::string> names = {"token_embd.weight"};
  std::vector<const char*> layer = {"attn_norm.weight"};
  if (c.fused_qkv) {
    layer.push_back("attn_qkv.weight");
  } else {
    for (const char* n : {"attn_q.weight", "attn_q.bias", "attn_k.weight", "attn_k.bias",
                          "attn_v.weight", "attn_v.bias"})
      layer.push_back(n);
  }
  if (c.qk_norm) {
    layer.push_back("attn_q_norm.weight");
    layer.push_back("attn_k_norm.weight");
  }
  layer.push_back("attn_output.weight");
  layer.push_back("attn_output.bias");
  if (c.post_norms) layer.push_back("post_attention_norm.weight");
  layer.push_back("ffn_norm.weight");
  if (!c.fused_gate_up) layer.push_back("ffn_gate.weight");
  layer.push_back("ffn_up.weight");
  layer.push_back("ffn_down.weight");
  if (c.post_norms) layer.push_back("post_ffw_norm.weight");
  for (int l = 0; l < c.n_layers; ++l)
    for (const char* n : layer) names.push_back("blk." + std::to_string(l) + "." + n);
  names.push_back("output_norm.weight");
  names.push_back("output.weight");
  names.push_back("rope_freqs.weight");
  return names;
}

std::vector<int64_t> RopeRowPermutation(int n_heads, int head_dim, bool to_interleaved) {
  const int half = head_dim / 2;
  std::vector<int64_t> src(int64_t(n_heads) * head_dim);
  for (int h = 0; h < n_heads; ++h)
    for (int i = 0; i < half; ++i)
      for (int j = 0; j < 2; ++j) {
        const int64_t inter = int64_t(h) * head_dim + 2 * i + j;
        const int64_t halfr = int64_t(h) * head_dim + j * half + i;
        if (to_interleaved)
          src[inter] = halfr;
        else
          src[halfr] = inter;
      }
  return src;
}

}  // namespace lumen::model
