// Loading GGUF tokenizer.ggml.* metadata and llama2.c tokenizer files, and
// exporting a Tokenizer to GGUF metadata or a Hugging Face directory.
#include <cstring>
#include <filesystem>
#include <span>

#include <nlohmann/json.hpp>

#include "lumen/core/buffer.h"
#include "lumen/core/log.h"
#include "lumen/formats/gguf.h"
#include "lumen/tokenize/tokenizer.h"
#include "lumen/tokenize/tokenizer_impl.h"

namespace lumen::tokenize {
namespace {

using formats::GgufFile;
using formats::GgufValue;

Result<std::vector<std::string>> StringArray(const GgufFile& g, const std::string& key) {
  const GgufValue* v = g.Find(key);
  if (!v) return Errorf("{}: missing key '{}'", g.path(), key);
  const auto* arr = v->AsArray();
  if (!arr) return Errorf("{}: '{}' is not an array", g.path(), key);
  std::vector<std::string> out;
  out.reserve(arr->size());
  for (size_t i = 0; i < arr->size(); ++i) {
    const std::string* s = (*arr)[i].AsString();
    if (!s) return Errorf("{}: '{}'[{}] is not a string", g.path(), key, i);
    out.push_back(*s);
  }
  return out;
}

template <typename T, typename Get>
Result<std::vector<T>> NumArray(const GgufFile& g, const std::string& key, size_t n, Get get) {
  std::vector<T> out;
  const GgufValue* v = g.Find(key);
  if (!v) return out;
  const auto* arr = v->AsArray();
  if (!arr || arr->size() != n) {
    return Errorf("{}: '{}' must be an array of {} numbers", g.path(), key, n);
  }
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    auto x = get((*arr)[i]);
    if (!x) return Errorf("{}: '{}'[{}] is not a number", g.path(), key, i);
    out.push_back(T(*x));
  }
  return out;
}

std::string PreRegexFor(const std::string& pre) {
  if (pre == "llama3" || pre == "llama-bpe" || pre == "llama-v3" || pre == "smaug-bpe") {
    return kLlama3Pattern;
  }
  if (pre == "qwen2" || pre == "deepseek-r1-qwen") return kQwen2Pattern;
  if (pre == "default" || pre == "gpt-2" || pre == "gpt2" || pre == "phi-2" || pre == "olmo" ||
      pre == "jais" || pre == "starcoder" || pre == "refact" || pre == "smollm" ||
      pre == "codeshell" || pre == "exaone" || pre == "minerva-7b") {
    return kGpt2Pattern;
  }
  return {};
}

// A special-token id as stored: absent, an id inside the vocabulary, or a value
// that means "none" (-1 as a signed type, 0xFFFFFFFF as u32, or any id outside
// the vocabulary; converters write all three).
struct StoredId {
  enum Kind { kAbsent, kValid, kNone } kind = kAbsent;
  int32_t id = -1;
  std::string shown;  // the value as stored, for the warning
};

StoredId ReadStoredId(const GgufFile& g, const std::string& key, size_t n) {
  StoredId r;
  const GgufValue* v = g.Find(key);
  if (!v) return r;
  const std::optional<int64_t> x = v->AsInt();
  if (!x) {
    r.kind = StoredId::kNone;
    r.shown = "a non-integer value";
    return r;
  }
  r.shown = std::to_string(*x);
  if (*x < 0 || *x >= int64_t(n)) {
    r.kind = StoredId::kNone;
    return r;
  }
  r.kind = StoredId::kValid;
  r.id = int32_t(*x);
  return r;
}

// The id a vocabulary conventionally uses for BOS / EOS / UNK when the key is
// absent or unusable: SentencePiece ("llama") vocabularies use llama.cpp's
// defaults 1 / 2 / 0; byte-level ("gpt2") ones the first conventional text
// found (llama.cpp's own gpt2 default, id 11, is a GPT-NeoX-era id that means
// nothing in other vocabularies).
int32_t ConventionalId(const TokenizerImpl& impl, bool spm, std::string_view which) {
  const auto& pieces = impl.model.pieces;
  const int32_t n = int32_t(pieces.size());
  if (spm) {
    const int32_t id = which == "bos" ? 1 : which == "eos" ? 2 : 0;
    return id < n ? id : -1;
  }
  static constexpr std::string_view kBos[] = {"<|begin_of_text|>", "<s>", "<bos>",
                                              "<|startoftext|>"};
  static constexpr std::string_view kEos[] = {"<|end_of_text|>", "</s>", "<eos>", "<|endoftext|>"};
  static constexpr std::string_view kUnk[] = {"<unk>", "<|unk|>"};
  std::span<const std::string_view> names(kUnk);
  if (which == "bos") names = kBos;
  if (which == "eos") names = kEos;
  for (std::string_view name : names) {
    if (auto id = impl.model.Find(name)) return *id;
  }
  return -1;
}

// Reads every tokenizer.ggml.*_token_id key into `impl` by the rule in
// docs/reference/formats.md ("Special token ids"): a "none" value is never an
// error; it logs one warning naming the key and the value, then BOS / EOS / UNK
// fall back to the vocabulary's conventional id and the optional ids to none.
Status ReadSpecialIds(const GgufFile& g, bool spm, TokenizerImpl& impl) {
  const size_t n = impl.model.pieces.size();
  auto warn_none = [&](const std::string& key, const StoredId& s, const std::string& then) {
    LUMEN_LOG_WARN("{}: {} = {} is not a token id of this {}-token vocabulary; {}", g.path(), key,
                   s.shown, n, then);
  };
  struct Needed {
    const char* key;
    const char* which;
    int32_t* dst;
  };
  for (const Needed& k : {Needed{"tokenizer.ggml.bos_token_id", "bos", &impl.bos},
                          Needed{"tokenizer.ggml.eos_token_id", "eos", &impl.eos},
                          Needed{"tokenizer.ggml.unknown_token_id", "unk", &impl.unk}}) {
    const StoredId s = ReadStoredId(g, k.key, n);
    if (s.kind == StoredId::kValid) {
      *k.dst = s.id;
      continue;
    }
    // Absent: SentencePiece vocabularies take llama.cpp's defaults silently, as
    // llama.cpp does; byte-level ones have none (HF: the token is None).
    if (s.kind == StoredId::kAbsent) {
      *k.dst = spm ? ConventionalId(impl, spm, k.which) : -1;
      continue;
    }
    *k.dst = ConventionalId(impl, spm, k.which);
    warn_none(k.key, s,
              *k.dst >= 0
                  ? fmt::format("using id {} ('{}') instead", *k.dst, impl.model.pieces[*k.dst])
                  : std::string("this model has none"));
  }
  // Optional ids: used when valid, "none" otherwise. lumen reads pad, eot and
  // eom (end-of-generation); the others are checked so a bad value is reported
  // the same way, then ignored.
  static constexpr const char* kOptional[] = {
      "tokenizer.ggml.padding_token_id",   "tokenizer.ggml.eot_token_id",
      "tokenizer.ggml.eom_token_id",       "tokenizer.ggml.seperator_token_id",
      "tokenizer.ggml.separator_token_id", "tokenizer.ggml.cls_token_id",
      "tokenizer.ggml.mask_token_id",      "tokenizer.ggml.fim_pre_token_id",
      "tokenizer.ggml.fim_suf_token_id",   "tokenizer.ggml.fim_mid_token_id",
      "tokenizer.ggml.fim_pad_token_id",   "tokenizer.ggml.fim_rep_token_id",
      "tokenizer.ggml.fim_sep_token_id",   "tokenizer.ggml.prefix_token_id",
      "tokenizer.ggml.suffix_token_id",    "tokenizer.ggml.middle_token_id"};
  for (const char* key : kOptional) {
    const StoredId s = ReadStoredId(g, key, n);
    if (s.kind == StoredId::kNone) warn_none(key, s, "treated as none");
    if (s.kind != StoredId::kValid) continue;
    const std::string_view k(key);
    if (k.ends_with("padding_token_id")) impl.pad = s.id;
    if (k.ends_with("eot_token_id") || k.ends_with("eom_token_id")) impl.eog.insert(s.id);
  }
  return Status::Ok();
}

}  // namespace

