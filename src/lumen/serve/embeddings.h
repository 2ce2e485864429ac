// POST /v1/embeddings (OpenAI shape) for embedding models (engine/embed.h).
//
// Body: input (a string, an array of strings, an array of token ids, or an
// array of such arrays; at most kMaxInputs), model (reported back, not
// checked), dimensions (keep the first N components and re-normalize; at
// most the model's D), encoding_format ("float", default, or "base64": the
// little-endian f32 bytes), instruction (lumen's field, Qwen3-Embedding
// style: each text input becomes "Instruct: <instruction>\nQuery:<text>"),
// user (ignored). Text is tokenized as the model's tokenizer does with its
// special tokens (BOS where the model adds one). Every input must fit the
// server's context (400 context_length_exceeded, param "input[i]"); a model
// without pooling is a 400 on "model". Requests run one at a time on a
// thread pool of their own (the generation scheduler keeps the model's).
// Response: {object: "list", data: [{object: "embedding", index, embedding}],
// model, usage: {prompt_tokens, total_tokens}}.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "lumen/core/thread_pool.h"
#include "lumen/engine/embed.h"
#include "lumen/engine/model.h"
#include "lumen/serve/api_error.h"

namespace lumen::serve {

inline constexpr size_t kMaxEmbeddingInputs = 2048;

// Base64 (RFC 4648, with padding) of raw bytes.
std::string Base64Encode(std::string_view bytes);

class EmbeddingService {
 public:
  // pooling: kNone takes the model's; another value overrides it (serve --pooling).
  EmbeddingService(const engine::Model& model, int64_t ctx, std::string model_name,
                   model::Pooling pooling = model::Pooling::kNone);
  ~EmbeddingService();

  // The response body, or false with *err set (a 4xx naming the field).
  bool Handle(const nlohmann::ordered_json& body, nlohmann::ordered_json* out, ApiError* err);

 private:
  const engine::Model& model_;
  int64_t ctx_;
  std::string model_name_;
  model::Pooling pooling_;
  std::mutex mu_;  // one request at a time: the embedder's scratch is shared
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<engine::Embedder> embedder_;
};

}  // namespace lumen::serve
