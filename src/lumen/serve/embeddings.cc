#include "lumen/serve/embeddings.h"

#include <bit>
#include <cstring>

#include <fmt/format.h>

#include "lumen/serve/admission.h"

namespace lumen::serve {

using ojson = nlohmann::ordered_json;

std::string Base64Encode(std::string_view in) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= in.size(); i += 3) {
    const uint32_t v = uint32_t(uint8_t(in[i])) << 16 | uint32_t(uint8_t(in[i + 1])) << 8 |
                       uint32_t(uint8_t(in[i + 2]));
    for (int s = 18; s >= 0; s -= 6) out += kAlphabet[(v >> s) & 63];
  }
  if (const size_t rest = in.size() - i; rest > 0) {
    uint32_t v = uint32_t(uint8_t(in[i])) << 16;
    if (rest == 2) v |= uint32_t(uint8_t(in[i + 1])) << 8;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += rest == 2 ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

EmbeddingService::EmbeddingService(const engine::Model& model, int64_t ctx, std::string model_name,
                                   model::Pooling pooling)
    : model_(model), ctx_(ctx), model_name_(std::move(model_name)), pooling_(pooling) {}

EmbeddingService::~EmbeddingService() = default;

namespace {

bool IsTokenArray(const ojson& v) {
  if (!v.is_array() || v.empty()) return false;
  for (const auto& x : v)
    if (!x.is_number_integer()) return false;
  return true;
}

}  // namespace

bool EmbeddingService::Handle(const ojson& body, ojson* out, ApiError* err) {
  auto fail = [&](ApiError e) {
    *err = std::move(e);
    return false;
  };
  // serve --pooling overrides the model's pooling, and lets a generative model embed.
  if (model_.config().pooling == model::Pooling::kNone && pooling_ == model::Pooling::kNone) {
    ApiError e = FieldError(
        "model", fmt::format("'{}' is not an embedding model: it names no pooling (GGUF "
                             "<arch>.pooling_type, or sentence-transformers modules.json); serve "
                             "an embedding model such as Qwen3-Embedding for /v1/embeddings, or "
                             "start the server with --pooling mean|cls|last",
                             model_name_));
    return fail(e);
  }
  if (body.contains("model") && !body["model"].is_string())
    return fail(FieldError("model", "must be a string"));
  // Inputs: texts or token arrays.
  if (!body.contains("input") || body["input"].is_null())
    return fail(FieldError("input", "missing (required)"));
  const ojson& in = body["input"];
  std::vector<ojson> items;
  if (in.is_string() || IsTokenArray(in)) {
    items.push_back(in);
  } else if (in.is_array()) {
    if (in.empty()) return fail(FieldError("input", "must not be an empty array"));
    for (const auto& x : in) items.push_back(x);
  } else {
    return fail(FieldError("input", fmt::format("must be a string, an array of strings or token "
                                                "ids, got {}",
                                                in.type_name())));
  }
  if (items.size() > kMaxEmbeddingInputs)
    return fail(FieldError(
        "input", fmt::format("at most {} inputs, got {}", kMaxEmbeddingInputs, items.size())));
  std::string instruction;
  if (body.contains("instruction") && !body["instruction"].is_null()) {
    if (!body["instruction"].is_string())
      return fail(FieldError("instruction", "must be a string"));
    instruction = body["instruction"].get<std::string>();
  }
  const int D = model_.config().dim;
  int dims = D;
  if (body.contains("dimensions") && !body["dimensions"].is_null()) {
    const ojson& d = body["dimensions"];
    if (!d.is_number_integer() || d.get<int64_t>() < 1)
      return fail(FieldError("dimensions", "must be a positive integer"));
    if (d.get<int64_t>() > D)
      return fail(FieldError("dimensions", fmt::format("{} is more than the model's {} dimensions",
                                                       d.get<int64_t>(), D)));
    dims = d.get<int>();
  }
  bool base64 = false;
  if (body.contains("encoding_format") && !body["encoding_format"].is_null()) {
    const ojson& f = body["encoding_format"];
    if (!f.is_string() || (f != "float" && f != "base64"))
      return fail(FieldError("encoding_format", "must be \"float\" or \"base64\""));
    base64 = f == "base64";
  }
  const tokenize::Tokenizer& tok = model_.tokenizer();
  std::vector<std::vector<int32_t>> tokens(items.size());
  int64_t total = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string field =
        in.is_array() && !IsTokenArray(in) ? fmt::format("input[{}]", i) : std::string("input");
    const ojson& x = items[i];
    if (x.is_string()) {
      const std::string text = x.get<std::string>();
      if (text.empty()) return fail(FieldError(field, "must not be an empty string"));
      tokens[i] = tok.Encode(
          instruction.empty() ? text : fmt::format("Instruct: {}\nQuery:{}", instruction, text),
          /*add_special=*/true);
    } else if (IsTokenArray(x)) {
      if (!instruction.empty())
        return fail(FieldError("instruction", "applies to text inputs, not token ids"));
      for (const auto& t : x) {
        const int64_t id = t.get<int64_t>();
        if (id < 0 || id >= tok.vocab_size())
          return fail(
              FieldError(field, fmt::format("token id {} is outside the vocabulary (size {})", id,
                                            tok.vocab_size())));
        tokens[i].push_back(int32_t(id));
      }
    } else {
      return fail(
          FieldError(field, "must be a non-empty string or a non-empty array of token ids"));
    }
    if (tokens[i].empty()) return fail(FieldError(field, "tokenizes to no tokens"));
    if (int64_t(tokens[i].size()) > ctx_) {
      ApiError e = FieldError(
          field, fmt::format("{} tokens, more than the context ({} tokens): shorten it, or start "
                             "the server with a larger --ctx",
                             tokens[i].size(), ctx_));
      e.code = kContextLengthExceeded;
      return fail(e);
    }
    total += int64_t(tokens[i].size());
  }

  std::vector<std::vector<float>> vecs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!embedder_) {
      pool_ = std::make_unique<ThreadPool>(model_.pool() ? model_.pool()->size() : 1);
      auto e = engine::Embedder::Create(model_, pool_.get(), pooling_);
      if (!e.ok()) return fail(FieldError("model", e.status().message()));
      embedder_ = std::move(*e);
    }
    auto r = embedder_->Embed(tokens, ctx_);
    if (!r.ok()) {
      ApiError e = FromStatus(r.status(), 500);
      return fail(e);
    }
    vecs = std::move(*r);
  }
  ojson data = ojson::array();
  for (size_t i = 0; i < vecs.size(); ++i) {
    if (dims < D) engine::TruncateNormalized(vecs[i], dims);
    ojson item = {{"object", "embedding"}, {"index", i}};
    if (base64) {
      std::string bytes(vecs[i].size() * sizeof(float), '\0');
      static_assert(std::endian::native == std::endian::little, "base64 floats are little-endian");
      std::memcpy(bytes.data(), vecs[i].data(), bytes.size());
      item["embedding"] = Base64Encode(bytes);
    } else {
      item["embedding"] = vecs[i];
    }
    data.push_back(std::move(item));
  }
  *out = {{"object", "list"},
          {"data", std::move(data)},
          {"model", model_name_},
          {"usage", {{"prompt_tokens", total}, {"total_tokens", total}}}};
  return true;
}

}  // namespace lumen::serve