Result<Tokenizer> Tokenizer::FromGguf(const formats::GgufFile& g) {
  // A lumen export of a tokenizer.json that GGUF keys cannot express.
  if (const GgufValue* hf = g.Find("tokenizer.lumen.hf_json")) {
    const std::string* tj = hf->AsString();
    const GgufValue* cfg = g.Find("tokenizer.lumen.hf_config_json");
    const std::string* cj = cfg ? cfg->AsString() : nullptr;
    if (tj) return FromHfJson(*tj, cj ? *cj : std::string(), g.path());
  }
  LUMEN_ASSIGN_OR_RETURN(std::string model, g.GetString("tokenizer.ggml.model"));
  auto impl = std::make_shared<TokenizerImpl>();
  impl->name = g.path();
  LUMEN_ASSIGN_OR_RETURN(impl->model.pieces, StringArray(g, "tokenizer.ggml.tokens"));
  const size_t n = impl->model.pieces.size();
  if (n == 0 || n > (1u << 24))
    return Errorf("{}: tokenizer.ggml.tokens: bad size {}", g.path(), n);
  LUMEN_ASSIGN_OR_RETURN(impl->model.scores,
                         (NumArray<float>(g, "tokenizer.ggml.scores", n,
                                          [](const GgufValue& v) { return v.AsFloat(); })));
  if (impl->model.scores.empty()) impl->model.scores.assign(n, 0.0f);
  LUMEN_ASSIGN_OR_RETURN(impl->token_type,
                         (NumArray<int32_t>(g, "tokenizer.ggml.token_type", n,
                                            [](const GgufValue& v) { return v.AsInt(); })));
  impl->token_type.resize(n, kTypeNormal);
  impl->model.BuildIndex();
  LUMEN_RETURN_IF_ERROR(ReadSpecialIds(g, model == "llama", *impl));
  if (const GgufValue* ct = g.Find("tokenizer.chat_template")) {
    if (const std::string* s = ct->AsString()) impl->chat_template = *s;
  }
  // Control and user-defined tokens are matched in the text (user-defined ones
  // even when parse_special is off), as llama.cpp does.
  for (size_t i = 0; i < n; ++i) {
    int32_t t = impl->token_type[i];
    if ((t == kTypeControl || t == kTypeUserDefined) && !impl->model.pieces[i].empty()) {
      AddedToken a;
      a.content = impl->model.pieces[i];
      a.id = int32_t(i);
      a.special = t == kTypeControl;
      impl->added.push_back(std::move(a));
    }
  }
  if (model == "llama") {
    impl->flavor = Flavor::kSpm;
    impl->model.unk_id = impl->unk;
    LUMEN_ASSIGN_OR_RETURN(int64_t asp, g.GetInt("tokenizer.ggml.add_space_prefix", 1));
    impl->add_space_prefix = asp != 0;
    LUMEN_ASSIGN_OR_RETURN(int64_t ab, g.GetInt("tokenizer.ggml.add_bos_token", 1));
    LUMEN_ASSIGN_OR_RETURN(int64_t ae, g.GetInt("tokenizer.ggml.add_eos_token", 0));
    impl->add_bos = ab != 0;
    impl->add_eos = ae != 0;
  } else if (model == "gpt2") {
    impl->flavor = Flavor::kHf;  // expressed as the equivalent tokenizer.json pipeline
    std::string pre = "default";
    if (const GgufValue* p = g.Find("tokenizer.ggml.pre")) {
      if (const std::string* s = p->AsString()) pre = *s;
    }
    impl->gguf_pre = pre;
    std::string regex;
    if (const GgufValue* r = g.Find("tokenizer.lumen.pre_regex")) {
      if (const std::string* s = r->AsString()) regex = *s;
    }
    if (regex.empty()) regex = PreRegexFor(pre);
    if (regex.empty()) {
      // llama.cpp refuses a name it does not know; lumen falls back to the
      // GPT-2 split (HF's ByteLevel default), which differs from the model's
      // own pre-tokenizer only on some digit, space and punctuation runs.
      LUMEN_LOG_WARN(
          "{}: tokenizer.ggml.pre = '{}' is not a pre-tokenizer lumen knows (default, gpt-2, "
          "llama-bpe, llama3, qwen2, ...); using the GPT-2 split, so some texts may tokenize "
          "differently from the original",
          g.path(), pre);
      regex = kGpt2Pattern;
    }
    PreTokenizerStep split;
    split.kind = PreTokenizerKind::kSplit;
    LUMEN_ASSIGN_OR_RETURN(split.pattern, Regex::Compile(regex));
    split.pattern_is_regex = true;
    PreTokenizerStep bl;
    bl.kind = PreTokenizerKind::kByteLevel;
    bl.use_regex = false;
    impl->pretokenizers = {std::move(split), std::move(bl)};
    if (const GgufValue* nm = g.Find("tokenizer.lumen.normalizer")) {
      const std::string* s = nm->AsString();
      if (s && *s == "NFC") {
        NormalizerStep st;
        st.kind = NormalizerKind::kNfc;
        impl->normalizers.push_back(std::move(st));
      }
    }
    DecoderStep d;
    d.kind = DecoderKind::kByteLevel;
    impl->decoders = {d};
    impl->byte_level_decode = true;
    impl->model.ignore_merges = regex == kLlama3Pattern;
    if (const GgufValue* im = g.Find("tokenizer.lumen.ignore_merges")) {
      impl->model.ignore_merges = im->AsInt().value_or(0) != 0;
    }
    LUMEN_ASSIGN_OR_RETURN(std::vector<std::string> merges,
                           StringArray(g, "tokenizer.ggml.merges"));
    impl->model.merges.Reserve(merges.size());
    for (const std::string& m : merges) {
      size_t sp = m.find(' ', 1);
      if (sp == std::string::npos) continue;
      impl->model.AddMerge(std::string_view(m).substr(0, sp), std::string_view(m).substr(sp + 1));
    }
    LUMEN_ASSIGN_OR_RETURN(int64_t ab, g.GetInt("tokenizer.ggml.add_bos_token", 0));
    LUMEN_ASSIGN_OR_RETURN(int64_t ae, g.GetInt("tokenizer.ggml.add_eos_token", 0));
    if (ab && impl->bos >= 0) impl->prefix_ids = {impl->bos};
    if (ae && impl->eos >= 0) impl->suffix_ids = {impl->eos};
    impl->add_bos = ab != 0;
    impl->add_eos = ae != 0;
    impl->clean_up_spaces = false;
    impl->model.unk_id = impl->unk;
  } else {
    return Errorf("{}: tokenizer.ggml.model '{}' is not supported (llama, gpt2)", g.path(), model);
  }
  if (impl->bos >= 0) impl->bos_text = impl->model.pieces[impl->bos];
  if (impl->eos >= 0) impl->eos_text = impl->model.pieces[impl->eos];
  impl->Finish();
  return Tokenizer(std::move(impl));
}

