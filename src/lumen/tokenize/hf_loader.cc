// Loading Hugging Face tokenizer.json / tokenizer_config.json.
#include <filesystem>

#include <nlohmann/json.hpp>

#include "lumen/core/buffer.h"
#include "lumen/tokenize/tokenizer.h"
#include "lumen/tokenize/tokenizer_impl.h"

namespace lumen::tokenize {
namespace {

using json = nlohmann::json;

// Token text from a string or an AddedToken object ({"content": ...}).
std::string TokenText(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j.at("content").is_string()) {
    return j.at("content").get<std::string>();
  }
  return {};
}

Result<Regex> PatternOf(const json& p, const std::string& where, bool* is_regex) {
  if (p.contains("Regex")) {
    *is_regex = true;
    auto r = Regex::Compile(p.at("Regex").get<std::string>());
    if (!r.ok()) return r.status().WithContext(where);
    return r;
  }
  if (p.contains("String")) {
    *is_regex = false;
    return Regex::Literal(p.at("String").get<std::string>());
  }
  return Errorf("{}: pattern needs \"Regex\" or \"String\"", where);
}

Status ParseNormalizer(const json& j, std::vector<NormalizerStep>& out) {
  if (j.is_null()) return Status::Ok();
  std::string type = j.value("type", "");
  if (type == "Sequence") {
    for (const json& s : j.at("normalizers")) LUMEN_RETURN_IF_ERROR(ParseNormalizer(s, out));
    return Status::Ok();
  }
  NormalizerStep st;
  if (type == "NFC")
    st.kind = NormalizerKind::kNfc;
  else if (type == "NFD")
    st.kind = NormalizerKind::kNfd;
  else if (type == "NFKC")
    st.kind = NormalizerKind::kNfkc;
  else if (type == "NFKD")
    st.kind = NormalizerKind::kNfkd;
  else if (type == "Lowercase")
    st.kind = NormalizerKind::kLowercase;
  else if (type == "Prepend") {
    st.kind = NormalizerKind::kPrepend;
    st.content = j.value("prepend", "");
  } else if (type == "Replace") {
    st.kind = NormalizerKind::kReplace;
    LUMEN_ASSIGN_OR_RETURN(st.pattern,
                           PatternOf(j.at("pattern"), "normalizer Replace", &st.pattern_is_regex));
    st.content = j.value("content", "");
  } else if (type == "Strip") {
    st.kind = NormalizerKind::kStrip;
    st.left = j.value("strip_left", true);
    st.right = j.value("strip_right", true);
  } else {
    return Errorf("normalizer type '{}' is not supported", type);
  }
  out.push_back(std::move(st));
  return Status::Ok();
}

SplitBehavior BehaviorOf(const std::string& b) {
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  return SplitBehavior::kIsolated;
}

Status ParsePreTokenizer(const json& j, std::vector<PreTokenizerStep>& out) {
  if (j.is_null()) return Status::Ok();
  std::string type = j.value("type", "");
  if (type == "Sequence") {
    for (const json& s : j.at("pretokenizers")) LUMEN_RETURN_IF_ERROR(ParsePreTokenizer(s, out));
    return Status::Ok();
  }
  PreTokenizerStep st;
  if (type == "Split") {
    st.kind = PreTokenizerKind::kSplit;
    LUMEN_ASSIGN_OR_RETURN(st.pattern,
                           PatternOf(j.at("pattern"), "pre_tokenizer Split", &st.pattern_is_regex));
    st.behavior = BehaviorOf(j.value("behavior", "Isolated"));
    st.invert = j.value("invert", false);
  } else if (type == "ByteLevel") {
    st.kind = PreTokenizerKind::kByteLevel;
    st.add_prefix_space = j.value("add_prefix_space", true);
    st.use_regex = j.value("use_regex", true);
    if (st.use_regex) {
      LUMEN_ASSIGN_OR_RETURN(st.pattern, Regex::Compile(kGpt2Pattern));
      st.pattern_is_regex = true;
    }
  } else if (type == "Metaspace") {
    st.kind = PreTokenizerKind::kMetaspace;
    st.replacement = j.value("replacement", "\xE2\x96\x81");
    st.prepend_scheme = j.value("prepend_scheme", "always");
    st.add_prefix_space = j.value("add_prefix_space", true);
    st.split = j.value("split", true);
  } else if (type == "Digits") {
    st.kind = PreTokenizerKind::kDigits;
    st.individual_digits = j.value("individual_digits", false);
  } else {
    return Errorf("pre_tokenizer type '{}' is not supported", type);
  }
  out.push_back(std::move(st));
  return Status::Ok();
}

Status ParseDecoder(const json& j, std::vector<DecoderStep>& out) {
  if (j.is_null()) return Status::Ok();
  std::string type = j.value("type", "");
  if (type == "Sequence") {
    for (const json& s : j.at("decoders")) LUMEN_RETURN_IF_ERROR(ParseDecoder(s, out));
    return Status::Ok();
  }
  DecoderStep d;
  if (type == "ByteLevel")
    d.kind = DecoderKind::kByteLevel;
  else if (type == "ByteFallback")
    d.kind = DecoderKind::kByteFallback;
  else if (type == "Fuse")
    d.kind = DecoderKind::kFuse;
  else if (type == "Strip") {
    d.kind = DecoderKind::kStrip;
    d.a = j.value("content", " ");
    d.start = j.value("start", 0);
    d.stop = j.value("stop", 0);
  } else if (type == "Replace") {
    d.kind = DecoderKind::kReplace;
    if (!j.at("pattern").contains("String")) {
      return Error("decoder Replace: only {\"String\": ...} patterns are supported");
    }
    d.a = j.at("pattern").at("String").get<std::string>();
    d.b = j.value("content", "");
  } else if (type == "Metaspace") {
    d.kind = DecoderKind::kMetaspace;
    d.a = j.value("replacement", "\xE2\x96\x81");
    d.prepend = j.value("add_prefix_space", true) && j.value("prepend_scheme", "always") != "never";
  } else {
    return Errorf("decoder type '{}' is not supported", type);
  }
  out.push_back(std::move(d));
  return Status::Ok();
}

void ParsePostProcessor(const json& j, TokenizerImpl& impl) {
  if (j.is_null()) return;
  std::string type = j.value("type", "");
  if (type == "Sequence") {
    for (const json& s : j.at("processors")) ParsePostProcessor(s, impl);
    return;
  }
  auto id_of = [&](const std::string& name) -> int32_t {
    if (j.contains("special_tokens") && j.at("special_tokens").contains(name)) {
      const json& ids = j.at("special_tokens").at(name).at("ids");
      if (ids.is_array() && !ids.empty()) return ids.at(0).get<int32_t>();
    }
    return impl.model.Find(name).value_or(-1);
  };
  if (type == "TemplateProcessing") {
    impl.prefix_ids.clear();
    impl.suffix_ids.clear();
    bool after = false;
    for (const json& item : j.at("single")) {
      if (item.contains("Sequence")) {
        after = true;
      } else if (item.contains("SpecialToken")) {
        int32_t id = id_of(item.at("SpecialToken").at("id").get<std::string>());
        if (id >= 0) (after ? impl.suffix_ids : impl.prefix_ids).push_back(id);
      }
    }
  } else if (type == "BertProcessing" || type == "RobertaProcessing") {
    impl.prefix_ids = {j.at("cls").at(1).get<int32_t>()};
    impl.suffix_ids = {j.at("sep").at(1).get<int32_t>()};
  }
}

Status LoadModel(const json& m, TokenizerImpl& impl) {
  std::string type = m.value("type", "BPE");
  if (type != "BPE") return Errorf("model type '{}' is not supported (only BPE)", type);
  BpeModel& bpe = impl.model;
  const json& vocab = m.at("vocab");
  if (!vocab.is_object()) return Error("model.vocab: expected an object");
  int64_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    int64_t id = it.value().get<int64_t>();
    if (id < 0 || id > (1 << 22))
      return Errorf("model.vocab['{}']: id {} out of range", it.key(), id);
    max_id = std::max(max_id, id);
  }
  if (impl.added.size()) {
    for (const AddedToken& t : impl.added) max_id = std::max<int64_t>(max_id, t.id);
  }
  bpe.pieces.assign(size_t(max_id + 1), std::string());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    bpe.pieces[it.value().get<int64_t>()] = it.key();
  }
  for (const AddedToken& t : impl.added) {
    if (bpe.pieces[t.id].empty()) bpe.pieces[t.id] = t.content;
  }
  bpe.BuildIndex();
  // transformers.js maps token text to ids with added tokens taking precedence.
  for (const AddedToken& t : impl.added) bpe.SetPiece(t.content, t.id);
  bpe.byte_fallback = m.value("byte_fallback", false);
  bpe.ignore_merges = m.value("ignore_merges", false);
  bpe.fuse_unk = m.value("fuse_unk", false);
  if (m.contains("continuing_subword_prefix") && m.at("continuing_subword_prefix").is_string()) {
    bpe.continuing_subword_prefix = m.at("continuing_subword_prefix").get<std::string>();
  }
  if (m.contains("end_of_word_suffix") && m.at("end_of_word_suffix").is_string()) {
    bpe.end_of_word_suffix = m.at("end_of_word_suffix").get<std::string>();
  }
  if (m.contains("unk_token") && m.at("unk_token").is_string()) {
    bpe.unk_id = bpe.Find(m.at("unk_token").get<std::string>()).value_or(-1);
  }
  const json& merges = m.at("merges");
  if (!merges.is_array()) return Error("model.merges: expected an array");
  bpe.merges.Reserve(merges.size());
  bpe.merge_list.reserve(merges.size());
  size_t i = 0;
  for (const json& mg : merges) {
    std::string a, b;
    if (mg.is_string()) {
      const std::string& s = mg.get_ref<const std::string&>();
      size_t sp = s.find(' ');
      if (sp == std::string::npos) return Errorf("model.merges[{}]: '{}' has no space", i, s);
      a = s.substr(0, sp);
      size_t sp2 = s.find(' ', sp + 1);
      b = s.substr(sp + 1, sp2 == std::string::npos ? std::string::npos : sp2 - sp - 1);
    } else if (mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string()) {
      a = mg[0].get<std::string>();
      b = mg[1].get<std::string>();
    } else {
      return Errorf("model.merges[{}]: expected \"a b\" or [a, b]", i);
    }
    // A merge whose parts are not in the vocabulary can never apply.
    bpe.AddMerge(a, b);
    ++i;
  }
  bpe.scores.assign(bpe.pieces.size(), 0.0f);
  return Status::Ok();
}

