// --exact end to end (issue 18): `lumen generate --exact` and `lumen serve
// --exact` reproduce the reference path bit for bit, on the embedded model and
// on a synth model of every family. The reference path is the library called
// directly with the lowest-tier routes: LoadOptions{act_route = kExact} and an
// f32 KV cache. Generate is compared on seeded T=1 sampling (a changed logit
// bit moves a sample sooner or later) and serve on the logprob of every
// generated token, compared as floats for equality.
#include <algorithm>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "lumen/engine/default_model.h"
#include "lumen/engine/generate.h"
#include "lumen/engine/model.h"
#include "lumen/engine/session.h"
#include "lumen/kernels/matmul_bf16.h"
#include "lumen/kernels/matmul_bf16_amx.h"
#include "lumen/kernels/matmul_q8.h"
#include "lumen/kernels/matmul_q8_avx2.h"
#include "lumen/sample/sampler.h"
#include "lumen_cli.h"

namespace lumen::testing {
namespace {

namespace fs = std::filesystem;

const char* kPrompt = "Once upon a time";

struct Reference {
  std::string text;
  std::vector<float> logprobs;
};

Reference RunReference(const std::string& model_path, float temperature, uint64_t seed, int n,
                       bool ignore_eos) {
  engine::LoadOptions lo;
  lo.act_route = kernels::ActRoute::kExact;
  lo.threads = 1;
  auto model = engine::LoadModelOrDefault(model_path, lo);
  Reference ref;
  EXPECT_TRUE(model.ok()) << model.status().message();
  if (!model.ok()) return ref;
  engine::SessionOptions so;
  so.kv_dtype = DType::kF32;
  so.ctx = 256;
  auto session = engine::Session::Create(**model, so);
  EXPECT_TRUE(session.ok());
  sample::SamplerConfig cfg;
  cfg.temperature = temperature;
  cfg.seed = seed;
  auto sampler = sample::Sampler::Create(cfg);
  EXPECT_TRUE(sampler.ok());
  const std::vector<int32_t> prompt = (*model)->tokenizer().Encode(kPrompt, true);
  engine::GenerateOptions g;
  g.max_tokens = n;
  g.ignore_eos = ignore_eos;
  g.want_logprobs = true;
  auto r = engine::Generate(**session, *sampler, prompt, g, [](std::string_view) { return true; });
  EXPECT_TRUE(r.ok());
  if (!r.ok()) return ref;
  ref.text = r->text;
  for (const auto& t : r->tokens) ref.logprobs.push_back(t.logprobs.chosen.logprob);
  return ref;
}

// The routes `lumen routes --for generate --json` names for the nodes whose
// names are in `nodes`, for the model at path and the extra flags; a failed
// run or unparsable output is a test failure and gives none.
std::vector<std::string> RoutesOf(const std::string& path, const std::string& flags,
                                  const std::vector<std::string>& nodes) {
  std::vector<std::string> out;
  CliRun r = RunLumen("routes -m " + path + " --for generate --json" + flags);
  EXPECT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  EXPECT_TRUE(j.is_array()) << r.out;
  if (r.code != 0 || !j.is_array()) return out;
  for (const auto& n : j)
    if (std::find(nodes.begin(), nodes.end(), n["node"].get<std::string>()) != nodes.end())
      out.push_back(n["route"].get<std::string>());
  return out;
}

// `lumen routes --check` on a results file holding the one <testcase> given.
CliRun CheckGate(const std::string& dir_name, const std::string& testcase) {
  const std::string junit = TempDir(dir_name) + "/junit.xml";
  std::ofstream(junit) << "<testsuite>\n" << testcase << "\n</testsuite>\n";
  return RunLumen("routes --check " + junit);
}

class ExactRoute : public ::testing::TestWithParam<std::string> {
 protected:
  // "" is the embedded model; otherwise a synth model of that shape.
  std::string ModelPath() {
    if (GetParam() == "embedded") return "";
    const std::string path = TempDir("exact") + "/" + GetParam() + ".gguf";
    if (!fs::exists(path)) {
      CliRun s = RunLumen("synth " + GetParam() + " -o " + path + " --seed 3");
      EXPECT_EQ(s.code, 0) << s.err;
    }
    return path;
  }
};

TEST_P(ExactRoute, GenerateIsTheReferencePath) {
  const std::string path = ModelPath();
  const Reference ref = RunReference(path, 1.0f, 7, 24, /*ignore_eos=*/true);
  ASSERT_FALSE(ref.text.empty());
  CliRun r = RunLumen("generate " + (path.empty() ? "" : "-m " + path) +
                      " -p \"Once upon a time\" -n 24 --temp 1 --seed 7 --ignore-eos --no-echo "
                      "--ctx 256 -t 1 --exact");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, ref.text + "\n");
  EXPECT_NE(r.err.find("--exact: every node at its lowest tier"), std::string::npos) << r.err;
}

TEST_P(ExactRoute, ServeIsTheReferencePath) {
  const std::string path = ModelPath();
  const Reference ref = RunReference(path, 0.0f, 1, 8, /*ignore_eos=*/false);
  ASSERT_FALSE(ref.logprobs.empty());
  const std::string body =
      R"({"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "logprobs": 1})";
  ServeResult s =
      ServeOnce(path.empty() ? "" : path, "/v1/completions", body, {"--exact", "--ctx", "256"});
  ASSERT_TRUE(s.started) << s.log;
  const size_t at = s.response.find("\r\n\r\n");
  ASSERT_NE(at, std::string::npos) << s.response;
  auto j = nlohmann::json::parse(s.response.substr(at + 4), nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << s.response;
  const auto& choice = j["choices"][0];
  EXPECT_EQ(choice["text"].get<std::string>(), ref.text);
  const auto& lps = choice["logprobs"]["token_logprobs"];
  ASSERT_EQ(lps.size(), ref.logprobs.size()) << s.response;
  for (size_t i = 0; i < lps.size(); ++i)
    EXPECT_EQ(static_cast<float>(lps[i].get<double>()), ref.logprobs[i]) << "token " << i;
  EXPECT_NE(s.log.find("--exact: every node at its lowest tier"), std::string::npos) << s.log;
}