Result<Tokenizer> Tokenizer::FromLlama2c(const std::string& path, int vocab_size) {
  LUMEN_ASSIGN_OR_RETURN(std::string data, ReadFile(path));
  if (vocab_size <= 0 || vocab_size > (1 << 24))
    return Errorf("{}: bad vocab size {}", path, vocab_size);
  size_t off = 0;
  auto read = [&](void* dst, size_t n) -> bool {
    if (off + n > data.size()) return false;
    std::memcpy(dst, data.data() + off, n);
    off += n;
    return true;
  };
  int32_t max_len = 0;
  if (!read(&max_len, 4)) return Errorf("{}: too short for the header", path);
  // A SentencePiece .model (a protobuf: field 1, a length-delimited piece,
  // tag 0x0a) is the file people reach for beside a llama2.c model; say so
  // rather than fail on a "token length" read from protobuf bytes.
  if (data.size() >= 2 && uint8_t(data[0]) == 0x0a && (max_len < 1 || max_len > (1 << 16)))
    return Errorf(
        "{}: not a llama2.c tokenizer.bin (it reads as a SentencePiece .model, which lumen "
        "does not load): pass the tokenizer.bin that llama2.c's export writes, or use a GGUF "
        "or Hugging Face model",
        path);
  auto impl = std::make_shared<TokenizerImpl>();
  impl->flavor = Flavor::kLlama2c;
  impl->name = path;
  impl->model.pieces.resize(vocab_size);
  impl->model.scores.resize(vocab_size);
  impl->token_type.assign(vocab_size, kTypeNormal);
  for (int i = 0; i < vocab_size; ++i) {
    int32_t len = 0;
    size_t at = off;
    if (!read(&impl->model.scores[i], 4) || !read(&len, 4)) {
      return Errorf("{}: offset {}: token {} truncated", path, at, i);
    }
    if (len < 0 || size_t(len) > data.size() - off) {
      return Errorf("{}: offset {}: token {} has bad length {}", path, at, i, len);
    }
    impl->model.pieces[i].assign(data, off, size_t(len));
    off += size_t(len);
    const std::string& p = impl->model.pieces[i];
    if (p.size() == 6 && p.starts_with("<0x") && p.back() == '>') impl->token_type[i] = kTypeByte;
  }
  impl->model.BuildIndex();
  impl->unk = 0;
  impl->bos = vocab_size > 1 ? 1 : -1;
  impl->eos = vocab_size > 2 ? 2 : -1;
  for (int i = 0; i < std::min(vocab_size, 3); ++i) {
    impl->token_type[i] = i == 0 ? kTypeUnknown : kTypeControl;
  }
  impl->model.unk_id = 0;
  impl->add_bos = true;
  impl->add_space_prefix = true;
  impl->bos_text = "<s>";
  impl->eos_text = "</s>";
  impl->Finish();
  return Tokenizer(std::move(impl));
}

