// Tokenizer: text <-> token ids for the vocabularies lumen loads.
//
// Sources: Hugging Face tokenizer.json (+ tokenizer_config.json), GGUF
// tokenizer.ggml.* metadata (model "llama" = SentencePiece BPE with scores and
// byte fallback, "gpt2" = byte-level BPE with merges), and llama2.c tokenizer
// .bin files. Encoding follows the reference of each source exactly:
// transformers.js / HF tokenizers for tokenizer.json, llama.cpp for GGUF, run.c
// for llama2.c (docs/reference/tokenizers.md lists the rules and the known
// differences between them).
//
// Input text is bytes; invalid UTF-8 is first replaced by U+FFFD per maximal
// invalid subpart, as a JS or Rust string would hold it. Decode returns valid
// UTF-8 (byte sequences that do not form UTF-8 become U+FFFD the same way).
//
// A Tokenizer is immutable after loading, cheap to copy (shared state) and safe
// to use from many threads at once.
//
//   LUMEN_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::FromHf("models/qwen3"));
//   std::vector<int32_t> ids = tok.Encode("Hello world", /*add_special=*/true);
//   std::string text = tok.Decode(ids);
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "lumen/core/status.h"

namespace lumen::formats {
class GgufFile;
class GgufWriter;
}  // namespace lumen::formats

namespace lumen::tokenize {

struct TokenizerImpl;

class Tokenizer {
 public:
  // A tokenizer.json file, or a directory holding tokenizer.json and optionally
  // tokenizer_config.json (chat_template, bos/eos text, add_bos/add_eos,
  // clean_up_tokenization_spaces).
  static Result<Tokenizer> FromHf(const std::string& path);
  // Same from in-memory JSON texts (config may be empty); `name` is used in errors.
  static Result<Tokenizer> FromHfJson(std::string_view tokenizer_json, std::string_view config_json,
                                      const std::string& name);
  static Result<Tokenizer> FromGguf(const formats::GgufFile& gguf);
  // llama2.c tokenizer.bin (e.g. tok512.bin) with run.c encode semantics.
  static Result<Tokenizer> FromLlama2c(const std::string& tok_bin_path, int vocab_size);

  // add_special: BOS/EOS as the post-processor / add_bos / add_eos say.
  // parse_special: special-token text (e.g. "<|im_start|>") maps to its id;
  // when false it is encoded as plain text.
  std::vector<int32_t> Encode(std::string_view text, bool add_special,
                              bool parse_special = true) const;
  // Ids out of range are skipped. skip_special drops special/control tokens.
  std::string Decode(std::span<const int32_t> ids, bool skip_special = false) const;
  // Whether Decode leaves this id out altogether (out of range, or a special
  // token that skip_special or the llama2.c format drops): the bytes on either
  // side of it then join.
  bool DecodeDrops(int32_t id, bool skip_special) const;

  // The vocabulary entry as stored (byte-level alphabet, "▁", "<0x0A>" ...).
  std::string_view Piece(int32_t id) const;
  // The bytes one token stands for on its own (may be partial UTF-8).
  std::string TokenBytes(int32_t id) const;
  std::optional<int32_t> TokenId(std::string_view piece) const;
  bool IsSpecial(int32_t id) const;
  int32_t vocab_size() const;
  int32_t bos() const;  // -1 when none
  int32_t eos() const;  // -1 when none
  // End of generation: eos, eot, <|im_end|>, <end_of_turn>, <|eot_id|> ...
  bool IsEog(int32_t id) const;
  const std::string& chat_template() const;
  const std::string& bos_text() const;
  const std::string& eos_text() const;
  // Whether Encode(add_special=true) prepends BOS.
  bool adds_bos() const;

  // Writes tokenizer.ggml.* so that FromGguf of the result encodes identically.
  Status ExportGguf(formats::GgufWriter& w) const;
  // Writes tokenizer.json (+ tokenizer_config.json) into `dir` so that FromHf
  // of it encodes identically.
  Status ExportHf(const std::string& dir) const;

  const TokenizerImpl& impl() const { return *impl_; }
  explicit Tokenizer(std::shared_ptr<const TokenizerImpl> impl) : impl_(std::move(impl)) {}

 private:
  std::shared_ptr<const TokenizerImpl> impl_;
};

// Incremental decoding for streaming output: Push returns the text that is
// complete so far (only whole UTF-8 characters), Flush returns the rest.
// The concatenation of every Push and the final Flush equals Decode(all ids).
class StreamingDetokenizer {
 public:
  explicit StreamingDetokenizer(const Tokenizer& tok, bool skip_special = false);
  std::string Push(int32_t id);
  std::string Flush();

 private:
  bool EndsIncomplete(const std::vector<int32_t>& ids) const;
  std::string Take(const std::string& text, size_t end);

  const Tokenizer* tok_;
  bool skip_special_;
  std::vector<int32_t> ids_;
  size_t emitted_ = 0;  // bytes of Decode(ids_) already returned
};

enum class SyntheticKind { kByteBpe, kSpm };
// A small working vocabulary for `lumen synth`: merges learned
// deterministically from built-in English text, plus a ChatML template.
Result<Tokenizer> MakeSyntheticTokenizer(SyntheticKind kind, int vocab_size, uint64_t seed);

}  // namespace lumen::tokenize