INSTANTIATE_TEST_SUITE_P(Families, ExactRoute,
                         ::testing::Values("embedded", "tiny-llama", "tiny-mistral", "tiny-qwen2",
                                           "tiny-qwen3", "tiny-gemma2", "tiny-gemma3",
                                           "tiny-minicpm", "tiny-phi3"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

// The registry's table through the CLI: every node of every graph has a route,
// --exact changes the product and KV routes to their lowest tiers, and the DOT
// output names every node.
TEST(RoutesCli, TableExactAndDot) {
  CliRun r = RunLumen("routes --for generate");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.find("UNTAGGED"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("kv.store"), std::string::npos);
  EXPECT_NE(r.out.find("f16/bf16"), std::string::npos) << r.out;  // the default KV
  CliRun e = RunLumen("routes --for generate --exact --json");
  ASSERT_EQ(e.code, 0) << e.err;
  auto j = nlohmann::json::parse(e.out, nullptr, false);
  ASSERT_TRUE(j.is_array()) << e.out;
  bool kv = false;
  for (const auto& n : j) {
    ASSERT_FALSE(n["route"].is_null()) << n.dump();
    if (n["node"] == "kv.store") {
      kv = true;
      EXPECT_EQ(n["route"], "f32");
      EXPECT_EQ(n["tier"], "L1");
    }
    if (n["node"].get<std::string>().rfind("matmul.", 0) == 0) {
      EXPECT_EQ(n["tier"], "L2");
    }
  }
  EXPECT_TRUE(kv);
  CliRun d = RunLumen("routes --dot");
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_EQ(d.out.rfind("digraph", 0), 0u);
  EXPECT_NE(d.out.find("head.ce"), std::string::npos);
  CliRun bad = RunLumen("routes --exact --tier l3");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("--exact means --tier l1"), std::string::npos) << bad.err;
}

// `--compute bf16` shows the train graph as `lumen train --compute bf16`
// runs it: the four product nodes take their L3 bf16 routes where the CPU
// has AVX512-BF16 (train.product_t's bf16-amx where it has usable AMX
// tiles); the default (f32) keeps them at L2 (LoRA's as the epilogue of the
// frozen products).
// --compute auto (the default of lumen train and of routes --for train):
// bf16 where the AMX tiles are usable, else f32; f32 under --exact and
// --tier l2 whatever the CPU.
TEST(RoutesCli, TrainComputeAutoFollowsTheTiles) {
  auto product_route = [](const std::string& flags) {
    CliRun r = RunLumen("routes --for train --json" + flags);
    EXPECT_EQ(r.code, 0) << r.err;
    auto j = nlohmann::json::parse(r.out, nullptr, false);
    if (j.is_array())
      for (const auto& n : j)
        if (n["node"] == "train.product") return n["route"].get<std::string>();
    return std::string("(missing)");
  };
  const std::string want = kernels::AmxBf16Usable() ? "bf16" : "f32";
  EXPECT_EQ(product_route(""), want);
  EXPECT_EQ(product_route(" --compute auto"), want);
  EXPECT_EQ(product_route(" --exact"), "f32");
  EXPECT_EQ(product_route(" --tier l2"), "f32");
}

TEST(RoutesCli, TrainComputeShowsTheBf16Routes) {
  const char* nodes[] = {"train.product", "train.product_t", "head.chunk", "train.lora"};
  for (const char* compute : {"f32", "bf16"}) {
    CliRun r = RunLumen(std::string("routes --for train --json --compute ") + compute);
    if (std::string(compute) == "bf16" && !kernels::CpuHasBf16()) {
      // Refused as `lumen train --compute bf16` is here, with its reason.
      EXPECT_NE(r.code, 0);
      EXPECT_NE(r.err.find("no AVX512-BF16"), std::string::npos) << r.err;
      continue;
    }
    ASSERT_EQ(r.code, 0) << r.err;
    auto j = nlohmann::json::parse(r.out, nullptr, false);
    ASSERT_TRUE(j.is_array()) << r.out;
    const bool bf16 = std::string(compute) == "bf16" && kernels::CpuHasBf16();
    int seen = 0;
    for (const auto& n : j)
      for (const char* node : nodes)
        if (n["node"] == node) {
          ++seen;
          // f32 LoRA products run fused into the frozen products' tiles.
          const std::string f32 = std::string(node) == "train.lora" ? "f32-epilogue" : "f32";
          // The transposed product has its own route on the AMX tiles.
          const std::string bf16_route =
              std::string(node) == "train.product_t" && kernels::AmxBf16Usable() ? "bf16-amx"
                                                                                 : "bf16";
          EXPECT_EQ(n["route"], bf16 ? bf16_route : f32) << compute << " " << node;
          EXPECT_EQ(n["tier"], bf16 ? "L3" : "L2") << compute << " " << node;
        }
    EXPECT_EQ(seen, 4) << r.out;
  }
  CliRun bad = RunLumen("routes --for train --compute f16");
  EXPECT_NE(bad.code, 0);
}

// The table names the decode route each weight type actually takes: the
// int8x2 route (the default) for every quantized type with an int8 kernel on
// this CPU (VNNI and AVX2: every one), and the exact route for
// float weights and under --exact. `lumen bench` says the same per storage.
TEST(RoutesCli, DecodeRoutePerWeightType) {
  const std::string dir = TempDir("routes_types");
  struct Want {
    std::string quant, node;
    bool int8;
  };
  const bool vnni = kernels::CpuHasVnni(), int8 = vnni || kernels::CpuHasAvx2();
  const std::string route = vnni ? "int8x2-vnni" : "int8x2-avx2";
  const Want wants[] = {{"q5_k", "matmul.q5_k.decode", int8},
                        {"q4_1", "matmul.q4_1.decode", int8},
                        {"mlx8-g32", "matmul.mlx8.decode", int8},
                        {"f16", "matmul.f16.decode", false}};
  for (const Want& w : wants) {
    const std::string path = dir + "/" + w.quant + (w.quant.starts_with("mlx") ? "" : ".gguf");
    CliRun s = RunLumen("synth tiny-llama --dim 256 --ffn 512 --quant " + w.quant + " -o " + path);
    ASSERT_EQ(s.code, 0) << s.err;
    for (const std::string flags : {"", " --exact"}) {
      const std::vector<std::string> routes = RoutesOf(path, flags, {w.node});
      ASSERT_EQ(routes.size(), 1u) << w.quant << flags;
      EXPECT_EQ(routes[0] == route, w.int8 && flags.empty())
          << w.quant << flags << ": " << routes[0];
    }
    CliRun b = RunLumen("bench " + path + " --prompt 2 --gen 2 --repeat 1 --no-membw");
    ASSERT_EQ(b.code, 0) << b.err;
    EXPECT_EQ(b.out.find("int8x2 activations") != std::string::npos, w.int8) << w.quant << b.out;
  }
}

// The gate itself: a results file where a named test failed, or is missing,
// fails the check, naming the route and the test.
TEST(RoutesCli, GateFailsOnAFailedOrMissingTest) {
  CliRun r = CheckGate("gate",
                       "<testcase name=\"GatedActivation.EveryTargetGivesTheReferenceBits\" "
                       "status=\"fail\"><failure message=\"Failed\"/></testcase>");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("act.gated / simd: test GatedActivation.EveryTargetGivesTheReferenceBits "
                       "failed"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("did not run"), std::string::npos) << r.out;
}

// The default prefill is the faster route on this CPU: bf16 where
// kernels::Bf16PrefillPays (AMX, or AVX512-BF16 on AMD, where vdpbf16ps runs
// well above the f32 FMA rate), the exact product elsewhere; --act-route
// int8x2+bf16 still asks for bf16 wherever the CPU has it. The node table and the summary line
// agree (the table once listed the exact route while int8x2+bf16 ran bf16).
TEST(RoutesCli, DefaultPrefillIsTheFasterRouteAndTheTableSaysWhichRuns) {
  const std::string path = TempDir("routes_prefill") + "/q4_0.gguf";
  CliRun s = RunLumen("synth tiny-llama --dim 256 --ffn 512 --quant q4_0 -o " + path);
  ASSERT_EQ(s.code, 0) << s.err;
  const std::string bf16 = kernels::AmxBf16Usable() ? "bf16-amx" : "bf16-avx512";
  struct Case {
    std::string flags;
    bool bf16;
  };
  const Case cases[] = {{"", kernels::Bf16PrefillPays()},
                        {" --act-route int8x2+bf16", kernels::CpuHasBf16()},
                        {" --act-route int8x2", false}};
  for (const Case& c : cases) {
    const std::vector<std::string> routes =
        RoutesOf(path, c.flags, {"matmul.q4_0_cols.prefill", "matmul.q4_0.prefill"});
    ASSERT_EQ(routes.size(), 1u) << c.flags;
    EXPECT_EQ(routes[0] == bf16, c.bf16) << c.flags << ": " << routes[0];
    CliRun t = RunLumen("routes -m " + path + " --for generate" + c.flags);
    ASSERT_EQ(t.code, 0) << t.err;
    EXPECT_EQ(t.out.find("prefill products bf16") != std::string::npos, c.bf16) << c.flags << t.out;
  }
}

// The summary line names how long a prompt stays on the int8 dot kernels
// (kernels::Int8MaxRows, asked on the chosen route): Q4_0 up to 32 tokens
// with the VNNI kernels (the int8x2 GEMM above) and with the AVX2 ones.
TEST(RoutesCli, SummarySaysWhichPromptsTakeTheDotKernels) {
  const std::string path = TempDir("routes_short") + "/q4_0.gguf";
  CliRun s = RunLumen("synth tiny-llama --dim 256 --ffn 512 --quant q4_0 -o " + path);
  ASSERT_EQ(s.code, 0) << s.err;
  CliRun t = RunLumen("routes -m " + path + " --for generate --act-route int8x2");
  ASSERT_EQ(t.code, 0) << t.err;
  const bool dots = kernels::CpuHasVnni() || kernels::CpuHasAvx2();
  EXPECT_EQ(t.out.find("int8x2 for prompts of up to 32 tokens") != std::string::npos, dots)
      << t.out;
  CliRun e = RunLumen("routes -m " + path + " --for generate --act-route exact");
  ASSERT_EQ(e.code, 0) << e.err;
  EXPECT_EQ(e.out.find("for prompts of up to"), std::string::npos) << e.out;
}

// A skipped test counts against a route only where the route can run. The
// AVX2 int8 routes run only without AVX512-VNNI (a VNNI CPU has AVX2 too and
// never takes them), so their route-specific tests may skip on a VNNI CPU but
// not on an AVX2-only one; the gate once required them on every AVX2 CPU and
// failed the README's test command on AVX-512 hosts.
TEST(RoutesCli, GateAsksTheAvx2Int8TestsOnlyWhereThoseKernelsRun) {
  CliRun r = CheckGate("gate_avx2",
                       "<testcase name=\"RouteKl.Int8x2ShortPrefillPassesTheDefaultGate\" "
                       "status=\"run\"><skipped message=\"not on this CPU\"/></testcase>");
  const bool runs_there = kernels::CpuHasAvx2() && !kernels::CpuHasVnni();
  const std::string complaint =
      "int8x2-avx2: test RouteKl.Int8x2ShortPrefillPassesTheDefaultGate was skipped";
  EXPECT_EQ(r.out.find(complaint) != std::string::npos, runs_there) << r.out;
  EXPECT_NE(r.code, 0);  // every other route's tests are missing from this file
}

}  // namespace
}  // namespace lumen::testing
