#include "lumen/train/bench_train.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "lumen/core/thread_pool.h"
#include "lumen/engine/synth.h"
#include "lumen/kernels/roofline.h"
#include "lumen/train/memory_plan.h"
#include "lumen/train/step_profile.h"
#include "lumen/train/trainer.h"

namespace lumen::train {

namespace {
namespace fs = std::filesystem;

struct Row {
  double step_s = 0, peak_mb = 0, predicted_mb = 0;
  StepProfile prof;  // summed over the measured steps
  std::string error;
};

// Runs fn in a forked child and returns the JSON object it produced, or
// {"error": ...}. Each configuration and the synth model run this way, so a
// configuration's peak RSS (VmHWM) holds only what it allocated: a forked
// child starts with its parent's resident pages, and the synth model's
// writer leaves tens of MB of heap behind in the process that ran it.
nlohmann::json InChild(const std::function<void(nlohmann::json&)>& fn) {
  int fds[2];
  if (::pipe(fds) != 0) return {{"error", "pipe failed"}};
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return {{"error", "fork failed"}};
  }
  if (pid == 0) {
    ::close(fds[0]);
    nlohmann::json out = nlohmann::json::object();
    fn(out);
    const std::string text = out.dump();
    for (size_t done = 0; done < text.size();) {
      const ssize_t n = ::write(fds[1], text.data() + done, text.size() - done);
      if (n <= 0) break;
      done += size_t(n);
    }
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string text;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0) text.append(buf, size_t(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return {{"error", fmt::format("child exited with status {}", status)}};
  return j;
}

// One configuration in a child process: its peak RSS is its own.
Row RunChild(const std::string& model_path, const TrainBenchOptions& o, int64_t seq,
             const std::string& config, const fs::path& tmp) {
  const nlohmann::json j = InChild([&](nlohmann::json& out) {
    auto run = [&]() -> Status {
      engine::LoadOptions lo;
      lo.threads = o.threads;
      LUMEN_ASSIGN_OR_RETURN(auto model, engine::Model::Load(model_path, lo));
      const int V = model->config().vocab_size;
      TrainOptions t;
      LUMEN_ASSIGN_OR_RETURN(t.method, ParseMethod(o.method));
      // Preference methods: prompt, chosen, rejected; sft: prompt + chosen
      // (the same tokens, the rejected response dropped).
      const bool pref = IsPreference(t.method);
      Dataset d;
      d.kind = pref ? RowKind::kPreference : RowKind::kPromptCompletion;
      d.path = "(bench)";
      const int64_t half = seq / 2;
      for (int r = 0; r < 4; ++r) {
        Example e;
        for (int64_t i = 0; i < half; ++i) e.prompt.push_back(int32_t((r * 7919 + i * 31) % V));
        for (int64_t i = 0; i < seq - half; ++i) {
          e.chosen.push_back(int32_t((r * 104729 + i * 17 + 3) % V));
          if (pref) e.rejected.push_back(int32_t((r * 1299709 + i * 13 + 5) % V));
        }
        d.rows.push_back(std::move(e));
      }
      t.preloaded = &d;
      t.out_dir = (tmp / fmt::format("{}-{}", config, seq)).string();
      t.iters = o.steps;
      t.quiet = true;
      t.lr = 1e-4;
      t.steps_per_report = 1000000;
      const bool all = config == "all";
      t.fused_ce = all || config == "fused-ce";
      t.prefix_share = all || config == "prefix-share";
      t.segment = all || config == "segment" ? 1 : 0;
      t.mlp_chunk = all || config == "mlp-chunk" ? 256 : 0;
      t.plan_only = o.plan_only;
      t.compute = ParseCompute(o.compute).value_or(Compute::kF32);
      LUMEN_ASSIGN_OR_RETURN(auto res, Train(*model, t));
      double total = 0;
      for (double s : res.step_seconds) total += s;
      out["step_s"] = total / double(std::max<size_t>(1, res.step_seconds.size()));
      out["predicted_mb"] = res.predicted_peak_mb;
      const StepProfile& p = res.profile;
      out["profile"] = {p.total_s,       p.head_s,       p.attention_s, p.products_s,
                        p.norms_s,       p.optimizer_s,  p.head_flops,  p.attention_flops,
                        p.product_flops, double(p.steps)};
      return Status::Ok();
    };
    Status s = run();
    if (!s.ok()) out["error"] = s.message();
    out["peak_mb"] = PeakRssMb();
  });
  Row row;
  row.step_s = j.value("step_s", 0.0);
  row.peak_mb = j.value("peak_mb", 0.0);
  row.predicted_mb = j.value("predicted_mb", 0.0);
  row.error = j.value("error", "");
  if (j.contains("profile") && j["profile"].is_array() && j["profile"].size() == 10) {
    const auto& p = j["profile"];
    StepProfile& q = row.prof;
    q.total_s = p[0];
    q.head_s = p[1];
    q.attention_s = p[2];
    q.products_s = p[3];
    q.norms_s = p[4];
    q.optimizer_s = p[5];
    q.head_flops = p[6];
    q.attention_flops = p[7];
    q.product_flops = p[8];
    q.steps = int64_t(double(p[9]));
  }
  return row;
}
}  // namespace

Result<std::string> RunTrainBench(const TrainBenchOptions& given) {
  const std::optional<Compute> compute =
      given.compute == "auto" ? AutoCompute(false) : ParseCompute(given.compute);
  if (!compute) return Errorf("--compute: '{}' is not auto, f32 or bf16", given.compute);
  LUMEN_RETURN_IF_ERROR(ValidateCompute(*compute));
  TrainBenchOptions o = given;  // the children get the resolved precision
  o.compute = std::string(ComputeName(*compute));
  const bool bf16 = *compute == Compute::kBf16;
  const fs::path tmp = fs::temp_directory_path() / fmt::format("lumen_bench_train_{}", ::getpid());
  fs::create_directories(tmp);
  std::string model = o.model;
  if (model.empty()) {
    engine::SynthOptions so;
    so.name = "llama-3.2-1b";
    so.layers = o.layers;
    so.out = (tmp / "model.gguf").string();
    const nlohmann::json j = InChild([&](nlohmann::json& out) {
      const Status s = engine::Synthesize(so);
      if (!s.ok()) out["error"] = s.message();
    });
    if (j.contains("error")) {
      std::error_code ec;
      fs::remove_all(tmp, ec);  // leaves nothing behind
      return Errorf("synth model: {}", j.value("error", ""));
    }
    model = so.out;
  }
  std::string table = fmt::format(
      "{} on {} ({}, --compute {}), {}, each configuration in its own process\n\n"
      "| seq | configuration | step s | peak RSS MB | plan MB | step vs plain | peak vs plain |\n"
      "|---|---|---|---|---|---|---|\n",
      o.method, o.model.empty() ? fmt::format("synth llama-3.2-1b, {} layers", o.layers) : o.model,
      "f16 weights",
      given.compute == o.compute ? o.compute : fmt::format("{} = {}", given.compute, o.compute),
      o.plan_only ? std::string("memory plan only (no step run)")
                  : fmt::format("{} measured step(s) per row", o.steps));
  // The peak of the instructions the products run on, for the threads the
  // steps run on (one core's measured loop, as `lumen bench` reports it,
  // times the thread count): f32 FMA; bf16: the AMX tiles' tdpbf16ps where
  // they are usable, else AVX512-BF16 vdpbf16ps (named beside it anyway).
  const int threads = o.threads > 0 ? o.threads : ThreadPool::DefaultThreads();
  double peak = 0, dot_peak = 0;
  std::string peak_name = bf16 ? "AMX-BF16 tdpbf16ps" : "f32 FMA";
  if (!o.plan_only) {
    if (bf16) {
      dot_peak = kernels::MeasureBf16DotFlops(0.5) * threads;
      peak = kernels::MeasureAmxBf16Flops(0.5) * threads;
      if (peak <= 0) peak = dot_peak, peak_name = "AVX512-BF16 vdpbf16ps";
    } else {
      peak = kernels::MeasureFmaFlops(0.5) * threads;
    }
  }
  std::string shares = fmt::format(
      "\nShare of the step time per phase (train/step_profile.h) and useful training FLOP/s, "
      "of the whole step and of the products phase alone, against the measured {} peak "
      "({:.1f} GFLOP/s on {} threads, {}{})\n\n"
      "| seq | configuration | head | attention | products | norms | optimizer | other | "
      "GFLOP/s | of peak | products GFLOP/s | products of peak |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|\n",
      peak_name, peak / 1e9, threads, kernels::KernelTargetName(),
      dot_peak > 0 && dot_peak != peak
          ? fmt::format("; AVX512-BF16 vdpbf16ps: {:.1f} GFLOP/s", dot_peak / 1e9)
          : "");
  for (int64_t seq : o.seqs) {
    Row plain;
    for (const std::string& config : o.configs) {
      const Row r = RunChild(model, o, seq, config, tmp);
      if (config == "plain") plain = r;
      if (!r.error.empty()) {
        table += fmt::format("| {} | {} | error: {} | | | | |\n", seq, config, r.error);
        continue;
      }
      if (o.plan_only) {
        const bool ratio = plain.predicted_mb > 0 && plain.error.empty();
        table += fmt::format(
            "| {} | {} | - | - | {:.0f} | - | {} (plan) |\n", seq, config, r.predicted_mb,
            ratio ? fmt::format("{:.2f}x", r.predicted_mb / plain.predicted_mb) : "-");
        continue;
      }
      const StepProfile& p = r.prof;
      if (p.total_s > 0) {
        auto pct = [&](double x) { return fmt::format("{:.1f}%", 100.0 * x / p.total_s); };
        const double other =
            p.total_s - p.head_s - p.attention_s - p.products_s - p.norms_s - p.optimizer_s;
        const double flops = (p.head_flops + p.attention_flops + p.product_flops) / p.total_s;
        const double products = p.products_s > 0 ? p.product_flops / p.products_s : 0.0;
        auto of_peak = [&](double x) { return peak > 0 ? 100.0 * x / peak : 0.0; };
        shares += fmt::format(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {:.1f} | {:.0f}% | {:.1f} | {:.0f}% |\n",
            seq, config, pct(p.head_s), pct(p.attention_s), pct(p.products_s), pct(p.norms_s),
            pct(p.optimizer_s), pct(other), flops / 1e9, of_peak(flops), products / 1e9,
            of_peak(products));
      }
      const bool ratio = plain.step_s > 0 && plain.error.empty();
      table += fmt::format("| {} | {} | {:.2f} | {:.0f} | {:.0f} | {} | {} |\n", seq, config,
                           r.step_s, r.peak_mb, r.predicted_mb,
                           ratio ? fmt::format("{:.2f}x", r.step_s / plain.step_s) : "-",
                           ratio ? fmt::format("{:.2f}x", r.peak_mb / plain.peak_mb) : "-");
      fmt::print(stderr, "seq {} {}: {:.2f} s, {:.0f} MB\n", seq, config, r.step_s, r.peak_mb);
    }
  }
  std::error_code ec;
  fs::remove_all(tmp, ec);
  return o.plan_only ? table : table + shares;
}

}  // namespace lumen::train