Status Tokenizer::ExportGguf(formats::GgufWriter& w) const {
  const TokenizerImpl& impl = *impl_;
  const BpeModel& m = impl.model;
  if (impl.flavor == Flavor::kLlama2c) {
    // llama2.c stores SentencePiece's '▁' as ' ' and BOS/EOS as "\n<s>\n" /
    // "\n</s>\n"; GGUF "llama" vocabularies use the SentencePiece spelling.
    std::vector<std::string> pieces = m.pieces;
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (int32_t(i) == impl.bos) {
        pieces[i] = "<s>";
        continue;
      }
      if (int32_t(i) == impl.eos) {
        pieces[i] = "</s>";
        continue;
      }
      std::string out;
      for (char c : pieces[i]) {
        if (c == ' ')
          out += "\xe2\x96\x81";
        else
          out += c;
      }
      pieces[i] = out;
    }
    w.SetStringArray("tokenizer.ggml.tokens", pieces);
  } else {
    w.SetStringArray("tokenizer.ggml.tokens", m.pieces);
  }
  w.SetI32Array("tokenizer.ggml.token_type", impl.token_type);
  if (impl.bos >= 0) w.SetU32("tokenizer.ggml.bos_token_id", uint32_t(impl.bos));
  if (impl.eos >= 0) w.SetU32("tokenizer.ggml.eos_token_id", uint32_t(impl.eos));
  if (impl.unk >= 0) w.SetU32("tokenizer.ggml.unknown_token_id", uint32_t(impl.unk));
  if (impl.pad >= 0) w.SetU32("tokenizer.ggml.padding_token_id", uint32_t(impl.pad));
  if (!impl.chat_template.empty()) w.SetString("tokenizer.chat_template", impl.chat_template);
  w.SetBool("tokenizer.ggml.add_bos_token", adds_bos());
  w.SetBool("tokenizer.ggml.add_eos_token",
            impl.flavor == Flavor::kHf ? !impl.suffix_ids.empty() : impl.add_eos);
  if (impl.flavor == Flavor::kSpm || impl.flavor == Flavor::kLlama2c) {
    w.SetString("tokenizer.ggml.model", "llama");
    w.SetF32Array("tokenizer.ggml.scores", m.scores);
    w.SetBool("tokenizer.ggml.add_space_prefix", impl.add_space_prefix);
    return Status::Ok();
  }
  // kHf: byte-level pipelines map onto "gpt2"; anything else keeps its JSON.
  bool byte_level = impl.byte_level_decode && impl.pretokenizers.size() == 2 &&
                    impl.pretokenizers[0].kind == PreTokenizerKind::kSplit &&
                    impl.pretokenizers[0].pattern_is_regex &&
                    impl.pretokenizers[1].kind == PreTokenizerKind::kByteLevel &&
                    !impl.pretokenizers[1].use_regex && !impl.pretokenizers[1].add_prefix_space &&
                    impl.normalizers.size() <= 1 &&
                    (impl.normalizers.empty() || impl.normalizers[0].kind == NormalizerKind::kNfc);
  w.SetString("tokenizer.ggml.model", "gpt2");
  std::vector<std::string> merges;
  merges.reserve(m.merge_list.size());
  for (auto [a, b] : m.merge_list) merges.push_back(m.pieces[a] + " " + m.pieces[b]);
  w.SetStringArray("tokenizer.ggml.merges", merges);
  if (!byte_level) {
    if (impl.hf_json.empty()) return Error("ExportGguf: no tokenizer.json to embed");
    w.SetString("tokenizer.lumen.hf_json", impl.hf_json);
    w.SetString("tokenizer.lumen.hf_config_json", impl.hf_config_json);
    return Status::Ok();
  }
  const std::string& re = impl.pretokenizers[0].pattern.source();
  std::string pre = re == kLlama3Pattern ? "llama-bpe" : re == kQwen2Pattern ? "qwen2" : "";
  if (pre.empty()) {
    w.SetString("tokenizer.ggml.pre", "default");
    w.SetString("tokenizer.lumen.pre_regex", re);
  } else {
    w.SetString("tokenizer.ggml.pre", pre);
  }
  w.SetBool("tokenizer.lumen.ignore_merges", m.ignore_merges);
  if (!impl.normalizers.empty()) w.SetString("tokenizer.lumen.normalizer", "NFC");
  return Status::Ok();
}

