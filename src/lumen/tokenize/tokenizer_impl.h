// Internal state of a Tokenizer, shared by the loaders (hf_loader.cc,
// gguf_loader.cc), the encoder (tokenizer.cc) and the exporters. Not part of
// the public API.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "lumen/tokenize/bpe.h"
#include "lumen/tokenize/pretokenize.h"

namespace lumen::tokenize {

// How text becomes model symbols; each flavor follows one reference.
enum class Flavor {
  kHf,       // tokenizer.json pipeline (transformers.js semantics)
  kSpm,      // llama.cpp llm_tokenizer_spm (GGUF "llama")
  kGguf2,    // llama.cpp byte-level BPE (GGUF "gpt2")
  kLlama2c,  // llama2.c run.c encode
};

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool single_word = false;
};

// GGUF token types (llama.cpp numbering).
enum TokenType : int32_t {
  kTypeUndefined = 0,
  kTypeNormal = 1,
  kTypeUnknown = 2,
  kTypeControl = 3,
  kTypeUserDefined = 4,
  kTypeUnused = 5,
  kTypeByte = 6,
};

enum class DecoderKind { kByteLevel, kMetaspace, kByteFallback, kFuse, kStrip, kReplace };
struct DecoderStep {
  DecoderKind kind;
  std::string a, b;         // Replace: pattern -> content; Metaspace: replacement
  int start = 0, stop = 0;  // Strip
  bool prepend = true;      // Metaspace: strip the leading space of the first token
};

struct TokenizerImpl {
  Flavor flavor = Flavor::kHf;
  std::string name;  // source path, for messages
  BpeModel model;
  std::vector<int32_t> token_type;  // per id (kTypeNormal when unknown)
  std::vector<AddedToken> added;
  std::vector<uint8_t> is_special;  // per id

  // kHf pipeline.
  std::vector<NormalizerStep> normalizers;
  std::vector<PreTokenizerStep> pretokenizers;
  std::vector<DecoderStep> decoders;
  bool clean_up_spaces = false;
  std::vector<int32_t> prefix_ids, suffix_ids;  // added by add_special
  // kHf loaded from JSON: the source texts, written back by the exporters.
  std::string hf_json, hf_config_json;

  // kSpm / kLlama2c.
  bool add_space_prefix = true;
  // kGguf2: the named pre-tokenizer.
  std::string gguf_pre;

  int32_t bos = -1, eos = -1, unk = -1, pad = -1;
  bool add_bos = false, add_eos = false;
  std::string bos_text, eos_text, chat_template;
  std::unordered_set<int32_t> eog;

  // Added-token matchers (byte tries, longest match): every added token, and
  // only the non-special ones (parse_special = false).
  struct TrieNode {
    int32_t added = -1;  // index into `added` ending here
    std::vector<std::pair<uint8_t, int32_t>> kids;
  };
  std::vector<TrieNode> trie_all, trie_plain;
  bool byte_level_decode = false;  // kHf: decoder chain has ByteLevel

  // Fills is_special, the tries and eog from the fields above.
  void Finish();
};

}  // namespace lumen::tokenize
