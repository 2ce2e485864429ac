// lumen bench [MODEL]: prefill/decode speed, TTFT, peak RSS and the roofline
// (engine/bench.h measures; this file only prints). lumen bench --membw: the
// machine's read bandwidth alone.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

#include <fmt/format.h>

#include "lumen/cli/common.h"
#include "lumen/cli/routes.h"
#include "lumen/cli/verbs.h"
#include "lumen/engine/bench.h"
#include "lumen/train/bench_train.h"

namespace lumen::cli {
namespace {

struct BenchArgs {
  std::string model;
  engine::BenchOptions opts;
  int threads = 0;
  ModelArgs routes;  // --act-route, --kv-type, --exact, --tier (the same presets as generate)
  int64_t depth = 0;
  bool membw_only = false;
  bool no_membw = false;
};

std::string LoadAvg() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a.empty() ? "unknown" : a + " " + b + " " + c;
}

std::string Line(const char* what, const engine::Spread& s, const char* unit) {
  return fmt::format("{}: {:.2f} {} (median of {}, min {:.2f}, max {:.2f})", what, s.median, unit,
                     s.n, s.min, s.max);
}

void PrintMembw(const engine::MemBandwidth& m) {
  std::printf("membw: %.1f MiB buffer, vector loads\n", m.buffer_bytes / 1048576.0);
  std::printf("  %s\n", Line("read bandwidth, 1 thread", m.one_thread, "GB/s").c_str());
  std::printf("  %s\n", Line(fmt::format("read bandwidth, {} threads", m.threads).c_str(),
                             m.all_threads, "GB/s")
                            .c_str());
}

void RunBenchVerb(BenchArgs& a) {
  std::printf("load average: %s\n", LoadAvg().c_str());
  if (a.membw_only) {
    auto m = engine::MeasureMemBandwidth(a.threads);
    if (!m.ok()) return ReportError(m.status());
    return PrintMembw(*m);
  }
  ModelArgs margs;
  margs.model = a.model;
  margs.threads = a.threads;
  margs.act_route = a.routes.act_route;
  margs.kv_type = a.routes.kv_type;
  margs.exact = a.routes.exact;
  margs.tier = a.routes.tier;
  margs.show_routes = a.routes.show_routes;
  const auto load_start = std::chrono::steady_clock::now();
  auto model = LoadModel(margs);
  if (!model.ok()) return ReportError(model.status());
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
  AnnounceRoutes(margs, **model, "generate");
  auto sopts = SessionOptionsFrom(margs);
  if (!sopts.ok()) return ReportError(sopts.status());
  a.opts.depth = a.depth;
  a.opts.kv_dtype = sopts->kv_dtype;
  a.opts.membw = !a.no_membw;
  auto rr = engine::RunBench(**model, a.opts);
  if (!rr.ok()) return ReportError(rr.status());
  const engine::BenchReport& r = *rr;
  const double gb = 1e9;
  std::printf("model: %s | %d threads | prompt %d, gen %d, repeat %d (+1 warm-up)\n",
              r.model_name.c_str(), r.threads, a.opts.prompt, a.opts.gen, a.opts.repeat);
  std::printf("kernels: %s target, %d f32 lanes;", r.peak.target.c_str(), r.peak.f32_lanes);
  for (const auto& s : r.kernel_routes) std::printf(" [%s]", s.c_str());
  std::printf("\nweights: %.3f GB total, %.3f GB read per decoded token; KV cache %.1f MB\n",
              r.weight_bytes_total / gb, r.weight_bytes_per_token / gb, r.kv_bytes / 1e6);
  std::printf("load: %.2f s (open, copy or map, load-time repack; one run)\n", load_s);
  if (a.opts.membw) PrintMembw(r.membw);
  const double bw = r.membw.all_threads.median * gb;
  const double roof = bw > 0 ? bw / r.weight_bytes_per_token : 0;
  auto pct = [&](double tok_s) { return roof > 0 ? 100.0 * tok_s / roof : 0.0; };
  std::printf("%s\n", Line("TTFT", r.ttft_ms, "ms").c_str());
  const double pre_flops = r.prefill_tok_s.median * r.prefill_flop_per_token;
  std::printf(
      "%s = %.1f GFLOP/s = %.0f%% of f32 FMA peak (%.1f GFLOP/s: %.1f measured per core x %d), "
      "%.0f%% of %s peak (%.1f GFLOP/s)",
      Line("prefill", r.prefill_tok_s, "tok/s").c_str(), pre_flops / 1e9,
      100.0 * pre_flops / r.peak.f32_peak, r.peak.f32_peak / 1e9, r.peak.f32_fma_per_core / 1e9,
      r.peak.cores, 100.0 * pre_flops / r.peak.best_peak, r.peak.best_isa.c_str(),
      r.peak.best_peak / 1e9);
  if (r.peak.int8_dot_per_core > 0) {
    const double int8_peak = r.peak.int8_dot_per_core * r.peak.cores;
    std::printf(", %.0f%% of AVX512-VNNI int8 peak (%.1f GOP/s measured)",
                100.0 * pre_flops / int8_peak, int8_peak / 1e9);
  }
  std::printf("\n");
  if (roof > 0) {
    std::printf("%s = %.0f%% of roofline (%.1f tok/s = %.1f GB/s / %.3f GB per token)\n",
                Line("decode", r.decode_tok_s, "tok/s").c_str(), pct(r.decode_tok_s.median), roof,
                bw / gb, r.weight_bytes_per_token / gb);
  } else {
    std::printf("%s\n", Line("decode", r.decode_tok_s, "tok/s").c_str());
  }
  if (a.depth > 0) {
    std::printf(
        "%s = %.0f%% of decode at the prompt's depth\n",
        Line(fmt::format("decode at context {}", a.depth).c_str(), r.depth_decode_tok_s, "tok/s")
            .c_str(),
        100.0 * r.depth_decode_tok_s.median / r.decode_tok_s.median);
  }
  if (a.opts.batch > 1) {
    std::printf("%s\n", Line("batch 1 (RunBatch)", r.batch1_tok_s, "tok/s").c_str());
    std::printf(
        "%s = %.2fx batch 1\n",
        Line(fmt::format("batch {} aggregate", a.opts.batch).c_str(), r.batch_tok_s, "tok/s")
            .c_str(),
        r.batch_tok_s.median / r.batch1_tok_s.median);
  }
  // Where the calling thread's time went: the pool's hand-offs (ThreadPool::Stats).
  auto handoffs = [&](const char* phase, const ThreadPool::Stats& p, double units,
                      const char* unit) {
    const double total = p.own_s + p.wait_s + p.between_s;
    if (p.calls == 0 || total <= 0) return;
    std::printf(
        "%s hand-offs: %.1f per %s; the calling thread %.1f%% in its share, %.1f%% waiting "
        "for the other threads, %.1f%% between hand-offs\n",
        phase, p.calls / units, unit, 100.0 * p.own_s / total, 100.0 * p.wait_s / total,
        100.0 * p.between_s / total);
  };
  handoffs("prefill", r.prefill_pool, a.opts.repeat, "prompt");
  handoffs("decode", r.decode_pool, double(a.opts.repeat) * a.opts.gen, "token");
  std::printf(
      "peak RSS: %.3f GB after prefill+decode (weights read per token %.3f GB + KV %.3f GB "
      "= %.0f%%)\n",
      r.peak_rss_bytes / gb, r.weight_bytes_total / gb, r.kv_bytes / gb,
      100.0 * r.peak_rss_bytes / double(r.weight_bytes_total + r.kv_bytes));
  std::printf("load average: %s\n", LoadAvg().c_str());
}

}  // namespace

