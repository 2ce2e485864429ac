// The route table of a run: the graph nodes a verb executes (generate, serve,
// train), each resolved against the registry (core/route.h) for the model, the
// CPU and the route flags; and the presets behind --exact and --tier.
//
// Presets (route choices; a per-route flag given explicitly overrides them):
//   default   the fastest routes that pass the default gate (DESIGN.md 4:
//             KL to exact below a quarter of what Q8_0 weights cost):
//             bf16 prefill products, int8x2 decode products (two int8
//             activation levels, L2; exact where the weight type or CPU has
//             no int8 kernel), f16 KV; serve too (its prompt cache keeps
//             whole prefill chunks on these routes, engine/scheduler.h)
//   --tier l3 every L3 route: int8 decode + bf16 prefill, f16 KV
//   --tier l2 no L3 route: exact products, f16 KV (the L2 int8x2 decode
//             route only with --act-route int8x2)
//   --tier l1 / --exact: every node at its lowest tier: exact products, f32 KV;
//             bit-identical to the reference path (LoadOptions{kExact} with an
//             f32 KvCache), and lumen says so at start.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "lumen/cli/common.h"
#include "lumen/core/route.h"
#include "lumen/engine/model.h"

namespace lumen::cli {

struct RouteChoice {
  std::string act_route;  // kernels::kActRouteNames
  std::string kv_type;    // f16, bf16, f32, q8_0
  std::string preset;     // "default", "l1", "l2", "l3"
  Tier max_tier = Tier::kL3;
  bool lowest = false;  // --exact / --tier l1: every node at its lowest tier
};
Result<RouteChoice> ResolveRouteChoice(const ModelArgs& args);

struct ResolvedNode {
  std::string node;  // "matmul.q4_0.decode"
  const Route* active = nullptr;
  std::vector<const Route*> others;  // applicable, not chosen
};

// graph: "generate", "serve" or "train"; model may be null (no per-dtype nodes).
Result<std::vector<ResolvedNode>> ResolveGraph(std::string_view graph, const ModelArgs& args,
                                               const engine::Model* model);

// One line for stderr at start: the preset and the active product/KV routes.
std::string RouteSummary(const RouteChoice& c, const engine::Model& model);

// Prints the summary line, and with --show-routes the whole table, to stderr.
void AnnounceRoutes(const ModelArgs& args, const engine::Model& model, std::string_view graph);

// The CI gate: every route's tests passed in the junit file ctest wrote
// (scripts/test.sh), every L3 measurement exists, every node is tagged.
// Returns the number of problems, each printed to stdout.
int CheckRoutes(const std::string& junit_path, const std::string& source_dir);

}  // namespace lumen::cli
