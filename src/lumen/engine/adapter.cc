#include "lumen/engine/adapter.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "lumen/core/buffer.h"
#include "lumen/core/half.h"
#include "lumen/formats/safetensors.h"

namespace lumen::engine {

namespace {
namespace fs = std::filesystem;
constexpr std::string_view kModules[] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                         "gate_proj", "up_proj", "down_proj"};

// PEFT's names with or without the "base_model.model." prefix, as stored.
std::string WithPeftPrefix(const std::string& name) {
  static const std::string kPrefix = "base_model.model.";
  return name.starts_with(kPrefix) ? name : kPrefix + name;
}

// Rows of B to permute between the base's order and HF's (q, k only).
bool PermutesRows(const model::ModelConfig& c, int t) {
  return c.rope_style == kernels::RopeStyle::kInterleaved &&
         (t == model::kLoraQ || t == model::kLoraK);
}

std::vector<float> PermuteRows(const std::vector<float>& b, int heads, int head_dim, int r,
                               bool to_interleaved) {
  const std::vector<int64_t> src = model::RopeRowPermutation(heads, head_dim, to_interleaved);
  std::vector<float> out(b.size());
  for (size_t d = 0; d < src.size(); ++d)
    std::copy(b.begin() + src[d] * r, b.begin() + (src[d] + 1) * r, out.begin() + d * r);
  return out;
}

Result<std::vector<float>> ToF32(const formats::SafetensorsTensor& t) {
  const int64_t n = t.view.numel();
  std::vector<float> out(n);
  const auto* p = static_cast<const uint8_t*>(t.view.data);
  for (int64_t i = 0; i < n; ++i) {
    switch (t.dtype) {
      case DType::kF32:
        std::memcpy(&out[i], p + 4 * i, 4);
        break;
      case DType::kF16: {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = F16ToF32(h);
        break;
      }
      case DType::kBF16: {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = BF16ToF32(h);
        break;
      }
      default:
        return Errorf("tensor '{}': dtype {} (an adapter holds F32, F16 or BF16)", t.name,
                      Name(t.dtype));
    }
  }
  return out;
}
}  // namespace

float Adapter::Scale() const {
  return rs_lora ? alpha / std::sqrt(float(rank)) : alpha / float(rank);
}

std::string_view AdapterModuleName(int target) { return kModules[target]; }

std::string AdapterTensorName(int layer, int target, char ab) {
  const char* block = target <= model::kLoraO ? "self_attn" : "mlp";
  return fmt::format("base_model.model.model.layers.{}.{}.{}.lora_{}.weight", layer, block,
                     kModules[target], ab);
}

Result<Adapter> LoadAdapter(const std::string& dir, const model::ModelConfig& c) {
  const std::string cfg_path = (fs::path(dir) / "adapter_config.json").string();
  const std::string st_path = (fs::path(dir) / "adapter_model.safetensors").string();
  if (!fs::is_directory(dir)) return Errorf("adapter {}: not a directory", dir);
  std::ifstream f(cfg_path);
  if (!f) return Errorf("adapter {}: no adapter_config.json", dir);
  nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Errorf("{}: not a JSON object", cfg_path);
  Adapter a;
  if (j.value("peft_type", "LORA") != "LORA")
    return Errorf("{}: peft_type '{}' (only LORA adapters load)", cfg_path,
                  j.value("peft_type", ""));
  if (!j.contains("r") || !j["r"].is_number_integer() || j["r"].get<int>() < 1)
    return Errorf("{}: 'r' must be a positive integer", cfg_path);
  a.rank = j["r"].get<int>();
  a.alpha = j.contains("lora_alpha") && j["lora_alpha"].is_number() ? j["lora_alpha"].get<float>()
                                                                    : float(a.rank);
  a.rs_lora = j.value("use_rslora", false);
  if (j.contains("base_model_name_or_path") && j["base_model_name_or_path"].is_string())
    a.base_model = j["base_model_name_or_path"].get<std::string>();
  if (j.value("fan_in_fan_out", false))
    return Errorf("{}: fan_in_fan_out adapters (Conv1D bases) do not apply to these models",
                  cfg_path);

  LUMEN_ASSIGN_OR_RETURN(auto st, formats::SafetensorsFile::Open(st_path));
  // name -> tensor, accepting PEFT's names with or without "base_model.model.".
  std::map<std::string, const formats::SafetensorsTensor*> by_name;
  for (const auto& t : st.tensors()) {
    by_name[WithPeftPrefix(t.name)] = &t;
  }
  size_t used = 0;
  for (int l = 0; l < c.n_layers; ++l) {
    for (int t = 0; t < model::kLoraTargets; ++t) {
      auto ia = by_name.find(AdapterTensorName(l, t, 'A'));
      auto ib = by_name.find(AdapterTensorName(l, t, 'B'));
      if (ia == by_name.end() && ib == by_name.end()) continue;
      if (ia == by_name.end() || ib == by_name.end())
        return Errorf("{}: {} has only one of lora_A / lora_B", st_path,
                      AdapterTensorName(l, t, ia == by_name.end() ? 'A' : 'B'));
      used += 2;
      const auto [N, K] = model::LoraTargetShape(c, t);
      const auto& ta = *ia->second;
      const auto& tb = *ib->second;
      if (ta.shape != std::vector<int64_t>{a.rank, K} ||
          tb.shape != std::vector<int64_t>{N, a.rank})
        return Errorf(
            "{}: layer {} {}: lora_A is [{}] and lora_B [{}]; this base model needs "
            "[{}, {}] and [{}, {}] (an adapter of another model or rank?)",
            st_path, l, kModules[t], fmt::join(ta.shape, ", "), fmt::join(tb.shape, ", "), a.rank,
            K, N, a.rank);
      AdapterPair p;
      p.layer = l;
      p.target = t;
      p.n = N;
      p.k = K;
      LUMEN_ASSIGN_OR_RETURN(p.a, ToF32(ta));
      LUMEN_ASSIGN_OR_RETURN(p.b, ToF32(tb));
      if (PermutesRows(c, t))
        p.b = PermuteRows(p.b, t == model::kLoraQ ? c.n_heads : c.n_kv_heads, c.head_dim, a.rank,
                          true);
      a.pairs.push_back(std::move(p));
    }
  }
  if (used != st.tensors().size()) {
    for (const auto& t : st.tensors()) {
      const std::string n = WithPeftPrefix(t.name);
      bool known = false;
      for (const auto& p : a.pairs)
        known |= n == AdapterTensorName(p.layer, p.target, 'A') ||
                 n == AdapterTensorName(p.layer, p.target, 'B');
      if (!known)
        return Errorf("{}: tensor '{}' matches no layer/target of this {}-layer base model",
                      st_path, t.name, c.n_layers);
    }
  }
  if (a.pairs.empty()) return Errorf("{}: no LoRA tensors", st_path);
  return a;
}

