#include "lumen/cli/common.h"

#include <cmath>
#include <cstdio>

#include "lumen/cli/routes.h"
#include "lumen/cli/verbs.h"
#include "lumen/core/log.h"
#include "lumen/engine/default_model.h"
#include "lumen/kernels/matrix.h"

namespace lumen::cli {

void AddModelArgs(CLI::App* app, ModelArgs& args, bool positional) {
  if (positional)
    app->add_option("model", args.model,
                    "model: .gguf file, Hugging Face directory, or llama2.c .bin "
                    "(default: the embedded stories260K)");
  app->add_option("--tokenizer", args.tokenizer, "tokenizer file for llama2.c .bin models");
  app->add_option("-t,--threads", args.threads, "threads (default: LUMEN_THREADS or all cores)")
      ->check(CLI::Range(1, 1024));
  app->add_option("-c,--ctx", args.ctx,
                  "context size in tokens (default: the model's, max 4096; serve: the model's "
                  "as far as memory allows)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 24));
  AddKvTypeOption(app, args.kv_type);
  AddActRouteOption(app, args.act_route);
  AddTierOptions(app, args);
  app->add_option("--adapter", args.adapter,
                  "LoRA adapter directory (PEFT layout, e.g. from lumen train) applied unmerged");
}

void AddTierOptions(CLI::App* app, ModelArgs& args) {
  app->add_flag("--exact", args.exact,
                "every node at its lowest tier (exact f32 products, f32 KV): bit-identical to "
                "the reference path; same as --tier l1");
  app->add_option("--tier", args.tier,
                  "route preset: l1 (= --exact), l2 (no L3 route: exact products, f16 KV), l3 "
                  "(every L3 route: int8 decode + bf16 prefill); default: int8x2 decode, bf16 "
                  "prefill where it is the faster (AMX, or AVX512-BF16 on AMD), f16 KV. "
                  "--act-route / --kv-type override it")
      ->check(CLI::IsMember({"l1", "l2", "l3"}));
  app->add_flag("--show-routes", args.show_routes,
                "print the resolved route of every graph node before running (lumen routes)");
}

void WarnBeyondModelContext(const engine::Model& model, int64_t ctx) {
  const int64_t trained = model.config().max_ctx;
  if (ctx > trained && trained > 0)
    LUMEN_LOG_WARN(
        "--ctx {} exceeds the model's context of {} tokens: positions past it are "
        "extrapolated, and the KV cache is sized for all of them",
        ctx, trained);
}

CLI::Validator FiniteRange(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(text, v)) return fmt::format("'{}' is not a number", text);
        if (!std::isfinite(v) || v < lo || v > hi)
          return fmt::format("{} is not a finite number in [{}, {}]", text, lo, hi);
        return "";
      },
      fmt::format("FLOAT in [{} - {}]", lo, hi));
}

void AddKvTypeOption(CLI::App* app, std::string& kv_type) {
  app->add_option("--kv-type", kv_type,
                  "KV cache element type: f16, bf16, f32 or q8_0 (8-bit blocks of 32: half the "
                  "memory and bandwidth of f16, head dim a multiple of 32)")
      ->check(CLI::IsMember({"f16", "bf16", "f32", "q8_0"}));
}

void AddActRouteOption(CLI::App* app, std::string& act_route) {
  app->add_option("--act-route", act_route,
                  "matmul activations: exact (f32); int8 (decode: Q8_0/Q4_0/Q4_K/Q6_K/"
                  "MLX-4-bit weights against int8 activations, VNNI dot products; AVX2 ones on "
                  "other x86 CPUs); int8x2 (the "
                  "same with two int8 levels per block, about 16-bit activations; with "
                  "AVX512-VNNI prompts too, as an int16 GEMM, unless bf16 takes them); bf16 "
                  "(prefill: bf16 weights and activations, AVX512-BF16 dot products); int8+bf16, "
                  "int8x2+bf16 (both). int8 and bf16 are tier L3, int8x2 L2, "
                  "docs/reference/performance.md. Default: the --tier preset's (int8x2+bf16 "
                  "where the bf16 prefill is the faster on this CPU, else int8x2)")
      ->check(CLI::IsMember(std::vector<std::string>(kernels::kActRouteNames.begin(),
                                                     kernels::kActRouteNames.end())));
}

Result<std::unique_ptr<engine::Model>> LoadModel(const ModelArgs& args) {
  LUMEN_ASSIGN_OR_RETURN(RouteChoice routes, ResolveRouteChoice(args));
  engine::LoadOptions opts;
  opts.tokenizer_path = args.tokenizer;
  opts.threads = args.threads;
  opts.act_route = kernels::ParseActRoute(routes.act_route).value_or(kernels::ActRoute::kExact);
  opts.adapter_dir = args.adapter;
  return engine::LoadModelOrDefault(args.model, opts);
}

Result<engine::SessionOptions> SessionOptionsFrom(const ModelArgs& args) {
  engine::SessionOptions s;
  s.ctx = args.ctx;
  LUMEN_ASSIGN_OR_RETURN(RouteChoice routes, ResolveRouteChoice(args));
  auto t = ParseDType(routes.kv_type);
  if (!t) return Errorf("--kv-type: unknown type '{}'", routes.kv_type);
  s.kv_dtype = *t;
  return s;
}

void AddSamplerFlags(CLI::App* app, SamplerArgs& args) {
  for (std::string_view flag : sample::SamplerFlags()) {
    auto& slot = args.storage.emplace_back(std::make_unique<std::string>());
    std::string name(flag);
    std::string* dst = slot.get();
    CLI::Option* opt;
    if (flag == "--logit-bias" || flag == "--dry-sequence-breaker") {
      // Repeatable (each use adds one entry, as in llama.cpp).
      opt = app->add_option_function<std::vector<std::string>>(
                   name,
                   [&args, name, dst](const std::vector<std::string>& vs) {
                     for (const auto& v : vs) args.given.emplace_back(name, v);
                     if (!vs.empty()) *dst = vs.back();
                   },
                   "sampler setting, repeatable (docs/reference/sampling.md)")
                ->expected(1)
                ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
    } else {
      opt = app->add_option_function<std::string>(
          name,
          [&args, name, dst](const std::string& v) {
            *dst = v;
            args.given.emplace_back(name, v);
          },
          "sampler setting (docs/reference/sampling.md)");
    }
    opt->group("Sampling");
  }
}

Result<sample::SamplerConfig> BuildSamplerConfig(const CLI::App*, SamplerArgs& args,
                                                 sample::SamplerConfig base) {
  for (const auto& [flag, value] : args.given)
    LUMEN_RETURN_IF_ERROR(sample::ApplyFlag(base, flag, value));
  LUMEN_RETURN_IF_ERROR(sample::Validate(base));
  return base;
}

void ReportError(const Status& s) {
  std::fprintf(stderr, "lumen: error: %s\n", s.message().c_str());
  SetExitCode(1);
}

}  // namespace lumen::cli
