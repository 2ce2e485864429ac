#include "lumen/engine/synth.h"

#include <cmath>
#include <cstdio>

#include "lumen/tokenize/tokenizer.h"

namespace lumen::engine {
namespace {

using model::Family;
using model::ModelConfig;

uint64_t SplitMix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t HashName(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Standard normal draws (Box-Muller) from a splitmix stream.
void FillNormal(uint64_t seed, float scale, float mean, float* out, int64_t n) {
  uint64_t s = seed;
  for (int64_t i = 0; i < n; i += 2) {
    const double u1 = (double(SplitMix(s) >> 11) + 1.0) * 0x1.0p-53;
    const double u2 = double(SplitMix(s) >> 11) * 0x1.0p-53;
    const double r = std::sqrt(-2.0 * std::log(u1));
    out[i] = mean + scale * float(r * std::cos(2 * M_PI * u2));
    if (i + 1 < n) out[i + 1] = mean + scale * float(r * std::sin(2 * M_PI * u2));
  }
}

ModelConfig Base(Family f, int L, int D, int H, int Hkv, int F, int V, int64_t ctx) {
  ModelConfig c;
  c.family = f;
  c.n_layers = L;
  c.dim = D;
  c.n_heads = H;
  c.n_kv_heads = Hkv;
  c.ffn_dim = F;
  c.vocab_size = V;
  c.max_ctx = ctx;
  c.rope_style = kernels::RopeStyle::kHalf;
  return c;
}

// Family switches as ConfigFromHf would set them (HF conventions).
void ApplyFamily(ModelConfig& c) {
  switch (c.family) {
    case Family::kQwen3:
      c.qk_norm = true;
      break;
    case Family::kGemma2:
    case Family::kGemma3:
      c.norm_offset = 1.0f;
      c.post_norms = true;
      c.qk_norm = c.family == Family::kGemma3;
      c.act = kernels::Activation::kGeluTanh;
      c.embed_scale = std::sqrt(float(c.dim));
      c.tied_embeddings = true;
      if (c.family == Family::kGemma2) {
        c.attn_softcap = 50.0f;
        c.final_softcap = 30.0f;
      } else {
        c.rope_theta_local = 10000.0;
        c.rope_theta = 1000000.0;
      }
      break;
    case Family::kMiniCpm:
      c.embed_scale = 12.0f;
      c.residual_scale = float(1.4 / std::sqrt(double(c.n_layers)));
      c.logit_scale = 0.25f;
      break;
    case Family::kPhi3:
      c.fused_qkv = true;
      c.fused_gate_up = true;
      break;
    default:
      break;
  }
}

}  // namespace

Status ParseSynthQuant(std::string_view q, SynthOptions& o) {
  if (q.starts_with("mlx")) {
    std::string_view rest = q.substr(3);
    int bits = 0, group = 64;
    if (rest.starts_with("4"))
      bits = 4;
    else if (rest.starts_with("8"))
      bits = 8;
    if (bits) rest = rest.substr(1);
    if (rest == "-g32")
      group = 32;
    else if (rest == "-g64")
      group = 64;
    else if (rest == "-g128")
      group = 128;
    else if (!rest.empty())
      bits = 0;
    if (!bits) return Errorf("--quant: '{}' is not mlx4, mlx8 or mlx<4|8>-g<32|64|128>", q);
    o.mlx_bits = bits;
    o.mlx_group = group;
    o.format = OutputFormat::kHf;
    return Status::Ok();
  }
  if (q == "q4_k_m") {
    o.dtype = DType::kQ4_K;
    o.q4_k_m = true;
    return Status::Ok();
  }
  const std::optional<DType> t = ParseDType(q);
  if (!t) return Errorf("--quant: unknown type '{}'", q);
  o.dtype = *t;
  return Status::Ok();
}

std::vector<std::string> SynthNames() {
  return {"llama-3.2-1b", "qwen3-0.6b",   "gemma-3-1b", "tiny-llama",
          "tiny-mistral", "tiny-qwen2",   "tiny-qwen3", "tiny-gemma2",
          "tiny-gemma3",  "tiny-minicpm", "tiny-phi3"};
}

Result<ModelConfig> SynthConfig(const SynthOptions& o) {
  ModelConfig c;
  const std::string& n = o.name;
  if (n == "llama-3.2-1b") {
    c = Base(Family::kLlama, 16, 2048, 32, 8, 8192, 128256, 131072);
    c.rope_theta = 500000.0;
    c.tied_embeddings = true;
    c.rope_scaling.type = kernels::RopeScaling::Type::kLlama3;
    c.rope_scaling.factor = 32.0;
    c.rope_scaling.low_freq_factor = 1.0;
    c.rope_scaling.high_freq_factor = 4.0;
    c.rope_scaling.original_max_pos = 8192;
  } else if (n == "qwen3-0.6b") {
    c = Base(Family::kQwen3, 28, 1024, 16, 8, 3072, 151936, 40960);
    c.head_dim = 128;
    c.rope_theta = 1000000.0;
    c.norm_eps = 1e-6f;
    c.tied_embeddings = true;
  } else if (n == "gemma-3-1b") {
    c = Base(Family::kGemma3, 26, 1152, 4, 1, 6912, 262144, 32768);
    c.head_dim = 256;
    c.norm_eps = 1e-6f;
    c.sliding_window = 512;
    c.attn_scale = float(1.0 / 16.0);  // query_pre_attn_scalar 256
  } else if (n.starts_with("tiny-")) {
    LUMEN_ASSIGN_OR_RETURN(Family f, model::ParseFamily(n.substr(5)));
    // Small but with GQA, odd-ish sizes and every family feature exercised.
    c = Base(f, 2, 64, 4, 2, 96, 512, 256);
    c.head_dim = f == Family::kQwen3 || f == Family::kGemma3 ? 32 : 0;
    if (f == Family::kMistral || f == Family::kGemma2 || f == Family::kGemma3 ||
        f == Family::kQwen2 || f == Family::kQwen3)
      c.sliding_window = 8;
    // Qwen: use_sliding_window; qwen2 slides layer 1 (max_window_layers 1),
    // qwen3 layer 0 (only expressible with layer_types).
    if (f == Family::kQwen2) c.layer_sliding = {false, true};
    if (f == Family::kQwen3) c.layer_sliding = {true, false};
    if (f == Family::kPhi3) c.rope_dim = 8;  // partial_rotary_factor 0.5 of head_dim 16
    if (f == Family::kGemma2 || f == Family::kGemma3) c.n_layers = f == Family::kGemma3 ? 3 : 2;
    if (f == Family::kGemma3) c.attn_scale = float(1.0 / std::sqrt(24.0));
  } else {
    return Errorf("synth: unknown model shape '{}'", n);
  }
  if (o.layers) c.n_layers = o.layers;
  if (o.dim) c.dim = o.dim;
  if (o.ffn) c.ffn_dim = o.ffn;
  if (o.heads) c.n_heads = o.heads;
  if (o.kv_heads) c.n_kv_heads = o.kv_heads;
  if (o.vocab) c.vocab_size = o.vocab;
  if (o.ctx) c.max_ctx = o.ctx;
  c.pooling = o.pooling;
  if (int(c.layer_sliding.size()) != c.n_layers) c.layer_sliding.clear();
  if (c.family == Family::kPhi3 && c.rope_dim > 0 && o.dim) c.rope_dim = 0;  // reshaped: full
  ApplyFamily(c);
  if (c.family == Family::kGemma3) {
    c.layer_sliding.assign(c.n_layers, false);
    for (int i = 0; i < c.n_layers; ++i)
      c.layer_sliding[i] = c.sliding_window > 0 && (i + 1) % (c.n_layers >= 6 ? 6 : 3) != 0;
  } else if (c.family == Family::kGemma2) {
    c.layer_sliding.assign(c.n_layers, false);
    for (int i = 0; i < c.n_layers; ++i) c.layer_sliding[i] = c.sliding_window > 0 && i % 2 == 0;
  }
  LUMEN_RETURN_IF_ERROR(c.Finalize().WithContext("synth " + n));
  return c;
}

Status Synthesize(const SynthOptions& o) {
  LUMEN_ASSIGN_OR_RETURN(ModelConfig c, SynthConfig(o));
  const auto kind = c.family == Family::kGemma2 || c.family == Family::kGemma3 ||
                            (c.family == Family::kLlama && c.vocab_size <= 32000)
                        ? tokenize::SyntheticKind::kSpm
                        : tokenize::SyntheticKind::kByteBpe;
  LUMEN_ASSIGN_OR_RETURN(tokenize::Tokenizer tok,
                         tokenize::MakeSyntheticTokenizer(kind, c.vocab_size, o.seed));
  // Plans in HF conventions, then adjusted for GGUF like a conversion would.
  const bool gguf = o.format == OutputFormat::kGguf;
  const bool tiny = o.name.starts_with("tiny-");
  const float std_w = tiny ? 0.2f : 0.02f;  // tiny models: larger weights, non-trivial logits
  const int64_t D = c.dim, F = c.ffn_dim, V = c.vocab_size, Q = c.q_dim(), KV = c.kv_dim();
  std::vector<TensorPlan> plans;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float scale, float mean) {
    TensorPlan p;
    p.name = name;
    p.shape = shape;
    const uint64_t base = HashName(name) ^ (o.seed * 0x9e3779b97f4a7c15ull);
    const int64_t cols = shape.back();
    p.row = [base, scale, mean, cols](int64_t r, float* out) {
      FillNormal(base + uint64_t(r) * 0x632be59bd9b4e019ull, scale, mean, out, cols);
    };
    plans.push_back(std::move(p));
  };
  // Norm weights: HF Gemma stores w with (1 + w) applied, others w near 1.
  const bool gemma = c.family == Family::kGemma2 || c.family == Family::kGemma3;
  const float norm_mean = gemma ? 0.0f : 1.0f;
  add("token_embd.weight", {V, D}, tiny ? 1.0f : 0.02f, 0);
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    add(p + "attn_norm.weight", {D}, 0.1f, norm_mean);
    if (c.fused_qkv) {
      add(p + "attn_qkv.weight", {Q + 2 * KV, D}, std_w, 0);
    } else {
      add(p + "attn_q.weight", {Q, D}, std_w, 0);
      add(p + "attn_k.weight", {KV, D}, std_w, 0);
      add(p + "attn_v.weight", {KV, D}, std_w, 0);
      if (c.family == Family::kQwen2) {
        add(p + "attn_q.bias", {Q}, std_w, 0);
        add(p + "attn_k.bias", {KV}, std_w, 0);
        add(p + "attn_v.bias", {KV}, std_w, 0);
      }
    }
    if (c.qk_norm) {
      add(p + "attn_q_norm.weight", {c.head_dim}, 0.1f, norm_mean);
      add(p + "attn_k_norm.weight", {c.head_dim}, 0.1f, norm_mean);
    }
    add(p + "attn_output.weight", {D, Q}, std_w, 0);
    if (c.post_norms) add(p + "post_attention_norm.weight", {D}, 0.1f, norm_mean);
    add(p + "ffn_norm.weight", {D}, 0.1f, norm_mean);
    if (c.fused_gate_up) {
      add(p + "ffn_up.weight", {2 * F, D}, std_w, 0);
    } else {
      add(p + "ffn_gate.weight", {F, D}, std_w, 0);
      add(p + "ffn_up.weight", {F, D}, std_w, 0);
    }
    add(p + "ffn_down.weight", {D, F}, std_w, 0);
    if (c.post_norms) add(p + "post_ffw_norm.weight", {D}, 0.1f, norm_mean);
  }
  add("output_norm.weight", {D}, 0.1f, norm_mean);
  if (!c.tied_embeddings) add("output.weight", {V, D}, std_w, 0);
  if (o.q4_k_m) {
    const int L = c.n_layers;
    auto more_bits = [L](int l) { return l < L / 8 || l >= 7 * L / 8 || (l - L / 8) % 3 == 2; };
    for (auto& p : plans) {
      int l = -1;
      std::sscanf(p.name.c_str(), "blk.%d.", &l);
      const bool head = p.name == (c.tied_embeddings ? "token_embd.weight" : "output.weight");
      const bool mixed = p.name.ends_with("attn_v.weight") || p.name.ends_with("ffn_down.weight");
      if (head || (mixed && l >= 0 && more_bits(l))) p.dtype = DType::kQ6_K;
    }
  }