Status SaveAdapter(const std::string& dir, const Adapter& a, const model::ModelConfig& c) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Errorf("adapter {}: cannot create the directory: {}", dir, ec.message());
  formats::SafetensorsWriter w;
  std::vector<std::string> modules;
  for (const auto& p : a.pairs) {
    std::vector<float> b = p.b;
    if (PermutesRows(c, p.target))
      b = PermuteRows(b, p.target == model::kLoraQ ? c.n_heads : c.n_kv_heads, c.head_dim, a.rank,
                      false);
    LUMEN_RETURN_IF_ERROR(
        w.Add(AdapterTensorName(p.layer, p.target, 'A'), DType::kF32, {a.rank, p.k},
              std::string(reinterpret_cast<const char*>(p.a.data()), p.a.size() * sizeof(float))));
    LUMEN_RETURN_IF_ERROR(
        w.Add(AdapterTensorName(p.layer, p.target, 'B'), DType::kF32, {p.n, a.rank},
              std::string(reinterpret_cast<const char*>(b.data()), b.size() * sizeof(float))));
    const std::string m(kModules[p.target]);
    if (std::find(modules.begin(), modules.end(), m) == modules.end()) modules.push_back(m);
  }
  w.SetMetadata("format", "pt");
  LUMEN_RETURN_IF_ERROR(w.Write((fs::path(dir) / "adapter_model.safetensors").string()));
  std::vector<int> layers;
  for (const auto& p : a.pairs)
    if (layers.empty() || layers.back() != p.layer) layers.push_back(p.layer);
  nlohmann::ordered_json j;
  j["peft_type"] = "LORA";
  j["task_type"] = "CAUSAL_LM";
  j["base_model_name_or_path"] = a.base_model;
  j["r"] = a.rank;
  j["lora_alpha"] = a.alpha;
  j["lora_dropout"] = 0.0;
  j["use_rslora"] = a.rs_lora;
  j["bias"] = "none";
  j["fan_in_fan_out"] = false;
  j["target_modules"] = modules;
  if (int(layers.size()) != c.n_layers) j["layers_to_transform"] = layers;
  j["inference_mode"] = true;
  return WriteFileAtomic((fs::path(dir) / "adapter_config.json").string(), j.dump(2) + "\n");
}

void AttachAdapter(const Adapter& a, model::Weights& w) {
  for (const auto& p : a.pairs) {
    model::LoraMatrix& m = w.layers[p.layer].lora[p.target];
    m.a = p.a.data();
    m.b = p.b.data();
    m.rank = a.rank;
    m.scale = a.Scale();
    m.n = p.n;
    m.k = p.k;
  }
}

}  // namespace lumen::engine
