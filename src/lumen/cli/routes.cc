#include "lumen/cli/routes.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "lumen/cli/verbs.h"
#include "lumen/kernels/matmul_bf16.h"
#include "lumen/kernels/matmul_bf16_amx.h"
#include "lumen/kernels/matmul_q8.h"
#include "lumen/kernels/matmul_q8_avx2.h"
#include "lumen/kernels/matmul_q8x2_gemm.h"
#include "lumen/train/compute.h"

namespace lumen::cli {
namespace {

// A node of a verb's graph. per_dtype: one instance per weight storage of the
// model ("matmul.decode" shows as "matmul.q4_0.decode"). needs: a context
// condition for the node to exist at all ("adapter=on").
struct GraphNode {
  const char* node;
  bool per_dtype = false;
  const char* needs = "";
};

// The nodes in execution order. Inference: tokenize, then per layer norm,
// products, RoPE, KV, attention, activation, then sampling.
constexpr GraphNode kGenerate[] = {
    {"tokenize"},
    {"embed"},
    {"norm.rms"},
    {"matmul.prefill", true},
    {"matmul.decode", true},
    {"lora.apply", false, "adapter=on"},
    {"rope"},
    {"kv.store"},
    {"attn.prefill"},
    {"attn.decode"},
    {"attn.decode.long"},
    {"act.gated"},
    {"forward"},
    {"sample.tone"},
    {"sample.chain"},
};
constexpr GraphNode kServeExtra[] = {
    {"decode.batched"}, {"prompt_cache.restore"}, {"sample.constraint"}};
constexpr GraphNode kTrain[] = {
    {"tokenize"},
    {"embed"},
    {"norm.rms"},
    {"matmul.prefill", true},
    {"matmul.backward", true},
    {"matmul.lora"},
    {"matmul.lora_t"},
    {"train.product"},
    {"train.product_t"},
    {"train.lora"},
    {"rope"},
    {"attn.train"},
    {"act.gated"},
    {"train.mlp"},
    {"head.ce"},
    {"head.chunk"},
    {"train.loss"},
    {"train.pairs"},
    {"train.backward"},
    {"train.step"},
    {"train.lambda"},
    {"train.graph"},
};

std::vector<GraphNode> GraphNodes(std::string_view graph) {
  std::vector<GraphNode> out;
  if (graph == "train") return {std::begin(kTrain), std::end(kTrain)};
  out.assign(std::begin(kGenerate), std::end(kGenerate));
  if (graph == "serve") out.insert(out.end(), std::begin(kServeExtra), std::end(kServeExtra));
  return out;
}

std::string StorageName(const kernels::Matrix& m) {
  if (m.mlx_bits) return fmt::format("mlx{}", m.mlx_bits);
  return std::string(Name(m.w.dtype));
}

// True when every product matrix stored as `storage` holds `has` (and there
// is one): with kernels::Int8RouteSupports the condition int8=kernel of the
// int8 decode routes, with kernels::Int8x2GemmSupports int8gemm=kernel of
// the int8x2 prefill route, so the table shows the route that runs.
bool EveryMatrixOf(const engine::Model* model, const std::string& storage,
                   bool (*has)(const kernels::Matrix&)) {
  if (!model) return false;
  bool any = false;
  for (const auto& t : model->tensors()) {
    if (t.shape.size() != 2 || StorageName(t.matrix) != storage) continue;
    if (!has(t.matrix)) return false;
    any = true;
  }
  return any;
}

// The CPU's features as route conditions. "int8-avx2": the int8 products run
// on the AVX2 kernels, which only a CPU without AVX512-VNNI takes
// (kernels::Int8RouteSupports); a VNNI CPU has AVX2 too but never runs them,
// so the gate must not ask their route-specific tests to run there.
void AddCpuFacts(RouteContext* ctx) {
  if (kernels::CpuHasBf16()) ctx->Add("cpu", "avx512bf16");
  if (kernels::CpuHasVnni()) ctx->Add("cpu", "avx512vnni");
  if (kernels::CpuHasAvx2()) ctx->Add("cpu", "avx2");
  if (kernels::CpuHasAvx2() && !kernels::CpuHasVnni()) ctx->Add("cpu", "int8-avx2");
  if (kernels::AmxBf16Usable()) ctx->Add("cpu", "amx");
}

std::vector<std::string> ProductDtypes(const engine::Model* model) {
  std::set<std::string> s;
  if (model)
    for (const auto& t : model->tensors())
      if (t.shape.size() == 2) s.insert(StorageName(t.matrix));
  return {s.begin(), s.end()};
}

RouteContext MakeContext(std::string_view graph, const ModelArgs& args, const RouteChoice& c,
                         const engine::Model* model) {
  RouteContext ctx;
  AddCpuFacts(&ctx);
  ctx.Set("act", c.act_route);
  ctx.Set("kv", c.kv_type);
  const int threads = model && model->pool() ? model->pool()->size() : args.threads;
  ctx.Set("threads", threads == 1 ? "one" : "many");
  if (!args.adapter.empty()) ctx.Set("adapter", "on");
  ctx.Set("sampler", "temperature");
  if (graph == "serve") {
    ctx.Set("prompt_cache", "on");
    ctx.Set("constraint", "on");
  }
  if (graph == "train") {  // TrainOptions' defaults (docs/reference/training.md)
    ctx.Set("train.fused_ce", "on");
    ctx.Set("train.prefix_share", "on");
    // `lumen train`'s default, --compute auto (train/compute.h).
    const bool low_tier = args.exact || args.tier == "l1" || args.tier == "l2";
    ctx.Set("train.compute", args.train_compute.empty() || args.train_compute == "auto"
                                 ? std::string(train::ComputeName(train::AutoCompute(low_tier)))
                                 : args.train_compute);
  }
  return ctx;
}

const Route* Choose(std::string_view node, const RouteContext& ctx, const RouteChoice& c,
                    std::vector<const Route*>* others) {
  std::vector<const Route*> cand = CandidateRoutes(node, ctx, c.max_tier);
  if (cand.empty()) cand = CandidateRoutes(node, ctx);  // nothing at or below the tier
  if (c.lowest)
    std::stable_sort(cand.begin(), cand.end(),
                     [](const Route* a, const Route* b) { return a->tier < b->tier; });
  if (cand.empty()) return nullptr;
  others->assign(cand.begin() + 1, cand.end());
  return cand.front();
}

std::string Escape(std::string_view s) {  // for JSON and DOT strings
  std::string out;
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    out += ch;
  }
  return out;
}

}  // namespace

