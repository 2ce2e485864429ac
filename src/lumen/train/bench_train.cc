#include "lumen/train/bench_train.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "lumen/engine/synth.h"
#include "lumen/train/memory_plan.h"
#include "lumen/train/trainer.h"

namespace lumen::train {

namespace {
namespace fs = std::filesystem;

struct Row {
  double step_s = 0, peak_mb = 0, predicted_mb = 0;
  std::string error;
};

// One configuration in a child process: its peak RSS is its own.
Row RunChild(const std::string& model_path, const TrainBenchOptions& o, int64_t seq,
             const std::string& config, const fs::path& tmp) {
  int fds[2];
  if (::pipe(fds) != 0) return {0, 0, 0, "pipe failed"};
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    nlohmann::json out;
    auto run = [&]() -> Status {
      engine::LoadOptions lo;
      lo.threads = o.threads;
      LUMEN_ASSIGN_OR_RETURN(auto model, engine::Model::Load(model_path, lo));
      const int V = model->config().vocab_size;
      Dataset d;
      d.kind = RowKind::kPreference;
      d.path = "(bench)";
      const int64_t half = seq / 2;
      for (int r = 0; r < 4; ++r) {
        Example e;
        for (int64_t i = 0; i < half; ++i) e.prompt.push_back(int32_t((r * 7919 + i * 31) % V));
        for (int64_t i = 0; i < seq - half; ++i) {
          e.chosen.push_back(int32_t((r * 104729 + i * 17 + 3) % V));
          e.rejected.push_back(int32_t((r * 1299709 + i * 13 + 5) % V));
        }
        d.rows.push_back(std::move(e));
      }
      TrainOptions t;
      LUMEN_ASSIGN_OR_RETURN(t.method, ParseMethod(o.method));
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
      LUMEN_ASSIGN_OR_RETURN(auto res, Train(*model, t));
      double total = 0;
      for (double s : res.step_seconds) total += s;
      out["step_s"] = total / double(std::max<size_t>(1, res.step_seconds.size()));
      out["predicted_mb"] = res.predicted_peak_mb;
      return Status::Ok();
    };
    Status s = run();
    if (!s.ok()) out["error"] = s.message();
    out["peak_mb"] = PeakRssMb();
    const std::string text = out.dump();
    const ssize_t n = ::write(fds[1], text.data(), text.size());
    (void)n;
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
  Row row;
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    row.error = fmt::format("child exited with status {}", status);
    return row;
  }
  row.step_s = j.value("step_s", 0.0);
  row.peak_mb = j.value("peak_mb", 0.0);
  row.predicted_mb = j.value("predicted_mb", 0.0);
  row.error = j.value("error", "");
  return row;
}
}  // namespace

Result<std::string> RunTrainBench(const TrainBenchOptions& o) {
  const fs::path tmp = fs::temp_directory_path() / fmt::format("lumen_bench_train_{}", ::getpid());
  fs::create_directories(tmp);
  std::string model = o.model;
  if (model.empty()) {
    engine::SynthOptions so;
    so.name = "llama-3.2-1b";
    so.layers = o.layers;
    so.out = (tmp / "model.gguf").string();
    LUMEN_RETURN_IF_ERROR(engine::Synthesize(so));
    model = so.out;
  }
  std::string table = fmt::format(
      "{} on {} ({}), {}, each configuration in its own process\n\n"
      "| seq | configuration | step s | peak RSS MB | plan MB | step vs plain | peak vs plain |\n"
      "|---|---|---|---|---|---|---|\n",
      o.method, o.model.empty() ? fmt::format("synth llama-3.2-1b, {} layers", o.layers) : o.model,
      "f16 weights",
      o.plan_only ? std::string("memory plan only (no step run)")
                  : fmt::format("{} measured step(s) per row", o.steps));
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
  return table;
}

}  // namespace lumen::train
