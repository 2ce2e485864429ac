// lumen fit [MODEL] [--ctx N] [--parallel P] [--memory-budget GB] [--kv-type T]
// [--remeasure | --membw GBS] [--json]: the memory a configuration needs, whether it
// fits, the largest context that does, and the decode speed the measured
// bandwidth predicts (engine/fit.h holds the arithmetic; this file prints).
#include <fmt/format.h>

#include "lumen/cli/common.h"
#include "lumen/cli/verbs.h"
#include "lumen/engine/default_model.h"
#include "lumen/engine/fit.h"

namespace lumen::cli {
namespace {

struct FitArgs {
  ModelArgs model;
  int parallel = 1;
  double budget_gb = 0;
  double membw_gbs = 0;
  bool remeasure = false;
  bool no_speed = false;
  bool json = false;
};

std::string Bytes(double b) {
  const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (b >= 1024 && i < 4) {
    b /= 1024;
    ++i;
  }
  return fmt::format("{:.2f} {}", b, unit[i]);
}

void Run(const FitArgs& a) {
  auto so = SessionOptionsFrom(a.model);
  if (!so.ok()) return ReportError(so.status());
  auto m = LoadModel(a.model);
  if (!m.ok()) return ReportError(m.status());
  engine::FitOptions o{.ctx = a.model.ctx,
                       .parallel = a.parallel,
                       .kv_dtype = so->kv_dtype,
                       .budget_bytes = uint64_t(a.budget_gb * 1e9)};
  std::string bw_source;
  if (a.membw_gbs > 0) {
    o.bandwidth = a.membw_gbs * 1e9;
    bw_source = "given by --membw";
  } else if (!a.no_speed) {
    auto bw = engine::MachineBandwidth(a.model.threads, a.remeasure, &bw_source);
    if (!bw.ok()) return ReportError(bw.status());
    o.bandwidth = *bw;
  }
  auto r = engine::Fit(**m, o);
  if (!r.ok()) return ReportError(r.status());
  if (!r->fits) SetExitCode(2);
  if (a.json) {
    fmt::print("{}\n", engine::FitReportJson(*r).dump(2));
    return;
  }
  const auto& c = (*m)->config();
  fmt::print("model: {}\n", a.model.model.empty() ? engine::kDefaultModelName : a.model.model);
  fmt::print("context {} of {}, {} parallel sequence(s), KV type {}\n", r->ctx, c.max_ctx,
             r->parallel, Name(r->kv_dtype));
  fmt::print("weights: {} bytes ({}); read per decoded token {} bytes\n", r->weight_bytes,
             Bytes(double(r->weight_bytes)), r->weight_bytes_per_token);
  fmt::print("KV per token: {} bytes", r->kv_bytes_per_token);
  if (c.sliding_window > 0)
    fmt::print(" (global layers; sliding layers saturate at window {} + {})", c.sliding_window,
               model::kMaxChunk);
  fmt::print("\n");
  fmt::print("KV per sequence: {} bytes ({})\n", r->kv_bytes_per_seq,
             Bytes(double(r->kv_bytes_per_seq)));
  fmt::print("transient per sequence: {} bytes ({})\n", r->transient_bytes_per_seq,
             Bytes(double(r->transient_bytes_per_seq)));
  fmt::print("total: {} bytes ({})\n", r->total_bytes, Bytes(double(r->total_bytes)));
  fmt::print("budget: {} bytes ({}){}\n", r->budget_bytes, Bytes(double(r->budget_bytes)),
             o.budget_bytes ? "" : " (MemAvailable)");
  fmt::print("fits: {}\n", r->fits ? "yes" : "no");
  fmt::print("largest context that fits: {}\n", r->max_ctx);
  if (r->bandwidth > 0) {
    fmt::print("bandwidth: {:.2f} GB/s ({})\n", r->bandwidth / 1e9, bw_source);
    fmt::print("decode (predicted): {:.1f} tok/s at position 0, {:.1f} tok/s at position {}",
               r->decode_tok_s_start, r->decode_tok_s_full, r->ctx - 1);
    if (r->parallel > 1)
      fmt::print(", {:.1f} tok/s for {} sequences together", r->decode_tok_s_batch, r->parallel);
    fmt::print("\n");
  }
}

}  // namespace

void RegisterFit(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "fit", "memory for weights, KV and scratch; whether it fits; predicted decode speed");
  auto a = std::make_shared<FitArgs>();
  AddModelArgs(cmd, a->model);
  cmd->add_option("-P,--parallel", a->parallel, "sequences held at once (default 1)")
      ->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--memory-budget", a->budget_gb,
                  "memory budget in GB (1e9 bytes; default: MemAvailable from /proc/meminfo)")
      ->check(FiniteRange(1e-9, 1e9));
  cmd->add_option("--membw", a->membw_gbs,
                  "memory bandwidth in GB/s to predict with (default: measured once, cached)")
      ->check(FiniteRange(1e-6, 1e6));
  cmd->add_flag("--remeasure", a->remeasure, "measure the bandwidth again and update the cache");
  cmd->add_flag("--no-speed", a->no_speed, "skip the bandwidth and speed prediction");
  cmd->add_flag("--json", a->json, "print the report as one JSON object (the server's GET /fit)");
  cmd->callback([a] { Run(*a); });
}

}  // namespace lumen::cli
