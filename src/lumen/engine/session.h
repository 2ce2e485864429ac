// Session: one sequence being generated: its KV cache, token history and the
// logits of its last token. Many Sessions share one Model. Append runs the
// forward in chunks of at most model::kMaxChunk tokens (prefill is
// matrix-matrix, decode is one token).
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "lumen/engine/model.h"
#include "lumen/model/forward.h"
#include "lumen/model/kv_cache.h"

namespace lumen::engine {

struct SessionOptions {
  int64_t ctx = 0;  // 0: the model's context, capped at kDefaultCtx
  DType kv_dtype = DType::kF16;
  static constexpr int64_t kDefaultCtx = 4096;
};

// /proc/meminfo MemAvailable in bytes; 0 when it cannot be read.
uint64_t MemAvailableBytes();

// The context a server uses when --ctx is not given: the model's whole
// context (config max_ctx) when `slots` KV caches of that size fit in a
// quarter of `mem_available` bytes, else the largest multiple of 256 that
// does, but never below min(max_ctx, kMinAutoCtx). mem_available 0 (unknown):
// min(max_ctx, kUnknownMemCtx).
int64_t AutoContext(const model::ModelConfig& c, DType kv_dtype, int slots, uint64_t mem_available);
inline constexpr int64_t kMinAutoCtx = 2048;
inline constexpr int64_t kUnknownMemCtx = 8192;

class Session {
 public:
  static Result<std::unique_ptr<Session>> Create(const Model& model, const SessionOptions& opts);

  // Appends tokens; afterwards logits() is the distribution after the last one.
  // If all_logits is given it receives [n, V] logits of every appended token.
  Status Append(std::span<const int32_t> tokens, std::vector<float>* all_logits = nullptr);
  // Forgets tokens from position n on (their KV is overwritten later) and
  // returns how many tokens are kept: n, or 0 when a sliding-window ring has
  // already evicted keys that position n would need (then the caller appends
  // the history again). logits() is invalid until the next Append.
  int64_t Truncate(int64_t n);

  std::span<float> logits() { return logits_; }

  // The adapter set Append runs with (null: none beyond the model-wide one).
  // The caller keeps it alive while it is set; KV appended under one set is
  // only valid for that set (the scheduler's prompt cache is keyed by it).
  void SetLora(const model::LoraSet* lora) { lora_ = lora; }
  const model::LoraSet* lora() const { return lora_; }

  // Continuous batching (engine/ schedulers): the caller runs one
  // Forward::RunBatch over many sessions' caches, then hands each session its
  // token and logits row. Equivalent to Append({token}).
  model::KvCache& batch_cache() { return cache_; }
  int64_t next_pos() const { return static_cast<int64_t>(tokens_.size()); }
  void CommitBatchToken(int32_t token, std::span<const float> logits);
  const std::vector<int32_t>& tokens() const { return tokens_; }
  // Positions [0, whole_chunks()) were appended in whole kMaxChunk-token
  // chunks starting at multiples of kMaxChunk: as a fresh prefill of any
  // longer prompt appends them. On a route whose arithmetic depends on a
  // product's row count (bf16 above 4 rows, int8 up to 8; matmul.h) only
  // those positions carry the bits a fresh prefill would give them.
  int64_t whole_chunks() const { return whole_chunks_; }
  // KV bytes this session has touched: the rows of the most positions it
  // ever held (its cache is allocated for ctx but zeroed lazily). The
  // prompt cache counts entries by it.
  size_t touched_kv_bytes() const { return cache_.BytesFor(most_positions_); }
  int64_t ctx() const { return cache_.ctx(); }
  const Model& model() const { return model_; }
  const model::KvCache& cache() const { return cache_; }

 private:
  Session(const Model& m, model::KvCache cache);
  void NoteLength();  // after tokens_ grew: the high-water marks
  const Model& model_;
  model::KvCache cache_;
  model::Forward forward_;
  std::vector<int32_t> tokens_;
  std::vector<float> logits_;
  int64_t high_water_ = 0;  // most positions ever written since the last reset
  int64_t whole_chunks_ = 0;
  int64_t most_positions_ = 0;  // never lowered: Truncate keeps the pages
  const model::LoraSet* lora_ = nullptr;
};

}  // namespace lumen::engine
