// MakeSyntheticTokenizer: a small deterministic vocabulary for `lumen synth`.
// Merges are learned greedily (most frequent adjacent pair, ties broken by the
// pair's ids, then by `seed`-independent order) from a built-in English text,
// so the same arguments always give the same tokenizer.
#include <map>

#include <nlohmann/json.hpp>

#include "lumen/tokenize/tokenizer.h"
#include "lumen/tokenize/tokenizer_impl.h"
#include "lumen/tokenize/unicode.h"

namespace lumen::tokenize {
namespace {

constexpr char kText[] =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
    "park with her friends. One day, she saw a big red ball under a tree. She wanted to play "
    "with it, but it was too high. Her mother said that they could ask the man at the shop for "
    "help. The man was kind and he gave them a long stick. Lily and her mother were very happy "
    "and they played with the ball all day. The sun was warm and the birds were singing in the "
    "trees. When it was time to go home, Lily said thank you to the man and waved goodbye. "
    "The quick brown fox jumps over the lazy dog. It is what it is, and that is that.";

constexpr char kChatMl[] =
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\n' }}{% endif %}";

// Learns merges over words given as symbol-string sequences.
std::vector<std::pair<std::string, std::string>> Learn(std::vector<std::vector<std::string>> words,
                                                       size_t n_merges) {
  std::vector<std::pair<std::string, std::string>> merges;
  while (merges.size() < n_merges) {
    std::map<std::pair<std::string, std::string>, int> counts;
    for (const auto& w : words) {
      for (size_t i = 0; i + 1 < w.size(); ++i) ++counts[{w[i], w[i + 1]}];
    }
    const std::pair<std::string, std::string>* best = nullptr;
    int best_n = 1;  // a pair must occur at least twice
    for (const auto& [p, n] : counts) {
      if (n > best_n) {
        best_n = n;
        best = &p;
      }
    }
    if (!best) break;
    auto pair = *best;
    merges.push_back(pair);
    for (auto& w : words) {
      std::vector<std::string> nw;
      for (size_t i = 0; i < w.size(); ++i) {
        if (i + 1 < w.size() && w[i] == pair.first && w[i + 1] == pair.second) {
          nw.push_back(pair.first + pair.second);
          ++i;
        } else {
          nw.push_back(w[i]);
        }
      }
      w = std::move(nw);
    }
  }
  return merges;
}

}  // namespace

Result<Tokenizer> MakeSyntheticTokenizer(SyntheticKind kind, int vocab_size, uint64_t seed) {
  (void)seed;  // the vocabulary is fixed by the text; seed kept for the CLI contract
  using json = nlohmann::json;
  const std::vector<std::string> specials = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  if (kind == SyntheticKind::kByteBpe) {
    int base = 256 + int(specials.size());
    if (vocab_size < base)
      return Errorf("synthetic byte_bpe: vocab_size {} < {}", vocab_size, base);
    std::vector<std::vector<std::string>> words;
    std::string text = kText;
    size_t start = 0;
    for (size_t i = 1; i <= text.size(); ++i) {
      if (i == text.size() || text[i] == ' ') {
        std::vector<std::string> w;
        for (size_t k = start; k < i; ++k) {
          std::string ch;
          AppendUtf8(ch, ByteToUnicode(uint8_t(text[k])));
          w.push_back(ch);
        }
        words.push_back(std::move(w));
        start = i;
      }
    }
    auto merges = Learn(words, size_t(vocab_size - base));
    json vocab = json::object();
    int id = 0;
    for (int b = 0; b < 256; ++b) {
      std::string ch;
      AppendUtf8(ch, ByteToUnicode(uint8_t(b)));
      vocab[ch] = id++;
    }
    json jm = json::array();
    for (auto& [a, b] : merges) {
      if (!vocab.contains(a + b)) vocab[a + b] = id++;
      jm.push_back({a, b});
    }
    json added = json::array();
    for (const auto& s : specials) {
      added.push_back({{"id", id},
                       {"content", s},
                       {"special", true},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"single_word", false}});
      vocab[s] = id++;
    }
    // The learned merges cannot fill a large vocabulary from the short text;
    // fill the rest with whole-word tokens (" w0", " w1", ...) so every id a
    // model can emit decodes to text. Encoding never produces them (no merges).
    for (int k = 0; id < vocab_size; ++k) {
      std::string enc;
      for (unsigned char c : " w" + std::to_string(k)) AppendUtf8(enc, ByteToUnicode(c));
      if (!vocab.contains(enc)) vocab[enc] = id++;
    }
    json split = {{"type", "Split"},
                  {"pattern", {{"Regex", std::string(kQwen2Pattern)}}},
                  {"behavior", "Isolated"},
                  {"invert", false}};
    json bl = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
    json j = json::object();
    j["version"] = "1.0";
    j["added_tokens"] = added;
    j["normalizer"] = nullptr;
    j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", json::array({split, bl})}};
    j["post_processor"] = nullptr;
    j["decoder"] = {{"type", "ByteLevel"}};
    j["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", jm}};
    json cfg = {{"chat_template", kChatMl},
                {"eos_token", "<|im_end|>"},
                {"clean_up_tokenization_spaces", false}};
    return Tokenizer::FromHfJson(j.dump(), cfg.dump(), "synthetic byte_bpe");
  }
  // SentencePiece-style: <unk> <s> </s>, 256 byte pieces, then merged pieces
  // scored by merge order; ChatML markers are user-defined tokens.
  int base = 3 + 256 + int(specials.size());
  if (vocab_size < base) return Errorf("synthetic spm: vocab_size {} < {}", vocab_size, base);
  auto impl = std::make_shared<TokenizerImpl>();
  impl->flavor = Flavor::kSpm;
  impl->name = "synthetic spm";
  auto add = [&](std::string p, float score, int32_t type) {
    impl->model.pieces.push_back(std::move(p));
    impl->model.scores.push_back(score);
    impl->token_type.push_back(type);
  };
  add("<unk>", 0, kTypeUnknown);
  add("<s>", 0, kTypeControl);
  add("</s>", 0, kTypeControl);
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    snprintf(buf, sizeof(buf), "<0x%02X>", b);
    add(buf, 0, kTypeByte);
  }
  for (const auto& s : specials) add(s, 0, kTypeUserDefined);
  std::vector<std::vector<std::string>> words;
  std::string text = std::string(" ") + kText;
  std::vector<std::string> w;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == ' ' && !w.empty()) {
      words.push_back(std::move(w));
      w.clear();
    }
    w.push_back(text[i] == ' ' ? "\xE2\x96\x81" : std::string(1, text[i]));
  }
  words.push_back(std::move(w));
  // Single characters of the text are pieces too (SentencePiece keeps them).
  std::map<std::string, int> chars;
  for (const auto& wd : words)
    for (const auto& c : wd) chars[c] = 1;
  for (const auto& [c, _] : chars) add(c, -1e6f, kTypeNormal);
  int room = vocab_size - int(impl->model.pieces.size());
  auto merges = room > 0 ? Learn(words, size_t(room)) : decltype(Learn(words, 0)){};
  float score = 0;
  std::map<std::string, int> seen;
  for (const auto& p : impl->model.pieces) seen[p] = 1;
  for (auto& [a, b] : merges) {
    if (int(impl->model.pieces.size()) >= vocab_size) break;
    if (seen.count(a + b)) continue;
    seen[a + b] = 1;
    add(a + b, score, kTypeNormal);
    score -= 1;
  }
  // As above: whole-word fillers so every id decodes to text.
  for (int k = 0; int(impl->model.pieces.size()) < vocab_size; ++k) {
    const std::string w = "\xE2\x96\x81w" + std::to_string(k);  // "▁wK"
    if (seen.count(w)) continue;
    seen[w] = 1;
    add(w, -1e9f, kTypeNormal);
  }
  impl->model.BuildIndex();
  impl->bos = 1;
  impl->eos = 2;
  impl->unk = 0;
  impl->model.unk_id = 0;
  impl->add_bos = true;
  impl->bos_text = "<s>";
  impl->eos_text = "</s>";
  impl->chat_template = kChatMl;
  for (size_t i = 0; i < impl->model.pieces.size(); ++i) {
    int32_t t = impl->token_type[i];
    if (t == kTypeControl || t == kTypeUserDefined) {
      impl->added.push_back({impl->model.pieces[i], int32_t(i), t == kTypeControl});
    }
  }
  impl->Finish();
  if (auto id = impl->model.Find("<|im_end|>")) impl->eog.insert(*id);
  return Tokenizer(std::move(impl));
}

}  // namespace lumen::tokenize
