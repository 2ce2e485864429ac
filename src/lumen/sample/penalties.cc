#include "lumen/sample/penalties.h"

#include <algorithm>
#include <cmath>

namespace lumen::sample {

namespace {
bool InRange(int32_t id, size_t n) { return id >= 0 && static_cast<size_t>(id) < n; }

std::span<const int32_t> Window(std::span<const int32_t> history, int32_t last_n) {
  if (last_n < 0 || static_cast<size_t>(last_n) >= history.size()) return history;
  return history.subspan(history.size() - static_cast<size_t>(last_n));
}

// Past this many tokens beyond allowed_length the DRY penalty has saturated
// (base^256 overflows float for any base >= 1.42), so matching stops there and
// the cost stays O(window * 256) even on degenerate all-repeats histories.
constexpr int32_t kDryMaxExtra = 256;
constexpr double kDryMaxPenalty = 1e30;
}  // namespace

void ApplyLogitBias(std::span<float> logits, std::span<const std::pair<int32_t, double>> bias) {
  for (const auto& [id, b] : bias) {
    if (InRange(id, logits.size())) logits[id] = static_cast<float>(logits[id] + b);
  }
}

void ApplyPenalties(std::span<float> logits, std::span<const int32_t> history,
                    const SamplerConfig& c, PenaltyScratch& scratch) {
  const bool active =
      c.repetition_penalty != 1.0 || c.presence_penalty != 0.0 || c.frequency_penalty != 0.0;
  if (!active || c.repeat_last_n == 0) return;
  const auto window = Window(history, c.repeat_last_n);
  auto& t = scratch.tokens;
  t.assign(window.begin(), window.end());
  std::sort(t.begin(), t.end());
  const float rep = static_cast<float>(c.repetition_penalty);
  for (size_t i = 0; i < t.size();) {
    size_t j = i;
    while (j < t.size() && t[j] == t[i]) ++j;
    const int32_t id = t[i];
    const auto count = static_cast<float>(j - i);
    i = j;
    if (!InRange(id, logits.size())) continue;
    float& x = logits[id];
    x = x > 0 ? x / rep : x * rep;
    x -= count * static_cast<float>(c.frequency_penalty) + static_cast<float>(c.presence_penalty);
  }
}

void ApplyDry(std::span<float> logits, std::span<const int32_t> history, const DryConfig& dry,
              PenaltyScratch& scratch) {
  if (dry.multiplier == 0.0 || dry.last_n == 0) return;
  const auto h = Window(history, dry.last_n);
  const auto n = static_cast<int64_t>(h.size());
  if (n < 2) return;

  auto breaker_ends_at = [&](int64_t p) {
    for (const auto& b : dry.breaker_ids) {
      const auto len = static_cast<int64_t>(b.size());
      if (len == 0 || len > p + 1) continue;
      if (std::equal(b.begin(), b.end(), h.begin() + (p - len + 1))) return true;
    }
    return false;
  };
  auto is_single_breaker = [&](int32_t tok) {
    for (const auto& b : dry.breaker_ids) {
      if (b.size() == 1 && b[0] == tok) return true;
    }
    return false;
  };

  const int64_t cap = static_cast<int64_t>(dry.allowed_length) + kDryMaxExtra;
  int64_t limit = 0;  // length of the breaker-free suffix
  while (limit < n && limit < cap && !breaker_ends_at(n - 1 - limit)) ++limit;
  if (limit == 0) return;

  auto& hits = scratch.dry_hits;
  hits.clear();
  const int32_t last = h[n - 1];
  for (int64_t j = n - 2; j >= 0; --j) {
    if (h[j] != last) continue;
    int64_t len = 1;
    while (len < limit && j - len >= 0 && h[j - len] == h[n - 1 - len]) ++len;
    if (len < dry.allowed_length) continue;
    const int32_t next = h[j + 1];
    if (is_single_breaker(next)) continue;
    hits.emplace_back(next, static_cast<int32_t>(len));
  }
  std::sort(hits.begin(), hits.end());
  for (size_t i = 0; i < hits.size(); ++i) {
    // After the sort the longest match of each token is the last of its run.
    if (i + 1 < hits.size() && hits[i + 1].first == hits[i].first) continue;
    const auto [tok, len] = hits[i];
    if (!InRange(tok, logits.size())) continue;
    const double pen =
        std::min(kDryMaxPenalty, dry.multiplier * std::pow(dry.base, len - dry.allowed_length));
    logits[tok] = static_cast<float>(logits[tok] - pen);
  }
}

}  // namespace lumen::sample
