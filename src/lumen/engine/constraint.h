// Token constraints: a per-job hook that decides, step by step, which tokens a
// generation may take (tool_choice, response_format json_object).
//
// The Scheduler asks a job's TokenConstraint, before each decode step,
//   1. Forced(): tokens that must come next (no sampling; they are emitted as
//      ordinary tokens and appended to the session in one forward),
//   2. otherwise Mask(logits): every token that may not come next gets -inf,
//      then the job's Sampler runs its whole chain over what is left,
// and then Accept(token) with the token taken. When done() the job ends
// (FinishReason::kEos). Jobs without a constraint run the unconstrained path
// unchanged.
//
// GrammarConstraint is the one implementation: a byte-level matcher over a
// sequence of segments, each a literal, a choice among prefix-free strings
// (tool names followed by their closing quote), one JSON object, or one JSON
// value valid against a schema (constraint_schema.h). A token is
// allowed when all of its bytes keep the text a prefix of some sentence of the
// grammar, so tokens may cross segment boundaries. Token bytes come from a
// TokenTable built once per tokenizer; a masked step touches each vocabulary
// entry once, and tokens inside a JSON string that hold no quote, backslash
// or control byte are accepted without being walked.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "lumen/core/status.h"
#include "lumen/engine/constraint_schema.h"
#include "lumen/tokenize/tokenizer.h"

namespace lumen::engine {

// The bytes of every token, flat, plus flags. Immutable; share it between jobs.
class TokenTable {
 public:
  // Special and end-of-generation tokens are never sampled under a constraint
  // (they may still be forced when a literal's tokenization holds one).
  static std::shared_ptr<const TokenTable> Build(const tokenize::Tokenizer& tok);
  // For tests: texts[i] is token i; special[i] as above (may be empty).
  static std::shared_ptr<const TokenTable> FromStrings(const std::vector<std::string>& texts,
                                                       const std::vector<bool>& special = {});

  int32_t size() const { return static_cast<int32_t>(offsets_.size()) - 1; }
  std::string_view text(int32_t id) const {
    return std::string_view(bytes_.data() + offsets_[id], offsets_[id + 1] - offsets_[id]);
  }
  bool special(int32_t id) const { return flags_[id] & kSpecial; }
  // Non-empty, no '"', '\\' or byte < 0x20, and whole UTF-8 characters: the
  // token may sit inside a JSON string as it is.
  bool plain_string(int32_t id) const { return flags_[id] & kPlainString; }

  // Tokens whose bytes are exactly `text`: the tokenizer's own encoding when
  // its bytes match, else the fewest non-special tokens that spell it.
  // nullopt when the vocabulary cannot spell the text.
  std::optional<std::vector<int32_t>> EncodeExact(std::string_view text) const;

 private:
  enum : uint8_t { kSpecial = 1, kPlainString = 2 };
  void Index();
  const tokenize::Tokenizer* tok_ = nullptr;  // null for FromStrings
  std::string bytes_;
  std::vector<uint32_t> offsets_;                          // [V + 1]
  std::vector<uint8_t> flags_;                             // [V]
  std::unordered_map<std::string_view, int32_t> by_text_;  // non-special, first id wins
  size_t max_len_ = 0;
};

// Incremental JSON acceptor for one object (RFC 8259 grammar): Feed returns
// false on the first byte that no valid object text could continue with.
// Checked: structure, string escapes (\uXXXX with surrogate pairs), UTF-8 of
// raw string bytes, number syntax, true/false/null. Limits: nesting depth 64,
// at most kMaxWhitespaceRun consecutive whitespace bytes outside strings (so
// a model cannot stall in blank space); leading whitespace before '{' counts.
// Plain data (copyable, no allocation).
class JsonAcceptor {
 public:
  static constexpr int kMaxDepth = 64;
  static constexpr int kMaxWhitespaceRun = 8;

  bool Feed(uint8_t c);
  bool Feed(std::string_view s) {
    for (char c : s)
      if (!Feed(static_cast<uint8_t>(c))) return false;
    return true;
  }
  bool complete() const { return mode_ == kDone; }
  // Inside a string with no escape or UTF-8 sequence pending.
  bool in_plain_string() const { return mode_ == kString && utf8_left_ == 0; }

