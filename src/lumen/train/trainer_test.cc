// Issue 14, proofs 2 and 4 and the run guarantees: training the embedded
// stories260K on the repo's efficacy sets (tests/data/train, made by
// tools/reference/make_train_data.py) moves it the intended way; the same
// seed gives a bit-identical adapter; a resumed run ends bit-identical to an
// uninterrupted one; bad inputs give clear errors and leave no output
// directory.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "lumen/engine/adapter.h"
#include "lumen/engine/default_model.h"
#include "lumen/engine/session.h"
#include "lumen/kernels/matmul_bf16.h"
#include "lumen/model/test_util.h"
#include "lumen/train/test_util.h"
#include "lumen/train/trainer.h"

namespace lumen::train {
namespace {

namespace fs = std::filesystem;

std::string DataDir(const std::string& name) {
  return testing_util::SourceDir() + "/tests/data/train/" + name;
}

std::unique_ptr<engine::Model> Embedded(const std::string& adapter = "") {
  engine::LoadOptions o;
  o.threads = 2;
  o.adapter_dir = adapter;
  auto m = engine::LoadModelOrDefault("", o);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return m.ok() ? std::move(m).value() : nullptr;
}

TrainOptions Options(const std::string& data, Method m, const fs::path& out) {
  TrainOptions o;
  o.data_dir = DataDir(data);
  o.out_dir = out.string();
  o.method = m;
  o.iters = 30;
  o.lr = 3e-3;
  o.batch_size = 4;
  o.steps_per_report = 10;
  o.quiet = true;
  o.seed = 1;
  if (m == Method::kSimpo) o.objective.beta = 2.0;
  return o;
}

std::string ReadFile(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

// Greedy continuation of `prompt` (n tokens) as text.
std::string Greedy(const engine::Model& m, const std::string& prompt, int n) {
  auto s = engine::Session::Create(m, {});
  EXPECT_TRUE(s.ok());
  std::vector<int32_t> ids = m.tokenizer().Encode(prompt, true);
  EXPECT_TRUE((*s)->Append(ids).ok());
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    auto l = (*s)->logits();
    const int32_t t = int32_t(std::max_element(l.begin(), l.end()) - l.begin());
    out.push_back(t);
    const int32_t one[] = {t};
    EXPECT_TRUE((*s)->Append(one).ok());
  }
  return m.tokenizer().Decode(out);
}

class PreferenceEfficacy : public ::testing::TestWithParam<Method> {};

// "Prefer the UPPERCASE continuation": the base model prefers normal case on
// every validation row (accuracy 0, below the issue's ~0.5), and 30 steps of
// each method lift validation preference accuracy to >= 0.9.
TEST_P(PreferenceEfficacy, LiftsValidationAccuracy) {
  auto model = Embedded();
  ASSERT_TRUE(model);
  testing::TempDir dir("eff");
  auto r = Train(*model, Options("uppercase", GetParam(), dir.path() / "out"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_LE(r->first_eval.accuracy, 0.5);
  EXPECT_GE(r->last_eval.accuracy, 0.9) << MethodName(GetParam());
  EXPECT_LT(r->last_eval.loss, r->first_eval.loss);
  EXPECT_EQ(r->first_eval.pairs, 40);
  EXPECT_TRUE(fs::exists(dir.path() / "out" / "adapter_model.safetensors"));
  EXPECT_TRUE(fs::exists(dir.path() / "out" / "metrics.jsonl"));
}

INSTANTIATE_TEST_SUITE_P(Methods, PreferenceEfficacy,
                         ::testing::Values(Method::kOrpo, Method::kDpo, Method::kSimpo),
                         [](const auto& info) { return std::string(MethodName(info.param)); });

// --compute bf16 (compute.h, tier L3) passes the same efficacy bar as f32.
// Runs both and prints their final validation accuracy and loss side by
// side, so a drift is reported (docs/experiments/compute-precision.md).
class Bf16Efficacy : public ::testing::TestWithParam<Method> {};

TEST_P(Bf16Efficacy, LiftsValidationAccuracy) {
  if (!kernels::CpuHasBf16()) GTEST_SKIP() << "no AVX512-BF16: --compute bf16 is refused here";
  auto model = Embedded();
  ASSERT_TRUE(model);
  testing::TempDir dir("eff_bf16");
  TrainOptions o = Options("uppercase", GetParam(), dir.path() / "f32");
  auto f32 = Train(*model, o);
  ASSERT_TRUE(f32.ok()) << f32.status().message();
  o.out_dir = (dir.path() / "bf16").string();
  o.compute = Compute::kBf16;
  auto r = Train(*model, o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_LE(r->first_eval.accuracy, 0.5);
  EXPECT_GE(r->last_eval.accuracy, 0.9) << MethodName(GetParam());
  EXPECT_LT(r->last_eval.loss, r->first_eval.loss);
  std::printf("%s: validation accuracy f32 %.3f bf16 %.3f; loss f32 %.4g bf16 %.4g (from %.4g)\n",
              std::string(MethodName(GetParam())).c_str(), f32->last_eval.accuracy,
              r->last_eval.accuracy, f32->last_eval.loss, r->last_eval.loss, r->first_eval.loss);
}

INSTANTIATE_TEST_SUITE_P(Methods, Bf16Efficacy,
                         ::testing::Values(Method::kOrpo, Method::kDpo, Method::kSimpo),
                         [](const auto& info) { return std::string(MethodName(info.param)); });

// SFT on the style set (every story's hero is "Tom"): validation NLL at least
// halves and greedy generations after "... a brave boy named" say Tom, which
// the base model never does.
TEST(SftEfficacy, LowersValidationLossAndChangesGenerations) {
  auto base = Embedded();
  ASSERT_TRUE(base);
  testing::TempDir dir("sft");
  TrainOptions o = Options("style", Method::kSft, dir.path() / "out");
  o.iters = 40;
  auto r = Train(*base, o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_LT(r->last_eval.nll, 0.5 * r->first_eval.nll);
  auto tuned = Embedded((dir.path() / "out").string());
  ASSERT_TRUE(tuned);
  const char* prompts[] = {"Once upon a time, there was a brave boy named",
                           "One day, a little boy named", "There was a happy boy named"};
  int base_tom = 0, tuned_tom = 0;
  for (const char* p : prompts) {
    base_tom += Greedy(*base, p, 3).find("Tom") != std::string::npos;
    tuned_tom += Greedy(*tuned, p, 3).find("Tom") != std::string::npos;
  }
  EXPECT_EQ(base_tom, 0);
  EXPECT_EQ(tuned_tom, 3);
}

// The SFT efficacy bar with --compute bf16: validation NLL at least halves
// and the greedy generations say Tom.
TEST(Bf16SftEfficacy, LowersValidationLossAndChangesGenerations) {
  if (!kernels::CpuHasBf16()) GTEST_SKIP() << "no AVX512-BF16: --compute bf16 is refused here";
  auto base = Embedded();
  ASSERT_TRUE(base);
  testing::TempDir dir("sft_bf16");
  TrainOptions o = Options("style", Method::kSft, dir.path() / "out");
  o.iters = 40;
  o.compute = Compute::kBf16;
  auto r = Train(*base, o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_LT(r->last_eval.nll, 0.5 * r->first_eval.nll);
  std::printf("sft bf16: validation nll %.4f (from %.4f)\n", r->last_eval.nll, r->first_eval.nll);
  auto tuned = Embedded((dir.path() / "out").string());
  ASSERT_TRUE(tuned);
  int tuned_tom = 0;
  for (const char* p : {"Once upon a time, there was a brave boy named",
                        "One day, a little boy named", "There was a happy boy named"})
    tuned_tom += Greedy(*tuned, p, 3).find("Tom") != std::string::npos;
  EXPECT_EQ(tuned_tom, 3);
}

// --probe-ranges: every product kind reports its operands (stderr text and a
// "ranges" line in metrics.jsonl), and probing changes nothing it observes.
TEST(TrainRun, ProbeRangesReportsEveryProductKind) {
  auto model = Embedded();
  ASSERT_TRUE(model);
  testing::TempDir dir("probe");
  TrainOptions o = Options("uppercase", Method::kOrpo, dir.path() / "plain");
  o.iters = 3;
  ASSERT_TRUE(Train(*model, o).ok());
  o.out_dir = (dir.path() / "probed").string();
  o.probe_ranges = true;
  auto r = Train(*model, o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(ReadFile(dir.path() / "plain" / "adapter_model.safetensors"),
            ReadFile(dir.path() / "probed" / "adapter_model.safetensors"));
  std::ifstream f(dir.path() / "probed" / "metrics.jsonl");
  std::string line;
  nlohmann::json sites;
  while (std::getline(f, line)) {
    auto j = nlohmann::json::parse(line);
    if (j["kind"] == "ranges") sites = j["sites"];
  }
  for (const char* site : {"product.x", "product_t.dy", "head.xn", "head.coeff", "lora.x", "lora.u",
                           "lora.dy", "lora.du"}) {
    ASSERT_TRUE(sites.contains(site)) << site;
    EXPECT_GT(sites[site]["values"].get<int64_t>(), 0) << site;
    EXPECT_GT(sites[site]["max_abs"].get<double>(), 0) << site;
    EXPECT_NE(r->ranges.find(site), std::string::npos) << r->ranges;
  }
  EXPECT_GT(sites["head.coeff"]["min_nonzero"].get<double>(), 0);
  EXPECT_EQ(sites["head.coeff"]["bf16_overflow"].get<int64_t>(), 0);
}

TEST(TrainRun, SameSeedGivesBitIdenticalAdapter) {
  auto model = Embedded();
  ASSERT_TRUE(model);
  testing::TempDir dir("det");
  TrainOptions o = Options("uppercase", Method::kOrpo, dir.path() / "a");
  o.iters = 4;
  o.lora.dropout = 0.1f;
  ASSERT_TRUE(Train(*model, o).ok());
  o.out_dir = (dir.path() / "b").string();
  ASSERT_TRUE(Train(*model, o).ok());
  const std::string a = ReadFile(dir.path() / "a" / "adapter_model.safetensors");
  EXPECT_GT(a.size(), 1000u);
  EXPECT_EQ(a, ReadFile(dir.path() / "b" / "adapter_model.safetensors"));
  o.seed = 2;
  o.out_dir = (dir.path() / "c").string();
  ASSERT_TRUE(Train(*model, o).ok());
  EXPECT_NE(a, ReadFile(dir.path() / "c" / "adapter_model.safetensors"));
}

// A run checkpointed at step 3 and resumed ends bit-identical to the run
// that never stopped (optimizer state, data position and dropout masks all
// continue exactly).
TEST(TrainRun, ResumeEndsBitIdentical) {
  auto model = Embedded();
  ASSERT_TRUE(model);
  testing::TempDir dir("resume");
  TrainOptions o = Options("uppercase", Method::kDpo, dir.path() / "full");
  o.iters = 6;
  o.save_every = 3;
  o.lora.dropout = 0.1f;
  o.schedule = LrSchedule::kCosine;
  o.warmup = 2;
  ASSERT_TRUE(Train(*model, o).ok());
  // A second run whose only state is the step-3 checkpoint of the first.
  const fs::path part = dir.path() / "part";
  fs::create_directories(part / "checkpoints");
  fs::copy(dir.path() / "full" / "checkpoints" / "step-00000003",
           part / "checkpoints" / "step-00000003", fs::copy_options::recursive);
  std::ofstream(part / "checkpoints" / "latest") << "step-00000003\n";
  TrainOptions r = o;
  r.out_dir = part.string();
  r.resume_dir = part.string();
  r.save_every = 0;  // keep "latest" at step 3 for the truncation check below
  auto res = Train(*model, r);
  ASSERT_TRUE(res.ok()) << res.status().message();
  EXPECT_EQ(res->steps, 6);
  EXPECT_EQ(ReadFile(dir.path() / "full" / "adapter_model.safetensors"),
            ReadFile(part / "adapter_model.safetensors"));
  // A truncated checkpoint is refused with its path.
  const fs::path state = part / "checkpoints" / "step-00000003" / "state.safetensors";
  fs::resize_file(state, fs::file_size(state) / 2);
  auto bad = Train(*model, r);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("state.safetensors"), std::string::npos)
      << bad.status().message();
}

// Writes DIR/train.jsonl with the given lines.
fs::path DataWith(const fs::path& dir, const std::vector<std::string>& lines) {
  fs::create_directories(dir);
  std::ofstream f(dir / "train.jsonl");
  for (const auto& l : lines) f << l << "\n";
  return dir;
}

TEST(TrainRun, BadInputsGiveClearErrorsAndNoOutput) {
  auto model = Embedded();
  ASSERT_TRUE(model);
  testing::TempDir dir("bad");
  const fs::path out = dir.path() / "out";
  auto expect_error = [&](TrainOptions o, const std::string& needle) {
    o.out_dir = out.string();
    auto r = Train(*model, o);
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
    EXPECT_FALSE(fs::exists(out)) << needle;
  };
  TrainOptions o = Options("style", Method::kSft, out);
  o.data_dir =
      DataWith(dir.path() / "d1", {R"({"prompt": "a", "completion": "b"})", "{not json"}).string();
  expect_error(o, "train.jsonl:2: not valid JSON");
  o.data_dir = DataWith(dir.path() / "d2", {R"({"messages": [{"role": "user", "content": "hi"}]})"})
                   .string();
  expect_error(o, "train.jsonl:1: the last message must be the assistant turn");
  o.data_dir = DataDir("style");
  o.lora.rank = 0;
  expect_error(o, "--rank 0");
  o.lora.rank = 8;
  o.lora.num_layers = 99;
  expect_error(o, "--num-layers 99");
  o.lora.num_layers = 0;
  o.method = Method::kDpo;
  expect_error(o, "needs prompt/chosen/rejected rows");
  o.method = Method::kSft;
  o.data_dir = (dir.path() / "missing").string();
  expect_error(o, "not a directory");
  o.data_dir = DataDir("style");
  // Counts below their floor and non-finite numbers, before anything is
  // written (they once ran anyway, fell back silently, or failed steps later
  // as a "non-finite gradient").
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const auto with = [&](auto set) {
    TrainOptions b = o;
    set(b);
    return b;
  };
  expect_error(with([](TrainOptions& b) { b.iters = -3; }), "--iters -3");
  expect_error(with([](TrainOptions& b) { b.epochs = 0; }), "--epochs 0");
  expect_error(with([](TrainOptions& b) { b.warmup = -5; }), "--warmup -5");
  expect_error(with([](TrainOptions& b) { b.save_every = -1; }), "--save-every -1");
  expect_error(with([](TrainOptions& b) { b.steps_per_report = 0; }), "--steps-per-report 0");
  expect_error(with([](TrainOptions& b) { b.memory_budget_mb = -1; }), "--memory-budget -1");
  expect_error(with([&](TrainOptions& b) { b.grad_clip = -1; }), "--grad-clip -1");
  expect_error(with([&](TrainOptions& b) { b.weight_decay = nan; }), "--weight-decay nan");
  expect_error(with([&](TrainOptions& b) { b.lr = std::numeric_limits<double>::infinity(); }),
               "--lr inf");
  expect_error(with([&](TrainOptions& b) { b.beta1 = 1.0; }), "--betas 1 0.999");
  expect_error(with([&](TrainOptions& b) { b.lora.alpha = float(nan); }), "--alpha nan");
  expect_error(with([&](TrainOptions& b) { b.lora.scale = -1.0f; }), "--scale -1");
  // --skip-bad-rows counts and continues.
  o.data_dir = DataWith(dir.path() / "d3", {R"({"prompt": "One day", "completion": " Tom ran."})",
                                            "{not json", R"({"text": "x"})"})
                   .string();
  o.data.skip_bad_rows = true;
  o.iters = 1;
  o.out_dir = out.string();
  EXPECT_TRUE(Train(*model, o).ok());
  // An adapter for another base shape is refused with both shapes.
  testing::TempDir other("bad_other");
  auto tiny = testing::SynthModel(other, "tiny-llama");
  ASSERT_TRUE(tiny);
  auto a = engine::LoadAdapter(out.string(), tiny->config());
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("this base model needs"), std::string::npos)
      << a.status().message();
}

TEST(LoraLayout, TargetsAndLayers) {
  auto t = ParseTargets("q,v,down");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(TargetsString(*t), "q,v,down");
  EXPECT_FALSE(ParseTargets("q,w").ok());
  auto model = Embedded();
  ASSERT_TRUE(model);
  LoraConfig c;
  c.targets = *t;
  c.num_layers = 2;
  auto L = LoraLayout::Make(model->config(), c);
  ASSERT_TRUE(L.ok());
  EXPECT_EQ(L->slots.size(), 6u);
  EXPECT_EQ(L->first_layer, model->config().n_layers - 2);
  // B starts at zero: step 0 is the base model exactly.
  const LoraParams<float> p = InitLora(*L, 3);
  for (const auto& s : L->slots)
    for (int64_t i = 0; i < s.n * c.rank; ++i) ASSERT_EQ(p.w[s.b_off + i], 0.0f);
}

}  // namespace
}  // namespace lumen::train

namespace lumen::train {
namespace {

// Issue 15: the levers compose. Segmenting never changes a bit of the
// adapter; the fused head and prefix sharing stay within a bound of the
// plain paths after 6 optimizer steps (their per-step gradients agree to
// 1e-5; Adam's normalization keeps a few steps' drift at that scale relative
// to the update size); every combination, with gradient accumulation, runs.
std::vector<float> AdapterValues(const fs::path& dir) {
  auto model = Embedded();
  auto a = engine::LoadAdapter(dir.string(), model->config());
  EXPECT_TRUE(a.ok()) << a.status().message();
  std::vector<float> v;
  if (!a.ok()) return v;
  for (const auto& p : a->pairs) {
    v.insert(v.end(), p.a.begin(), p.a.end());
    v.insert(v.end(), p.b.begin(), p.b.end());
  }
  return v;
}

TEST(Levers, EveryCombinationTrainsAndMatchesThePlainPath) {
  auto model = Embedded();
  ASSERT_TRUE(model);
  testing::TempDir dir("levers");
  auto run = [&](bool fused, bool share, int segment, int accum, const std::string& name) {
    TrainOptions o = Options("uppercase", Method::kOrpo, dir.path() / name);
    o.iters = 6;
    o.fused_ce = fused;
    o.vocab_chunk = 100;
    o.prefix_share = share;
    o.segment = segment;
    o.grad_accum = accum;
    o.batch_size = 4 / accum;
    auto r = Train(*model, o);
    EXPECT_TRUE(r.ok()) << name << ": " << r.status().message();
    return AdapterValues(dir.path() / name);
  };
  const auto plain = run(false, false, 0, 1, "plain");
  ASSERT_FALSE(plain.empty());
  for (int fused : {0, 1})
    for (int share : {0, 1})
      for (int segment : {0, 2}) {
        const std::string name = fmt::format("f{}s{}g{}", fused, share, segment);
        const auto v = run(fused, share, segment, 1, name);
        if (segment) {
          EXPECT_EQ(v, run(fused, share, 0, 1, name + "ref")) << name;
        }
        EXPECT_LT(testing::RelativeL2(v, plain), 1e-3) << name;
        // Measured 3.1e-2 after 6 steps: each micro-batch normalizes by its own
        // token count, so accumulation is not the whole-batch mean (issue 18 note).
        EXPECT_LT(testing::RelativeL2(run(fused, share, segment, 2, name + "acc"), plain), 5e-2)
            << name << " with grad-accum 2";
      }
}

// All levers on (fused head, prefix sharing, segments of one layer) pass the
// efficacy bar of the training issue.
TEST(Levers, AllOnPassEfficacy) {
  auto model = Embedded();
  ASSERT_TRUE(model);
  testing::TempDir dir("levers_eff");
  TrainOptions o = Options("uppercase", Method::kSimpo, dir.path() / "out");
  o.segment = 1;
  auto r = Train(*model, o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_GE(r->last_eval.accuracy, 0.9);
}

}  // namespace
}  // namespace lumen::train

namespace lumen::train {
namespace {

// Issue 17: checkpoints carry the controller's state; a resumed adaptive run
// ends bit-identical (adapter and the controller's trajectory) to one that
// never stopped. A static schedule reproduces the fixed-lambda run exactly.
TEST(Controller, ResumeContinuesTheControllerBitIdentically) {
  auto model = Embedded();
  ASSERT_TRUE(model);
  testing::TempDir dir("ctl_resume");
  TrainOptions o = Options("uppercase", Method::kOrpo, dir.path() / "full");
  o.iters = 12;
  o.save_every = 6;
  o.control_every = 1;
  o.control_probe = 8;
  o.controller.kind = ControllerKind::kAimd;
  o.controller.warmup_readings = 3;
  o.controller.hysteresis = 1;
  ASSERT_TRUE(Train(*model, o).ok());
  const fs::path part = dir.path() / "part";
  fs::create_directories(part / "checkpoints");
  fs::copy(dir.path() / "full" / "checkpoints" / "step-00000006",
           part / "checkpoints" / "step-00000006", fs::copy_options::recursive);
  std::ofstream(part / "checkpoints" / "latest") << "step-00000006\n";
  TrainOptions r = o;
  r.out_dir = part.string();
  r.resume_dir = part.string();
  r.save_every = 0;
  ASSERT_TRUE(Train(*model, r).ok());
  EXPECT_EQ(ReadFile(dir.path() / "full" / "adapter_model.safetensors"),
            ReadFile(part / "adapter_model.safetensors"));
  // The lambda reported at the last step agrees too.
  auto last_lambda = [](const fs::path& metrics) {
    std::ifstream f(metrics);
    std::string line;
    double v = -1;
    while (std::getline(f, line)) {
      auto j = nlohmann::json::parse(line);
      if (j["kind"] == "train") v = j["lambda"].get<double>();
    }
    return v;
  };
  EXPECT_EQ(last_lambda(dir.path() / "full" / "metrics.jsonl"),
            last_lambda(part / "metrics.jsonl"));
  EXPECT_GT(last_lambda(part / "metrics.jsonl"), o.controller.min);  // it moved

  TrainOptions s = Options("uppercase", Method::kOrpo, dir.path() / "static");
  s.iters = 4;
  ASSERT_TRUE(Train(*model, s).ok());
  s.out_dir = (dir.path() / "static2").string();
  s.controller.kind = ControllerKind::kStatic;  // explicit static: the same run
  ASSERT_TRUE(Train(*model, s).ok());
  EXPECT_EQ(ReadFile(dir.path() / "static" / "adapter_model.safetensors"),
            ReadFile(dir.path() / "static2" / "adapter_model.safetensors"));
}

}  // namespace
}  // namespace lumen::train
