#include "lumen/model/config.h"

#include <algorithm>
#include <cmath>

namespace lumen::model {
namespace {

using kernels::RopeScaling;
using nlohmann::json;

struct FamilyEntry {
  Family family;
  std::string_view name;
};
constexpr FamilyEntry kFamilies[] = {
    {Family::kLlama, "llama"},     {Family::kMistral, "mistral"}, {Family::kQwen2, "qwen2"},
    {Family::kQwen3, "qwen3"},     {Family::kGemma2, "gemma2"},   {Family::kGemma3, "gemma3"},
    {Family::kMiniCpm, "minicpm"}, {Family::kPhi3, "phi3"},
};

// Reads a required number from config.json.
template <typename T>
Status Need(const json& j, const char* key, T& out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Errorf("config.json: missing key '{}'", key);
  if (!it->is_number()) return Errorf("config.json: key '{}' must be a number", key);
  out = it->get<T>();
  return Status::Ok();
}

template <typename T>
Status Opt(const json& j, const char* key, T& out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::Ok();
  if (!it->is_number() && !it->is_boolean())
    return Errorf("config.json: key '{}' must be a number", key);
  out = it->get<T>();
  return Status::Ok();
}

Result<RopeScaling> RopeScalingFromHf(const json& j) {
  RopeScaling s;
  auto it = j.find("rope_scaling");
  if (it == j.end() || it->is_null()) return s;
  if (!it->is_object()) return Error("config.json: 'rope_scaling' must be an object");
  const json& r = *it;
  std::string type = r.value("rope_type", r.value("type", std::string("default")));
  if (type == "default") return s;
  LUMEN_RETURN_IF_ERROR(Opt(r, "factor", s.factor));
  if (type == "linear") {
    s.type = RopeScaling::Type::kLinear;
  } else if (type == "dynamic") {
    s.type = RopeScaling::Type::kDynamic;
  } else if (type == "llama3") {
    s.type = RopeScaling::Type::kLlama3;
    LUMEN_RETURN_IF_ERROR(Opt(r, "low_freq_factor", s.low_freq_factor));
    LUMEN_RETURN_IF_ERROR(Opt(r, "high_freq_factor", s.high_freq_factor));
    LUMEN_RETURN_IF_ERROR(Need(r, "original_max_position_embeddings", s.original_max_pos));
  } else if (type == "yarn") {
    s.type = RopeScaling::Type::kYarn;
    int64_t max_pos = 0;
    LUMEN_RETURN_IF_ERROR(Opt(j, "max_position_embeddings", max_pos));
    s.original_max_pos = max_pos;
    LUMEN_RETURN_IF_ERROR(Opt(r, "original_max_position_embeddings", s.original_max_pos));
    if (s.original_max_pos <= 0)
      return Error(
          "config.json: yarn needs rope_scaling.original_max_position_embeddings or "
          "max_position_embeddings");
    if (r.find("factor") == r.end() || r["factor"].is_null())  // HF: factor = M / O
      s.factor = double(max_pos > 0 ? max_pos : s.original_max_pos) / double(s.original_max_pos);
    LUMEN_RETURN_IF_ERROR(Opt(r, "beta_fast", s.beta_fast));
    LUMEN_RETURN_IF_ERROR(Opt(r, "beta_slow", s.beta_slow));
    LUMEN_RETURN_IF_ERROR(Opt(r, "attention_factor", s.attention_factor));
    if (r.contains("truncate") && r["truncate"].is_boolean() && !r["truncate"].get<bool>())
      return Error("config.json: rope_scaling.truncate false is not supported");
    if (s.attention_factor <= 0) {
      // HF: get_mscale(f, mscale) / get_mscale(f, mscale_all_dim) when both are
      // set and non-zero, else get_mscale(f) (families.md section 3).
      double m = 0, m_all = 0;
      LUMEN_RETURN_IF_ERROR(Opt(r, "mscale", m));
      LUMEN_RETURN_IF_ERROR(Opt(r, "mscale_all_dim", m_all));
      auto g = [&](double mm) { return s.factor <= 1 ? 1.0 : 0.1 * mm * std::log(s.factor) + 1.0; };
      s.attention_factor = m != 0 && m_all != 0 ? g(m) / g(m_all) : g(1.0);
    }
  } else {
    return Errorf(
        "config.json: rope_scaling type '{}' is not supported "
        "(supported: linear, dynamic, llama3, yarn)",
        type);
  }
  if (!(s.factor > 0)) return Error("config.json: rope_scaling.factor must be > 0");
  return s;
}

// "<arch>.attention.sliding_window_pattern": an integer period P (layer i
// slides iff (i + 1) % P != 0; llama.cpp's set_swa_pattern) or a per-layer
// array of bools / 0-1 integers. Absent: the family's period `def`.
Status ReadLayerTypes(const formats::GgufFile& g, const std::string& key, int64_t def, int n_layers,
                      std::vector<bool>& out) {
  out.assign(n_layers, false);
  const formats::GgufValue* v = g.Find(key);
  if (v && v->AsArray()) {
    const auto& a = *v->AsArray();
    if (int(a.size()) != n_layers)
      return Errorf("{}: {} entries for {} layers", key, a.size(), n_layers);
    for (int i = 0; i < n_layers; ++i) {
      auto x = a[i].AsInt();
      if (!x) return Errorf("{}: entry {} is not a bool or integer", key, i);
      out[i] = *x != 0;
    }
    return Status::Ok();
  }
  int64_t period = def;
  if (v) {
    auto x = v->AsInt();
    if (!x) return Errorf("{}: not an integer or array", key);
    period = *x;
  }
  if (period <= 0) return Errorf("{}: period {} must be positive", key, period);
  for (int i = 0; i < n_layers; ++i) out[i] = (i + 1) % period != 0;
  return Status::Ok();
}

std::string_view RopeTypeName(RopeScaling::Type t) {
  switch (t) {
    case RopeScaling::Type::kLinear:
      return "linear";
    case RopeScaling::Type::kDynamic:
      return "dynamic";
    case RopeScaling::Type::kLlama3:
      return "llama3";
    case RopeScaling::Type::kYarn:
      return "yarn";
    default:
      return "none";
  }
}

}  // namespace

std::string_view FamilyName(Family f) {
  for (const auto& e : kFamilies)
    if (e.family == f) return e.name;
  return "?";
}

Result<Family> ParseFamily(std::string_view name) {
  for (const auto& e : kFamilies)
    if (e.name == name) return e.family;
  if (name == "gemma3_text") return Family::kGemma3;
  return Errorf(
      "unknown architecture '{}' (supported: llama, mistral, qwen2, qwen3, gemma2, "
      "gemma3, minicpm, phi3)",
      name);
}

Status ModelConfig::Finalize() {
  if (n_layers <= 0 || dim <= 0 || n_heads <= 0 || ffn_dim <= 0 || vocab_size <= 0)
    return Errorf(
        "model config: layers, width, heads, ffn and vocab must be positive "
        "(got L={} D={} H={} F={} V={})",
        n_layers, dim, n_heads, ffn_dim, vocab_size);
  if (n_kv_heads <= 0) n_kv_heads = n_heads;
  if (n_heads % n_kv_heads != 0)
    return Errorf("model config: {} heads is not a multiple of {} kv heads", n_heads, n_kv_heads);
  if (head_dim <= 0) {
    if (dim % n_heads != 0)
      return Errorf("model config: width {} not divisible by {} heads", dim, n_heads);
    head_dim = dim / n_heads;
  }
  if (rope_dim <= 0) rope_dim = head_dim;
  if (rope_dim > head_dim || rope_dim % 2 != 0)
    return Errorf("model config: rotary dim {} must be even and <= head dim {}", rope_dim,
                  head_dim);
  if (attn_scale == 0.0f) attn_scale = float(1.0 / std::sqrt(double(head_dim)));
  if (max_ctx <= 0) max_ctx = 2048;
  if (rope_theta_local <= 0) rope_theta_local = rope_theta;
  if (layer_sliding.empty()) layer_sliding.assign(n_layers, sliding_window > 0);
  if (int(layer_sliding.size()) != n_layers)
    return Errorf("model config: {} layer types for {} layers", layer_sliding.size(), n_layers);
  if (sliding_window <= 0)
    for (bool s : layer_sliding)
      if (s) return Error("model config: sliding layers but no sliding_window");
  return Status::Ok();
}

Result<ModelConfig> ConfigFromHf(const json& j) {
  if (!j.is_object()) return Error("config.json: not a JSON object");
  ModelConfig c;
  std::string type = j.value("model_type", std::string());
  if (type.empty()) return Error("config.json: missing key 'model_type'");
  LUMEN_ASSIGN_OR_RETURN(c.family, ParseFamily(type).WithContext("config.json: model_type"));
  const bool gemma = c.family == Family::kGemma2 || c.family == Family::kGemma3;
  // Defaults of the HF config classes for keys a config.json may omit
  // (docs/design/families.md section 2).
  c.norm_eps = c.family == Family::kPhi3 ? 1e-5f : 1e-6f;
  if (c.family == Family::kQwen3) c.head_dim = 128;
  if (gemma) c.head_dim = 256;
  if (c.family == Family::kGemma3) c.rope_theta = 1e6;
  switch (c.family) {
    case Family::kMistral:
      c.max_ctx = 4096 * 32;
      break;
    case Family::kQwen2:
    case Family::kQwen3:
      c.max_ctx = 32768;
      break;
    case Family::kGemma2:
      c.max_ctx = 8192;
      break;
    case Family::kGemma3:
      c.max_ctx = 131072;
      break;
    case Family::kPhi3:
      c.max_ctx = 4096;
      break;
    default:
      c.max_ctx = 2048;
      break;
  }
  LUMEN_RETURN_IF_ERROR(Need(j, "num_hidden_layers", c.n_layers));
  LUMEN_RETURN_IF_ERROR(Need(j, "hidden_size", c.dim));
  LUMEN_RETURN_IF_ERROR(Need(j, "num_attention_heads", c.n_heads));
  LUMEN_RETURN_IF_ERROR(Opt(j, "num_key_value_heads", c.n_kv_heads));
  if (auto it = j.find("head_dim"); it != j.end() && it->is_null()) c.head_dim = 0;  // derive
  LUMEN_RETURN_IF_ERROR(Opt(j, "head_dim", c.head_dim));
  LUMEN_RETURN_IF_ERROR(Need(j, "intermediate_size", c.ffn_dim));
  LUMEN_RETURN_IF_ERROR(Need(j, "vocab_size", c.vocab_size));
  LUMEN_RETURN_IF_ERROR(Opt(j, "max_position_embeddings", c.max_ctx));
  LUMEN_RETURN_IF_ERROR(Opt(j, "rms_norm_eps", c.norm_eps));
  LUMEN_RETURN_IF_ERROR(Opt(j, "rope_theta", c.rope_theta));
  c.tied_embeddings = gemma;
  if (c.family == Family::kMiniCpm && !j.contains("tie_word_embeddings"))
    return Error("config.json: missing key 'tie_word_embeddings' (minicpm has no default)");
  LUMEN_RETURN_IF_ERROR(Opt(j, "tie_word_embeddings", c.tied_embeddings));
  LUMEN_ASSIGN_OR_RETURN(c.rope_scaling, RopeScalingFromHf(j));
  c.rope_style = kernels::RopeStyle::kHalf;  // HF rotate_half
  const std::string act = gemma ? j.value("hidden_activation", std::string("gelu_pytorch_tanh"))
                                : j.value("hidden_act", std::string("silu"));
  if (act == "silu" || act == "swish") {
    c.act = kernels::Activation::kSilu;
  } else if (act == "gelu_pytorch_tanh" || act == "gelu_tanh" || act == "gelu_new" ||
             act == "gelu_fast") {
    c.act = kernels::Activation::kGeluTanh;
  } else {
    return Errorf("config.json: activation '{}' is not supported", act);
  }
  if (j.value("mlp_bias", false)) return Error("config.json: 'mlp_bias' true is not supported");

  // Reads sliding_window with a class default: absent -> def, null -> off.
  auto window = [&](int64_t def) -> Status {
    auto it = j.find("sliding_window");
    if (it == j.end()) {
      c.sliding_window = def;
      return Status::Ok();
    }
    if (it->is_null()) {
      c.sliding_window = 0;
      return Status::Ok();
    }
    if (!it->is_number_integer() || it->get<int64_t>() <= 0)
      return Error("config.json: 'sliding_window' must be a positive integer or null");
    c.sliding_window = it->get<int64_t>();
    return Status::Ok();
  };
  // layer_types (transformers >= 4.5x) overrides every family's pattern.
  std::vector<bool> types;
  if (auto it = j.find("layer_types"); it != j.end() && !it->is_null()) {
    if (!it->is_array() || int(it->size()) != c.n_layers)
      return Errorf(
          "config.json: 'layer_types' must be an array of num_hidden_layers ({}) "
          "entries",
          c.n_layers);
    for (const auto& t : *it) {
      if (!t.is_string()) return Error("config.json: 'layer_types' entries must be strings");
      types.push_back(t == "sliding_attention");
    }
  }
  auto pattern = [&](auto slides) {
    c.layer_sliding.assign(c.n_layers, false);
    if (c.sliding_window <= 0) return;
    for (int i = 0; i < c.n_layers; ++i)
      c.layer_sliding[i] = types.empty() ? bool(slides(i)) : bool(types[i]);
  };

  switch (c.family) {
    case Family::kLlama:
      break;
    case Family::kMistral:
      LUMEN_RETURN_IF_ERROR(window(4096));
      pattern([](int) { return true; });
      break;
    case Family::kQwen2:
    case Family::kQwen3: {
      c.qk_norm = c.family == Family::kQwen3;
      c.sliding_window = 0;
      if (j.value("use_sliding_window", false)) LUMEN_RETURN_IF_ERROR(window(4096));
      int max_window_layers = 28;
      LUMEN_RETURN_IF_ERROR(Opt(j, "max_window_layers", max_window_layers));
      pattern([&](int i) { return i >= max_window_layers; });
      break;
    }
    case Family::kGemma2:
    case Family::kGemma3: {
      c.norm_offset = 1.0f;
      c.post_norms = true;
      c.qk_norm = c.family == Family::kGemma3;
      c.embed_scale = std::sqrt(float(c.dim));
      c.embed_scale_in_weight_dtype = true;
      double qpas = 256;
      LUMEN_RETURN_IF_ERROR(Opt(j, "query_pre_attn_scalar", qpas));
      if (!(qpas > 0)) return Error("config.json: 'query_pre_attn_scalar' must be > 0");
      c.attn_scale = float(1.0 / std::sqrt(qpas));
      // Gemma2's class defaults are 50 / 30; Gemma3's are null. null = off.
      if (c.family == Family::kGemma2) {
        c.attn_softcap = 50.0f;
        c.final_softcap = 30.0f;
      }
      for (const char* key : {"attn_logit_softcapping", "final_logit_softcapping"}) {
        float& dst = key[0] == 'a' ? c.attn_softcap : c.final_softcap;
        if (auto it = j.find(key); it != j.end()) {
          if (it->is_null())
            dst = 0;
          else
            LUMEN_RETURN_IF_ERROR(Opt(j, key, dst));
        }
      }
      LUMEN_RETURN_IF_ERROR(window(4096));
      if (c.family == Family::kGemma2) {
        pattern([](int i) { return i % 2 == 0; });
      } else {
        int period = 6;
        LUMEN_RETURN_IF_ERROR(Opt(j, "sliding_window_pattern", period));
        if (period <= 0) return Error("config.json: 'sliding_window_pattern' must be > 0");
        pattern([&](int i) { return (i + 1) % period != 0; });
        c.rope_theta_local = 10000.0;
        LUMEN_RETURN_IF_ERROR(Opt(j, "rope_local_base_freq", c.rope_theta_local));
      }
      break;
    }
    case Family::kMiniCpm: {
      double scale_emb = 0, scale_depth = 0, dim_model_base = 0;
      LUMEN_RETURN_IF_ERROR(Need(j, "scale_emb", scale_emb));
      LUMEN_RETURN_IF_ERROR(Need(j, "scale_depth", scale_depth));
      LUMEN_RETURN_IF_ERROR(Need(j, "dim_model_base", dim_model_base));
      if (!(dim_model_base > 0)) return Error("config.json: 'dim_model_base' must be > 0");
      c.embed_scale = float(scale_emb);
      c.residual_scale = float(scale_depth / std::sqrt(double(c.n_layers)));
      c.logit_scale = float(dim_model_base / double(c.dim));
      break;
    }
    case Family::kPhi3: {
      c.fused_qkv = true;
      c.fused_gate_up = true;
      double partial = 1.0;
      LUMEN_RETURN_IF_ERROR(Opt(j, "partial_rotary_factor", partial));
      LUMEN_RETURN_IF_ERROR(window(0));
      pattern([](int) { return true; });
      if (c.head_dim <= 0 && c.n_heads > 0) c.head_dim = c.dim / c.n_heads;
      c.rope_dim = int(c.head_dim * partial);
      break;
    }
  }
  if (c.layer_sliding.empty()) c.layer_sliding.assign(c.n_layers, false);
  if (std::find(c.layer_sliding.begin(), c.layer_sliding.end(), true) == c.layer_sliding.end())
    c.sliding_window = 0;
  LUMEN_RETURN_IF_ERROR(c.Finalize());
  return c;
}

std::string_view PoolingName(Pooling p) {
  switch (p) {
    case Pooling::kMean:
      return "mean";
    case Pooling::kCls:
      return "cls";
    case Pooling::kLast:
      return "last";
    case Pooling::kNone:
      break;
  }
  return "none";
}

Result<Pooling> ParsePooling(std::string_view name) {
  for (Pooling p : {Pooling::kNone, Pooling::kMean, Pooling::kCls, Pooling::kLast})
    if (name == PoolingName(p)) return p;
  return Errorf("pooling '{}': must be mean, cls, last or none", name);
}

Result<ModelConfig> ConfigFromGguf(const formats::GgufFile& g) {
  LUMEN_ASSIGN_OR_RETURN(std::string arch, g.GetString("general.architecture"));
  ModelConfig c;
  LUMEN_ASSIGN_OR_RETURN(c.family, ParseFamily(arch).WithContext("general.architecture"));
  const std::string p = arch + ".";
  // llama.cpp has no "mistral" arch: Mistral v0.1 is "llama" plus a window.
  if (c.family == Family::kLlama && g.Find(p + "attention.sliding_window"))
    c.family = Family::kMistral;
  auto need = [&](const std::string& k, auto& out) -> Status {
    auto r = g.GetInt(p + k);
    if (!r.ok()) return r.status();
    out = static_cast<std::decay_t<decltype(out)>>(*r);
    return Status::Ok();
  };
  auto opt_i = [&](const std::string& k, auto& out) -> Status {
    auto r = g.GetInt(p + k, int64_t(out));
    if (!r.ok()) return r.status();
    out = static_cast<std::decay_t<decltype(out)>>(*r);
    return Status::Ok();
  };
  auto opt_f = [&](const std::string& k, auto& out) -> Status {
    auto r = g.GetFloat(p + k, double(out));
    if (!r.ok()) return r.status();
    out = static_cast<std::decay_t<decltype(out)>>(*r);
    return Status::Ok();
  };
  LUMEN_RETURN_IF_ERROR(need("block_count", c.n_layers));
  LUMEN_RETURN_IF_ERROR(need("embedding_length", c.dim));
  LUMEN_RETURN_IF_ERROR(need("attention.head_count", c.n_heads));
  c.n_kv_heads = c.n_heads;
  LUMEN_RETURN_IF_ERROR(opt_i("attention.head_count_kv", c.n_kv_heads));
  LUMEN_RETURN_IF_ERROR(need("feed_forward_length", c.ffn_dim));
  LUMEN_RETURN_IF_ERROR(opt_i("context_length", c.max_ctx));
  LUMEN_RETURN_IF_ERROR(opt_i("attention.key_length", c.head_dim));
  LUMEN_RETURN_IF_ERROR(opt_i("rope.dimension_count", c.rope_dim));
  LUMEN_RETURN_IF_ERROR(opt_f("attention.layer_norm_rms_epsilon", c.norm_eps));
  LUMEN_RETURN_IF_ERROR(opt_f("rope.freq_base", c.rope_theta));
  LUMEN_RETURN_IF_ERROR(opt_i("attention.sliding_window", c.sliding_window));
  int64_t pooling = 0;
  LUMEN_RETURN_IF_ERROR(opt_i("pooling_type", pooling));
  if (pooling < 0 || pooling > 3)
    return Errorf("{}: {}pooling_type {} is not supported (0 none, 1 mean, 2 cls, 3 last)",
                  g.path(), p, pooling);
  c.pooling = static_cast<Pooling>(pooling);
  // vocab: metadata key if present, else the token list, else the embedding rows.
  c.vocab_size = 0;
  LUMEN_RETURN_IF_ERROR(opt_i("vocab_size", c.vocab_size));
  if (c.vocab_size == 0) {
    if (const auto* v = g.Find("tokenizer.ggml.tokens"); v && v->AsArray())
      c.vocab_size = int(v->AsArray()->size());
    else if (const auto* t = g.FindTensor("token_embd.weight"))
      c.vocab_size = int(t->view.dim(0));
  }
  // Added tokens appended to the vocabulary without resizing the model: ids
  // the embedding has no row for (llama.cpp refuses such a file too).
  if (const auto* v = g.Find("tokenizer.ggml.tokens"); v && v->AsArray()) {
    const auto* e = g.FindTensor("token_embd.weight");
    const int64_t n_tokens = int64_t(v->AsArray()->size());
    if (e && n_tokens > e->view.dim(0))
      return Errorf(
          "{}: tokenizer.ggml.tokens holds {} tokens but token_embd.weight has {} rows, so "
          "some token ids have no embedding; re-convert the model with its resized embedding",
          g.path(), n_tokens, e->view.dim(0));
  }
  // llama.cpp's key, else lumen's own for the types llama.cpp has no name for.
  const formats::GgufValue* scaling_type = g.Find(p + "rope.scaling.type");
  if (!scaling_type) scaling_type = g.Find(p + "rope.scaling.lumen_type");
  if (const auto* v = scaling_type; v && v->AsString()) {
    const std::string& t = *v->AsString();
    auto& s = c.rope_scaling;
    if (t == "linear")
      s.type = RopeScaling::Type::kLinear;
    else if (t == "yarn")
      s.type = RopeScaling::Type::kYarn;
    else if (t == "dynamic")
      s.type = RopeScaling::Type::kDynamic;
    else if (t == "llama3")
      s.type = RopeScaling::Type::kLlama3;
    else if (t != "none")
      return Errorf("{}rope.scaling.type: '{}' is not supported", p, t);
    LUMEN_RETURN_IF_ERROR(opt_f("rope.scaling.factor", s.factor));
    LUMEN_RETURN_IF_ERROR(opt_i("rope.scaling.original_context_length", s.original_max_pos));
    LUMEN_RETURN_IF_ERROR(opt_f("rope.scaling.low_freq_factor", s.low_freq_factor));
    LUMEN_RETURN_IF_ERROR(opt_f("rope.scaling.high_freq_factor", s.high_freq_factor));
    // yarn_beta_*: llama.cpp's names; beta_*: what older lumen files hold.
    LUMEN_RETURN_IF_ERROR(opt_f("rope.scaling.beta_fast", s.beta_fast));
    LUMEN_RETURN_IF_ERROR(opt_f("rope.scaling.beta_slow", s.beta_slow));
    LUMEN_RETURN_IF_ERROR(opt_f("rope.scaling.yarn_beta_fast", s.beta_fast));
    LUMEN_RETURN_IF_ERROR(opt_f("rope.scaling.yarn_beta_slow", s.beta_slow));
    LUMEN_RETURN_IF_ERROR(opt_f("rope.scaling.attn_factor", s.attention_factor));
  }
  if (g.FindTensor("rope_freqs.weight") && g.Find(p + "rope_freqs.lumen_llama3.factor")) {
    auto& s = c.rope_freqs_source;
    s.type = RopeScaling::Type::kLlama3;
    LUMEN_RETURN_IF_ERROR(opt_f("rope_freqs.lumen_llama3.factor", s.factor));
    LUMEN_RETURN_IF_ERROR(opt_f("rope_freqs.lumen_llama3.low_freq_factor", s.low_freq_factor));
    LUMEN_RETURN_IF_ERROR(opt_f("rope_freqs.lumen_llama3.high_freq_factor", s.high_freq_factor));
    LUMEN_RETURN_IF_ERROR(
        opt_i("rope_freqs.lumen_llama3.original_context_length", s.original_max_pos));
  }
  c.tied_embeddings = g.FindTensor("output.weight") == nullptr;
  // ggml rotates adjacent pairs for llama-style archs, halves for the rest.
  c.rope_style =
      (c.family == Family::kLlama || c.family == Family::kMistral || c.family == Family::kMiniCpm)
          ? kernels::RopeStyle::kInterleaved
          : kernels::RopeStyle::kHalf;
  switch (c.family) {
    case Family::kQwen3:
    case Family::kQwen2:
      c.qk_norm = c.family == Family::kQwen3;
      if (c.sliding_window > 0 && g.Find(p + "attention.sliding_window_pattern")) {
        std::vector<bool> types;
        LUMEN_RETURN_IF_ERROR(
            ReadLayerTypes(g, p + "attention.sliding_window_pattern", 1, c.n_layers, types));
        c.layer_sliding = types;
      }
      break;
    case Family::kGemma2:
    case Family::kGemma3: {
      c.post_norms = true;
      c.qk_norm = c.family == Family::kGemma3;
      c.act = kernels::Activation::kGeluTanh;
      c.embed_scale = std::sqrt(float(c.dim));  // llama.cpp: sqrtf(n_embd), never rounded
      // lumen-only key: a converted bf16/f16 HF Gemma keeps its rounded constant.
      LUMEN_RETURN_IF_ERROR(opt_f("embedding_scale", c.embed_scale));
      if (c.head_dim <= 0) c.head_dim = c.dim / c.n_heads;
      // llama.cpp's defaults: Gemma2 always soft-caps (50 / 30), Gemma3 never.
      // lumen writes 0 for a Gemma2 model without caps (0 = off).
      if (c.family == Family::kGemma2) {
        c.attn_softcap = 50.0f;
        c.final_softcap = 30.0f;
      }
      LUMEN_RETURN_IF_ERROR(opt_f("attn_logit_softcapping", c.attn_softcap));
      LUMEN_RETURN_IF_ERROR(opt_f("final_logit_softcapping", c.final_softcap));
      // query_pre_attn_scalar is not in llama.cpp files (lumen writes its own
      // key); llama.cpp uses 1/sqrt(head_dim) except for the 27B models (46 /
      // 62 layers), which use 1/sqrt(D/H) (families.md section 8).
      double qpas = 0;
      LUMEN_RETURN_IF_ERROR(opt_f("attention.query_pre_attn_scalar", qpas));
      if (qpas <= 0) {
        const bool is27b = c.n_layers == (c.family == Family::kGemma2 ? 46 : 62);
        qpas = is27b ? double(c.dim) / c.n_heads : double(c.head_dim);
      }
      c.attn_scale = float(1.0 / std::sqrt(qpas));
      // Layer pattern: llama.cpp hard-codes 2 (Gemma2: even layers slide) and
      // 6 (Gemma3); lumen writes the period (or a per-layer array) when different.
      std::vector<bool> types;
      LUMEN_RETURN_IF_ERROR(ReadLayerTypes(g, p + "attention.sliding_window_pattern",
                                           c.family == Family::kGemma2 ? 2 : 6, c.n_layers, types));
      c.layer_sliding.assign(c.n_layers, false);
      for (int i = 0; i < c.n_layers; ++i) c.layer_sliding[i] = c.sliding_window > 0 && types[i];
      if (c.family == Family::kGemma3) {
        c.rope_theta_local = 10000.0;
        LUMEN_RETURN_IF_ERROR(opt_f("rope.freq_base_swa", c.rope_theta_local));
      }
      break;
    }
    case Family::kMiniCpm:
      LUMEN_RETURN_IF_ERROR(opt_f("embedding_scale", c.embed_scale));
      LUMEN_RETURN_IF_ERROR(opt_f("residual_scale", c.residual_scale));
      {
        // llama.cpp's converter writes logit_scale = hidden_size / dim_model_base,
        // the divisor HF applies before lm_head; lumen keeps the multiplier.
        // Absent (older files): llama.cpp's fixed dim_model_base of 256.
        double div = double(c.dim) / 256.0;
        LUMEN_RETURN_IF_ERROR(opt_f("logit_scale", div));
        if (!(div > 0)) return Errorf("{}logit_scale: {} must be > 0", p, div);
        c.logit_scale = float(1.0 / div);
      }
      break;
    case Family::kPhi3:
      c.fused_qkv = g.FindTensor("blk.0.attn_qkv.weight") != nullptr;
      c.fused_gate_up = g.FindTensor("blk.0.ffn_gate.weight") == nullptr;
      break;
    default:
      break;
  }
  LUMEN_RETURN_IF_ERROR(c.Finalize().WithContext(g.path()));
  return c;
}

void ConfigToGguf(const ModelConfig& c, formats::GgufWriter& w) {
  // Mistral has no GGUF arch of its own in llama.cpp; it is "llama" + window.
  const std::string arch(c.family == Family::kMistral ? "llama" : FamilyName(c.family));
  const std::string p = arch + ".";
  w.SetString("general.architecture", arch);
  w.SetU32(p + "block_count", c.n_layers);
  w.SetU32(p + "embedding_length", c.dim);
  w.SetU32(p + "attention.head_count", c.n_heads);
  w.SetU32(p + "attention.head_count_kv", c.n_kv_heads);
  w.SetU32(p + "feed_forward_length", c.ffn_dim);
  w.SetU32(p + "context_length", uint32_t(c.max_ctx));
  w.SetU32(p + "attention.key_length", c.head_dim);
  w.SetU32(p + "attention.value_length", c.head_dim);
  w.SetU32(p + "rope.dimension_count", c.rope_dim);
  w.SetU32(p + "vocab_size", c.vocab_size);
  w.SetF32(p + "attention.layer_norm_rms_epsilon", c.norm_eps);
  w.SetF32(p + "rope.freq_base", float(c.rope_theta));
  if (c.sliding_window > 0) w.SetU32(p + "attention.sliding_window", uint32_t(c.sliding_window));
  if (c.pooling != Pooling::kNone) w.SetU32(p + "pooling_type", uint32_t(c.pooling));
  // Rope scaling in llama.cpp's keys where llama.cpp has the type (linear,
  // yarn); llama.cpp aborts on any other rope.scaling.type, so llama3 and
  // dynamic go under a lumen-only key it ignores. (WriteGgufModel turns llama3
  // scaling of "llama" files into llama.cpp's rope_freqs.weight tensor first.)
  const auto& s = c.rope_scaling;
  using T = RopeScaling::Type;
  if (s.type == T::kLinear || s.type == T::kYarn) {
    w.SetString(p + "rope.scaling.type", std::string(RopeTypeName(s.type)));
  } else if (s.type != T::kNone) {
    w.SetString(p + "rope.scaling.lumen_type", std::string(RopeTypeName(s.type)));
  }
  if (s.type != T::kNone) {
    w.SetF32(p + "rope.scaling.factor", float(s.factor));
    if (s.original_max_pos > 0)
      w.SetU32(p + "rope.scaling.original_context_length", uint32_t(s.original_max_pos));
  }
  if (s.type == T::kLlama3) {
    w.SetF32(p + "rope.scaling.low_freq_factor", float(s.low_freq_factor));
    w.SetF32(p + "rope.scaling.high_freq_factor", float(s.high_freq_factor));
  }
  if (s.type == T::kYarn) {
    w.SetF32(p + "rope.scaling.yarn_beta_fast", float(s.beta_fast));
    w.SetF32(p + "rope.scaling.yarn_beta_slow", float(s.beta_slow));
    if (s.attention_factor > 0) w.SetF32(p + "rope.scaling.attn_factor", float(s.attention_factor));
  }
  const bool any_sliding =
      c.sliding_window > 0 &&
      std::find(c.layer_sliding.begin(), c.layer_sliding.end(), true) != c.layer_sliding.end();
  // Which layers slide: a period when one describes them (llama.cpp's form),
  // else a per-layer array (lumen-only key; llama.cpp ignores it).
  auto write_pattern = [&](int64_t family_period) {
    int64_t period = 0;
    for (int64_t P = 1; P <= c.n_layers + 1 && !period; ++P) {
      bool ok = true;
      for (int i = 0; i < c.n_layers && ok; ++i) ok = c.layer_sliding[i] == ((i + 1) % P != 0);
      if (ok) period = P;
    }
    if (period == family_period) return;
    if (period > 0) {
      w.SetU32(p + "attention.sliding_window_pattern", uint32_t(period));
    } else {
      std::vector<int32_t> v(c.layer_sliding.begin(), c.layer_sliding.end());
      w.SetI32Array(p + "attention.sliding_window_pattern", v);
    }
  };
  if ((c.family == Family::kQwen2 || c.family == Family::kQwen3) && any_sliding) write_pattern(1);
  if (c.family == Family::kGemma2 || c.family == Family::kGemma3) {
    // Gemma2 GGUF readers default to caps 50 / 30, so "off" is written as 0.
    if (c.family == Family::kGemma2 || c.attn_softcap > 0)
      w.SetF32(p + "attn_logit_softcapping", c.attn_softcap);
    if (c.family == Family::kGemma2 || c.final_softcap > 0)
      w.SetF32(p + "final_logit_softcapping", c.final_softcap);
    w.SetF32(p + "attention.query_pre_attn_scalar", 1.0f / (c.attn_scale * c.attn_scale));
    if (c.embed_scale != std::sqrt(float(c.dim))) w.SetF32(p + "embedding_scale", c.embed_scale);
    if (any_sliding) write_pattern(c.family == Family::kGemma2 ? 2 : 6);
    if (c.family == Family::kGemma3) w.SetF32(p + "rope.freq_base_swa", float(c.rope_theta_local));
  }
  if (c.family == Family::kMiniCpm) {
    w.SetF32(p + "embedding_scale", c.embed_scale);
    w.SetF32(p + "residual_scale", c.residual_scale);
    w.SetF32(p + "logit_scale", float(1.0 / double(c.logit_scale)));  // H / dim_model_base
  }
}

nlohmann::json ConfigToHf(const ModelConfig& c) {
  static const char* kArch[] = {"LlamaForCausalLM",   "MistralForCausalLM", "Qwen2ForCausalLM",
                                "Qwen3ForCausalLM",   "Gemma2ForCausalLM",  "Gemma3ForCausalLM",
                                "MiniCPMForCausalLM", "Phi3ForCausalLM"};
  json j;
  j["architectures"] = {kArch[int(c.family)]};
  j["model_type"] = c.family == Family::kGemma3 ? "gemma3_text" : std::string(FamilyName(c.family));
  j["num_hidden_layers"] = c.n_layers;
  j["hidden_size"] = c.dim;
  j["num_attention_heads"] = c.n_heads;
  j["num_key_value_heads"] = c.n_kv_heads;
  j["head_dim"] = c.head_dim;
  j["intermediate_size"] = c.ffn_dim;
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_ctx;
  j["rms_norm_eps"] = c.norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["tie_word_embeddings"] = c.tied_embeddings;
  j["hidden_act"] = c.act == kernels::Activation::kSilu ? "silu" : "gelu_pytorch_tanh";
  const auto& s = c.rope_scaling;
  if (s.type != RopeScaling::Type::kNone) {
    json r = {{"rope_type", RopeTypeName(s.type)}, {"factor", s.factor}};
    if (s.type == RopeScaling::Type::kLlama3) {
      r["low_freq_factor"] = s.low_freq_factor;
      r["high_freq_factor"] = s.high_freq_factor;
      r["original_max_position_embeddings"] = s.original_max_pos;
    } else if (s.type == RopeScaling::Type::kYarn) {
      r["original_max_position_embeddings"] = s.original_max_pos;
      r["beta_fast"] = s.beta_fast;
      r["beta_slow"] = s.beta_slow;
      if (s.attention_factor > 0) r["attention_factor"] = s.attention_factor;
    }
    j["rope_scaling"] = r;
  }
  switch (c.family) {
    case Family::kMistral:
      j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
      break;
    case Family::kQwen2:
    case Family::kQwen3: {
      const bool any =
          std::find(c.layer_sliding.begin(), c.layer_sliding.end(), true) != c.layer_sliding.end();
      j["use_sliding_window"] = c.sliding_window > 0 && any;
      j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
      // max_window_layers = first sliding layer when the sliding layers are a
      // suffix (older readers), and layer_types always (newer ones).
      int first = c.n_layers;
      for (int i = c.n_layers - 1; i >= 0 && c.layer_sliding[i]; --i) first = i;
      j["max_window_layers"] = first;
      json types = json::array();
      for (bool s2 : c.layer_sliding) types.push_back(s2 ? "sliding_attention" : "full_attention");
      j["layer_types"] = types;
      break;
    }
    case Family::kGemma2:
    case Family::kGemma3: {
      j["hidden_activation"] = "gelu_pytorch_tanh";
      {
        const double q = 1.0 / (double(c.attn_scale) * c.attn_scale);
        // attn_scale is a float: snap 255.99998 back to the integer it came from.
        j["query_pre_attn_scalar"] =
            std::abs(q - std::round(q)) < 1e-3 * q ? json(std::llround(q)) : json(q);
      }
      j["attn_logit_softcapping"] = c.attn_softcap > 0 ? json(c.attn_softcap) : json(nullptr);
      j["final_logit_softcapping"] = c.final_softcap > 0 ? json(c.final_softcap) : json(nullptr);
      j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
      json types = json::array();
      for (bool s2 : c.layer_sliding) types.push_back(s2 ? "sliding_attention" : "full_attention");
      j["layer_types"] = types;
      if (c.family == Family::kGemma3) j["rope_local_base_freq"] = c.rope_theta_local;
      break;
    }
    case Family::kMiniCpm:
      j["scale_emb"] = c.embed_scale;
      j["scale_depth"] = c.residual_scale * std::sqrt(double(c.n_layers));
      j["dim_model_base"] = double(c.logit_scale) * c.dim;
      break;
    case Family::kPhi3:
      j["partial_rotary_factor"] = double(c.rope_dim) / c.head_dim;
      j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
      break;
    default:
      break;
  }
  return j;
}

}  // namespace lumen::model
