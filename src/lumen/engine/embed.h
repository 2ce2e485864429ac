// Embeddings: one L2-normalized vector per input for embedding models.
//
// An embedding model is a dense decoder whose config names a pooling
// (model::Pooling): GGUF "<arch>.pooling_type" (llama.cpp's values: 1 mean,
// 2 cls, 3 last), or in a Hugging Face directory sentence-transformers'
// modules.json whose sentence_transformers.models.Pooling module's
// config.json sets pooling_mode_mean_tokens, pooling_mode_cls_token or
// pooling_mode_lasttoken (Qwen3-Embedding: last token). The vector is the
// pooled final-norm output (model::Forward::RunHidden: no LM head), then
// divided by its L2 norm; pooling and the norm are summed in double.
//
// Batching: Embed packs the tokens of several inputs into each forward step
// (up to kMaxChunk rows, each input with its own f32 KV cache, in input
// order), so short inputs share weight reads. Every step has at least
// max(5, threads) rows (a short one repeats its last row), so every step
// takes the kernel routes of a full step and a row's bits do not depend on
// its neighbours: the batched route is L1 (bit-identical) to running one
// input at a time (batched = false); tested in embed_test.cc.
//
// Example:
//   auto e = Embedder::Create(model, pool);
//   auto vecs = (*e)->Embed({{1, 2, 3}, {4, 5}}, /*max_tokens=*/512);
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "lumen/core/status.h"
#include "lumen/core/thread_pool.h"
#include "lumen/engine/model.h"
#include "lumen/model/config.h"
#include "lumen/model/forward.h"

namespace lumen::engine {

// The pooling of a sentence-transformers directory: kNone when it has no
// modules.json (or no Pooling module); an error naming the file for a mode
// lumen does not implement (max, weighted mean, mean_sqrt_len).
Result<model::Pooling> ReadSentenceTransformersPooling(const std::string& dir);
// Writes modules.json and 1_Pooling/config.json for `pooling` (not kNone).
Status WriteSentenceTransformersPooling(const std::string& dir, model::Pooling pooling, int dim);

// Keeps the first `dims` components and divides by their L2 norm (OpenAI's
// `dimensions` for matryoshka models). dims must be in [1, v.size()].
void TruncateNormalized(std::vector<float>& v, int dims);

class Embedder {
 public:
  // pooling: kNone takes the model's (model.config().pooling), which must then
  // not be kNone; another value overrides it (llama.cpp's --pooling), which
  // also embeds with a generative model. pool: the threads this embedder's
  // forward uses (not shared with a concurrent caller).
  static Result<std::unique_ptr<Embedder>> Create(const Model& model, ThreadPool* pool,
                                                  model::Pooling pooling = model::Pooling::kNone);

  // One vector [D] per input. Every input needs 1..max_tokens tokens
  // (errors name "input[i]"). batched = false runs one input at a time.
  Result<std::vector<std::vector<float>>> Embed(std::span<const std::vector<int32_t>> inputs,
                                                int64_t max_tokens, bool batched = true);

  model::Pooling pooling() const { return pooling_; }
  int dim() const { return dim_; }

 private:
  Embedder(const Model& model, ThreadPool* pool, model::Pooling pooling);

  const Model& model_;
  model::Forward forward_;
  model::Pooling pooling_;
  int dim_;
  int threads_;
};

}  // namespace lumen::engine
