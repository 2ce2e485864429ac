#include "lumen/train/lora.h"

#include <cmath>
#include <tuple>

#include <fmt/format.h>

#include "lumen/model/lora.h"

namespace lumen::train {

Result<uint32_t> ParseTargets(std::string_view s) {
  if (s == "all") return uint32_t(0x7f);
  uint32_t mask = 0;
  size_t b = 0;
  while (b <= s.size()) {
    size_t e = s.find(',', b);
    if (e == std::string_view::npos) e = s.size();
    const std::string_view name = s.substr(b, e - b);
    int found = -1;
    for (int t = 0; t < kNumTargets; ++t)
      if (name == kTargetNames[t] || name == kHfModules[t]) found = t;
    if (found < 0)
      return Errorf("--targets: unknown target '{}' (choose from q,k,v,o,gate,up,down or all)",
                    name);
    mask |= 1u << found;
    b = e + 1;
  }
  return mask;
}

std::string TargetsString(uint32_t mask) {
  std::string out;
  for (int t = 0; t < kNumTargets; ++t)
    if (mask & (1u << t)) out += (out.empty() ? "" : ",") + std::string(kTargetNames[t]);
  return out;
}

float LoraConfig::Scale() const {
  if (scale > 0) return scale;
  return rs_lora ? alpha / std::sqrt(float(rank)) : alpha / float(rank);
}

Result<LoraLayout> LoraLayout::Make(const model::ModelConfig& c, const LoraConfig& cfg) {
  if (cfg.rank < 1) return Errorf("--rank {}: the LoRA rank must be at least 1", cfg.rank);
  if (cfg.targets == 0 || cfg.targets > 0x7f) return Error("--targets: no target selected");
  if (cfg.num_layers < 0 || cfg.num_layers > c.n_layers)
    return Errorf("--num-layers {}: the model has {} layers", cfg.num_layers, c.n_layers);
  if (!(cfg.dropout >= 0 && cfg.dropout < 1))  // NaN too
    return Errorf("--dropout {}: must be in [0, 1)", cfg.dropout);
  if (!std::isfinite(cfg.alpha) || cfg.alpha <= 0)
    return Errorf("--alpha {}: must be a positive finite number", cfg.alpha);
  if (!std::isfinite(cfg.scale) || cfg.scale < 0)
    return Errorf("--scale {}: must be a positive finite number (0: alpha / rank)", cfg.scale);
  LoraLayout L;
  L.cfg = cfg;
  L.first_layer = cfg.num_layers ? c.n_layers - cfg.num_layers : 0;
  L.index.assign(c.n_layers, {-1, -1, -1, -1, -1, -1, -1});
  for (int l = L.first_layer; l < c.n_layers; ++l) {
    for (int t = 0; t < kNumTargets; ++t) {
      if (!(cfg.targets & (1u << t))) continue;
      LoraSlot s;
      s.layer = l;
      s.target = Target(t);
      std::tie(s.n, s.k) = model::LoraTargetShape(c, t);
      s.a_off = L.size;
      L.size += int64_t(cfg.rank) * s.k;
      s.b_off = L.size;
      L.size += s.n * cfg.rank;
      L.index[l][t] = int(L.slots.size());
      L.slots.push_back(s);
    }
  }
  return L;
}

LoraParams<float> InitLora(const LoraLayout& layout, uint64_t seed) {
  LoraParams<float> p;
  p.w.assign(layout.size, 0.0f);
  for (size_t i = 0; i < layout.slots.size(); ++i) {
    const LoraSlot& s = layout.slots[i];
    const double bound = 1.0 / std::sqrt(double(s.k));
    const int64_t n = int64_t(layout.cfg.rank) * s.k;
    for (int64_t j = 0; j < n; ++j)
      p.w[s.a_off + j] =
          float((2.0 * Uniform01(HashKey({seed, 0xA, i, uint64_t(j)})) - 1.0) * bound);
  }
  return p;
}

engine::Adapter ToAdapter(const LoraLayout& layout, const LoraParams<float>& p,
                          const std::string& base_model) {
  const LoraConfig& cfg = layout.cfg;
  engine::Adapter a;
  a.rank = cfg.rank;
  a.rs_lora = cfg.rs_lora;
  a.alpha = cfg.scale > 0
                ? (cfg.rs_lora ? cfg.scale * std::sqrt(float(a.rank)) : cfg.scale * float(a.rank))
                : cfg.alpha;
  a.base_model = base_model;
  for (const LoraSlot& s : layout.slots) {
    engine::AdapterPair pr;
    pr.layer = s.layer;
    pr.target = int(s.target);
    pr.n = s.n;
    pr.k = s.k;
    pr.a.assign(p.w.begin() + s.a_off, p.w.begin() + s.a_off + int64_t(a.rank) * s.k);
    pr.b.assign(p.w.begin() + s.b_off, p.w.begin() + s.b_off + s.n * a.rank);
    a.pairs.push_back(std::move(pr));
  }
  return a;
}

}  // namespace lumen::train
