#include "lumen/train/trainer.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>

#include <malloc.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "lumen/core/buffer.h"
#include "lumen/core/log.h"
#include "lumen/core/route.h"
#include "lumen/engine/adapter.h"
#include "lumen/formats/safetensors.h"
#include "lumen/train/fused_head.h"
#include "lumen/train/graph.h"
#include "lumen/train/head.h"
#include "lumen/train/memory_plan.h"
#include "lumen/train/range_probe.h"

namespace lumen::train {

// The lambda controller (lambda_controller.h) runs inside the trainer's step.
LUMEN_ROUTE(
    lambda_adaptive,
    {.node = "train.lambda",
     .name = "adaptive",
     .tier = Tier::kL3,
     .oracle = "none (original controller); static lambda is the baseline",
     .bound = "unit laws of each controller; the experiment's measured outcome",
     .tests = "LambdaControllerTest.*;Controller.ResumeContinuesTheControllerBitIdentically",
     .measure = "docs/experiments/dynamic-lambda.md",
     .when = "train.controller=on",
     .priority = 10});
LUMEN_ROUTE(lambda_static, {.node = "train.lambda",
                            .name = "static",
                            .tier = Tier::kL1,
                            .oracle = "the ORPO paper's fixed lambda",
                            .bound = "bit-identical",
                            .tests = "LambdaControllerTest.*",
                            .priority = 0});
LUMEN_ROUTE(
    train_prefix_share,
    {.node = "train.pairs",
     .name = "prefix-shared",
     .tier = Tier::kL2,
     .oracle = "two forwards per pair",
     .bound = "loss and LoRA gradients within the bound of graph_test.cc; log-probs bit-identical",
     .tests = "Families/PrefixShare.MatchesTwoForwards/"
              "*;Levers.EveryCombinationTrainsAndMatchesThePlainPath",
     .when = "train.prefix_share=on",
     .priority = 10});
LUMEN_ROUTE(train_two_forwards, {.node = "train.pairs",
                                 .name = "two-forwards",
                                 .tier = Tier::kL1,
                                 .oracle = "itself",
                                 .bound = "bit-identical",
                                 .tests = "Methods/PreferenceEfficacy.LiftsValidationAccuracy/*",
                                 .priority = 0});
LUMEN_ROUTE(
    train_grad_accum,
    {.node = "train.step",
     .name = "grad-accum",
     .tier = Tier::kL2,
     .oracle = "one step over the whole batch",
     .bound =
         "adapter within relative L2 5e-2 of the unaccumulated run after 6 steps (measured 3.1e-2: "
         "micro-batches normalize by their own token counts)",
     .tests = "Levers.EveryCombinationTrainsAndMatchesThePlainPath",
     .when = "train.grad_accum=on",
     .priority = 10});
LUMEN_ROUTE(train_step,
            {.node = "train.step",
             .name = "adamw",
             .tier = Tier::kL1,
             .oracle = "itself on resume (bit-identical) and the same seed",
             .bound = "bit-identical",
             .tests = "TrainRun.SameSeedGivesBitIdenticalAdapter;TrainRun.ResumeEndsBitIdentical",
             .priority = 0});

namespace {
namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

// Set by SIGINT; the loop saves a checkpoint at the next step boundary. The
// one process-wide flag a signal handler can touch.
std::atomic<bool> g_interrupted{false};
extern "C" void OnSigint(int) { g_interrupted.store(true); }

// One step's rows packed: sequences and pairs.
struct Packed {
  PackedBatch batch;
  std::vector<Pair> pairs;
  std::vector<int> rows;  // dataset row of each pair
};

struct PackOptions {
  bool preference = false;
  bool mask_prompt = true;
  bool prefix_share = false;
  bool nll_full = false;  // ORPO --sft-scope full
};

Packed Pack(const Dataset& d, std::span<const int> rows, const PackOptions& o) {
  Packed p;
  const bool preference = o.preference, mask_prompt = o.mask_prompt;
  for (int r : rows) {
    const Example& e = d.rows[r];
    const int64_t nll_begin = o.nll_full ? 1 : -1;
    Pair pr;
    if (preference && o.prefix_share) {
      std::tie(pr.chosen, pr.rejected) =
          p.batch.AddSharedPair(e.prompt, e.chosen, e.rejected, nll_begin);
      p.pairs.push_back(pr);
      p.rows.push_back(r);
      continue;
    }
    std::vector<int32_t> seq = e.prompt;
    seq.insert(seq.end(), e.chosen.begin(), e.chosen.end());
    const int64_t begin = mask_prompt || preference ? int64_t(e.prompt.size()) : 1;
    pr.chosen = p.batch.AddSequence(seq, begin, nll_begin);
    if (preference) {
      seq = e.prompt;
      seq.insert(seq.end(), e.rejected.begin(), e.rejected.end());
      pr.rejected = p.batch.AddSequence(seq, begin);
    }
    p.pairs.push_back(pr);
    p.rows.push_back(r);
  }
  return p;
}

// Summed log-probs per sequence of a batch under the base model (adapter off).
std::vector<double> SequenceSums(Graph<float>& g, Head<float>& head, const PackedBatch& b) {
  const auto& h = g.Forward(b, nullptr, {}, false);
  std::vector<float> logp;
  head.Forward(h.data(), b, logp, false);
  std::vector<double> S(b.sequences(), 0.0);
  for (int64_t i = 0; i < b.size(); ++i)
    if (b.targets[i] >= 0 && !b.nll_only[i]) S[b.seq[i]] += double(logp[i]);
  return S;
}

void AddMetrics(EvalMetrics& m, const ObjectiveResult& r) {
  const double w = r.pairs;
  m.loss += r.loss * w;
  m.nll += r.nll * w;
  m.l_w += r.l_w * w;
  m.l_r += r.l_r * w;
  m.margin += r.margin * w;
  m.accuracy += r.accuracy * w;
  m.pairs += r.pairs;
}
void FinishMetrics(EvalMetrics& m) {
  if (m.pairs == 0) return;
  for (double* v : {&m.loss, &m.nll, &m.l_w, &m.l_r, &m.margin, &m.accuracy}) *v /= m.pairs;
}

json MetricsJson(const EvalMetrics& m) {
  return {{"loss", m.loss}, {"nll", m.nll},       {"l_w", m.l_w},
          {"l_r", m.l_r},   {"margin", m.margin}, {"accuracy", m.accuracy}};
}

// The run's state a checkpoint holds (with the adapter).
struct State {
  LoraParams<float> params;
  std::vector<float> m, v;
  int64_t step = 0;
  int64_t cursor = 0;         // rows consumed
  nlohmann::json controller;  // LambdaController::Serialize (null: none saved)
};

Status SaveCheckpoint(const fs::path& dir, const LoraLayout& layout, const State& st,
                      const model::ModelConfig& c, const std::string& base) {
  const fs::path final_dir = dir / fmt::format("step-{:08d}", st.step);
  const fs::path tmp = dir / fmt::format(".tmp-step-{:08d}", st.step);
  std::error_code ec;
  // A run killed mid-save (SIGKILL, power) leaves its temporaries: a
  // .tmp-step-* directory or latest.tmp.<pid>. `latest` still names a whole
  // checkpoint; the leftovers go at the next save.
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(".tmp-step-", 0) == 0 || name.rfind("latest.tmp.", 0) == 0)
      fs::remove_all(e.path(), ec);
  }
  ec.clear();
  fs::create_directories(tmp, ec);
  if (ec) return Errorf("checkpoint {}: {}", tmp.string(), ec.message());
  LUMEN_RETURN_IF_ERROR(engine::SaveAdapter(tmp.string(), ToAdapter(layout, st.params, base), c));
  formats::SafetensorsWriter w;
  auto add = [&](const char* name, const std::vector<float>& v) {
    return w.AddBorrowed(name, DType::kF32, {int64_t(v.size())}, v.data(), v.size() * 4);
  };
  LUMEN_RETURN_IF_ERROR(add("params", st.params.w));
  LUMEN_RETURN_IF_ERROR(add("adam_m", st.m));
  LUMEN_RETURN_IF_ERROR(add("adam_v", st.v));
  w.SetMetadata("step", std::to_string(st.step));
  w.SetMetadata("cursor", std::to_string(st.cursor));
  if (!st.controller.is_null()) w.SetMetadata("controller", st.controller.dump());
  LUMEN_RETURN_IF_ERROR(w.Write((tmp / "state.safetensors").string()));
  fs::remove_all(final_dir, ec);
  fs::rename(tmp, final_dir, ec);
  if (ec) return Errorf("checkpoint {}: rename failed: {}", final_dir.string(), ec.message());
  return WriteFileAtomic((dir / "latest").string(), final_dir.filename().string() + "\n");
}

