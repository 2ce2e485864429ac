// lumen eval diversity|kl|match: sampler evaluation over a prompt file
// (eval/sampling_eval.h; docs/experiments/sampling.md for the definitions);
// lumen eval route: the int8-activation route's KL to the exact route
// (eval/route_eval.h; docs/reference/performance.md).
#include <cmath>
#include <cstdio>
#include <memory>

#include <fmt/format.h>

#include "lumen/cli/common.h"
#include "lumen/cli/verbs.h"
#include "lumen/eval/route_eval.h"
#include "lumen/eval/sampling_eval.h"
#include "lumen/kernels/matrix.h"

namespace lumen::cli {
namespace {

struct EvalArgs {
  ModelArgs model;
  SamplerArgs sampler;
  std::string prompts;
  eval::EvalOptions opts;
  int seeds = 3;
};

struct Loaded {
  std::unique_ptr<engine::Model> model;
  std::vector<eval::Seq> prompts;
  sample::SamplerConfig config;
};

Result<Loaded> Load(CLI::App* cmd, EvalArgs& a) {
  Loaded l;
  LUMEN_ASSIGN_OR_RETURN(l.config, BuildSamplerConfig(cmd, a.sampler, {}));
  if (l.config.seed) a.opts.seed = *l.config.seed;
  LUMEN_ASSIGN_OR_RETURN(auto text, eval::ReadPrompts(a.prompts));
  LUMEN_ASSIGN_OR_RETURN(l.model, LoadModel(a.model));
  LUMEN_RETURN_IF_ERROR(sample::ValidateForVocab(l.config, l.model->tokenizer().vocab_size()));
  LUMEN_ASSIGN_OR_RETURN(l.prompts, eval::EncodePrompts(*l.model, text));
  return l;
}

void PrintDiversity(const char* label, const eval::DiversityResult& d) {
  std::printf(
      "%s distinct-1 %.4f  distinct-2 %.4f  self-BLEU %.4f  NLL %.4f  entropy %.4f  (%lld "
      "tokens)\n",
      label, d.distinct1, d.distinct2, d.self_bleu, d.nll, d.entropy,
      static_cast<long long>(d.tokens));
}

void RunDiversity(CLI::App* cmd, EvalArgs& a) {
  auto l = Load(cmd, a);
  if (!l.ok()) return ReportError(l.status());
  auto d = eval::Diversity(*l->model, l->prompts, l->config, a.opts);
  if (!d.ok()) return ReportError(d.status());
  PrintDiversity("", *d);
}

void RunKl(CLI::App* cmd, EvalArgs& a) {
  auto l = Load(cmd, a);
  if (!l.ok()) return ReportError(l.status());
  auto rows = eval::BaseForcedRows(*l->model, l->prompts, a.opts);
  if (!rows.ok()) return ReportError(rows.status());
  auto f = eval::Forced(*rows, l->config);
  if (!f.ok()) return ReportError(f.status());
  std::printf(
      "KL(base T=1 || setting) %.6f per token (finite part %.6f, %lld of %lld positions "
      "infinite)\n",
      f->kl, f->kl_finite, static_cast<long long>(f->inf_positions),
      static_cast<long long>(f->tokens));
  std::printf("entropy: setting %.4f, base %.4f nats per token\n", f->entropy, f->base_entropy);
}

struct Stat {
  double mean = 0, sd = 0;
};
Stat MeanSd(const std::vector<double>& v) {
  Stat s;
  for (double x : v) s.mean += x;
  s.mean /= v.size();
  if (v.size() > 1) {
    for (double x : v) s.sd += (x - s.mean) * (x - s.mean);
    s.sd = std::sqrt(s.sd / (v.size() - 1));
  }
  return s;
}

void RunMatch(CLI::App* cmd, EvalArgs& a) {
  auto l = Load(cmd, a);
  if (!l.ok()) return ReportError(l.status());
  if (!l->config.hlg.enabled && !l->config.curve.enabled) {
    return ReportError(Error("match: give an HLG setting (--hlg-sampling on ...) or --curve"));
  }
  auto rows = eval::BaseForcedRows(*l->model, l->prompts, a.opts);
  if (!rows.ok()) return ReportError(rows.status());
  auto m = eval::MatchTemperature(*rows, l->config);
  if (!m.ok()) return ReportError(m.status());
  auto kl_set = eval::Forced(*rows, l->config);
  sample::SamplerConfig plain;
  plain.temperature = m->temperature;
  auto kl_t = eval::Forced(*rows, plain);
  if (!kl_set.ok() || !kl_t.ok()) return ReportError(Error("match: teacher-forced KL failed"));
  std::printf("teacher-forced entropy %.4f -> matched temperature %.4f (entropy %.4f, %d steps)\n",
              m->target_entropy, m->temperature, m->entropy, m->iterations);
  std::printf("| sampler | KL(base||s) | distinct-1 | distinct-2 | self-BLEU | NLL | entropy |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (int which = 0; which < 2; ++which) {
    const sample::SamplerConfig& c = which == 0 ? l->config : plain;
    std::vector<double> d1, d2, sb, nll, ent;
    for (int s = 0; s < a.seeds; ++s) {
      eval::EvalOptions o = a.opts;
      o.seed = a.opts.seed + s;
      auto d = eval::Diversity(*l->model, l->prompts, c, o);
      if (!d.ok()) return ReportError(d.status());
      d1.push_back(d->distinct1);
      d2.push_back(d->distinct2);
      sb.push_back(d->self_bleu);
      nll.push_back(d->nll);
      ent.push_back(d->entropy);
    }
    auto cell = [](const std::vector<double>& v) {
      const Stat s = MeanSd(v);
      return fmt::format("{:.4f} ± {:.4f}", s.mean, s.sd);
    };
    const std::string name = which == 0 ? "setting" : fmt::format("T = {:.4f}", m->temperature);
    std::printf("| %s | %.4f | %s | %s | %s | %s | %s |\n", name.c_str(),
                which == 0 ? kl_set->kl : kl_t->kl, cell(d1).c_str(), cell(d2).c_str(),
                cell(sb).c_str(), cell(nll).c_str(), cell(ent).c_str());
  }
  std::printf("(mean ± sample standard deviation over %d seeds)\n", a.seeds);
}

void RunRoute(EvalArgs& a) {
  auto run = [&]() -> Status {
    LUMEN_ASSIGN_OR_RETURN(auto text, eval::ReadPrompts(a.prompts));
    // The route under test is --act-route; none given (or "exact") means int8.
    ModelArgs exact_args = a.model, route_args = a.model;
    exact_args.act_route = "exact";
    if (route_args.act_route.empty() || route_args.act_route == "exact")
      route_args.act_route = "int8";
    // bf16 applies to products with many rows, so those routes are measured on prefill.
    const bool prefill = kernels::RouteHasBf16(*kernels::ParseActRoute(route_args.act_route));
    LUMEN_ASSIGN_OR_RETURN(auto exact, LoadModel(exact_args));
    LUMEN_ASSIGN_OR_RETURN(auto route, LoadModel(route_args));
    LUMEN_ASSIGN_OR_RETURN(auto prompts, eval::EncodePrompts(*exact, text));
    LUMEN_ASSIGN_OR_RETURN(
        auto r, eval::RouteKl(*exact, *route, prompts, a.opts,
                              prefill ? eval::RouteMode::kPrefill : eval::RouteMode::kDecode));
    std::printf(
        "%s route vs exact (%s): mean KL %.4g nats (max %.4g) over %lld positions; top-1 "
        "agreement %.1f%%\n",
        route_args.act_route.c_str(), prefill ? "one prefill per sequence" : "token by token",
        r.kl_mean, r.kl_max, static_cast<long long>(r.positions), 100.0 * r.top1);
    return Status::Ok();
  };
  if (Status s = run(); !s.ok()) ReportError(s);
}

void AddCommon(CLI::App* cmd, EvalArgs& a, bool samples) {
  AddModelArgs(cmd, a.model, /*positional=*/true);
  cmd->add_option("--prompts", a.prompts, "prompt file, one per line")->required();
  cmd->add_option("-n,--samples", a.opts.samples,
                  samples ? "samples per prompt" : "base continuations per prompt")
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--max-tokens", a.opts.max_tokens, "tokens per sample")
      ->check(CLI::Range(1, 1 << 20));
  AddSamplerFlags(cmd, a.sampler);
}

}  // namespace

void RegisterEval(CLI::App& app) {
  auto* eval = app.add_subcommand(
      "eval", "evaluate samplers (diversity, kl, match) and kernel routes (route)");
  eval->require_subcommand(1);
  auto d = std::make_shared<EvalArgs>();
  auto* dc = eval->add_subcommand("diversity",
                                  "N samples per prompt: distinct-1/2, self-BLEU, NLL, entropy");
  AddCommon(dc, *d, true);
  dc->callback([dc, d] { RunDiversity(dc, *d); });

  auto k = std::make_shared<EvalArgs>();
  auto* kc = eval->add_subcommand(
      "kl", "mean KL(base T=1 || setting), teacher-forced on base T=1 samples");
  k->opts.samples = 2;
  AddCommon(kc, *k, false);
  kc->callback([kc, k] { RunKl(kc, *k); });

  auto m = std::make_shared<EvalArgs>();
  auto* mc = eval->add_subcommand(
      "match", "entropy-matched temperature for an HLG/curve setting, then compare");
  AddCommon(mc, *m, true);
  mc->add_option("--seeds", m->seeds, "seeds to repeat the comparison over")
      ->check(CLI::Range(1, 100));
  mc->callback([mc, m] { RunMatch(mc, *m); });

  auto r = std::make_shared<EvalArgs>();
  auto* rc = eval->add_subcommand(
      "route",
      "mean KL(exact || route) on exact-route T=1 samples; the route is --act-route (default "
      "int8, decoded token by token; bf16 routes prefill each sequence)");
  r->opts.samples = 2;
  AddCommon(rc, *r, false);
  rc->callback([r] { RunRoute(*r); });
}

}  // namespace lumen::cli