Result<RouteChoice> ResolveRouteChoice(const ModelArgs& a) {
  RouteChoice c;
  std::string tier = a.tier;
  if (a.exact) {
    if (!tier.empty() && tier != "l1")
      return Errorf("--exact means --tier l1; it cannot be combined with --tier {}", tier);
    tier = "l1";
  }
  c.preset = tier.empty() ? "default" : tier;
  if (tier.empty()) {
    c.act_route = a.default_act_route;
    // The default takes the bf16 prefill only where it is the faster one
    // (kernels::Bf16PrefillPays); --act-route and --tier l3 still ask for it.
    if (c.act_route.ends_with("+bf16") && !kernels::Bf16PrefillPays())
      c.act_route.resize(c.act_route.size() - std::string_view("+bf16").size());
    c.kv_type = "f16";
  } else if (tier == "l3") {
    c.act_route = "int8+bf16";
    c.kv_type = "f16";
  } else if (tier == "l2") {
    c.act_route = "exact";
    c.kv_type = "f16";
    c.max_tier = Tier::kL2;
  } else if (tier == "l1") {
    c.act_route = "exact";
    c.kv_type = "f32";
    c.max_tier = Tier::kL1;
    c.lowest = true;
  } else {
    return Errorf("--tier: '{}' is not one of l1, l2, l3", tier);
  }
  if (!a.act_route.empty()) c.act_route = a.act_route;  // a per-route flag overrides the preset
  if (!a.kv_type.empty()) c.kv_type = a.kv_type;
  return c;
}

