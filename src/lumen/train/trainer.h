// The trainer loop: data -> PackedBatch -> Graph forward -> head ->
// objective -> backward -> gradient accumulation -> global-norm clip ->
// AdamW with the schedule; reports, evaluation, atomic checkpoints, resume,
// and the adapter written in PEFT's layout (engine/adapter.h).
//
// Determinism: every random draw (initialization, shuffling, dropout) is a
// hash of (seed, ...), and the data position is one counter, so the same
// seed, data and thread count give a bit-identical adapter, and a resumed
// run continues exactly where its checkpoint stopped.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "lumen/core/status.h"
#include "lumen/engine/model.h"
#include "lumen/train/compute.h"
#include "lumen/train/dataset.h"
#include "lumen/train/lambda_controller.h"
#include "lumen/train/lora.h"
#include "lumen/train/objective.h"
#include "lumen/train/step_profile.h"

namespace lumen::train {

enum class LrSchedule { kConstant, kCosine, kLinear };

struct TrainOptions {
  std::string data_dir;
  std::string out_dir;
  std::string resume_dir;  // an out dir or one of its checkpoints
  std::string model_name;  // base_model_name_or_path in the adapter config
  Method method = Method::kSft;
  LoraConfig lora;
  ObjectiveParams objective;
  DatasetOptions data;
  bool mask_prompt = true;
  int batch_size = 1;
  int grad_accum = 1;
  int64_t iters = 0;  // 0: epochs
  int epochs = 1;
  double lr = 1e-4;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0.0;
  LrSchedule schedule = LrSchedule::kConstant;
  int64_t warmup = 0;
  double grad_clip = 1.0;  // 0: off
  double lora_plus_ratio = 1.0;
  uint64_t seed = 0;
  int64_t steps_per_report = 10;
  int64_t steps_per_eval = 0;  // 0: only at the end
  int val_size = 0;            // held out of train.jsonl when there is no valid.jsonl
  int64_t save_every = 0;      // 0: only the final adapter
  bool quiet = false;          // no progress lines

  // Memory levers (docs/reference/training.md, "Memory").
  bool fused_ce = true;        // the fused linear cross-entropy head
  float ce_skip_eps = 0.0f;    // > 0: skip head-backward chunks below it (L3)
  int64_t vocab_chunk = 8192;  // the fused head's vocabulary chunk
  bool prefix_share = true;    // one forward per preference pair, prompt shared
  int segment = 0;
  int64_t mlp_chunk = 0;  // sequence-chunked MLP: tokens per chunk (0: off)                     //
                          // segmented backward: layers per segment (0: off)
  int64_t memory_budget_mb = 0;        // > 0: choose segment from the plan (memory_plan.h)
  const Dataset* preloaded = nullptr;  // benchmarks: train on these rows, not data_dir
  bool plan_only = false;              // --plan: validate, print the memory plan, write nothing
  bool sft_scope_full = false;         // ORPO: NLL over prompt + chosen (TRL's full scope)

  // Compute precision of the large products (compute.h; issue 16).
  Compute compute = Compute::kF32;  // kBf16: L3, needs AVX512-BF16
  bool probe_ranges = false;        // --probe-ranges: operand ranges per product (range_probe.h)

  // Adaptive preference pressure (issue 17): ORPO's lambda or SimPO's beta.
  ControllerOptions controller;  // kind kStatic: the fixed value (bit-identical)
  bool control_beta = false;     // --controlled-param beta (SimPO)
  int64_t control_every = 0;     // > 0: read a probe set every N steps (else each eval)
  int control_probe = 16;        // probe rows held out of train.jsonl
};

struct EvalMetrics {
  double loss = 0, nll = 0, l_w = 0, l_r = 0, margin = 0, accuracy = 0;
  int pairs = 0;
};

struct TrainResult {
  int64_t steps = 0;
  EvalMetrics first_eval, last_eval;
  bool interrupted = false;
  std::string plan;  // the memory plan (memory_plan.h), printed by --plan
  double predicted_peak_mb = 0;
  std::vector<double> step_seconds;  // wall time of each optimizer step
  StepProfile profile;               // phases of the optimizer steps (step_profile.h)
  std::string ranges;                // --probe-ranges: the report (RangeProbe::Describe)
};

// Validates everything (data, targets, options) before creating out_dir, so a
// bad input leaves no output directory.
Result<TrainResult> Train(const engine::Model& model, const TrainOptions& opts);

// Metrics of params (null: the base model) on a dataset, with a run's
// options (head, prefix sharing, NLL scope); no gradients.
Result<EvalMetrics> Evaluate(const engine::Model& model, const Dataset& data, const TrainOptions& o,
                             const ObjectiveParams& op, const LoraLayout* layout,
                             const LoraParams<float>* params, int batch_size);

}  // namespace lumen::train