Result<Tokenizer> Build(std::string_view tj, std::string_view cj, const std::string& name) {
  auto impl = std::make_shared<TokenizerImpl>();
  impl->flavor = Flavor::kHf;
  impl->name = name;
  try {
    json j = json::parse(tj);
    if (!j.is_object()) return Error("tokenizer.json: expected an object");
    if (j.contains("added_tokens") && j.at("added_tokens").is_array()) {
      for (const json& a : j.at("added_tokens")) {
        AddedToken t;
        t.content = a.value("content", "");
        t.id = a.value("id", -1);
        t.special = a.value("special", false);
        t.lstrip = a.value("lstrip", false);
        t.rstrip = a.value("rstrip", false);
        t.normalized = a.value("normalized", false);
        t.single_word = a.value("single_word", false);
        if (t.id < 0 || t.id > (1 << 22) || t.content.empty()) {
          return Errorf("added_tokens: bad entry '{}'", a.dump());
        }
        impl->added.push_back(std::move(t));
      }
    }
    if (!j.contains("model")) return Error("tokenizer.json: no \"model\"");
    LUMEN_RETURN_IF_ERROR(LoadModel(j.at("model"), *impl).WithContext("model"));
    LUMEN_RETURN_IF_ERROR(ParseNormalizer(j.value("normalizer", json()), impl->normalizers));
    LUMEN_RETURN_IF_ERROR(ParsePreTokenizer(j.value("pre_tokenizer", json()), impl->pretokenizers));
    LUMEN_RETURN_IF_ERROR(ParseDecoder(j.value("decoder", json()), impl->decoders));
    ParsePostProcessor(j.value("post_processor", json()), *impl);
    const int64_t V = static_cast<int64_t>(impl->model.pieces.size());
    for (const std::vector<int32_t>* ids : {&impl->prefix_ids, &impl->suffix_ids})
      for (const int32_t id : *ids)
        if (id < 0 || id >= V)
          return Errorf("post_processor: special token id {} is outside the vocabulary (size {})",
                        id, V);
    for (const DecoderStep& d : impl->decoders) {
      if (d.kind == DecoderKind::kByteLevel) impl->byte_level_decode = true;
    }
    impl->clean_up_spaces = true;  // transformers.js default
    if (!cj.empty()) {
      json c = json::parse(cj);
      if (!c.is_object()) return Error("tokenizer_config.json: expected an object");
      if (c.contains("clean_up_tokenization_spaces") &&
          c.at("clean_up_tokenization_spaces").is_boolean()) {
        impl->clean_up_spaces = c.at("clean_up_tokenization_spaces").get<bool>();
      }
      if (c.contains("bos_token")) impl->bos_text = TokenText(c.at("bos_token"));
      if (c.contains("eos_token")) impl->eos_text = TokenText(c.at("eos_token"));
      if (c.contains("add_bos_token") && c.at("add_bos_token").is_boolean()) {
        impl->add_bos = c.at("add_bos_token").get<bool>();
      }
      if (c.contains("add_eos_token") && c.at("add_eos_token").is_boolean()) {
        impl->add_eos = c.at("add_eos_token").get<bool>();
      }
      if (c.contains("pad_token"))
        impl->pad = impl->model.Find(TokenText(c.at("pad_token"))).value_or(-1);
      if (c.contains("additional_special_tokens") && c.at("additional_special_tokens").is_array()) {
        for (const json& s : c.at("additional_special_tokens")) {
          std::string t = TokenText(s);
          for (AddedToken& a : impl->added) {
            if (a.content == t) a.special = true;
          }
        }
      }
      if (c.contains("chat_template")) {
        const json& ct = c.at("chat_template");
        if (ct.is_string()) {
          impl->chat_template = ct.get<std::string>();
        } else if (ct.is_array()) {
          for (const json& e : ct) {
            if (e.value("name", "") == "default") impl->chat_template = e.value("template", "");
          }
        }
      }
    }
  } catch (const json::exception& e) {
    return Errorf("{}: {}", name, e.what());
  }
  if (!impl->bos_text.empty()) impl->bos = impl->model.Find(impl->bos_text).value_or(-1);
  if (impl->bos < 0 && !impl->prefix_ids.empty()) {
    impl->bos = impl->prefix_ids[0];
    impl->bos_text = impl->model.pieces[impl->bos];
  }
  if (!impl->eos_text.empty()) impl->eos = impl->model.Find(impl->eos_text).value_or(-1);
  impl->add_bos = !impl->prefix_ids.empty();
  impl->add_eos = !impl->suffix_ids.empty();
  impl->unk = impl->model.unk_id;
  impl->Finish();
  impl->hf_json = std::string(tj);
  impl->hf_config_json = std::string(cj);
  return Tokenizer(std::move(impl));
}

}  // namespace

Result<Tokenizer> Tokenizer::FromHfJson(std::string_view tokenizer_json,
                                        std::string_view config_json, const std::string& name) {
  auto r = Build(tokenizer_json, config_json, name);
  if (!r.ok()) return r.status().WithContext(name);
  return r;
}

Result<Tokenizer> Tokenizer::FromHf(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string tok_path = path, cfg_path;
  if (fs::is_directory(path, ec)) {
    tok_path = (fs::path(path) / "tokenizer.json").string();
    cfg_path = (fs::path(path) / "tokenizer_config.json").string();
  } else {
    cfg_path = (fs::path(path).parent_path() / "tokenizer_config.json").string();
  }
  LUMEN_ASSIGN_OR_RETURN(std::string tj, ReadFile(tok_path));
  std::string cj;
  if (fs::exists(cfg_path, ec)) {
    LUMEN_ASSIGN_OR_RETURN(cj, ReadFile(cfg_path));
  }
  return FromHfJson(tj, cj, tok_path);
}

}  // namespace lumen::tokenize
