#include "lumen/engine/adapter_registry.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace lumen::engine {

namespace {

// "meta-llama/Llama-3.2-1B/" -> "llama-3.2-1b"; "x/Model-Q4.gguf" -> "model-q4".
std::string NameStem(std::string s) {
  while (!s.empty() && (s.back() == '/' || s.back() == '\\')) s.pop_back();
  const size_t slash = s.find_last_of("/\\");
  if (slash != std::string::npos) s = s.substr(slash + 1);
  for (const char* ext : {".gguf", ".bin", ".safetensors"})
    if (s.size() > std::strlen(ext) && s.ends_with(ext)) s.resize(s.size() - std::strlen(ext));
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string Trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

std::string MountedIds(const std::vector<std::shared_ptr<const MountedAdapter>>& m) {
  if (m.empty()) return "none is mounted";
  std::vector<std::string> ids;
  for (const auto& a : m) ids.push_back(a->id);
  return fmt::format("mounted: {}", fmt::join(ids, ", "));
}

}  // namespace

bool ValidAdapterId(const std::string& id) {
  if (id.empty() || id.size() > 64) return false;
  for (unsigned char c : id)
    if (!std::isalnum(c) && c != '_' && c != '.' && c != '-') return false;
  return true;
}

Status CheckBaseModel(const std::string& adapter_base, const std::string& model_name) {
  const std::string want = NameStem(adapter_base), have = NameStem(model_name);
  if (want.empty() || have.empty()) return Status::Ok();
  if (have.find(want) != std::string::npos || want.find(have) != std::string::npos)
    return Status::Ok();
  return Errorf(
      "made for base model '{}' (adapter_config.json base_model_name_or_path), but the served "
      "model is '{}'",
      adapter_base, model_name);
}

Result<std::shared_ptr<const MountedAdapter>> AdapterRegistry::Mount(const std::string& id,
                                                                     const std::string& dir,
                                                                     bool replace, bool* conflict) {
  if (conflict) *conflict = false;
  if (!ValidAdapterId(id))
    return Errorf("adapter id '{}': use 1-64 of the characters A-Z a-z 0-9 _ . -", id);
  // Everything is loaded and checked before the registry is touched.
  const model::ModelConfig& c = model_.config();
  Result<Adapter> loaded = LoadAdapter(dir, c);
  if (!loaded.ok()) return loaded.status();
  auto m = std::make_shared<MountedAdapter>();
  m->id = id;
  m->path = std::filesystem::absolute(dir).lexically_normal().string();
  m->adapter = std::move(*loaded);
  const Adapter& a = m->adapter;
  if (Status st = CheckBaseModel(a.base_model, model_.name()); !st.ok())
    return st.WithContext(fmt::format("adapter {}", dir));
  const float scale = a.Scale();
  if (!std::isfinite(scale) || scale == 0.0f)
    return Errorf("adapter {}: lora_alpha {} with r {} gives the scale {}", dir, a.alpha, a.rank,
                  scale);
  m->weights.layers.resize(size_t(c.n_layers));
  for (const AdapterPair& p : a.pairs) {
    for (const auto* v : {&p.a, &p.b})
      for (float x : *v)
        if (!std::isfinite(x))
          return Errorf("adapter {}: {} holds a non-finite value ({})", dir,
                        AdapterTensorName(p.layer, p.target, v == &p.a ? 'A' : 'B'), x);
    m->weights.layers[size_t(p.layer)][size_t(p.target)] =
        model::LoraMatrix{p.a.data(), p.b.data(), a.rank, scale, p.n, p.k};
    const std::string t(AdapterModuleName(p.target));
    if (std::find(m->targets.begin(), m->targets.end(), t) == m->targets.end())
      m->targets.push_back(t);
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto at = std::lower_bound(mounted_.begin(), mounted_.end(), id,
                             [](const auto& x, const std::string& k) { return x->id < k; });
  if (at != mounted_.end() && (*at)->id == id && !replace) {
    if (conflict) *conflict = true;
    return Errorf(
        "adapter id '{}': already mounted (from {}); DELETE it first or send \"replace\": true", id,
        (*at)->path);
  }
  m->generation = next_generation_++;
  if (at != mounted_.end() && (*at)->id == id)
    *at = m;
  else
    mounted_.insert(at, m);
  return std::shared_ptr<const MountedAdapter>(std::move(m));
}

bool AdapterRegistry::Unmount(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto at =
      std::find_if(mounted_.begin(), mounted_.end(), [&](const auto& x) { return x->id == id; });
  if (at == mounted_.end()) return false;
  mounted_.erase(at);
  return true;
}

std::vector<std::shared_ptr<const MountedAdapter>> AdapterRegistry::List() const {
  std::lock_guard<std::mutex> lock(mu_);
  return mounted_;
}

Result<std::shared_ptr<const AdapterSet>> AdapterRegistry::Resolve(const std::string& spec) const {
  if (Trim(spec).empty()) return std::shared_ptr<const AdapterSet>();
  auto set = std::make_shared<AdapterSet>();
  std::vector<std::string> parts;
  for (size_t b = 0;;) {
    const size_t e = spec.find('+', b);
    parts.push_back(Trim(spec.substr(b, e == std::string::npos ? std::string::npos : e - b)));
    if (e == std::string::npos) break;
    b = e + 1;
  }
  if (int(parts.size()) > kMaxAdaptersPerSet)
    return Errorf("adapter: '{}' stacks {} adapters; at most {}", spec, parts.size(),
                  kMaxAdaptersPerSet);
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::string& part : parts) {
    std::string id = part;
    float w = 1.0f;
    if (const size_t star = part.find('*'); star != std::string::npos) {
      id = Trim(part.substr(0, star));
      const std::string ws = Trim(part.substr(star + 1));
      char* end = nullptr;
      w = ws.empty() ? NAN : std::strtof(ws.c_str(), &end);
      if (ws.empty() || end != ws.c_str() + ws.size() || !std::isfinite(w))
        return Errorf("adapter: '{}' in '{}': the weight after '*' must be a finite number", part,
                      spec);
    }
    if (id.empty())
      return Errorf(
          "adapter: '{}' has an empty adapter id (the form is \"a\", \"a+b\" or "
          "\"a*0.5+b\")",
          spec);
    auto at =
        std::find_if(mounted_.begin(), mounted_.end(), [&](const auto& x) { return x->id == id; });
    if (at == mounted_.end())
      return Errorf("adapter: no adapter '{}' is mounted ({}; GET /v1/adapters)", id,
                    MountedIds(mounted_));
    for (const auto& have : set->adapters)
      if (have->id == id) return Errorf("adapter: '{}' names '{}' twice", spec, id);
    set->adapters.push_back(*at);
    set->weights.push_back(w);
  }
  for (size_t i = 0; i < set->adapters.size(); ++i) {
    const MountedAdapter& m = *set->adapters[i];
    const float w = set->weights[i];
    set->lora.terms.push_back({&m.weights, w});
    const std::string sep = i ? "+" : "";
    set->spec += sep + (w == 1.0f ? m.id : fmt::format("{}*{}", m.id, w));
    uint32_t bits;
    std::memcpy(&bits, &w, sizeof bits);
    set->key += fmt::format("{}g{}*{:08x}", sep, m.generation, bits);
  }
  return std::shared_ptr<const AdapterSet>(std::move(set));
}

}  // namespace lumen::engine
