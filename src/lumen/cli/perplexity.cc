// lumen perplexity [MODEL] --file F [--ctx N] [--stride S] [--batch B] [--base M]:
// strided perplexity of a text file with its standard error, and with --base
// the KL divergence and top-1 agreement against another model of the same
// vocabulary (eval/perplexity.h defines every number; this file only prints).
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "lumen/cli/common.h"
#include "lumen/cli/routes.h"
#include "lumen/cli/verbs.h"
#include "lumen/engine/default_model.h"
#include "lumen/eval/perplexity.h"
#include "lumen/model/kv_cache.h"

namespace lumen::cli {
namespace {

struct PplArgs {
  ModelArgs model;
  std::string file;
  std::string base;
  int64_t stride = 0;
  int64_t batch = 0;
};

void Run(const PplArgs& a) {
  std::error_code ec;
  if (std::filesystem::is_directory(a.file, ec))
    return ReportError(Errorf("--file {}: is a directory, not a text file", a.file));
  std::ifstream f(a.file, std::ios::binary);
  if (!f) return ReportError(Errorf("--file {}: cannot be read", a.file));
  std::stringstream ss;
  ss << f.rdbuf();
  if (f.bad()) return ReportError(Errorf("--file {}: read failed", a.file));
  const std::string text = ss.str();
  auto so = SessionOptionsFrom(a.model);
  if (!so.ok()) return ReportError(so.status());
  auto m = LoadModel(a.model);
  if (!m.ok()) return ReportError(m.status());
  AnnounceRoutes(a.model, **m, "generate");
  WarnBeyondModelContext(**m, a.model.ctx);
  std::unique_ptr<engine::Model> base;
  if (!a.base.empty()) {
    ModelArgs b = a.model;
    b.model = a.base;
    b.adapter.clear();
    auto bm = LoadModel(b);
    if (!bm.ok()) return ReportError(Errorf("--base {}: {}", a.base, bm.status().message()));
    base = std::move(bm).value();
  }
  const std::vector<int32_t> ids = (*m)->tokenizer().Encode(text, /*add_special=*/true);
  eval::PerplexityOptions o{
      .ctx = a.model.ctx, .stride = a.stride, .batch = a.batch, .kv_dtype = so->kv_dtype};
  const std::string name =
      a.model.model.empty() ? std::string(engine::kDefaultModelName) : a.model.model;
  auto r = eval::Perplexity(
      **m, ids, o, base.get(), [](int64_t done, int64_t total, const eval::PerplexityResult& run) {
        fmt::print(stderr, "[{}/{}] {} tokens scored, PPL {:.4f} +/- {:.4f}\n", done, total,
                   run.scored, run.ppl, run.ppl_se);
      });
  if (!r.ok()) return ReportError(Errorf("{}: {}", a.file, r.status().message()));
  fmt::print("model: {}\n", name);
  fmt::print("file: {} ({} tokens)\n", a.file, ids.size());
  fmt::print("windows: {} of ctx {}, stride {}; {} tokens scored\n", r->windows, r->ctx, r->stride,
             r->scored);
  fmt::print("mean NLL: {:.6f} +/- {:.6f} nats\n", r->nll, r->nll_se);
  fmt::print("PPL: {:.6f} +/- {:.6f}\n", r->ppl, r->ppl_se);
  if (r->has_base) {
    fmt::print("base: {}\n", a.base);
    fmt::print("base PPL: {:.6f} +/- {:.6f}\n", r->base_ppl, r->base_ppl_se);
    fmt::print("KL(base || model): mean {:.6g} +/- {:.6g}, max {:.6g} nats\n", r->kl_mean, r->kl_se,
               r->kl_max);
    fmt::print("top-1 agreement: {:.4f}%\n", 100.0 * r->top1);
  }
}

}  // namespace

void RegisterPerplexity(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "perplexity", "perplexity of a text file by strided windows (and KL to a --base model)");
  auto a = std::make_shared<PplArgs>();
  // A measurement of the model: the exact products unless a route flag asks to
  // measure another (--tier l3, --act-route bf16).
  a->model.default_act_route = "exact";
  AddModelArgs(cmd, a->model);
  cmd->add_option("-f,--file", a->file, "text file to evaluate")->required();
  cmd->add_option("--stride", a->stride,
                  "tokens between window starts (default ctx/2: each window scores the tokens "
                  "the previous one did not)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 24));
  cmd->add_option("-b,--batch", a->batch,
                  fmt::format("tokens per forward call (default and most: {})", model::kMaxChunk))
      ->check(CLI::Range(int64_t(1), model::kMaxChunk));
  cmd->add_option("--base", a->base,
                  "base model of the same vocabulary: report KL(base || model) and top-1 "
                  "agreement");
  cmd->callback([a] { Run(*a); });
}

}  // namespace lumen::cli