Result<std::vector<ResolvedNode>> ResolveGraph(std::string_view graph, const ModelArgs& args,
                                               const engine::Model* model) {
  if (graph != "generate" && graph != "serve" && graph != "train")
    return Errorf("--for: '{}' is not one of generate, serve, train", graph);
  LUMEN_ASSIGN_OR_RETURN(RouteChoice c, ResolveRouteChoice(args));
  // Training's products are chosen by --compute (train.compute), not --act-route.
  if (graph == "train") c.act_route = "exact";
  RouteContext ctx = MakeContext(graph, args, c, model);
  std::vector<std::string> dtypes = ProductDtypes(model);
  if (dtypes.empty()) dtypes = {"f32"};
  std::vector<ResolvedNode> out;
  for (const GraphNode& g : GraphNodes(graph)) {
    if (*g.needs && !ctx.Holds(g.needs)) continue;
    const std::vector<std::string> instances =
        g.per_dtype ? dtypes : std::vector<std::string>{std::string()};
    for (const std::string& dt : instances) {
      RouteContext local = ctx;
      ResolvedNode r;
      r.node = g.node;
      if (g.per_dtype) {
        local.Set("dtype", dt);
        if (EveryMatrixOf(model, dt, kernels::Int8RouteSupports)) local.Set("int8", "kernel");
        if (EveryMatrixOf(model, dt, kernels::Int8x2GemmSupports)) local.Set("int8gemm", "kernel");
        const size_t dot = r.node.find('.');
        r.node = r.node.substr(0, dot) + "." + dt + r.node.substr(dot);
      }
      r.active = Choose(g.node, local, c, &r.others);
      out.push_back(std::move(r));
    }
  }
  return out;
}

std::string RouteSummary(const RouteChoice& c, const engine::Model& model) {
  if (c.lowest)
    return "routes: --exact: every node at its lowest tier (exact f32 products, f32 KV), "
           "bit-identical to the reference path";
  const auto act = kernels::ParseActRoute(c.act_route).value_or(kernels::ActRoute::kExact);
  bool int8 = false, gemm = false, requantized = false;
  // The fewest and most rows the int8 dot kernels take (kernels::Int8MaxRows, by weight type).
  int64_t short_min = 0, short_rows = 0;
  for (const auto& t : model.tensors()) {
    if (t.shape.size() != 2) continue;
    if (kernels::Int8RouteSupports(t.matrix)) {
      int8 = true;
      kernels::Matrix on_route = t.matrix;  // the counts depend on the route (the GEMM's)
      on_route.route = act;
      const int64_t rows = kernels::Int8MaxRows(on_route);
      short_min = short_rows == 0 ? rows : std::min(short_min, rows);
      short_rows = std::max(short_rows, rows);
    }
    if (kernels::Int8x2GemmSupports(t.matrix)) {
      gemm = true;
      requantized = requantized || kernels::Int8x2GemmRequantizes(t.matrix);
    }
  }
  const bool bf16 = kernels::RouteHasBf16(act) && kernels::CpuHasBf16();
  int8 = int8 && kernels::RouteHasInt8(act);  // Int8RouteSupports asked the CPU
  const bool x2 = kernels::Int8Levels(act) == 2;
  const char* decode = !int8 ? "exact (L2)"
                       : x2  ? "int8x2 (L2; exact for other weight types)"
                             : "int8 (L3)";
  gemm = gemm && x2 && !bf16;  // kernels::Int8x2GemmTakes
  std::string prefill = gemm ? fmt::format("int8x2 (L2, VNNI GEMM{}; exact for other weight types)",
                                           requantized ? ", F16/BF16 weights requantized to 12-bit "
                                                         "codes per 32"
                                                       : "")
                        : !bf16                    ? "exact (L2)"
                        : kernels::AmxBf16Usable() ? "bf16 (L3, AMX tiles)"
                                                   : "bf16 (L3)";
  if (int8 && short_rows > kernels::kInt8MaxRows)  // short prompts on the dot kernels
    prefill += fmt::format(", {} for prompts of up to {}", x2 ? "int8x2" : "int8",
                           short_min == short_rows ? fmt::format("{} tokens", short_rows)
                                                   : fmt::format("{}-{} tokens (by weight type)",
                                                                 short_min, short_rows));
  return fmt::format(
      "routes ({}): prefill products {}, decode products {}, KV {} ({}); "
      "`lumen routes` lists every node, --exact restores the reference path",
      c.preset, prefill, decode, c.kv_type, c.kv_type == "f32" ? "L1" : "L2");
}

