// Normalizers and pre-tokenizers of the Hugging Face tokenizer.json pipeline,
// with the semantics of transformers.js (the reference lumen's goldens come
// from). Regexes run on PCRE2 (UTF, JIT); `\s`/`\S` are rewritten to the
// JavaScript whitespace set and `(?i:'s|...)` to its JS spelling so that the
// split points equal the reference's.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "lumen/core/status.h"

namespace lumen::tokenize {

// A compiled PCRE2 pattern (shared, immutable; matching is thread-safe).
class Regex {
 public:
  // `js_compat`: rewrite the pattern as transformers.js does before compiling.
  static Result<Regex> Compile(std::string_view pattern, bool js_compat = true);
  static Regex Literal(std::string_view text);  // matches `text` exactly
  // Calls fn(start, end) for each non-overlapping match, left to right.
  template <typename Fn>
  void ForEachMatch(std::string_view text, Fn&& fn) const;
  const std::string& source() const { return source_; }
  bool is_literal() const { return !code_; }

 private:
  struct Code;
  std::shared_ptr<Code> code_;
  std::string source_;  // original pattern (or the literal)
  std::vector<std::pair<size_t, size_t>> Matches(std::string_view text) const;
  friend struct RegexAccess;
};

template <typename Fn>
void Regex::ForEachMatch(std::string_view text, Fn&& fn) const {
  for (auto [s, e] : Matches(text)) fn(s, e);
}

enum class NormalizerKind { kNfc, kNfd, kNfkc, kNfkd, kReplace, kPrepend, kLowercase, kStrip };
struct NormalizerStep {
  NormalizerKind kind;
  Regex pattern;  // kReplace
  bool pattern_is_regex = false;
  std::string content;             // kReplace replacement, kPrepend text
  bool left = true, right = true;  // kStrip
};

enum class SplitBehavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };
enum class PreTokenizerKind { kSplit, kByteLevel, kMetaspace, kDigits };
struct PreTokenizerStep {
  PreTokenizerKind kind;
  Regex pattern;  // kSplit; kByteLevel when use_regex (GPT-2 pattern)
  bool pattern_is_regex = false;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;             // kByteLevel, kMetaspace
  bool use_regex = true;                     // kByteLevel
  std::string replacement = "\xE2\x96\x81";  // kMetaspace
  std::string prepend_scheme = "always";     // kMetaspace: first/always/never
  bool split = true;                         // kMetaspace
  bool individual_digits = false;            // kDigits
};

std::string ApplyNormalizers(const std::vector<NormalizerStep>& steps, std::string text);

// Splits `text` into pre-tokens. When the last step is ByteLevel the pieces are
// left as raw bytes and *byte_level is set (the model maps them to the byte
// alphabet itself); earlier ByteLevel steps map in place.
void PreTokenize(const std::vector<PreTokenizerStep>& steps, std::string_view text,
                 bool first_section, std::vector<std::string>& out, bool* byte_level);

bool IsJsSpace(char32_t cp);

// The GPT-2 pattern of the ByteLevel pre-tokenizer and the named patterns of
// GGUF tokenizer.ggml.pre.
extern const char kGpt2Pattern[];
extern const char kLlama3Pattern[];
extern const char kQwen2Pattern[];

}  // namespace lumen::tokenize
