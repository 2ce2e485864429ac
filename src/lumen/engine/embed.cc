#include "lumen/engine/embed.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "lumen/core/buffer.h"
#include "lumen/formats/hf_dir.h"
#include "lumen/model/kv_cache.h"

namespace lumen::engine {

using model::Pooling;

namespace {
constexpr int64_t kMinStepRows = 5;  // kernels/matmul.h: M <= 4 is the matvec route
constexpr size_t kPadding = ~size_t(0);
}  // namespace

Result<Pooling> ReadSentenceTransformersPooling(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path modules = fs::path(dir) / "modules.json";
  std::error_code ec;
  if (!fs::exists(modules, ec)) return Pooling::kNone;
  LUMEN_ASSIGN_OR_RETURN(nlohmann::json m, formats::ReadJsonFile(modules.string()));
  if (!m.is_array()) return Errorf("{}: must be an array of modules", modules.string());
  for (const auto& mod : m) {
    if (!mod.is_object() || mod.value("type", "") != "sentence_transformers.models.Pooling")
      continue;
    const std::string sub = mod.value("path", "");
    const fs::path cfg_path = fs::path(dir) / sub / "config.json";
    LUMEN_ASSIGN_OR_RETURN(nlohmann::json c, formats::ReadJsonFile(cfg_path.string()));
    auto on = [&](const char* k) { return c.is_object() && c.value(k, false); };
    for (const char* k : {"pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                          "pooling_mode_weightedmean_tokens"})
      if (on(k))
        return Errorf("{}: {} is not supported (lumen pools by last token, mean or cls)",
                      cfg_path.string(), k);
    const int n = on("pooling_mode_lasttoken") + on("pooling_mode_mean_tokens") +
                  on("pooling_mode_cls_token");
    if (n != 1)
      return Errorf(
          "{}: exactly one of pooling_mode_lasttoken, pooling_mode_mean_tokens, "
          "pooling_mode_cls_token must be true, {} are",
          cfg_path.string(), n);
    if (on("pooling_mode_lasttoken")) return Pooling::kLast;
    if (on("pooling_mode_mean_tokens")) return Pooling::kMean;
    return Pooling::kCls;
  }
  return Pooling::kNone;
}

Status WriteSentenceTransformersPooling(const std::string& dir, Pooling pooling, int dim) {
  namespace fs = std::filesystem;
  if (pooling == Pooling::kNone) return Error("sentence-transformers pooling: none given");
  const nlohmann::ordered_json modules =
      nlohmann::ordered_json::array({{{"idx", 0},
                                      {"name", "0"},
                                      {"path", ""},
                                      {"type", "sentence_transformers.models.Transformer"}},
                                     {{"idx", 1},
                                      {"name", "1"},
                                      {"path", "1_Pooling"},
                                      {"type", "sentence_transformers.models.Pooling"}},
                                     {{"idx", 2},
                                      {"name", "2"},
                                      {"path", "2_Normalize"},
                                      {"type", "sentence_transformers.models.Normalize"}}});
  const nlohmann::ordered_json pool = {{"word_embedding_dimension", dim},
                                       {"pooling_mode_cls_token", pooling == Pooling::kCls},
                                       {"pooling_mode_mean_tokens", pooling == Pooling::kMean},
                                       {"pooling_mode_max_tokens", false},
                                       {"pooling_mode_mean_sqrt_len_tokens", false},
                                       {"pooling_mode_weightedmean_tokens", false},
                                       {"pooling_mode_lasttoken", pooling == Pooling::kLast},
                                       {"include_prompt", true}};
  std::error_code ec;
  for (const char* sub : {"1_Pooling", "2_Normalize"}) {
    fs::create_directories(fs::path(dir) / sub, ec);
    if (ec) return Errorf("{}/{}: cannot create directory: {}", dir, sub, ec.message());
  }
  LUMEN_RETURN_IF_ERROR(WriteFileAtomic(dir + "/modules.json", modules.dump(2) + "\n"));
  return WriteFileAtomic(dir + "/1_Pooling/config.json", pool.dump(2) + "\n");
}

void TruncateNormalized(std::vector<float>& v, int dims) {
  v.resize(size_t(dims));
  double ss = 0;
  for (float x : v) ss += double(x) * x;
  const double inv = ss > 0 ? 1.0 / std::sqrt(ss) : 0.0;
  for (float& x : v) x = float(x * inv);
}

Embedder::Embedder(const Model& model, ThreadPool* pool, Pooling pooling)
    : model_(model),
      forward_(model.config(), model.weights(), pool),
      pooling_(pooling),
      dim_(model.config().dim),
      threads_(pool ? pool->size() : 1) {}

Result<std::unique_ptr<Embedder>> Embedder::Create(const Model& model, ThreadPool* pool,
                                                   Pooling pooling) {
  if (pooling == Pooling::kNone) pooling = model.config().pooling;
  if (pooling == Pooling::kNone)
    return Errorf(
        "model '{}' is not an embedding model: it names no pooling (GGUF <arch>.pooling_type, "
        "or sentence-transformers modules.json with a Pooling module); --pooling mean|cls|last "
        "pools its hidden states anyway",
        model.name());
  return std::unique_ptr<Embedder>(new Embedder(model, pool, pooling));
}

Result<std::vector<std::vector<float>>> Embedder::Embed(
    std::span<const std::vector<int32_t>> inputs, int64_t max_tokens, bool batched) {
  const int64_t D = dim_, V = model_.config().vocab_size;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const int64_t n = int64_t(inputs[i].size());
    if (n == 0) return Errorf("input[{}]: no tokens", i);
    if (n > max_tokens)
      return Errorf("input[{}]: {} tokens, more than the context of {} tokens", i, n, max_tokens);
    for (size_t t = 0; t < inputs[i].size(); ++t)
      if (inputs[i][t] < 0 || inputs[i][t] >= V)
        return Errorf("input[{}][{}]: token id {} is outside the vocabulary (size {})", i, t,
                      inputs[i][t], V);
  }
  std::vector<std::vector<double>> acc(inputs.size(), std::vector<double>(size_t(D), 0.0));
  std::vector<std::unique_ptr<model::KvCache>> caches(inputs.size());
  AlignedBuffer hidden(size_t(model::kMaxChunk) * D * sizeof(float));
  std::vector<model::BatchRow> rows;
  std::vector<size_t> owner;  // rows[r] belongs to input owner[r]
  size_t first = 0;           // first input not fully run
  std::vector<int64_t> done(inputs.size(), 0);
  while (first < inputs.size()) {
    rows.clear();
    owner.clear();
    for (size_t i = first; i < inputs.size() && int64_t(rows.size()) < model::kMaxChunk; ++i) {
      if (!batched && i > first) break;
      if (!caches[i]) {
        LUMEN_ASSIGN_OR_RETURN(
            model::KvCache kv,
            model::KvCache::Create(model_.config(), int64_t(inputs[i].size()), DType::kF32));
        caches[i] = std::make_unique<model::KvCache>(std::move(kv));
      }
      const int64_t n = int64_t(inputs[i].size());
      const int64_t take = std::min(n - done[i], model::kMaxChunk - int64_t(rows.size()));
      for (int64_t p = done[i]; p < done[i] + take; ++p) {
        rows.push_back({caches[i].get(), inputs[i][size_t(p)], p});
        owner.push_back(i);
      }
    }
    // A step of few rows would take other kernel routes (matvec for M <= 4
    // rows, attention split by heads when rows < threads) than a full one,
    // which sum in another order: repeat the last row (it rewrites the same
    // K/V at the same position) so every step takes the routes a full step
    // takes, and a row's bits do not depend on its neighbours.
    const size_t min_rows =
        size_t(std::min<int64_t>(model::kMaxChunk, std::max<int64_t>(kMinStepRows, threads_)));
    while (rows.size() < min_rows) {
      rows.push_back(rows.back());
      owner.push_back(kPadding);
    }
    LUMEN_RETURN_IF_ERROR(forward_.RunHidden(rows, hidden.as<float>()));
    for (size_t r = 0; r < rows.size(); ++r) {
      if (owner[r] == kPadding) continue;
      const size_t i = owner[r];
      const float* h = hidden.as<float>() + r * D;
      const int64_t n = int64_t(inputs[i].size());
      const bool take = pooling_ == Pooling::kMean ||
                        (pooling_ == Pooling::kLast && rows[r].pos == n - 1) ||
                        (pooling_ == Pooling::kCls && rows[r].pos == 0);
      if (take)
        for (int64_t d = 0; d < D; ++d) acc[i][d] += h[d];
      if (++done[i] == n) caches[i].reset();  // its KV is no longer needed
    }
    while (first < inputs.size() && done[first] == int64_t(inputs[first].size())) ++first;
  }
  std::vector<std::vector<float>> out(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::vector<double>& a = acc[i];
    if (pooling_ == Pooling::kMean)
      for (double& x : a) x /= double(inputs[i].size());
    double ss = 0;
    for (double x : a) ss += x * x;
    const double inv = ss > 0 ? 1.0 / std::sqrt(ss) : 0.0;
    out[i].resize(size_t(D));
    for (int64_t d = 0; d < D; ++d) out[i][d] = float(a[d] * inv);
  }
  return out;
}

}  // namespace lumen::engine