void AnnounceRoutes(const ModelArgs& args, const engine::Model& model, std::string_view graph) {
  auto c = ResolveRouteChoice(args);
  if (!c.ok()) return;
  std::fprintf(stderr, "lumen: %s\n", RouteSummary(*c, model).c_str());
  if (!args.show_routes) return;
  auto nodes = ResolveGraph(graph, args, &model);
  if (!nodes.ok()) return;
  for (const ResolvedNode& n : *nodes)
    std::fprintf(stderr, "  %-24s %-22s %s\n", n.node.c_str(),
                 n.active ? n.active->name : "UNTAGGED",
                 n.active ? std::string(TierName(n.active->tier)).c_str() : "-");
}

namespace {

void PrintTable(const std::vector<ResolvedNode>& nodes) {
  std::printf("%-24s %-22s %-4s %s\n", "node", "route", "tier", "oracle | proof");
  for (const ResolvedNode& n : nodes) {
    if (!n.active) {
      std::printf("%-24s %-22s %-4s %s\n", n.node.c_str(), "UNTAGGED", "-", "no route registered");
      continue;
    }
    const Route& r = *n.active;
    std::printf("%-24s %-22s %-4s %s\n", n.node.c_str(), r.name,
                std::string(TierName(r.tier)).c_str(), r.oracle);
    std::printf("%-24s %-22s %-4s   bound: %s\n", "", "", "", r.bound);
    std::printf("%-24s %-22s %-4s   tests: %s\n", "", "", "", r.tests);
    if (*r.measure) std::printf("%-24s %-22s %-4s   measured: %s\n", "", "", "", r.measure);
    for (const Route* o : n.others)
      std::printf("%-24s %-22s %-4s   (also applies: %s %s)\n", "", "", "", o->name,
                  std::string(TierName(o->tier)).c_str());
  }
}

void PrintJson(const std::vector<ResolvedNode>& nodes) {
  std::printf("[\n");
  for (size_t i = 0; i < nodes.size(); ++i) {
    const ResolvedNode& n = nodes[i];
    std::printf("  {\"node\": \"%s\"", Escape(n.node).c_str());
    if (n.active) {
      const Route& r = *n.active;
      std::printf(
          ", \"route\": \"%s\", \"tier\": \"%s\", \"oracle\": \"%s\", \"bound\": \"%s\", "
          "\"tests\": \"%s\", \"measure\": \"%s\", \"when\": \"%s\"",
          Escape(r.name).c_str(), std::string(TierName(r.tier)).c_str(), Escape(r.oracle).c_str(),
          Escape(r.bound).c_str(), Escape(r.tests).c_str(), Escape(r.measure).c_str(),
          Escape(r.when).c_str());
    } else {
      std::printf(", \"route\": null");
    }
    std::printf(", \"alternatives\": [");
    for (size_t j = 0; j < n.others.size(); ++j)
      std::printf("%s\"%s\"", j ? ", " : "", Escape(n.others[j]->name).c_str());
    std::printf("]}%s\n", i + 1 < nodes.size() ? "," : "");
  }
  std::printf("]\n");
}

// Graphviz: one cluster per graph, nodes in execution order, filled by tier.
void PrintDot(const std::vector<std::pair<std::string, std::vector<ResolvedNode>>>& graphs) {
  std::printf(
      "digraph lumen_routes {\n  rankdir=TB; node [shape=box, style=\"rounded,filled\", "
      "fontname=\"Helvetica\", fontsize=10];\n");
  std::printf(
      "  legend [shape=plaintext, style=\"\", label=<L1 bit-identical: green; L2 "
      "bounded: blue; L3 original: orange>];\n");
  for (size_t g = 0; g < graphs.size(); ++g) {
    const auto& [name, nodes] = graphs[g];
    std::printf("  subgraph cluster_%zu {\n    label=\"lumen %s\"; fontname=\"Helvetica\";\n", g,
                name.c_str());
    for (size_t i = 0; i < nodes.size(); ++i) {
      const ResolvedNode& n = nodes[i];
      const char* color = "#f4cccc";
      std::string label = Escape(n.node) + "\\nUNTAGGED";
      if (n.active) {
        const Tier t = n.active->tier;
        color = t == Tier::kL1 ? "#d9ead3" : t == Tier::kL2 ? "#cfe2f3" : "#fce5cd";
        label = fmt::format("{}\\n{} ({})", Escape(n.node), Escape(n.active->name), TierName(t));
      }
      std::printf("    g%zu_%zu [label=\"%s\", fillcolor=\"%s\"];\n", g, i, label.c_str(), color);
      if (i) std::printf("    g%zu_%zu -> g%zu_%zu;\n", g, i - 1, g, i);
    }
    std::printf("  }\n");
  }
  std::printf("}\n");
}

// ctest --output-junit: <testcase name="..." ... status="run|fail|notrun|disabled">, with a
// <failure> or <skipped> child when the test failed or skipped.
struct TestResult {
  bool passed = false, skipped = false;
};

std::string Attr(const std::string& tag, const std::string& key) {
  const std::string k = " " + key + "=\"";
  const size_t at = tag.find(k);
  if (at == std::string::npos) return "";
  const size_t b = at + k.size(), e = tag.find('"', b);
  return e == std::string::npos ? "" : tag.substr(b, e - b);
}

std::string Unescape(std::string s) {
  const std::pair<const char*, const char*> ents[] = {
      {"&lt;", "<"}, {"&gt;", ">"}, {"&quot;", "\""}, {"&apos;", "'"}, {"&amp;", "&"}};
  for (const auto& [from, to] : ents)
    for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + 1))
      s.replace(at, std::string_view(from).size(), to);
  return s;
}

