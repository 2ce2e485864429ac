#include "lumen/tokenize/tokenizer.h"
#include "lumen/core/route.h"

#include <algorithm>

#include "lumen/tokenize/tokenizer_impl.h"
#include "lumen/tokenize/unicode.h"

namespace lumen::tokenize {

LUMEN_ROUTE(tokenize_native,
            {.node = "tokenize",
             .name = "bpe/spm",
             .tier = Tier::kL1,
             .oracle = "HF tokenizers / transformers.js ids and llama.cpp's llama2.c tokenizer",
             .bound = "identical ids and round-trip text",
             .tests = "Fixtures/TestVectors.*;Goldens/CorpusGoldens.*;Llama2cTokenizer.*",
             .priority = 10});
namespace {

void TrieInsert(std::vector<TokenizerImpl::TrieNode>& trie, std::string_view s, int32_t idx) {
  if (trie.empty()) trie.emplace_back();
  int32_t node = 0;
  for (unsigned char c : s) {
    int32_t next = -1;
    for (auto& [k, v] : trie[node].kids) {
      if (k == c) next = v;
    }
    if (next < 0) {
      next = int32_t(trie.size());
      trie[node].kids.emplace_back(c, next);
      trie.emplace_back();
    }
    node = next;
  }
  if (trie[node].added < 0) trie[node].added = idx;
}

// Longest added token starting at text[i]; -1 when none.
int32_t TrieMatch(const std::vector<TokenizerImpl::TrieNode>& trie, std::string_view text, size_t i,
                  size_t* len) {
  if (trie.empty()) return -1;
  int32_t node = 0, best = -1;
  for (size_t j = i; j < text.size(); ++j) {
    unsigned char c = static_cast<unsigned char>(text[j]);
    int32_t next = -1;
    for (auto& [k, v] : trie[node].kids) {
      if (k == c) {
        next = v;
        break;
      }
    }
    if (next < 0) break;
    node = next;
    if (trie[node].added >= 0) {
      best = trie[node].added;
      *len = j + 1 - i;
    }
  }
  return best;
}

struct Section {
  std::string_view text;
  int32_t added = -1;  // index into impl.added, or -1 for plain text
};

std::vector<Section> SplitAdded(const TokenizerImpl& impl, std::string_view text,
                                bool parse_special) {
  const auto& trie = parse_special ? impl.trie_all : impl.trie_plain;
  std::vector<Section> out;
  size_t start = 0, i = 0;
  while (i < text.size()) {
    size_t len = 0;
    int32_t a = TrieMatch(trie, text, i, &len);
    if (a >= 0) {
      if (i > start) out.push_back({text.substr(start, i - start), -1});
      out.push_back({text.substr(i, len), a});
      i += len;
      start = i;
    } else {
      ++i;
    }
  }
  if (start < text.size()) out.push_back({text.substr(start), -1});
  return out;
}

std::string_view TrimJs(std::string_view s, bool left, bool right) {
  while (left && !s.empty()) {
    size_t i = 0;
    if (!IsJsSpace(DecodeUtf8(s, i))) break;
    s.remove_prefix(i);
  }
  while (right && !s.empty()) {
    size_t b = s.size() - 1;
    while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
    size_t i = b;
    if (!IsJsSpace(DecodeUtf8(s, i))) break;
    s = s.substr(0, b);
  }
  return s;
}

void EncodeHf(const TokenizerImpl& impl, std::string_view text, bool parse_special,
              std::vector<int32_t>& out) {
  std::vector<Section> secs = SplitAdded(impl, text, parse_special);
  for (size_t i = 0; i < secs.size(); ++i) {
    if (secs[i].added < 0) continue;
    const AddedToken& t = impl.added[secs[i].added];
    if (t.lstrip && i > 0 && secs[i - 1].added < 0) {
      secs[i - 1].text = TrimJs(secs[i - 1].text, false, true);
    }
    if (t.rstrip && i + 1 < secs.size() && secs[i + 1].added < 0) {
      secs[i + 1].text = TrimJs(secs[i + 1].text, true, false);
    }
  }
  std::vector<std::string> words;
  for (size_t i = 0; i < secs.size(); ++i) {
    const Section& s = secs[i];
    if (s.added >= 0) {
      out.push_back(impl.added[s.added].id);
      continue;
    }
    if (s.text.empty()) continue;
    std::string norm = impl.normalizers.empty()
                           ? std::string(s.text)
                           : ApplyNormalizers(impl.normalizers, std::string(s.text));
    if (norm.empty()) continue;
    words.clear();
    bool byte_level = false;
    if (impl.pretokenizers.empty()) {
      words.push_back(std::move(norm));
    } else {
      PreTokenize(impl.pretokenizers, norm, i == 0, words, &byte_level);
    }
    for (const std::string& w : words) {
      if (byte_level) {
        impl.model.EncodeByteLevel(w, out);
      } else {
        impl.model.EncodeWord(w, out);
      }
    }
  }
}

void EncodeSpm(const TokenizerImpl& impl, std::string_view text, bool parse_special,
               std::vector<int32_t>& out) {
  const bool llama2c = impl.flavor == Flavor::kLlama2c;
  if (llama2c) {
    // run.c: a dummy-prefix space, then merges over the raw text.
    if (text.empty()) return;
    std::string t = " ";
    t.append(text);
    impl.model.EncodeScored(t, out, 3);
    return;
  }
  std::vector<Section> secs = SplitAdded(impl, text, parse_special);
  bool prev_special = true;
  std::string buf;
  for (const Section& s : secs) {
    if (s.added >= 0) {
      out.push_back(impl.added[s.added].id);
      prev_special = true;
      continue;
    }
    buf.clear();
    if (impl.add_space_prefix && prev_special) buf += "\xE2\x96\x81";
    for (char c : s.text) {
      if (c == ' ')
        buf += "\xE2\x96\x81";
      else
        buf += c;
    }
    impl.model.EncodeScored(buf, out);
    prev_special = false;
  }
}

// JS `clean_up_tokenization`.
std::string CleanUp(std::string s) {
  static constexpr std::pair<std::string_view, std::string_view> kRules[] = {
      {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (auto [from, to] : kRules) {
    std::string out;
    size_t prev = 0;
    for (size_t pos; (pos = s.find(from, prev)) != std::string::npos; prev = pos + from.size()) {
      out.append(s, prev, pos - prev);
      out += to;
    }
    out.append(s, prev, std::string::npos);
    s = std::move(out);
  }
  return s;
}

void ReplaceAll(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  std::string out;
  size_t prev = 0;
  for (size_t pos; (pos = s.find(from, prev)) != std::string::npos; prev = pos + from.size()) {
    out.append(s, prev, pos - prev);
    out += to;
  }
  if (prev == 0) return;
  out.append(s, prev, std::string::npos);
  s = std::move(out);
}

int HexVal(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// JS ByteFallback: "<0xNN>" (6 UTF-16 units) with parseInt semantics.
int ByteFallbackValue(std::string_view t) {
  if (t.size() != 6 || !t.starts_with("<0x") || t.back() != '>') return -1;
  int a = HexVal(t[3]), b = HexVal(t[4]);
  if (a < 0) return -1;
  return b < 0 ? a : a * 16 + b;
}

// The ids Decode leaves out. HF drops what is special; SentencePiece and
// llama.cpp drop control tokens (always, for llama2.c's format).
bool Drops(const TokenizerImpl& impl, int32_t id, bool skip_special) {
  if (id < 0 || id >= int32_t(impl.model.pieces.size())) return true;
  if (impl.flavor == Flavor::kHf) return skip_special && impl.is_special[id];
  return impl.token_type[id] == kTypeControl && (skip_special || impl.flavor == Flavor::kLlama2c);
}

std::string DecodeHf(const TokenizerImpl& impl, std::span<const int32_t> ids, bool skip_special) {
  std::vector<std::string> toks;
  std::vector<uint8_t> is_added;
  toks.reserve(ids.size());
  for (int32_t id : ids) {
    if (Drops(impl, id, skip_special)) continue;
    toks.push_back(impl.model.pieces[id]);
    is_added.push_back(impl.token_type[id] == kTypeControl ||
                       impl.token_type[id] == kTypeUserDefined);
  }
  if (impl.decoders.empty()) {
    std::string out;
    for (size_t i = 0; i < toks.size(); ++i) {
      if (i) out += ' ';
      out += toks[i];
    }
    return impl.clean_up_spaces ? CleanUp(out) : out;
  }
  for (const DecoderStep& d : impl.decoders) {
    switch (d.kind) {
      case DecoderKind::kByteLevel: {
        std::vector<std::string> next;
        std::string bytes;
        auto flush = [&] {
          if (!bytes.empty()) next.push_back(SanitizeUtf8(bytes));
          bytes.clear();
        };
        for (size_t i = 0; i < toks.size(); ++i) {
          if (is_added[i]) {
            flush();
            next.push_back(toks[i]);
            continue;
          }
          const std::string& t = toks[i];
          for (size_t k = 0; k < t.size();) {
            int b = UnicodeToByte(DecodeUtf8(t, k));
            bytes.push_back(char(b < 0 ? 0 : b));
          }
        }
        flush();
        toks = std::move(next);
        is_added.assign(toks.size(), 0);
        break;
      }
      case DecoderKind::kReplace:
        for (auto& t : toks) ReplaceAll(t, d.a, d.b);
        break;
      case DecoderKind::kByteFallback: {
        std::vector<std::string> next;
        std::string bytes;
        auto flush = [&] {
          if (bytes.empty()) return;
          std::string_view v = bytes;
          if (v.starts_with("\xEF\xBB\xBF")) v.remove_prefix(3);  // TextDecoder drops a BOM
          next.push_back(SanitizeUtf8(v));
          bytes.clear();
        };
        for (auto& t : toks) {
          int b = ByteFallbackValue(t);
          if (b >= 0) {
            bytes.push_back(char(b));
          } else {
            flush();
            next.push_back(std::move(t));
          }
        }
        flush();
        toks = std::move(next);
        is_added.assign(toks.size(), 0);
        break;
      }
      case DecoderKind::kFuse: {
        std::string all;
        for (auto& t : toks) all += t;
        toks.clear();
        toks.push_back(std::move(all));
        is_added.assign(1, 0);
        break;
      }
      case DecoderKind::kStrip:
        for (auto& t : toks) {
          size_t b = 0, e = t.size();
          for (int k = 0; k < d.start && b < e && t.compare(b, d.a.size(), d.a) == 0; ++k) {
            b += d.a.size();
          }
          for (int k = 0;
               k < d.stop && e >= b + d.a.size() && t.compare(e - d.a.size(), d.a.size(), d.a) == 0;
               ++k) {
            e -= d.a.size();
          }
          t = t.substr(b, e - b);
        }
        break;
      case DecoderKind::kMetaspace:
        for (size_t i = 0; i < toks.size(); ++i) {
          ReplaceAll(toks[i], d.a, " ");
          if (d.prepend && i == 0 && toks[i].starts_with(' ')) toks[i].erase(0, 1);
        }
        break;
    }
  }
  std::string out;
  for (auto& t : toks) out += t;
  return impl.clean_up_spaces ? CleanUp(std::move(out)) : out;
}

std::string DecodeSpm(const TokenizerImpl& impl, std::span<const int32_t> ids, bool skip_special) {
  const bool llama2c = impl.flavor == Flavor::kLlama2c;
  std::string bytes;
  bool first = true;
  for (int32_t id : ids) {
    if (Drops(impl, id, skip_special)) continue;
    int32_t type = impl.token_type[id];
    const std::string& p = impl.model.pieces[id];
    if (type == kTypeByte) {
      int b = ByteFallbackValue(p);
      if (b >= 0) bytes.push_back(char(b));
    } else if (type == kTypeNormal || type == kTypeUndefined) {
      std::string t = p;
      if (!llama2c) ReplaceAll(t, "\xE2\x96\x81", " ");
      if (first && impl.add_space_prefix && t.starts_with(' ')) t.erase(0, 1);
      bytes += t;
    } else {
      bytes += p;
    }
    first = false;
  }
  return SanitizeUtf8(bytes);
}

}  // namespace

void TokenizerImpl::Finish() {
  size_t n = model.pieces.size();
  token_type.resize(n, kTypeNormal);
  is_special.assign(n, 0);
  trie_all.clear();
  trie_plain.clear();
  trie_all.emplace_back();
  trie_plain.emplace_back();
  for (size_t i = 0; i < added.size(); ++i) {
    const AddedToken& t = added[i];
    if (t.content.empty() || t.id < 0 || size_t(t.id) >= n) continue;
    if (t.special) is_special[t.id] = 1;
    if (token_type[t.id] == kTypeNormal) {
      token_type[t.id] = t.special ? kTypeControl : kTypeUserDefined;
    }
    TrieInsert(trie_all, t.content, int32_t(i));
    if (!t.special) TrieInsert(trie_plain, t.content, int32_t(i));
  }
  for (size_t i = 0; i < n; ++i) {
    if (token_type[i] == kTypeControl) is_special[i] = 1;
  }
  if (eos >= 0) eog.insert(eos);
  static constexpr std::string_view kEogNames[] = {
      "<|eot_id|>", "<|im_end|>", "<end_of_turn>", "<|end|>",    "<|endoftext|>", "<|end_of_text|>",
      "<|eom_id|>", "</s>",       "<eos>",         "<|return|>", "<|eot|>"};
  for (std::string_view name : kEogNames) {
    if (auto id = model.Find(name)) {
      if (is_special[*id] || token_type[*id] == kTypeControl) eog.insert(*id);
    }
  }
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_special,
                                       bool parse_special) const {
  const TokenizerImpl& impl = *impl_;
  std::string clean;
  if (!IsValidUtf8(text)) {
    clean = SanitizeUtf8(text);
    text = clean;
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (impl.flavor == Flavor::kHf) {
    if (add_special) out = impl.prefix_ids;
    EncodeHf(impl, text, parse_special, out);
    if (add_special) out.insert(out.end(), impl.suffix_ids.begin(), impl.suffix_ids.end());
  } else {
    if (add_special && impl.add_bos && impl.bos >= 0) out.push_back(impl.bos);
    EncodeSpm(impl, text, parse_special, out);
    if (add_special && impl.add_eos && impl.eos >= 0) out.push_back(impl.eos);
  }
  return out;
}

std::string Tokenizer::Decode(std::span<const int32_t> ids, bool skip_special) const {
  if (impl_->flavor == Flavor::kHf) return DecodeHf(*impl_, ids, skip_special);
  return DecodeSpm(*impl_, ids, skip_special);
}

bool Tokenizer::DecodeDrops(int32_t id, bool skip_special) const {
  return Drops(*impl_, id, skip_special);
}

std::string_view Tokenizer::Piece(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return impl_->model.pieces[id];
}

std::string Tokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  const TokenizerImpl& impl = *impl_;
  const std::string& p = impl.model.pieces[id];
  int32_t type = impl.token_type[id];
  if (type == kTypeControl || type == kTypeUserDefined) return p;
  int b = ByteFallbackValue(p);
  if (b >= 0 && (type == kTypeByte || impl.model.byte_piece_id[b] == id))
    return std::string(1, char(b));
  if (impl.flavor == Flavor::kHf && impl.byte_level_decode) {
    std::string out;
    for (size_t k = 0; k < p.size();) {
      int v = UnicodeToByte(DecodeUtf8(p, k));
      out.push_back(char(v < 0 ? 0 : v));
    }
    return out;
  }
  std::string t = p;
  if (impl.flavor != Flavor::kLlama2c) ReplaceAll(t, "\xE2\x96\x81", " ");
  return t;
}

std::optional<int32_t> Tokenizer::TokenId(std::string_view piece) const {
  return impl_->model.Find(piece);
}
bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->is_special[id];
}
int32_t Tokenizer::vocab_size() const { return int32_t(impl_->model.pieces.size()); }
int32_t Tokenizer::bos() const { return impl_->bos; }
int32_t Tokenizer::eos() const { return impl_->eos; }
bool Tokenizer::IsEog(int32_t id) const { return impl_->eog.count(id) > 0; }
const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }
const std::string& Tokenizer::bos_text() const { return impl_->bos_text; }
const std::string& Tokenizer::eos_text() const { return impl_->eos_text; }
bool Tokenizer::adds_bos() const {
  if (impl_->flavor == Flavor::kHf) {
    return !impl_->prefix_ids.empty() && impl_->prefix_ids[0] == impl_->bos;
  }
  return impl_->add_bos && impl_->bos >= 0;
}

// ---- StreamingDetokenizer ----

StreamingDetokenizer::StreamingDetokenizer(const Tokenizer& tok, bool skip_special)
    : tok_(&tok), skip_special_(skip_special) {}

// True when the raw bytes of the last tokens the decode keeps end in a proper
// prefix of a multi-byte UTF-8 character (a lead byte followed by fewer
// continuation bytes than it announces), i.e. the next token may still
// complete it. Dropped tokens (skipped specials) are passed over: the bytes
// around them join.
bool StreamingDetokenizer::EndsIncomplete(const std::vector<int32_t>& ids) const {
  std::string tail;
  int kept = 0;
  for (size_t i = ids.size(); i-- > 0 && kept < 4;) {
    if (tok_->DecodeDrops(ids[i], skip_special_)) continue;
    tail.insert(0, tok_->TokenBytes(ids[i]));
    ++kept;
  }
  const size_t n = tail.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto c = static_cast<unsigned char>(tail[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
    const size_t need = c >= 0xF0 && c <= 0xF4   ? 4
                        : c >= 0xE0 && c <= 0xEF ? 3
                        : c >= 0xC2 && c <= 0xDF ? 2
                                                 : 1;
    return need > back;
  }
  return false;
}

std::string StreamingDetokenizer::Push(int32_t id) {
  ids_.push_back(id);
  std::string text = tok_->Decode(ids_, skip_special_);
  // Hold back what a later token may still change: a trailing U+FFFD that
  // stands for the first bytes of an unfinished character and, with clean-up,
  // a trailing space run plus the next few characters. A U+FFFD for bytes
  // that can never become valid is final and goes out at once (otherwise a
  // stream of invalid bytes would be held until the end).
  size_t end = text.size();
  if (EndsIncomplete(ids_) && end >= 3 && text.compare(end - 3, 3, "\xEF\xBF\xBD") == 0) end -= 3;
  if (tok_->impl().clean_up_spaces) {
    size_t sp = text.rfind(' ', end);
    if (sp != std::string::npos && end - sp <= 4) end = sp;
  }
  return Take(text, end);
}

// What was sent cannot be taken back. Should a decode ever rewrite text
// already sent (no known tokenizer does, AnyIdSequenceStreamsToTheWholeDecode
// looks for one), the stream goes on from the first whole character past
// what was sent rather than repeat, split a character or fail.
std::string StreamingDetokenizer::Take(const std::string& text, size_t end) {
  size_t from = emitted_;
  while (from < text.size() && (static_cast<unsigned char>(text[from]) & 0xC0) == 0x80) ++from;
  if (end <= from) return "";
  emitted_ = end;
  return text.substr(from, end - from);
}

std::string StreamingDetokenizer::Flush() {
  const std::string text = tok_->Decode(ids_, skip_special_);
  return Take(text, text.size());
}

}  // namespace lumen::tokenize
