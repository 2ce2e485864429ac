#include "lumen/core/route.h"

#include <algorithm>

// The linker defines these for a section whose name is a C identifier. Weak:
// a binary without any route still links (AllRoutes is then empty).
extern "C" {
extern const lumen::Route* const __start_lumen_routes[] __attribute__((weak));
extern const lumen::Route* const __stop_lumen_routes[] __attribute__((weak));
}

namespace lumen {

std::string_view TierName(Tier t) {
  switch (t) {
    case Tier::kL1:
      return "L1";
    case Tier::kL2:
      return "L2";
    case Tier::kL3:
      return "L3";
  }
  return "L?";
}

std::span<const Route* const> AllRoutes() {
  if (__start_lumen_routes == nullptr) return {};
  return {__start_lumen_routes, static_cast<size_t>(__stop_lumen_routes - __start_lumen_routes)};
}

std::vector<std::string> SplitList(std::string_view s, char sep) {
  std::vector<std::string> out;
  while (!s.empty()) {
    const size_t end = std::min(s.find(sep), s.size());
    std::string_view item = s.substr(0, end);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (!item.empty()) out.emplace_back(item);
    s.remove_prefix(std::min(end + 1, s.size()));
  }
  return out;
}

bool GlobMatch(std::string_view p, std::string_view s) {
  // Iterative match with backtracking to the last '*' (linear in practice).
  size_t pi = 0, si = 0, star = std::string_view::npos, mark = 0;
  while (si < s.size()) {
    if (pi < p.size() && p[pi] == '*') {
      star = pi++;
      mark = si;
    } else if (pi < p.size() && p[pi] == s[si]) {
      ++pi;
      ++si;
    } else if (star != std::string_view::npos) {
      pi = star + 1;
      si = ++mark;
    } else {
      return false;
    }
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

bool RouteContext::Holds(std::string_view condition) const {
  const size_t eq = condition.find('=');
  if (eq == std::string_view::npos) return false;
  const auto it = values_.find(condition.substr(0, eq));
  if (it == values_.end()) return false;
  for (const std::string& v : SplitList(condition.substr(eq + 1), '|'))
    if (it->second.count(v) != 0) return true;
  return false;
}

bool RouteApplies(const Route& r, const RouteContext& ctx) {
  for (const std::string& c : SplitList(r.when, ' '))
    if (!ctx.Holds(c)) return false;
  return true;
}

std::vector<const Route*> CandidateRoutes(std::string_view node, const RouteContext& ctx,
                                          Tier max_tier) {
  std::vector<const Route*> out;
  for (const Route* r : AllRoutes())
    if (r->node == node && r->tier <= max_tier && RouteApplies(*r, ctx)) out.push_back(r);
  std::sort(out.begin(), out.end(), [](const Route* a, const Route* b) {
    if (a->priority != b->priority) return a->priority > b->priority;
    if (a->tier != b->tier) return a->tier < b->tier;
    return std::string_view(a->name) < b->name;
  });
  return out;
}

}  // namespace lumen