std::map<std::string, TestResult> ReadJunit(const std::string& xml) {
  std::map<std::string, TestResult> out;
  for (size_t at = xml.find("<testcase"); at != std::string::npos;
       at = xml.find("<testcase", at + 1)) {
    const size_t tag_end = xml.find('>', at);
    if (tag_end == std::string::npos) break;
    const std::string tag = xml.substr(at, tag_end - at);
    size_t body_end = tag_end;
    if (xml[tag_end - 1] != '/') body_end = xml.find("</testcase>", tag_end);
    const std::string body =
        xml.substr(tag_end, body_end == std::string::npos ? 0 : body_end - tag_end);
    TestResult r;
    const std::string status = Attr(tag, "status");
    r.skipped =
        body.find("<skipped") != std::string::npos || status == "notrun" || status == "disabled";
    r.passed = !r.skipped && body.find("<failure") == std::string::npos &&
               body.find("<error") == std::string::npos && status != "fail";
    out[Unescape(Attr(tag, "name"))] = r;
  }
  return out;
}

// True when some condition of r.when names a CPU feature this machine lacks.
bool NeedsAbsentCpu(const Route& r, const RouteContext& cpu) {
  for (const std::string& cond : SplitList(r.when, ' '))
    if (cond.rfind("cpu=", 0) == 0 && !cpu.Holds(cond)) return true;
  return false;
}

}  // namespace

int CheckRoutes(const std::string& junit_path, const std::string& source_dir) {
  int problems = 0;
  auto fail = [&](const std::string& msg) {
    std::printf("route gate: %s\n", msg.c_str());
    ++problems;
  };
  std::map<std::string, TestResult> results;
  if (!junit_path.empty()) {
    std::ifstream f(junit_path);
    if (!f) {
      fail(fmt::format("cannot read the test results '{}'", junit_path));
      return problems;
    }
    std::stringstream ss;
    ss << f.rdbuf();
    results = ReadJunit(ss.str());
    if (results.empty()) fail(fmt::format("no <testcase> in '{}'", junit_path));
  }
  RouteContext cpu;
  AddCpuFacts(&cpu);

  std::set<std::pair<std::string, std::string>> seen;
  int checked_tests = 0;
  for (const Route* r : AllRoutes()) {
    const std::string id = fmt::format("{} / {}", r->node, r->name);
    if (!seen.insert({r->node, r->name}).second) fail(id + ": registered twice");
    if (!*r->oracle || !*r->bound) fail(id + ": no oracle or bound");
    const std::vector<std::string> tests = SplitList(r->tests);
    if (r->tier != Tier::kL3 && tests.empty()) fail(id + ": an L1/L2 route names no test");
    if (r->tier == Tier::kL3) {
      if (!*r->measure) fail(id + ": an L3 route names no measurement");
      std::string path = r->measure;
      path = path.substr(0, path.find('#'));
      if (*r->measure && !std::filesystem::exists(std::filesystem::path(source_dir) / path))
        fail(fmt::format("{}: its measurement '{}' does not exist", id, path));
    }
    if (results.empty()) continue;
    for (const std::string& pattern : tests) {
      int matched = 0;
      for (const auto& [name, res] : results) {
        if (!GlobMatch(pattern, name)) continue;
        ++matched;
        if (res.skipped && !NeedsAbsentCpu(*r, cpu))
          fail(fmt::format("{}: test {} was skipped on a machine where the route runs", id, name));
        else if (!res.skipped && !res.passed)
          fail(fmt::format("{}: test {} failed", id, name));
      }
      if (matched == 0) fail(fmt::format("{}: test '{}' did not run (no such test?)", id, pattern));
      checked_tests += matched;
    }
  }
  // Every node of every graph has a route.
  for (const char* graph : {"generate", "serve", "train"}) {
    ModelArgs args;
    args.adapter = "x";  // include the optional nodes
    auto nodes = ResolveGraph(graph, args, nullptr);
    if (!nodes.ok()) {
      fail(nodes.status().message());
      continue;
    }
    for (const ResolvedNode& n : *nodes)
      if (!n.active) fail(fmt::format("{}: node {} has no route", graph, n.node));
  }
  std::printf("route gate: %zu routes, %d test results checked, %d problem(s)\n",
              AllRoutes().size(), checked_tests, problems);
  return problems;
}

