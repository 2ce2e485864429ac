// Fit: the memory admission arithmetic behind `lumen fit` (and, later, the
// server's admission): how many bytes a model needs to serve P sequences of
// ctx tokens, whether that fits a budget, the largest context that does, and
// the decode speed the measured memory bandwidth predicts.
//
// Bytes, as lumen allocates them (so the numbers are the allocation, not an
// estimate):
//   weights    every stored tensor (Model::weight_bytes; mapped, resident
//              once paged in).
//   KV         per sequence, as model::KvCache::Create sizes it: each layer
//              holds K and V rows of Hkv * Dh elements of the KV type
//              (RowBytes: q8_0 is 34 bytes per 32); a full-attention layer
//              holds ctx rows, a sliding-window layer min(ctx, window +
//              kMaxChunk) rows, so it stops growing at its window. The growth
//              per token once every window is full is kv_bytes_per_token.
//   transient  per sequence (each Session owns a model::Forward): the
//              activations (model::Activations::Floats: x and xn [D] for
//              kMaxChunk tokens, and a work buffer for the larger of their qkv
//              [H*Dh + 2*Hkv*Dh] and att [H*Dh], their FFN gate and up for one
//              piece of the hidden width and the FFN's output [D], and a decode
//              step's gate and up over the whole width),
//              the attention partials [threads, H*Dh], the attention scratch
//              [threads, ctx * (H + 1) + 2 * Hkv * Dh] and one logits row [V],
//              all f32.
//   total      weights + P * (KV + transient); fits when total <= budget.
// Decode speed (memory-bound): one token reads every matrix once plus one
// embedding row (weight_bytes_per_token) and, at position p, the K and V rows
// it attends to (p + 1 per full layer, min(p + 1, window) per sliding layer);
// tokens/s = bandwidth / bytes read. P sequences decoded in one batched step
// read the weights once: P * bandwidth / (weights + P * KV read).
//
// Example (cli/fit.cc):
//   auto r = Fit(*model, {.ctx = 8192, .parallel = 4, .bandwidth = 20e9});
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "lumen/core/dtype.h"
#include "lumen/core/status.h"
#include "lumen/engine/model.h"
#include "lumen/model/config.h"

namespace lumen::engine {

struct FitOptions {
  int64_t ctx = 0;               // 0: the model's whole context (config max_ctx)
  int parallel = 1;              // sequences held at once (one KV cache each)
  DType kv_dtype = DType::kF16;  // f16, bf16, f32 or q8_0
  uint64_t budget_bytes = 0;     // 0: MemAvailable from /proc/meminfo
  double bandwidth = 0;          // bytes/s; 0: no speed prediction
  int threads = 0;               // 0: the model's thread pool size
  // The server accepts a --ctx beyond the model's trained context (lumen fit
  // refuses it): allow it here too, and search max_ctx up to it.
  bool beyond_model_ctx = false;
};

struct FitReport {
  int64_t ctx = 0;
  int parallel = 1;
  DType kv_dtype = DType::kF16;
  uint64_t weight_bytes = 0;
  uint64_t weight_bytes_per_token = 0;  // read per decoded token
  uint64_t kv_bytes_per_token = 0;      // growth per token (full-attention layers)
  uint64_t kv_bytes_per_seq = 0;        // one sequence's cache at ctx
  uint64_t transient_bytes_per_seq = 0;
  uint64_t total_bytes = 0;
  uint64_t budget_bytes = 0;
  bool fits = false;
  int64_t max_ctx = 0;            // largest context <= the model's that fits (0: none)
  double bandwidth = 0;           // bytes/s used for the predictions (0: none)
  double decode_tok_s_start = 0;  // one sequence at position 0
  double decode_tok_s_full = 0;   // one sequence at position ctx - 1
  double decode_tok_s_batch = 0;  // all P sequences at ctx - 1, in one batched step
};

// The arithmetic, from a config alone (tests hand-compute these).
uint64_t KvBytesPerSeq(const model::ModelConfig& c, DType kv, int64_t ctx);
uint64_t KvBytesPerToken(const model::ModelConfig& c, DType kv);
uint64_t KvReadBytes(const model::ModelConfig& c, DType kv, int64_t pos);
uint64_t TransientBytesPerSeq(const model::ModelConfig& c, int threads, int64_t ctx);

Result<FitReport> Fit(const Model& model, const FitOptions& opts);

// The report as JSON, one key per FitReport field (kv_dtype as "kv_type": its
// name), for `lumen fit --json` and the server's GET /fit.
nlohmann::ordered_json FitReportJson(const FitReport& r);

// Read bandwidth of this machine in bytes/s (all threads, median of
// MeasureMemBandwidth), measured once and cached in
// $XDG_CACHE_HOME/lumen/membw.json (else ~/.cache/lumen/membw.json) keyed by
// the CPU model string (/proc/cpuinfo "model name") and the thread count.
// remeasure: measure and overwrite the entry. `source` receives "cached FILE"
// or "measured (cached in FILE)".
Result<double> MachineBandwidth(int threads, bool remeasure, std::string* source = nullptr);
std::string CpuModelName();

}  // namespace lumen::engine