Result<State> LoadCheckpoint(const std::string& resume, const LoraLayout& layout) {
  fs::path dir = resume;
  if (fs::exists(dir / "checkpoints" / "latest")) dir = dir / "checkpoints";
  if (fs::exists(dir / "latest")) {
    std::ifstream f(dir / "latest");
    std::string name;
    f >> name;
    dir = dir / name;
  }
  const std::string path = (dir / "state.safetensors").string();
  if (!fs::exists(path))
    return Errorf("--resume {}: no checkpoint (state.safetensors) found", resume);
  LUMEN_ASSIGN_OR_RETURN(auto st, formats::SafetensorsFile::Open(path));
  State s;
  auto get = [&](const char* name, std::vector<float>& out) -> Status {
    const auto* t = st.Find(name);
    if (!t || t->dtype != DType::kF32 || t->view.numel() != layout.size)
      return Errorf(
          "{}: '{}' is missing or not {} f32 values (a checkpoint of another run "
          "configuration?)",
          path, name, layout.size);
    out.resize(layout.size);
    std::memcpy(out.data(), t->view.data, out.size() * 4);
    return Status::Ok();
  };
  LUMEN_RETURN_IF_ERROR(get("params", s.params.w));
  LUMEN_RETURN_IF_ERROR(get("adam_m", s.m));
  LUMEN_RETURN_IF_ERROR(get("adam_v", s.v));
  try {
    s.step = std::stoll(st.metadata().value("step", "x"));
    s.cursor = std::stoll(st.metadata().value("cursor", "x"));
    if (st.metadata().contains("controller"))
      s.controller = nlohmann::json::parse(st.metadata()["controller"].get<std::string>());
  } catch (...) {
    return Errorf("{}: metadata lacks step/cursor", path);
  }
  return s;
}

