// lumen train [MODEL] --data DIR --method sft|dpo|orpo|simpo|ipo|hinge --out ADAPTER_DIR [options]
// lumen train [MODEL] --inspect DIR
// lumen merge MODEL ADAPTER OUT [--type T]
#include <filesystem>

#include <fmt/format.h>

#include "lumen/cli/common.h"
#include "lumen/cli/verbs.h"
#include "lumen/engine/convert.h"
#include "lumen/train/trainer.h"

namespace lumen::cli {

namespace {
struct TrainArgs {
  ModelArgs model;
  train::TrainOptions o;
  std::string method = "sft", targets = "all", schedule = "constant", inspect;
  std::vector<double> betas = {0.9, 0.999};
  double beta = -1, gamma = 0.5, lambda = 0.1, label_smoothing = 0;
  bool no_mask_prompt = false, mask_prompt = false;
  bool fused_ce = false, no_fused_ce = false, prefix_share = false, no_prefix_share = false;
  std::string sft_scope = "response", lambda_schedule = "static", controller = "aimd",
              controlled = "lambda", compute = "auto";
};
}  // namespace

void RegisterTrain(CLI::App& app) {
  auto a = std::make_shared<TrainArgs>();
  auto* cmd = app.add_subcommand("train", "fine-tune a LoRA adapter (SFT or a preference method)");
  a->model.default_act_route = "exact";  // the training products are f32 (the L2 route)
  AddModelArgs(cmd, a->model);
  cmd->add_option("--data", a->o.data_dir, "directory with train.jsonl (and valid.jsonl)");
  cmd->add_option("--inspect", a->inspect,
                  "print counts, row kind and token lengths of DIR's data, then exit");
  cmd->add_option("--method", a->method, "sft, dpo, orpo, simpo, ipo or hinge")
      ->check(CLI::IsMember({"sft", "dpo", "orpo", "simpo", "ipo", "hinge"}));
  cmd->add_option("-o,--out", a->o.out_dir, "adapter directory to write");
  cmd->add_option("--resume", a->o.resume_dir, "continue from a run's checkpoint (its --out dir)");
  cmd->add_option("--targets", a->targets, "LoRA targets: q,k,v,o,gate,up,down or all");
  cmd->add_option("--rank", a->o.lora.rank, "LoRA rank (8)");
  cmd->add_option("--alpha", a->o.lora.alpha, "LoRA alpha (16): scale = alpha / rank");
  cmd->add_option("--scale", a->o.lora.scale, "LoRA scale directly (overrides --alpha)");
  cmd->add_flag("--rs-lora", a->o.lora.rs_lora, "rsLoRA: scale = alpha / sqrt(rank)");
  cmd->add_option("--dropout", a->o.lora.dropout, "LoRA dropout on the adapter input (0)");
  cmd->add_option("--num-layers", a->o.lora.num_layers, "adapt the last N layers only (0: all)");
  cmd->add_option("--beta", a->beta, "preference strength: dpo/ipo/hinge 0.1, simpo 2.0");
  cmd->add_option("--gamma", a->gamma, "SimPO target margin (0.5)");
  cmd->add_option("--lambda", a->lambda, "ORPO odds-ratio weight (0.1)");
  cmd->add_option("--label-smoothing", a->label_smoothing, "conservative DPO (0)");
  cmd->add_flag("--mask-prompt", a->mask_prompt, "loss on responses only (default)");
  cmd->add_flag("--no-mask-prompt", a->no_mask_prompt, "SFT loss on prompt tokens too");
  cmd->add_option("--batch-size", a->o.batch_size, "rows per micro-batch, packed (1)");
  cmd->add_option("--grad-accum", a->o.grad_accum, "micro-batches per optimizer step (1)");
  cmd->add_option("--iters", a->o.iters, "optimizer steps (default: --epochs)");
  cmd->add_option("--epochs", a->o.epochs, "passes over train.jsonl when --iters is 0 (1)");
  cmd->add_option("--lr", a->o.lr, "learning rate (1e-4)");
  cmd->add_option("--betas", a->betas, "AdamW betas (0.9 0.999)")->expected(2);
  cmd->add_option("--eps", a->o.eps, "AdamW epsilon (1e-8)");
  cmd->add_option("--weight-decay", a->o.weight_decay, "AdamW decoupled weight decay (0)");
  cmd->add_option("--lr-schedule", a->schedule, "constant, cosine or linear")
      ->check(CLI::IsMember({"constant", "cosine", "linear"}));
  cmd->add_option("--warmup", a->o.warmup, "linear warmup steps (0)");
  cmd->add_option("--grad-clip", a->o.grad_clip, "global gradient-norm clip (1.0; 0 off)");
  cmd->add_option("--lora-plus-ratio", a->o.lora_plus_ratio, "B's learning-rate multiplier (1)");
  cmd->add_option("--seed", a->o.seed, "seed of initialization, shuffling and dropout (0)");
  cmd->add_option("--max-seq-len", a->o.data.max_seq_len, "cut longer rows (2048)");
  cmd->add_flag("--skip-bad-rows", a->o.data.skip_bad_rows, "skip and count malformed rows");
  cmd->add_option("--steps-per-report", a->o.steps_per_report, "report interval (10)");
  cmd->add_option("--steps-per-eval", a->o.steps_per_eval, "validation interval (0: at the end)");
  cmd->add_option("--val-size", a->o.val_size, "hold out N train rows when no valid.jsonl");
  cmd->add_option("--save-every", a->o.save_every, "checkpoint interval in steps (0: none)");
  cmd->add_flag("-q,--quiet", a->o.quiet, "no per-report lines on stderr");
  // Memory levers.
  cmd->add_flag("--fused-ce", a->fused_ce, "fused linear cross-entropy head (default)");
  cmd->add_flag("--no-fused-ce", a->no_fused_ce, "plain head: materializes [tokens, vocab] logits");
  cmd->add_option("--ce-skip-eps", a->o.ce_skip_eps,
                  "fused head: recompute the logits in the backward and skip vocab chunks whose "
                  "coefficients are all below E (L3; slower than the default one-pass head)");
  cmd->add_flag("--prefix-share", a->prefix_share,
                "preference rows: one forward with the prompt shared (default)");
  cmd->add_flag("--no-prefix-share", a->no_prefix_share, "two forwards per preference row");
  cmd->add_option("--segment", a->o.segment,
                  "segmented backward: keep residuals every N layers, recompute (0: off)")
      ->check(CLI::Range(0, 4096));
  cmd->add_option("--mlp-chunk", a->o.mlp_chunk,
                  "sequence-chunked MLP: T tokens at a time, recomputed in the backward (0: off; "
                  "at least 8)");
  cmd->add_option("--memory-budget", a->o.memory_budget_mb,
                  "MB: choose the segment length so the predicted peak fits");
  cmd->add_flag("--plan", a->o.plan_only,
                "print the memory plan (estimate, choice, predicted peak) and exit");
  cmd->add_option("--compute", a->compute,
                  "product precision: auto (default: bf16 where AMX tiles run it, else f32), "
                  "f32 (exact) or bf16 (bf16 operands, f32 sums; L3)")
      ->check(CLI::IsMember({"auto", "f32", "bf16"}));
  cmd->add_flag("--probe-ranges", a->o.probe_ranges,
                "record operand ranges per product and report whether f16 would under/overflow");
  cmd->add_option("--sft-scope", a->sft_scope, "ORPO's NLL over the response (default) or full")
      ->check(CLI::IsMember({"full", "response"}));
  // Adaptive preference pressure.
  cmd->add_option("--lambda-schedule", a->lambda_schedule, "static (default) or adaptive")
      ->check(CLI::IsMember({"static", "adaptive"}));
  cmd->add_option("--lambda-controller", a->controller, "aimd (default), p, pd or pid")
      ->check(CLI::IsMember({"aimd", "p", "pd", "pid"}));
  cmd->add_option("--controlled-param", a->controlled, "lambda (ORPO) or beta (SimPO)")
      ->check(CLI::IsMember({"lambda", "beta"}));
  cmd->add_option("--lambda-min", a->o.controller.min, "controller floor (0.05)");
  cmd->add_option("--lambda-max", a->o.controller.max, "controller ceiling (0.5)");
  cmd->add_option("--lambda-ramp", a->o.controller.ramp, "additive increase per reading (0.05)");
  cmd->add_option("--lambda-backoff", a->o.controller.backoff, "multiplicative decrease (0.5)");
  cmd->add_option("--lambda-hysteresis", a->o.controller.hysteresis,
                  "consecutive readings before a phase change (3)");
  cmd->add_option("--lambda-warmup-readings", a->o.controller.warmup_readings,
                  "readings that measure the noise of l_w (3)");
  cmd->add_option("--control-every", a->o.control_every,
                  "read a probe set every N steps (default: at each evaluation)");
  cmd->add_option("--control-probe", a->o.control_probe, "probe rows held out of train (16)");
  cmd->callback([a] {
    auto model = LoadModel(a->model);
    if (!model.ok()) return ReportError(model.status());
    if (!a->inspect.empty()) {
      auto s = train::InspectData(a->inspect, **model, a->o.data);
      if (!s.ok()) return ReportError(s.status());
      fmt::print("{}", *s);
      return;
    }
    if (a->o.data_dir.empty()) return ReportError(Error("--data DIR is required"));
    const bool low_tier = a->model.exact || a->model.tier == "l1" || a->model.tier == "l2";
    auto compute =
        a->compute == "auto" ? train::AutoCompute(low_tier) : train::ParseCompute(a->compute);
    if (!compute)
      return ReportError(Errorf("--compute: '{}' is not auto, f32 or bf16", a->compute));
    a->o.compute = *compute;
    if (*compute == train::Compute::kBf16 &&
        (a->model.exact || a->model.tier == "l1" || a->model.tier == "l2"))
      return ReportError(Errorf(
          "--compute bf16 is a tier L3 route; it cannot be combined with {} (drop one of them)",
          a->model.exact ? "--exact" : "--tier " + a->model.tier));
    auto method = train::ParseMethod(a->method);
    if (!method.ok()) return ReportError(method.status());
    a->o.method = *method;
    auto targets = train::ParseTargets(a->targets);
    if (!targets.ok()) return ReportError(targets.status());
    a->o.lora.targets = *targets;
    a->o.objective.beta = a->beta >= 0 ? a->beta : (*method == train::Method::kSimpo ? 2.0 : 0.1);
    a->o.objective.gamma = a->gamma;
    a->o.objective.lambda = a->lambda;
    a->o.objective.label_smoothing = a->label_smoothing;
    a->o.mask_prompt = !a->no_mask_prompt;
    a->o.fused_ce = !a->no_fused_ce;
    a->o.prefix_share = !a->no_prefix_share;
    a->o.sft_scope_full = a->sft_scope == "full";
    a->o.control_beta = a->controlled == "beta";
    if (a->lambda_schedule == "adaptive") {
      auto k = train::ParseControllerKind(a->controller);
      if (!k.ok()) return ReportError(k.status());
      a->o.controller.kind = *k;
    }
    a->o.beta1 = a->betas[0];
    a->o.beta2 = a->betas[1];
    a->o.schedule = a->schedule == "cosine"   ? train::LrSchedule::kCosine
                    : a->schedule == "linear" ? train::LrSchedule::kLinear
                                              : train::LrSchedule::kConstant;
    a->o.model_name = a->model.model.empty() ? "stories260K" : a->model.model;
    if (a->o.plan_only && a->o.out_dir.empty()) a->o.out_dir = "(plan)";
    auto r = train::Train(**model, a->o);
    if (!r.ok()) return ReportError(r.status());
    if (a->o.plan_only) {
      fmt::print("{}", r->plan);
      return;
    }
    fmt::print(stderr, "{} {} steps; adapter in {}\n", r->interrupted ? "stopped after" : "trained",
               r->steps, a->o.out_dir);
    if (!r->ranges.empty())
      fmt::print(stderr, "operand ranges per product (--probe-ranges; also in metrics.jsonl):\n{}",
                 r->ranges);
    if (r->last_eval.pairs)
      fmt::print(stderr, "validation: loss {:.4f} (from {:.4f}), accuracy {:.3f} (from {:.3f})\n",
                 r->last_eval.loss, r->first_eval.loss, r->last_eval.accuracy,
                 r->first_eval.accuracy);
  });
}

void RegisterMerge(CLI::App& app) {
  auto args = std::make_shared<ModelArgs>();
  auto out = std::make_shared<std::string>();
  auto type = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand("merge", "fold a LoRA adapter into the weights and write a model");
  cmd->add_option("model", args->model, "base model")->required();
  cmd->add_option("adapter", args->adapter, "adapter directory")->required();
  cmd->add_option("out", *out, "output: a .gguf file or a Hugging Face directory")->required();
  cmd->add_option("--type", *type, "output tensor type (default: the base's)");
  cmd->add_option("--tokenizer", args->tokenizer, "tokenizer file for llama2.c .bin models");
  cmd->callback([args, out, type] {
    std::optional<DType> dtype;
    if (!type->empty()) {
      dtype = ParseDType(*type);
      if (!dtype) return ReportError(Errorf("--type: unknown type '{}'", *type));
    }
    auto model = LoadModel(*args);
    if (!model.ok()) return ReportError(model.status());
    const auto format =
        out->ends_with(".gguf") ? engine::OutputFormat::kGguf : engine::OutputFormat::kHf;
    Status s = engine::ConvertModel(**model, format, *out, dtype);
    if (!s.ok()) return ReportError(s);
    fmt::print(stderr, "wrote {}\n", *out);
  });
}

}  // namespace lumen::cli