namespace {

struct RoutesArgs {
  ModelArgs model;
  std::string graph;  // "": all three
  bool json = false, dot = false;
  std::string check;  // junit file
  bool lint = false;
};

void RunRoutes(RoutesArgs& a) {
  if (a.lint || !a.check.empty()) {
    if (CheckRoutes(a.check, LUMEN_SOURCE_DIR) != 0) SetExitCode(1);
    return;
  }
  // The train graph for a precision `lumen train` would refuse on this CPU
  // is not a graph that runs: refused with train's reason.
  if (auto c = train::ParseCompute(a.model.train_compute); c) {
    if (Status ok = train::ValidateCompute(*c); !ok.ok()) return ReportError(ok);
  }
  auto model = LoadModel(a.model);
  if (!model.ok()) return ReportError(model.status());
  std::vector<std::pair<std::string, std::vector<ResolvedNode>>> graphs;
  for (const char* g : {"generate", "serve", "train"}) {
    if (!a.graph.empty() && a.graph != g) continue;
    auto nodes = ResolveGraph(g, a.model, model->get());
    if (!nodes.ok()) return ReportError(nodes.status());
    graphs.emplace_back(g, std::move(*nodes));
  }
  if (graphs.empty())
    return ReportError(Errorf("--for: '{}' is not one of generate, serve, train", a.graph));
  if (a.dot) return PrintDot(graphs);
  if (a.json) {
    std::vector<ResolvedNode> all;
    for (auto& [g, nodes] : graphs) all.insert(all.end(), nodes.begin(), nodes.end());
    return PrintJson(all);
  }
  auto c = ResolveRouteChoice(a.model);
  if (!c.ok()) return ReportError(c.status());
  std::printf("model: %s | %s\n", (*model)->name().c_str(), RouteSummary(*c, **model).c_str());
  for (auto& [g, nodes] : graphs) {
    std::printf("\n== lumen %s\n", g.c_str());
    PrintTable(nodes);
  }
}

}  // namespace

void RegisterRoutes(CLI::App& app) {
  auto a = std::make_shared<RoutesArgs>();
  auto* cmd = app.add_subcommand(
      "routes", "the compute graph's nodes with each node's active route, tier and oracle");
  cmd->add_option("-m,--model", a->model.model, "model (default: the embedded stories260K)");
  AddModelArgs(cmd, a->model, /*positional=*/false);
  cmd->add_option("--for", a->graph, "only this graph: generate, serve or train")
      ->check(CLI::IsMember({"generate", "serve", "train"}));
  cmd->add_option("--compute", a->model.train_compute,
                  "the train graph's product precision: auto (default, as lumen train), f32 "
                  "or bf16 (lumen train --compute)")
      ->check(CLI::IsMember({"auto", "f32", "bf16"}));
  cmd->add_flag("--json", a->json, "JSON: one object per node");
  cmd->add_flag("--dot", a->dot, "Graphviz DOT of the graphs (docs/design/routes.svg)");
  cmd->add_option("--check", a->check,
                  "CI gate: every route's tests passed in this ctest --output-junit file");
  cmd->add_flag("--lint", a->lint, "check the registry alone (oracles, tests named, measurements)");
  cmd->callback([a] { RunRoutes(*a); });
}

}  // namespace lumen::cli
