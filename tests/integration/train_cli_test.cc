// `lumen train` and the verbs around it, end to end through the binary on the
// embedded stories260K: a trained adapter changes generations through
// --adapter and through `lumen merge`; --inspect; SIGINT writes a checkpoint
// and exits 0; kill -9 between saves loses at most one interval and --resume
// finishes the run.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "lumen/kernels/matmul_bf16.h"
#include "lumen/kernels/matmul_bf16_amx.h"
#include "lumen_cli.h"

namespace lumen {
namespace {

namespace fs = std::filesystem;

using CliResult = testing::CliRun;

fs::path Tmp() {
  static const fs::path dir = testing::TempDir("train_cli");
  return dir;
}

std::string Slurp(const fs::path& p) { return testing::SlurpFile(p.string()); }

CliResult Lumen(const std::string& args) { return testing::RunLumen(args); }

std::string Src(const std::string& rel) { return std::string(LUMEN_SOURCE_DIR) + "/" + rel; }

// Starts `lumen args` in the background; returns its pid.
pid_t Spawn(const std::string& args) {
  const std::string cmd = "exec " + std::string(LUMEN_BINARY) + " " + args + " 2>/dev/null";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}

bool WaitFor(const fs::path& p, int seconds) {
  for (int i = 0; i < seconds * 20; ++i) {
    if (fs::exists(p)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

int LatestStep(const fs::path& out) {
  std::string name = Slurp(out / "checkpoints" / "latest");
  return name.size() > 5 ? std::stoi(name.substr(5)) : -1;
}

const char kTomPrompt[] = "\"Once upon a time, there was a brave boy named\"";

TEST(TrainCli, AdapterChangesGenerationsThroughGenerateAndMerge) {
  const fs::path out = Tmp() / "sft";
  CliResult r = Lumen("train --data " + Src("tests/data/train/style") + " --method sft --out " +
                      out.string() + " --iters 30 --lr 3e-3 --batch-size 4 -t 2");
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* f :
       {"adapter_model.safetensors", "adapter_config.json", "config.json", "metrics.jsonl"})
    EXPECT_TRUE(fs::exists(out / f)) << f;
  auto cfg = nlohmann::json::parse(Slurp(out / "adapter_config.json"));
  EXPECT_EQ(cfg["r"], 8);
  EXPECT_EQ(cfg["peft_type"], "LORA");
  std::ifstream metrics(out / "metrics.jsonl");
  std::string line;
  int train_lines = 0, eval_lines = 0;
  while (std::getline(metrics, line)) {
    auto j = nlohmann::json::parse(line);
    ASSERT_TRUE(j.contains("l_w") && j.contains("l_r") && j.contains("loss")) << line;
    train_lines += j["kind"] == "train";
    eval_lines += j["kind"] == "eval";
  }
  EXPECT_EQ(train_lines, 3);
  EXPECT_EQ(eval_lines, 2);

  CliResult base = Lumen(std::string("generate ") + kTomPrompt + " -n 3 --temp 0 --no-echo");
  CliResult tuned = Lumen(std::string("generate ") + kTomPrompt +
                          " -n 3 --temp 0 --no-echo --adapter " + out.string());
  ASSERT_EQ(tuned.code, 0) << tuned.err;
  EXPECT_EQ(base.out.find("Tom"), std::string::npos) << base.out;
  EXPECT_NE(tuned.out.find("Tom"), std::string::npos) << tuned.out;

  const fs::path merged = Tmp() / "merged.gguf";
  r = Lumen("merge " + Src("models/stories260K.gguf") + " " + out.string() + " " + merged.string());
  ASSERT_EQ(r.code, 0) << r.err;
  CliResult m =
      Lumen("generate " + merged.string() + " " + kTomPrompt + " -n 12 --temp 0 --no-echo");
  CliResult a = Lumen(std::string("generate ") + kTomPrompt +
                      " -n 12 --temp 0 --no-echo --adapter " + out.string());
  ASSERT_EQ(m.code, 0) << m.err;
  EXPECT_EQ(m.out, a.out);

  r = Lumen("generate " + std::string(kTomPrompt) + " --adapter " + (Tmp() / "nope").string());
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("not a directory"), std::string::npos) << r.err;
}

// Phi3 stores q/k/v and gate/up as fused matrices: LoRA trains one pair per
// slice, applies to slices of the fused products, and merges into the right
// rows of the fused tensors.
TEST(TrainCli, FusedPhi3AdapterAppliesAndMerges) {
  const fs::path model = Tmp() / "p3.gguf";
  ASSERT_EQ(Lumen("synth tiny-phi3 -o " + model.string()).code, 0);
  const fs::path data = Tmp() / "p3data";
  fs::create_directories(data);
  std::ofstream(data / "train.jsonl") << R"({"text": "hello world this is a row"})"
                                      << "\n"
                                      << R"({"text": "another row of text"})"
                                      << "\n";
  const fs::path out = Tmp() / "p3adapter";
  CliResult r = Lumen("train " + model.string() + " --data " + data.string() + " --out " +
                      out.string() + " --iters 3 --lr 1e-2 --rank 2 -q");
  ASSERT_EQ(r.code, 0) << r.err;
  const fs::path merged = Tmp() / "p3m.gguf";
  ASSERT_EQ(Lumen("merge " + model.string() + " " + out.string() + " " + merged.string()).code, 0);
  const std::string gen = " hello -n 8 --temp 0 --no-echo";
  CliResult base = Lumen("generate " + model.string() + gen);
  CliResult unmerged = Lumen("generate " + model.string() + gen + " --adapter " + out.string());
  CliResult folded = Lumen("generate " + merged.string() + gen);
  ASSERT_EQ(unmerged.code, 0) << unmerged.err;
  EXPECT_NE(base.out, unmerged.out);
  EXPECT_EQ(unmerged.out, folded.out);
}

// Issue 15: `--plan` predicts the peak resident memory of a run within 15%
// of what the run measures (VmHWM, metrics.jsonl's peak_rss_mb), and
// --memory-budget picks a segment length whose run fits the budget.
double PredictedMb(const std::string& out) {
  const auto at = out.find("predicted peak");
  if (at == std::string::npos) return -1;
  return std::stod(out.substr(out.find_first_of("0123456789", at)));
}
double MeasuredMb(const fs::path& run) {
  std::ifstream f(run / "metrics.jsonl");
  std::string line;
  double v = -1;
  while (std::getline(f, line)) {
    auto j = nlohmann::json::parse(line);
    if (j["kind"] == "train") v = j["peak_rss_mb"].get<double>();
  }
  return v;
}

TEST(TrainCli, PlanPredictsThePeakAndTheBudgetChoosesSegments) {
  const fs::path model = Tmp() / "plan.gguf";
  ASSERT_EQ(Lumen("synth tiny-llama --dim 256 --ffn 1024 --layers 4 --vocab 2048 --heads 4 "
                  "--kv-heads 2 -o " +
                  model.string())
                .code,
            0);
  const fs::path data = Tmp() / "plandata";
  fs::create_directories(data);
  {
    std::ofstream f(data / "train.jsonl");
    const char* words[] = {"the", "little", "girl", "dog", "ran", "happy", "big", "park", "sun"};
    for (int r = 0; r < 4; ++r) {
      std::string text;
      for (int i = 0; i < 700; ++i) text += std::string(i ? " " : "") + words[(i * 7 + r) % 9];
      f << nlohmann::json({{"text", text}}).dump() << "\n";
    }
  }
  const std::string common = "train " + model.string() + " --data " + data.string() +
                             " --method sft --batch-size 2 --max-seq-len 600 -t 2";
  std::vector<std::string> levers = {"--no-fused-ce", "--segment 1", "--mlp-chunk 64"};
  // --compute bf16 changes the backward's transients (memory_plan.cc).
  if (kernels::CpuHasBf16()) levers.push_back("--compute bf16 --segment 1");
  for (const std::string& flags : levers) {
    CliResult plan = Lumen(common + " --plan " + flags);
    ASSERT_EQ(plan.code, 0) << plan.err;
    const double predicted = PredictedMb(plan.out);
    ASSERT_GT(predicted, 50) << plan.out;
    const fs::path out = Tmp() / ("plan_run" + std::to_string(flags.size()));
    CliResult run = Lumen(common + " --iters 1 -q --out " + out.string() + " " + flags);
    ASSERT_EQ(run.code, 0) << run.err;
    const double measured = MeasuredMb(out);
    EXPECT_NEAR(predicted, measured, 0.15 * measured) << flags << "\n" << plan.out;
  }
  // A budget between the segmented and the unsegmented plan: a segment is
  // chosen and the run stays within the budget (and its 15% tolerance).
  const fs::path out = Tmp() / "plan_budget";
  CliResult run = Lumen(common + " --iters 1 -q --memory-budget 110 --out " + out.string());
  ASSERT_EQ(run.code, 0) << run.err;
  auto cfg = nlohmann::json::parse(Slurp(out / "config.json"));
  EXPECT_GT(cfg["segment"].get<int>(), 0);
  EXPECT_LT(MeasuredMb(out), 110 * 1.15);
  CliResult tiny =
      Lumen(common + " --iters 1 -q --memory-budget 20 --out " + (Tmp() / "plan_tiny").string());
  EXPECT_NE(tiny.code, 0);
  EXPECT_NE(tiny.err.find("--memory-budget 20 MB: the smallest plan needs"), std::string::npos)
      << tiny.err;
  EXPECT_FALSE(fs::exists(Tmp() / "plan_tiny"));
}

// --compute: a bad value, a conflict with --exact, and (without AVX512-BF16)
// the refusal are clear errors that leave no output; with the instructions,
// a bf16 run with --probe-ranges trains and reports the operand ranges.
// bench train runs every method: SFT on prompt + chosen rows, the preference
// methods on pairs; every configuration finishes a step (no error rows).
TEST(TrainCli, BenchTrainRunsSftAndPreferenceMethods) {
  const fs::path model = Tmp() / "bench.gguf";
  ASSERT_EQ(Lumen("synth tiny-llama -o " + model.string()).code, 0);
  for (const char* method : {"sft", "orpo", "dpo"}) {
    SCOPED_TRACE(method);
    const auto r = Lumen("bench train " + model.string() + " --seq 16 --method " + method +
                         " --configs plain --configs all -t 1");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out.find("error"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("| 16 | plain |"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("| 16 | all |"), std::string::npos) << r.out;
  }
}

// bench train --compute auto resolves as lumen train's default does and names
// the result; the products' rate is reported against the peak of the
// instructions they ran on (the AMX tiles where bf16 runs on them).
TEST(TrainCli, BenchTrainComputeAutoNamesTheResolvedRoute) {
  const fs::path model = Tmp() / "bench_auto.gguf";
  ASSERT_EQ(Lumen("synth tiny-llama -o " + model.string()).code, 0);
  const auto r = Lumen("bench train " + model.string() +
                       " --seq 16 --method sft --configs plain -t 1 "
                       "--compute auto");
  ASSERT_EQ(r.code, 0) << r.err;
  const bool amx = kernels::AmxBf16Usable();
  EXPECT_NE(r.out.find(amx ? "--compute auto = bf16" : "--compute auto = f32"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find(amx ? "AMX-BF16 tdpbf16ps peak" : "f32 FMA peak"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("| products GFLOP/s | products of peak |"), std::string::npos) << r.out;
  const auto bad = Lumen("bench train " + model.string() + " --seq 16 --compute fp16");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("--compute"), std::string::npos) << bad.err;
}

TEST(TrainCli, ComputeFlagErrorsAndRangeProbeReport) {
  const std::string common =
      "train --data " + Src("tests/data/train/uppercase") + " --method orpo --iters 2 -t 2 --out ";
  CliResult bad = Lumen(common + (Tmp() / "cmp_bad").string() + " --compute fp16");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("--compute"), std::string::npos) << bad.err;
  CliResult exact = Lumen(common + (Tmp() / "cmp_exact").string() + " --compute bf16 --exact");
  EXPECT_NE(exact.code, 0);
  EXPECT_NE(exact.err.find("cannot be combined with --exact"), std::string::npos) << exact.err;
  EXPECT_FALSE(fs::exists(Tmp() / "cmp_exact"));
  const fs::path out = Tmp() / "cmp_bf16";
  CliResult run = Lumen(common + out.string() + " --compute bf16 --probe-ranges");
  if (!kernels::CpuHasBf16()) {
    EXPECT_NE(run.code, 0);
    EXPECT_NE(run.err.find("AVX512-BF16"), std::string::npos) << run.err;
    EXPECT_FALSE(fs::exists(out));
    return;
  }
  ASSERT_EQ(run.code, 0) << run.err;
  EXPECT_NE(run.err.find("operand ranges per product"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("head.coeff"), std::string::npos) << run.err;
  EXPECT_EQ(nlohmann::json::parse(Slurp(out / "config.json"))["compute"], "bf16");
  // The default, --compute auto: bf16 where the AMX tiles run it, else f32.
  const fs::path dflt = Tmp() / "cmp_auto";
  CliResult automatic = Lumen(common + dflt.string());
  ASSERT_EQ(automatic.code, 0) << automatic.err;
  EXPECT_EQ(nlohmann::json::parse(Slurp(dflt / "config.json"))["compute"],
            kernels::AmxBf16Usable() ? "bf16" : "f32");
}

// --ce-skip-eps: a negative value is refused before anything is written; a
// positive one trains, warning that it keeps the recomputing head backward
// (slower than the default one-pass head).
TEST(TrainCli, CeSkipEpsRefusesNegativeAndWarnsItIsSlower) {
  const std::string common =
      "train --data " + Src("tests/data/train/uppercase") + " --method orpo --iters 1 -t 2 --out ";
  const fs::path bad_out = Tmp() / "skip_bad";
  CliResult bad = Lumen(common + bad_out.string() + " --ce-skip-eps -1");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("--ce-skip-eps -1: must be 0 (off) or a positive finite number"),
            std::string::npos)
      << bad.err;
  EXPECT_FALSE(fs::exists(bad_out));
  CliResult run = Lumen(common + (Tmp() / "skip_on").string() + " --ce-skip-eps 1e-8");
  ASSERT_EQ(run.code, 0) << run.err;
  EXPECT_NE(run.err.find("slower than the default one-pass head"), std::string::npos) << run.err;
}

TEST(TrainCli, InspectReportsKindAndLengths) {
  CliResult r = Lumen("train --inspect " + Src("tests/data/train/uppercase") + " --max-seq-len 20");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("train.jsonl: 200 rows, kind preference"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("valid.jsonl: 40 rows"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("longer than --max-seq-len 20"), std::string::npos) << r.out;
}

TEST(TrainCli, SigintCheckpointsAndResumeFinishes) {
  const fs::path out = Tmp() / "sigint";
  const std::string args = "train --data " + Src("tests/data/train/uppercase") +
                           " --method orpo --iters 100000 --lr 1e-3 -t 1 -q --out " + out.string();
  const pid_t pid = Spawn(args);
  ASSERT_TRUE(WaitFor(out / "metrics.jsonl", 30));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ::kill(pid, SIGINT);
  int st = 0;
  ::waitpid(pid, &st, 0);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 0);
  const int step = LatestStep(out);
  ASSERT_GT(step, 0);
  CliResult r = Lumen("train --data " + Src("tests/data/train/uppercase") +
                      " --method orpo --lr 1e-3 -t 1 -q --iters " + std::to_string(step + 2) +
                      " --out " + out.string() + " --resume " + out.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("trained " + std::to_string(step + 2) + " steps"), std::string::npos)
      << r.err;
}

TEST(TrainCli, KillNineLosesAtMostOneInterval) {
  const fs::path out = Tmp() / "kill9";
  const std::string common = "train --data " + Src("tests/data/train/uppercase") +
                             " --method simpo --lr 1e-3 -t 1 -q --save-every 4 "
                             "--steps-per-report 1 --out " +
                             out.string();
  const pid_t pid = Spawn(common + " --iters 100000");
  ASSERT_TRUE(WaitFor(out / "checkpoints" / "latest", 60));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  // The last reported step before the kill, and the checkpoint that survived.
  std::ifstream metrics(out / "metrics.jsonl");
  std::string line;
  int reported = 0;
  while (std::getline(metrics, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j["kind"] == "train") reported = j["step"].get<int>();
  }
  // `latest` names a whole checkpoint even when the kill landed mid-save
  // (which leaves a .tmp-step-* directory or latest.tmp.<pid> behind).
  const int step = LatestStep(out);
  ASSERT_GT(step, 0);
  EXPECT_GE(step, reported - 4);
  EXPECT_TRUE(
      fs::exists(out / "checkpoints" / fmt::format("step-{:08d}", step) / "state.safetensors"));
  // Four more steps: the resumed run saves once (--save-every 4), which
  // clears what the killed one left.
  CliResult r =
      Lumen(common + " --iters " + std::to_string(step + 4) + " --resume " + out.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("trained " + std::to_string(step + 4) + " steps"), std::string::npos)
      << r.err;
  for (const auto& e : fs::directory_iterator(out / "checkpoints"))  // the resumed run cleaned up
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
}

}  // namespace
}  // namespace lumen