double LearningRate(const TrainOptions& o, int64_t step, int64_t total) {
  if (o.warmup > 0 && step < o.warmup) return o.lr * double(step + 1) / double(o.warmup);
  const double span = double(std::max<int64_t>(1, total - o.warmup));
  const double t = std::min(1.0, double(step - o.warmup) / span);
  switch (o.schedule) {
    case LrSchedule::kCosine:
      return o.lr * 0.5 * (1.0 + std::cos(M_PI * t));
    case LrSchedule::kLinear:
      return o.lr * (1.0 - t);
    default:
      return o.lr;
  }
}

std::unique_ptr<Head<float>> MakeHead(const engine::Model& m, const TrainOptions& o) {
  std::unique_ptr<Head<float>> head;
  if (!o.fused_ce) {
    head = std::make_unique<PlainHead<float>>(m.config(), m.weights(), m.pool());
  } else {
    FusedHeadOptions fo;
    fo.vocab_chunk = o.vocab_chunk;
    fo.skip_eps = o.ce_skip_eps;
    head = std::make_unique<FusedHead<float>>(m.config(), m.weights(), m.pool(), fo);
  }
  head->set_compute((Bf16Kinds(o.compute) & kHeadChunks) != 0, nullptr);
  return head;
}

class Runner {
 public:
  Runner(const engine::Model& model, const LoraLayout* layout, const TrainOptions& o)
      : graph(model.config(), model.weights(), layout, model.pool()), head(MakeHead(model, o)) {
    graph.set_segment(o.segment);
    graph.set_mlp_chunk(o.mlp_chunk);
    graph.set_bf16(Bf16Kinds(o.compute));
  }
  Graph<float> graph;
  std::unique_ptr<Head<float>> head;
  std::map<int, std::pair<double, double>> ref_cache;  // row -> (ref_w, ref_r)

  void FillRefs(const Dataset& d, Packed& p, const PackOptions& po) {
    for (size_t i = 0; i < p.pairs.size(); ++i) {
      auto it = ref_cache.find(p.rows[i]);
      if (it == ref_cache.end()) {
        const int r = p.rows[i];
        Packed one = Pack(d, std::span<const int>(&r, 1), po);
        const auto S = SequenceSums(graph, *head, one.batch);
        it = ref_cache.emplace(r, std::make_pair(S[0], S[1])).first;
      }
      p.pairs[i].ref_chosen = it->second.first;
      p.pairs[i].ref_rejected = it->second.second;
    }
  }
};

}  // namespace

Result<EvalMetrics> Evaluate(const engine::Model& model, const Dataset& data, const TrainOptions& o,
                             const ObjectiveParams& op, const LoraLayout* layout,
                             const LoraParams<float>* params, int batch_size) {
  const Method m = o.method;
  Runner run(model, layout, o);
  EvalMetrics out;
  const bool pref = IsPreference(m);
  if (pref && data.kind != RowKind::kPreference)
    return Errorf("{}: {} needs preference rows", data.path, MethodName(m));
  const PackOptions po{pref, true, o.prefix_share, o.sft_scope_full};
  for (int b = 0; b < int(data.rows.size()); b += batch_size) {
    std::vector<int> rows;
    for (int r = b; r < std::min<int>(b + batch_size, int(data.rows.size())); ++r)
      rows.push_back(r);
    Packed p = Pack(data, rows, po);
    if (NeedsReference(m)) run.FillRefs(data, p, po);
    const auto& h = run.graph.Forward(p.batch, params, {}, false);
    std::vector<float> logp, dlogp;
    run.head->Forward(h.data(), p.batch, logp, false);
    AddMetrics(out, Objective(m, op, p.batch, logp, p.pairs, dlogp));
  }
  FinishMetrics(out);
  return out;
}