Status Tokenizer::ExportHf(const std::string& dir) const {
  namespace fs = std::filesystem;
  using json = nlohmann::json;
  const TokenizerImpl& impl = *impl_;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Errorf("{}: cannot create directory: {}", dir, ec.message());
  std::string tj = impl.hf_json, cj = impl.hf_config_json;
  if (tj.empty()) {
    // Build a tokenizer.json for SentencePiece-style and GGUF byte-level vocabularies.
    const BpeModel& m = impl.model;
    json vocab = json::object();
    for (size_t i = 0; i < m.pieces.size(); ++i) vocab[m.pieces[i]] = i;
    json merges = json::array();
    if (impl.flavor == Flavor::kHf) {
      for (auto [a, b] : m.merge_list) merges.push_back({m.pieces[a], m.pieces[b]});
    } else {
      // SentencePiece scores -> merge ranks: every split of a piece into two
      // pieces, ordered by the merged piece's score (as HF's LlamaConverter).
      struct M {
        float score;
        int32_t id, a, b;
      };
      std::vector<M> ms;
      for (size_t i = 0; i < m.pieces.size(); ++i) {
        if (impl.token_type[i] != kTypeNormal) continue;
        const std::string& p = m.pieces[i];
        for (size_t k = 1; k < p.size(); ++k) {
          if ((static_cast<unsigned char>(p[k]) & 0xC0) == 0x80) continue;
          auto a = m.Find(p.substr(0, k)), b = m.Find(p.substr(k));
          if (a && b) ms.push_back({m.scores[i], int32_t(i), *a, *b});
        }
      }
      std::stable_sort(ms.begin(), ms.end(), [](const M& x, const M& y) {
        if (x.score != y.score) return x.score > y.score;
        if (x.a != y.a) return x.a < y.a;
        return x.b < y.b;
      });
      for (const M& e : ms) merges.push_back({m.pieces[e.a], m.pieces[e.b]});
    }
    json model = {{"type", "BPE"},
                  {"vocab", vocab},
                  {"merges", merges},
                  {"byte_fallback", impl.flavor != Flavor::kHf},
                  {"ignore_merges", m.ignore_merges},
                  {"fuse_unk", impl.flavor != Flavor::kHf},
                  {"unk_token", impl.unk >= 0 ? json(m.pieces[impl.unk]) : json()}};
    json added = json::array();
    for (const AddedToken& a : impl.added) {
      added.push_back({{"id", a.id},
                       {"content", a.content},
                       {"special", a.special},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"single_word", false}});
    }
    json j = {{"version", "1.0"}, {"added_tokens", added}, {"model", model}};
    auto single = json::array();
    if (adds_bos())
      single.push_back({{"SpecialToken", {{"id", m.pieces[impl.bos]}, {"type_id", 0}}}});
    single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
    if (impl.flavor == Flavor::kHf ? !impl.suffix_ids.empty() : impl.add_eos) {
      single.push_back({{"SpecialToken", {{"id", m.pieces[impl.eos]}, {"type_id", 0}}}});
    }
    j["post_processor"] = {{"type", "TemplateProcessing"}, {"single", single}, {"pair", single}};
    if (impl.flavor == Flavor::kHf) {
      j["normalizer"] = impl.normalizers.empty() ? json() : json({{"type", "NFC"}});
      j["pre_tokenizer"] = {
          {"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"},
             {"pattern", {{"Regex", impl.pretokenizers[0].pattern.source()}}},
             {"behavior", "Isolated"},
             {"invert", false}},
            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
      j["decoder"] = {{"type", "ByteLevel"}};
    } else {
      if (impl.flavor == Flavor::kLlama2c)
        return Error(
            "a llama2.c tokenizer.bin vocabulary has no Hugging Face tokenizer.json form; "
            "write GGUF instead (an output path ending in .gguf)");
      json norms = json::array();
      if (impl.add_space_prefix)
        norms.push_back({{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}});
      norms.push_back(
          {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}});
      j["normalizer"] = {{"type", "Sequence"}, {"normalizers", norms}};
      j["pre_tokenizer"] = json();
      json decs = json::array(
          {{{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
           {{"type", "ByteFallback"}},
           {{"type", "Fuse"}}});
      if (impl.add_space_prefix)
        decs.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
      j["decoder"] = {{"type", "Sequence"}, {"decoders", decs}};
    }
    tj = j.dump();
    json c = {{"clean_up_tokenization_spaces", false}};
    if (!impl.chat_template.empty()) c["chat_template"] = impl.chat_template;
    if (!impl.bos_text.empty()) c["bos_token"] = impl.bos_text;
    if (!impl.eos_text.empty()) c["eos_token"] = impl.eos_text;
    cj = c.dump(2);
  }
  LUMEN_RETURN_IF_ERROR(WriteFileAtomic((fs::path(dir) / "tokenizer.json").string(), tj));
  if (!cj.empty()) {
    LUMEN_RETURN_IF_ERROR(WriteFileAtomic((fs::path(dir) / "tokenizer_config.json").string(), cj));
  }
  return Status::Ok();
}

}  // namespace lumen::tokenize
