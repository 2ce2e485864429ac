// The route registry: every way lumen can compute a node of the inference or
// training graph declares itself once, beside its code, with LUMEN_ROUTE.
//
// A route names the graph node it implements ("matmul.q4_0.decode",
// "attn.backward", "head.ce"), its parity tier (DESIGN.md section 4: L1
// bit-identical to its oracle, L2 within a stated bound, L3 original), the
// oracle, the bound, the ctest names that prove it (globs allowed) and, for
// L3, the measurement that gates it. `when` says when the route is taken:
// space-separated conditions key=v1|v2, all of which must hold in the
// RouteContext (cpu=avx512vnni, act=int8|int8+bf16, kv=q8_0, train.segment=on).
// Among the routes of a node whose conditions hold, the highest priority is
// the active one; `lumen routes` prints the table, `--exact` restricts every
// node to its lowest tier, and scripts/test.sh checks every route's tests
// against the same run's results (cli/routes.cc).
//
// Registration costs nothing at run time: each LUMEN_ROUTE puts a pointer to
// a constant Route into the "lumen_routes" ELF section, which the linker
// bounds with __start_/__stop_ symbols; AllRoutes() reads them. A route lives
// in a translation unit of its own code, so it is linked exactly when that
// code is.
//
// Example (kernels/matmul_q8.cc):
//   LUMEN_ROUTE(matmul_int8_decode, {.node = "matmul.q8_0.decode", .name = "int8-vnni",
//               .tier = Tier::kL3, ...});
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace lumen {

enum class Tier : uint8_t { kL1 = 1, kL2 = 2, kL3 = 3 };
std::string_view TierName(Tier t);  // "L1", "L2", "L3"

struct Route {
  const char* node = "";     // graph node; "{dtype}" expands per weight type
  const char* name = "";     // the route within the node ("scalar", "avx512", "int8-vnni")
  Tier tier = Tier::kL2;     //
  const char* oracle = "";   // what the route is compared to
  const char* bound = "";    // L1 "bit-identical"; L2 the stated bound; L3 the gate
  const char* tests = "";    // ';'-separated ctest names or globs proving the claim
  const char* measure = "";  // L3: the measurement (a repo path, '#' anchor allowed)
  const char* when = "";     // conditions (see above); "" always holds
  int priority = 0;          // the highest whose conditions hold is active
};

// Every route linked into this binary, in no particular order.
std::span<const Route* const> AllRoutes();

// What the conditions are evaluated against: key -> the values that hold.
// A key that is absent holds no value, so "key=x" is false for it.
class RouteContext {
 public:
  void Set(std::string key, std::string value) { values_[std::move(key)] = {std::move(value)}; }
  void Add(std::string key, std::string value) { values_[std::move(key)].insert(std::move(value)); }
  bool Holds(std::string_view condition) const;  // one "key=v1|v2"
  const std::map<std::string, std::set<std::string>, std::less<>>& values() const {
    return values_;
  }

 private:
  std::map<std::string, std::set<std::string>, std::less<>> values_;
};

// True when every condition of r.when holds in ctx.
bool RouteApplies(const Route& r, const RouteContext& ctx);

// The routes of `node` whose conditions hold, best first (priority, then
// lower tier); empty when none. max_tier drops routes above it.
std::vector<const Route*> CandidateRoutes(std::string_view node, const RouteContext& ctx,
                                          Tier max_tier = Tier::kL3);

// Splits a ';'-separated list, dropping empty items and surrounding spaces.
std::vector<std::string> SplitList(std::string_view s, char sep = ';');

// True when name matches pattern, where '*' matches any run of characters.
bool GlobMatch(std::string_view pattern, std::string_view name);

}  // namespace lumen

#define LUMEN_ROUTE_CAT2(a, b) a##b
#define LUMEN_ROUTE_CAT(a, b) LUMEN_ROUTE_CAT2(a, b)
// LUMEN_ROUTE(id, {designated initializers of Route}); id is unique per file.
#define LUMEN_ROUTE(id, ...)                                                               \
  namespace {                                                                              \
  const ::lumen::Route LUMEN_ROUTE_CAT(lumen_route_, id) = __VA_ARGS__;                    \
  [[gnu::used, gnu::section("lumen_routes")]] const ::lumen::Route* const LUMEN_ROUTE_CAT( \
      lumen_route_ptr_, id) = &LUMEN_ROUTE_CAT(lumen_route_, id);                          \
  }                                                                                        \
  static_assert(true, "")