Result<TrainResult> Train(const engine::Model& model, const TrainOptions& opts) {
  const model::ModelConfig& c = model.config();
  TrainOptions o = opts;  // --memory-budget resolves o.segment
  // Buffers of a megabyte or more are mapped and unmapped on their own, so
  // freed activations leave the process at once (glibc would otherwise raise
  // its threshold after the first large free and keep them in the heap): the
  // peak then follows the live bytes that the memory plan counts.
  ::mallopt(M_MMAP_THRESHOLD, 1 << 20);
  // The model's files may sit in anonymous memory (a huge-page copy): they
  // are weights, which the plan counts separately, not process baseline. The
  // code's mapped pages are baseline (the weights' mapped pages are not).
  const size_t anon = AnonymousRss(), copied = model.copied_bytes();
  const size_t baseline = (anon > copied ? anon - copied : 0) + CodeRss();
  if (o.batch_size < 1) return Errorf("--batch-size {}: must be at least 1", o.batch_size);
  if (o.grad_accum < 1) return Errorf("--grad-accum {}: must be at least 1", o.grad_accum);
  // Counts below their floor and non-finite rates are refused here, before
  // the output directory exists, rather than meeting them as a non-finite
  // gradient (or a silent fallback) steps later.
  auto nonneg = [](double v) { return std::isfinite(v) && v >= 0; };  // NaN fails
  auto positive = [](double v) { return std::isfinite(v) && v > 0; };
  auto unit = [&](double v) { return nonneg(v) && v < 1; };
  if (!positive(o.lr)) return Errorf("--lr {}: must be a positive finite number", o.lr);
  if (o.iters < 0) return Errorf("--iters {}: must be 0 (use --epochs) or more", o.iters);
  if (o.epochs < 1) return Errorf("--epochs {}: must be at least 1", o.epochs);
  if (o.warmup < 0) return Errorf("--warmup {}: must be 0 or more", o.warmup);
  if (o.steps_per_report < 1)
    return Errorf("--steps-per-report {}: must be at least 1", o.steps_per_report);
  if (o.steps_per_eval < 0)
    return Errorf("--steps-per-eval {}: must be 0 (at the end) or more", o.steps_per_eval);
  if (o.save_every < 0) return Errorf("--save-every {}: must be 0 (off) or more", o.save_every);
  if (o.val_size < 0) return Errorf("--val-size {}: must be 0 or more", o.val_size);
  if (o.memory_budget_mb < 0)
    return Errorf("--memory-budget {}: must be 0 (off) or more MB", o.memory_budget_mb);
  if (o.mlp_chunk < 0) return Errorf("--mlp-chunk {}: must be 0 (off) or more", o.mlp_chunk);
  if (o.control_every < 0)
    return Errorf("--control-every {}: must be 0 (each evaluation) or more", o.control_every);
  if (!nonneg(o.grad_clip))
    return Errorf("--grad-clip {}: must be 0 (off) or a positive finite number", o.grad_clip);
  if (!nonneg(o.weight_decay))
    return Errorf("--weight-decay {}: must be 0 or a positive finite number", o.weight_decay);
  if (!positive(o.eps)) return Errorf("--eps {}: must be a positive finite number", o.eps);
  if (!unit(o.beta1) || !unit(o.beta2))
    return Errorf("--betas {} {}: each must be in [0, 1)", o.beta1, o.beta2);
  if (!positive(o.lora_plus_ratio))
    return Errorf("--lora-plus-ratio {}: must be a positive finite number", o.lora_plus_ratio);
  if (!nonneg(o.ce_skip_eps))
    return Errorf("--ce-skip-eps {}: must be 0 (off) or a positive finite number", o.ce_skip_eps);
  if (o.ce_skip_eps > 0 && o.fused_ce)
    LUMEN_LOG_WARN(
        "--ce-skip-eps {}: the fused head recomputes its logits in the backward to skip chunks "
        "(tier L3), which is slower than the default one-pass head; it is kept for measurement",
        o.ce_skip_eps);
  LUMEN_RETURN_IF_ERROR(ValidateCompute(o.compute));
  if (o.out_dir.empty()) return Error("--out: an adapter directory is required");
  LUMEN_ASSIGN_OR_RETURN(LoraLayout layout, LoraLayout::Make(c, o.lora));
  const fs::path data_dir = o.data_dir;
  Dataset train;
  if (o.preloaded) {
    train = *o.preloaded;
  } else {
    if (!fs::is_directory(data_dir)) return Errorf("--data {}: not a directory", o.data_dir);
    LUMEN_ASSIGN_OR_RETURN(train, LoadJsonl((data_dir / "train.jsonl").string(), model, o.data));
  }
  const bool pref = IsPreference(o.method);
  if (pref != (train.kind == RowKind::kPreference))
    return Errorf("{}: {} rows, but --method {} needs {}", train.path, RowKindName(train.kind),
                  MethodName(o.method), pref ? "prompt/chosen/rejected rows" : "SFT rows");
  Dataset valid;
  bool have_valid = false;
  if (!o.preloaded && fs::exists(data_dir / "valid.jsonl")) {
    LUMEN_ASSIGN_OR_RETURN(valid, LoadJsonl((data_dir / "valid.jsonl").string(), model, o.data));
    if (valid.kind != train.kind)
      return Errorf("{}: {} rows but train.jsonl has {} rows", valid.path, RowKindName(valid.kind),
                    RowKindName(train.kind));
    have_valid = true;
  } else if (o.val_size > 0) {
    if (o.val_size >= int(train.rows.size()))
      return Errorf("--val-size {}: train.jsonl has only {} rows", o.val_size, train.rows.size());
    valid.path = train.path + " (held out)";
    valid.kind = train.kind;
    valid.rows.assign(train.rows.end() - o.val_size, train.rows.end());
    train.rows.resize(train.rows.size() - o.val_size);
    have_valid = true;
  }
  // The controller's probe set (--control-every): rows held out of train.jsonl,
  // separate from the reported validation set.
  Dataset probe;
  if (o.control_every > 0) {
    if (o.control_probe < 1 || o.control_probe * 2 > int(train.rows.size()))
      return Errorf("--control-probe {}: train.jsonl has {} rows", o.control_probe,
                    train.rows.size());
    probe.path = train.path + " (probe)";
    probe.kind = train.kind;
    probe.rows.assign(train.rows.end() - o.control_probe, train.rows.end());
    train.rows.resize(train.rows.size() - o.control_probe);
  }
  if (o.controller.kind != ControllerKind::kStatic) {
    if (!(o.method == Method::kOrpo || (o.control_beta && o.method == Method::kSimpo)))
      return Errorf(
          "--lambda-schedule adaptive drives ORPO's lambda or (--controlled-param "
          "beta) SimPO's beta, not --method {}",
          MethodName(o.method));
    if (!have_valid && o.control_every == 0)
      return Error(
          "--lambda-schedule adaptive needs readings: a valid.jsonl, --val-size or "
          "--control-every");
    LUMEN_RETURN_IF_ERROR(ValidateControllerOptions(o.controller));
  }
  State st;
  st.params = InitLora(layout, o.seed);
  st.m.assign(layout.size, 0.0f);
  st.v.assign(layout.size, 0.0f);
  if (!o.resume_dir.empty()) {
    LUMEN_ASSIGN_OR_RETURN(st, LoadCheckpoint(o.resume_dir, layout));
  }
  if (train.truncated)
    LUMEN_LOG_WARN("{}: {} rows cut to --max-seq-len {}", train.path, train.truncated,
                   o.data.max_seq_len);
  if (train.skipped) LUMEN_LOG_WARN("{}: {} bad rows skipped", train.path, train.skipped);

  const int64_t N = int64_t(train.rows.size());
  const int64_t per_step = int64_t(o.batch_size) * o.grad_accum;
  const int64_t total =
      o.iters > 0 ? o.iters : std::max<int64_t>(1, (N * o.epochs + per_step - 1) / per_step);

  // The memory plan for the largest micro-batch (an upper bound: the
  // longest rows packed together).
  PlanInputs plan_in;
  {
    std::vector<int64_t> row_tokens, row_scored;
    for (const Example& e : train.rows) {
      const int64_t P = int64_t(e.prompt.size()), C = int64_t(e.chosen.size()),
                    Rj = int64_t(e.rejected.size());
      row_tokens.push_back(!pref ? P + C : o.prefix_share ? P + C + 1 + Rj : 2 * P + C + Rj);
      row_scored.push_back(C + Rj + (o.sft_scope_full ? P : 0));
    }
    std::sort(row_tokens.rbegin(), row_tokens.rend());
    std::sort(row_scored.rbegin(), row_scored.rend());
    for (int b = 0; b < std::min<int>(o.batch_size, int(row_tokens.size())); ++b) {
      plan_in.tokens += row_tokens[b];
      plan_in.scored += row_scored[b];
    }
  }
  plan_in.weight_bytes = model.weight_bytes();
  plan_in.baseline = baseline;
  plan_in.fused_ce = o.fused_ce;
  plan_in.vocab_chunk = o.vocab_chunk;
  plan_in.mlp_chunk = o.mlp_chunk;
  plan_in.bf16 = o.compute == Compute::kBf16;
  plan_in.threads = model.pool() ? model.pool()->size() : 1;
  if (o.memory_budget_mb > 0) {
    LUMEN_ASSIGN_OR_RETURN(auto choice,
                           ChooseSegment(c, layout, plan_in, size_t(o.memory_budget_mb) << 20));
    o.segment = choice.segment;
    o.mlp_chunk = choice.mlp_chunk;
  }
  plan_in.segment = o.segment;
  plan_in.mlp_chunk = o.mlp_chunk;
  const MemoryPlan plan = PlanMemory(c, layout, plan_in);
  TrainResult result;
  result.plan = plan.Describe(c, plan_in);
  result.predicted_peak_mb = double(plan.peak) / (1024.0 * 1024.0);
  if (o.plan_only) return result;

  // Everything validated: create the outputs.
  const fs::path out = o.out_dir;
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec) return Errorf("--out {}: {}", o.out_dir, ec.message());
  json cfg = {
      {"method", MethodName(o.method)},
      {"base_model", o.model_name},
      {"data", o.data_dir},
      {"rank", o.lora.rank},
      {"alpha", o.lora.alpha},
      {"scale", o.lora.Scale()},
      {"rs_lora", o.lora.rs_lora},
      {"targets", TargetsString(o.lora.targets)},
      {"num_layers", o.lora.num_layers},
      {"dropout", o.lora.dropout},
      {"beta", o.objective.beta},
      {"gamma", o.objective.gamma},
      {"lambda", o.objective.lambda},
      {"label_smoothing", o.objective.label_smoothing},
      {"batch_size", o.batch_size},
      {"grad_accum", o.grad_accum},
      {"iters", total},
      {"lr", o.lr},
      {"betas", {o.beta1, o.beta2}},
      {"eps", o.eps},
      {"weight_decay", o.weight_decay},
      {"warmup", o.warmup},
      {"grad_clip", o.grad_clip},
      {"lora_plus_ratio", o.lora_plus_ratio},
      {"seed", o.seed},
      {"max_seq_len", o.data.max_seq_len},
      {"mask_prompt", o.mask_prompt},
      {"fused_ce", o.fused_ce},
      {"ce_skip_eps", o.ce_skip_eps},
      {"prefix_share", o.prefix_share},
      {"segment", o.segment},
      {"compute", ComputeName(o.compute)},
      {"probe_ranges", o.probe_ranges},
      {"sft_scope", o.sft_scope_full ? "full" : "response"},
      {"lambda_schedule", o.controller.kind == ControllerKind::kStatic ? "static" : "adaptive"},
      {"lambda_controller", ControllerKindName(o.controller.kind)},
      {"controlled_param", o.control_beta ? "beta" : "lambda"},
      {"control_every", o.control_every},
      {"threads", model.pool() ? model.pool()->size() : 1}};
  LUMEN_RETURN_IF_ERROR(WriteFileAtomic((out / "config.json").string(), cfg.dump(2) + "\n"));
  // The handler is in place before metrics.jsonl exists: a Ctrl-C from then on
  // checkpoints instead of killing (restored on every return by the guard).
  g_interrupted.store(false);
  const auto old_handler = std::signal(SIGINT, OnSigint);
  struct RestoreSigint {
    decltype(old_handler) h;
    ~RestoreSigint() { std::signal(SIGINT, h); }
  } restore_sigint{old_handler};
  std::ofstream metrics((out / "metrics.jsonl").string(),
                        o.resume_dir.empty() ? std::ios::trunc : std::ios::app);

  Runner run(model, &layout, o);
  std::unique_ptr<RangeProbe> ranges;
  if (o.probe_ranges) {
    ranges = std::make_unique<RangeProbe>();
    run.graph.set_probe(ranges.get());
    run.head->set_compute((Bf16Kinds(o.compute) & kHeadChunks) != 0, ranges.get());
  }
  const PackOptions po{pref, o.mask_prompt, o.prefix_share, o.sft_scope_full};
  // The controlled pressure: ORPO's lambda, or SimPO's beta.
  ControllerOptions co = o.controller;
  co.initial = o.control_beta ? o.objective.beta : o.objective.lambda;
  LambdaController controller(co);
  if (st.controller.is_object()) {
    LUMEN_ASSIGN_OR_RETURN(controller, LambdaController::Restore(co, st.controller));
  }
  auto objective_now = [&] {
    ObjectiveParams op = o.objective;
    (o.control_beta ? op.beta : op.lambda) = controller.value();
    return op;
  };
  auto evaluate = [&]() -> Result<EvalMetrics> {
    return Evaluate(model, valid, o, objective_now(), &layout, &st.params, o.batch_size);
  };
  auto control = [&](const EvalMetrics& m, std::ofstream& log) {
    if (co.kind == ControllerKind::kStatic) return;
    controller.Update({st.step, m.l_w, m.l_r, m.margin, m.accuracy, m.nll});
    if (!controller.last_reason().empty()) {
      if (!o.quiet) fmt::print(stderr, "step {}: {}\n", st.step, controller.last_reason());
      json j = {{"kind", "control"},
                {"step", st.step},
                {"value", controller.value()},
                {"phase", PhaseName(controller.phase())},
                {"reason", controller.last_reason()}};
      log << j.dump() << "\n" << std::flush;
    }
  };
  if (have_valid && st.step == 0) {
    LUMEN_ASSIGN_OR_RETURN(result.first_eval, evaluate());
    json j = MetricsJson(result.first_eval);
    j["kind"] = "eval";
    j["step"] = 0;
    metrics << j.dump() << "\n" << std::flush;
    if (o.control_every == 0) control(result.first_eval, metrics);
  }
  if (o.control_every > 0 && st.step == 0) {
    LUMEN_ASSIGN_OR_RETURN(
        auto pr, Evaluate(model, probe, o, objective_now(), &layout, &st.params, o.batch_size));
    control(pr, metrics);
  }

  // Per-epoch permutations, derived from (seed, epoch).
  // The cursor only moves forward, so one epoch's order is kept at a time.
  std::vector<int> perm(N);
  int64_t perm_epoch = -1;
  auto row_at = [&](int64_t cursor) {
    const int64_t epoch = cursor / N;
    if (epoch != perm_epoch) {
      for (int64_t i = 0; i < N; ++i) perm[i] = int(i);
      for (int64_t i = N - 1; i > 0; --i)
        std::swap(perm[i],
                  perm[HashKey({o.seed, 0xE, uint64_t(epoch), uint64_t(i)}) % uint64_t(i + 1)]);
      perm_epoch = epoch;
    }
    return perm[cursor % N];
  };

  LoraParams<float> grad;
  EvalMetrics window;
  int64_t window_tokens = 0;
  auto t0 = std::chrono::steady_clock::now();
  const auto run_start = t0;
  const int64_t first_step = st.step;
  const bool tty = !o.quiet && ::isatty(2);
  // Seconds left, from the mean step time of this process so far.
  auto eta = [&] {
    const double el =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
    const int64_t done = st.step - first_step;
    return done > 0 ? el / double(done) * double(total - st.step) : 0.0;
  };
  const std::string ckpt_dir = (out / "checkpoints").string();
  Status status = Status::Ok();
  StepProfile& prof = result.profile;
  run.graph.set_profile(&prof);
  while (st.step < total) {
    const auto step_start = std::chrono::steady_clock::now();
    grad.w.assign(layout.size, 0.0f);
    for (int micro = 0; micro < o.grad_accum; ++micro) {
      std::vector<int> rows;
      for (int b = 0; b < o.batch_size; ++b) rows.push_back(row_at(st.cursor++));
      Packed p = Pack(train, rows, po);
      if (NeedsReference(o.method)) run.FillRefs(train, p, po);
      const auto& h = run.graph.Forward(p.batch, &st.params, {o.seed, uint64_t(st.step)}, true);
      std::vector<float> logp, dlogp, dh;
      {
        PhaseTimer timer(&prof.head_s);
        run.head->Forward(h.data(), p.batch, logp, true);
        const ObjectiveResult r =
            Objective(o.method, objective_now(), p.batch, logp, p.pairs, dlogp);
        AddMetrics(window, r);
        window_tokens += p.batch.size();
        if (o.grad_accum > 1)
          for (float& g : dlogp) g /= float(o.grad_accum);
        run.head->Backward(dlogp.data(), dh);
      }
      run.graph.Backward(p.batch, st.params, std::move(dh), grad);
      run.graph.AddStepFlops(p.batch, prof);
      int64_t scored = 0;
      for (int32_t t : p.batch.targets) scored += t >= 0;
      // Logits forward and dh backward: 2 flops per multiply-add each.
      prof.head_flops +=
          4.0 * double(scored) * double(model.config().dim) * double(model.config().vocab_size);
    }
    std::optional<PhaseTimer> opt_timer(&prof.optimizer_s);
    double norm2 = 0;
    for (float g : grad.w) norm2 += double(g) * g;
    const double norm = std::sqrt(norm2);
    if (!std::isfinite(norm)) {
      status = Errorf("step {}: the gradient is not finite (lower --lr?)", st.step + 1);
      break;
    }
    const float clip = o.grad_clip > 0 && norm > o.grad_clip ? float(o.grad_clip / norm) : 1.0f;
    const double lr = LearningRate(o, st.step, total);
    const int64_t t = st.step + 1;
    const double bc1 = 1.0 - std::pow(o.beta1, double(t)), bc2 = 1.0 - std::pow(o.beta2, double(t));
    for (const LoraSlot& s : layout.slots) {
      const int64_t na = int64_t(layout.cfg.rank) * s.k, nb = s.n * layout.cfg.rank;
      for (auto [off, n, mult] :
           {std::tuple{s.a_off, na, 1.0}, std::tuple{s.b_off, nb, o.lora_plus_ratio}}) {
        const float lr_p = float(lr * mult);
        for (int64_t i = off; i < off + n; ++i) {
          const float g = grad.w[i] * clip;
          st.m[i] = float(o.beta1) * st.m[i] + float(1 - o.beta1) * g;
          st.v[i] = float(o.beta2) * st.v[i] + float(1 - o.beta2) * g * g;
          const float mh = st.m[i] / float(bc1), vh = st.v[i] / float(bc2);
          st.params.w[i] -=
              lr_p * (mh / (std::sqrt(vh) + float(o.eps)) + float(o.weight_decay) * st.params.w[i]);
        }
      }
    }
    opt_timer.reset();
    ++st.step;
    result.step_seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count());
    prof.total_s += result.step_seconds.back();
    ++prof.steps;
    const bool report = st.step % std::max<int64_t>(1, o.steps_per_report) == 0 || st.step == total;
    if (report) {
      FinishMetrics(window);
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      json j = MetricsJson(window);
      j["kind"] = "train";
      j["step"] = st.step;
      j["lambda"] = o.control_beta ? o.objective.lambda : controller.value();
      if (o.control_beta) j["beta"] = controller.value();
      j["phase"] = PhaseName(controller.phase());
      j["lr"] = lr;
      j["grad_norm"] = norm;
      j["tokens_per_s"] = secs > 0 ? double(window_tokens) / secs : 0.0;
      j["peak_rss_mb"] = PeakRssMb();
      metrics << j.dump() << "\n" << std::flush;
      if (!o.quiet)
        fmt::print(stderr,
                   "{}step {}/{} loss {:.4f} nll {:.4f} acc {:.2f} lr {:.2e} {:.0f} tok/s ETA "
                   "{:.0f}s\n",
                   tty ? "\r\033[K" : "", st.step, total, window.loss, window.nll, window.accuracy,
                   lr, secs > 0 ? double(window_tokens) / secs : 0.0, eta());
      window = {};
      window_tokens = 0;
      t0 = std::chrono::steady_clock::now();
    }
    if (have_valid &&
        ((o.steps_per_eval > 0 && st.step % o.steps_per_eval == 0) || st.step == total)) {
      auto ev = evaluate();
      if (!ev.ok()) {
        status = ev.status();
        break;
      }
      result.last_eval = *ev;
      json j = MetricsJson(*ev);
      j["kind"] = "eval";
      j["step"] = st.step;
      metrics << j.dump() << "\n" << std::flush;
      if (o.control_every == 0) control(*ev, metrics);
    }
    if (o.control_every > 0 && st.step % o.control_every == 0) {
      auto pr = Evaluate(model, probe, o, objective_now(), &layout, &st.params, o.batch_size);
      if (!pr.ok()) {
        status = pr.status();
        break;
      }
      control(*pr, metrics);
    }
    const bool interrupted = g_interrupted.load();
    if ((o.save_every > 0 && st.step % o.save_every == 0) || interrupted) {
      st.controller = controller.Serialize();
      status = SaveCheckpoint(ckpt_dir, layout, st, c, o.model_name);
      if (!status.ok()) break;
    }
    if (interrupted) {
      result.interrupted = true;
      LUMEN_LOG_WARN("interrupted: checkpoint at step {} in {} (continue with --resume {})",
                     st.step, ckpt_dir, o.out_dir);
      break;
    }
  }
  LUMEN_RETURN_IF_ERROR(status);
  if (ranges) {
    result.ranges = ranges->Describe();
    json j = {{"kind", "ranges"}, {"step", st.step}, {"sites", ranges->Json()}};
    metrics << j.dump() << "\n" << std::flush;
  }
  LUMEN_RETURN_IF_ERROR(
      engine::SaveAdapter(o.out_dir, ToAdapter(layout, st.params, o.model_name), c));
  result.steps = st.step;
  return result;
}

}  // namespace lumen::train