  WriteOptions wo;
  wo.dtype = o.dtype ? o.dtype : std::optional<DType>(tiny ? DType::kF32 : DType::kF16);
  wo.chat_template = tok.chat_template();
  wo.mlx_bits = o.mlx_bits;
  wo.mlx_group = o.mlx_group;
  wo.threads = o.threads;
  if (o.mlx_bits && gguf) return Error("synth: MLX quantization needs --format hf");
  if (!gguf) return WriteHfModel(c, tok, plans, wo, o.out);

  // GGUF conventions: pair-rotated q/k for llama-style archs, Gemma norms 1 + w.
  ModelConfig g = c;
  const bool pairs =
      c.family == Family::kLlama || c.family == Family::kMistral || c.family == Family::kMiniCpm;
  g.rope_style = pairs ? kernels::RopeStyle::kInterleaved : kernels::RopeStyle::kHalf;
  g.norm_offset = 0.0f;
  for (auto& p : plans) {
    const bool is_q = p.name.ends_with("attn_q.weight") || p.name.ends_with("attn_q.bias");
    const bool is_k = p.name.ends_with("attn_k.weight") || p.name.ends_with("attn_k.bias");
    if (pairs && (is_q || is_k)) {
      auto perm = model::RopeRowPermutation(is_q ? c.n_heads : c.n_kv_heads, c.head_dim, true);
      auto inner = p.row;
      const int64_t cols = p.shape.back();
      const bool bias = p.shape.size() == 1;
      p.row = [inner, perm, cols, bias](int64_t r, float* out) {
        if (bias) {
          std::vector<float> tmp(cols);
          inner(0, tmp.data());
          for (int64_t i = 0; i < cols; ++i) out[i] = tmp[perm[i]];
        } else {
          inner(perm[r], out);
        }
      };
    }
    if (gemma && p.name.find("norm.weight") != std::string::npos) {
      auto inner = p.row;
      const int64_t cols = p.shape.back();
      p.row = [inner, cols](int64_t r, float* out) {
        inner(r, out);
        for (int64_t i = 0; i < cols; ++i) out[i] += 1.0f;
      };
    }
  }
  return WriteGgufModel(g, tok, plans, wo, o.out);
}

}  // namespace lumen::engine