void RegisterBench(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  auto* cmd = app.add_subcommand("bench", "measure prefill/decode speed against the roofline");
  cmd->add_option("model", a->model, "model file or directory (default: the embedded model)");
  cmd->add_option("--prompt", a->opts.prompt, "prefill tokens (default 512)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--gen", a->opts.gen, "decoded tokens per repetition (default 128)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("-t,--threads", a->threads, "threads (default: LUMEN_THREADS or all cores)")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--batch", a->opts.batch, "also decode B sequences at once (default 1)")
      ->check(CLI::Range(1, 256));
  cmd->add_option("--repeat", a->opts.repeat, "repetitions after the warm-up (default 3)")
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--ctx", a->depth, "also decode starting at this context position")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 24));
  AddActRouteOption(cmd, a->routes.act_route);
  AddKvTypeOption(cmd, a->routes.kv_type);
  AddTierOptions(cmd, a->routes);
  cmd->add_flag("--membw", a->membw_only, "only measure the read bandwidth (1 and all threads)");
  cmd->add_flag("--no-membw", a->no_membw, "skip the bandwidth measurement");
  // lumen bench train: the training memory levers side by side (issue 15).
  auto t = std::make_shared<train::TrainBenchOptions>();
  auto* tc = cmd->add_subcommand("train", "training step time and peak memory per memory lever");
  tc->add_option("model", t->model, "model (default: synth llama-3.2-1b widths)");
  tc->add_option("--layers", t->layers, "layers of the synth model (2)");
  tc->add_option("--method", t->method,
                 "sft (prompt + chosen rows) or a preference method (default orpo)");
  tc->add_option("--seq", t->seqs, "tokens per sequence, repeatable (512)");
  tc->add_option("--configs", t->configs,
                 "plain, fused-ce, prefix-share, segment, all (default: every one)");
  tc->add_option("--steps", t->steps, "measured steps per configuration (1)");
  tc->add_option("-t,--threads", t->threads, "threads");
  tc->add_flag("--plan", t->plan_only, "only the memory plan's predicted peaks (no training)");
  tc->add_option("--compute", t->compute,
                 "product precision: f32 (default), bf16, or auto (lumen train's default)")
      ->check(CLI::IsMember({"f32", "bf16", "auto"}));
  tc->callback([t] {
    auto r = train::RunTrainBench(*t);
    if (!r.ok()) return ReportError(r.status());
    fmt::print("{}", *r);
  });
  cmd->callback([a, tc] {
    if (!tc->parsed()) RunBenchVerb(*a);
  });
}

}  // namespace lumen::cli
