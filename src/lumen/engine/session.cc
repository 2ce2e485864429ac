#include "lumen/engine/session.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace lumen::engine {

uint64_t MemAvailableBytes() {
  FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  uint64_t kb = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "MemAvailable: %lu kB", &kb) == 1) break;
  std::fclose(f);
  return kb * 1024;
}

int64_t AutoContext(const model::ModelConfig& c, DType kv_dtype, int slots,
                    uint64_t mem_available) {
  const int64_t max_ctx = std::max<int64_t>(c.max_ctx, 1);
  if (mem_available == 0) return std::min(max_ctx, kUnknownMemCtx);
  // KV bytes per position: every layer's K and V row (sliding-window layers
  // are counted in full, which only errs towards a smaller context).
  auto row = RowBytes(kv_dtype, c.kv_dim());
  const uint64_t per_pos = 2 * uint64_t(std::max(c.n_layers, 1)) * (row ? *row : 0);
  if (per_pos == 0) return std::min(max_ctx, kUnknownMemCtx);
  const uint64_t budget = mem_available / 4 / uint64_t(std::max(slots, 1));
  int64_t fit = static_cast<int64_t>(budget / per_pos) / 256 * 256;
  fit = std::max(fit, std::min(max_ctx, kMinAutoCtx));
  return std::min(max_ctx, fit);
}

Session::Session(const Model& m, model::KvCache cache)
    : model_(m),
      cache_(std::move(cache)),
      forward_(m.config(), m.weights(), m.pool()),
      logits_(m.config().vocab_size) {}

Result<std::unique_ptr<Session>> Session::Create(const Model& model, const SessionOptions& opts) {
  int64_t ctx = opts.ctx > 0
                    ? opts.ctx
                    : std::min<int64_t>(model.config().max_ctx, SessionOptions::kDefaultCtx);
  LUMEN_ASSIGN_OR_RETURN(model::KvCache cache,
                         model::KvCache::Create(model.config(), ctx, opts.kv_dtype));
  return std::unique_ptr<Session>(new Session(model, std::move(cache)));
}

Status Session::Append(std::span<const int32_t> tokens, std::vector<float>* all_logits) {
  if (tokens.empty()) return Error("append: no tokens");
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t pos0 = static_cast<int64_t>(tokens_.size());
  if (pos0 + n > cache_.ctx())
    return Errorf(
        "prompt too long: {} tokens after {} already in context exceed the context "
        "size {} (raise --ctx)",
        n, pos0, cache_.ctx());
  const int64_t V = model_.config().vocab_size;
  if (all_logits) all_logits->resize(size_t(n * V));
  for (int64_t off = 0; off < n; off += model::kMaxChunk) {
    const int64_t len = std::min(model::kMaxChunk, n - off);
    const auto chunk = tokens.subspan(off, len);
    const bool last = off + len == n;
    if (all_logits) {
      LUMEN_RETURN_IF_ERROR(forward_.Run(chunk, pos0 + off, cache_, model::LogitsFor::kAll,
                                         all_logits->data() + off * V, lora_));
    } else {
      // Intermediate chunks only fill the cache; their logits are not needed.
      LUMEN_RETURN_IF_ERROR(
          forward_.Run(chunk, pos0 + off, cache_, model::LogitsFor::kLast, logits_.data(), lora_));
    }
    if (pos0 + off == whole_chunks_ && len == model::kMaxChunk) whole_chunks_ += len;
    tokens_.insert(tokens_.end(), chunk.begin(), chunk.end());
    NoteLength();
    if (last && all_logits) std::copy(all_logits->end() - V, all_logits->end(), logits_.begin());
  }
  return Status::Ok();
}

void Session::NoteLength() {
  high_water_ = std::max<int64_t>(high_water_, tokens_.size());
  most_positions_ = std::max(most_positions_, high_water_);
}

void Session::CommitBatchToken(int32_t token, std::span<const float> logits) {
  LUMEN_CHECK(logits.size() == logits_.size());
  tokens_.push_back(token);
  NoteLength();
  std::copy(logits.begin(), logits.end(), logits_.begin());
}

int64_t Session::Truncate(int64_t n) {
  n = std::clamp<int64_t>(n, 0, static_cast<int64_t>(tokens_.size()));
  const auto& c = model_.config();
  const bool rings =
      std::find(c.layer_sliding.begin(), c.layer_sliding.end(), true) != c.layer_sliding.end();
  // A ring holds window + kMaxChunk rows: writing more than kMaxChunk positions
  // past n has evicted rows that position n still attends to.
  if (rings && high_water_ - n > model::kMaxChunk && n > 0) n = 0;
  tokens_.resize(n);
  whole_chunks_ = std::min(whole_chunks_, n - n % model::kMaxChunk);
  if (n == 0) high_water_ = 0;
  return n;
}

}  // namespace lumen::engine