 private:
  enum Mode : uint8_t {
    kStart,          // before the root '{'
    kObjKeyOrEnd,    // after '{'
    kObjKey,         // after ',' in an object
    kColon,          // after a key
    kValue,          // after ':' or ',' in an array
    kArrValueOrEnd,  // after '['
    kAfterValue,     // ',' or the container's close
    kString,
    kEscape,
    kUnicode,       // \u and hex_ digits so far
    kLowBackslash,  // after a high surrogate: "\" of its low half
    kLowU,          // ... then "u"
    kNumMinus,      // "-"
    kNumZero,       // "0" or "-0"
    kNumInt,        // [1-9][0-9]*
    kNumDot,        // "."
    kNumFrac,       // ".[0-9]+"
    kNumExp,        // "e"
    kNumExpSign,    // "e+" / "e-"
    kNumExpDigits,
    kLiteral,
    kDone,
  };
  bool Open(bool object);
  bool Close(bool object);
  bool EndValue();
  bool Value(uint8_t c);
  bool Whitespace(uint8_t c);
  bool StringByte(uint8_t c);
  bool in_object() const { return depth_ > 0 && ((stack_ >> (depth_ - 1)) & 1); }

  Mode mode_ = kStart;
  bool key_ = false;       // the current string is an object key
  bool want_low_ = false;  // the \u escape must be a low surrogate
  uint8_t depth_ = 0;
  uint8_t ws_run_ = 0;
  uint8_t hex_ = 0;                          // hex digits of the \u escape so far
  uint8_t utf8_left_ = 0;                    // continuation bytes still due
  uint8_t utf8_lo_ = 0x80, utf8_hi_ = 0xBF;  // range of the next continuation byte
  uint8_t lit_ = 0, lit_pos_ = 0;            // literal index (true/false/null) and bytes matched
  uint16_t code_ = 0;                        // the \u value so far
  uint64_t stack_ = 0;                       // bit d: level d is an object (1) or array (0)
};

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Tokens that must come next; empty when the model chooses. False when the
  // vocabulary cannot spell what must come (*error says what).
  virtual bool Forced(std::vector<int32_t>* out, std::string* error) = 0;
  // Sets every token that may not come next to -inf; returns how many remain.
  virtual size_t Mask(std::span<float> logits) const = 0;
  // Advances over a token taken; false (state unchanged) if it is not allowed.
  virtual bool Accept(int32_t id) = 0;
  virtual bool done() const = 0;
};

struct GrammarSegment {
  enum Kind { kLiteral, kOneOf, kJsonObject, kSchema } kind = kLiteral;
  std::string text;                             // kLiteral
  std::vector<std::string> options;             // kOneOf: non-empty, prefix-free
  std::shared_ptr<const SchemaGrammar> schema;  // kSchema: one value valid against it
  static GrammarSegment Literal(std::string t) { return {kLiteral, std::move(t), {}, {}}; }
  static GrammarSegment OneOf(std::vector<std::string> o) { return {kOneOf, {}, std::move(o), {}}; }
  static GrammarSegment JsonObject() { return {kJsonObject, {}, {}, {}}; }
  // The segment ends as soon as a whole value has been read.
  static GrammarSegment Schema(std::shared_ptr<const SchemaGrammar> g) {
    return {kSchema, {}, {}, std::move(g)};
  }
};

class GrammarConstraint : public TokenConstraint {
 public:
  // Errors: an empty or non-prefix-free option list, a vocabulary mismatch.
  static Result<std::unique_ptr<GrammarConstraint>> Create(std::shared_ptr<const TokenTable> table,
                                                           std::vector<GrammarSegment> segments);

  bool Forced(std::vector<int32_t>* out, std::string* error) override;
  size_t Mask(std::span<float> logits) const override;
  bool Accept(int32_t id) override;
  bool done() const override { return state_.seg >= segs_.size(); }

  // The bytes accepted so far (forced and chosen).
  const std::string& text() const { return text_; }
  // Whether the bytes of `s` may come next (tests, diagnostics).
  bool Allows(std::string_view s) const;

 private:
  struct State {
    uint32_t seg = 0;
    uint32_t off = 0;         // bytes matched in a literal / option
    uint32_t lo = 0, hi = 0;  // options still possible: [lo, hi) of the sorted list
    JsonAcceptor json;
    SchemaGrammar::Stacks stacks;  // kSchema
  };
  GrammarConstraint(std::shared_ptr<const TokenTable> t, std::vector<GrammarSegment> s);
  void Enter(State& st) const;  // sets up st.seg's start state, skipping empty ones
  bool Step(State& st, uint8_t c) const;
  bool Walk(State& st, std::string_view bytes) const;

  std::shared_ptr<const TokenTable> table_;
  std::vector<GrammarSegment> segs_;
  State state_;
  std::string text_;
};

}  // namespace lumen::engine
