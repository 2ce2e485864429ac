// JSON Schema -> byte grammar, for response_format / text.format json_schema.
//
// CompileJsonSchema turns the subset of JSON Schema that client libraries emit
// (the AI SDK's and LangChain's zod conversions, OpenAI strict mode) into a
// SchemaGrammar: a context-free grammar over bytes whose sentences are exactly
// compact JSON texts (no whitespace between tokens) that validate against the
// schema. GrammarConstraint runs it as one segment (GrammarSegment::Schema), so
// every reply the model can produce validates.
//
// Supported keywords: type (a name or a list), properties, required,
// additionalProperties (false, true, or a schema: extra keys are only ever
// generated for an object without properties), items, minItems, maxItems,
// enum, const, anyOf, $ref (local "#..." pointers) with $defs / definitions,
// minLength, maxLength (such strings keep to the BMP, so code points, JSON
// Schema's length, equal UTF-16 units, JavaScript's), and minimum / maximum on integer and number
// when the range holds 0 (enforced by a digit count, a subset that always lies inside the range:
// maximum 100 allows 0..99). Annotations ($schema, $id, $comment, title, description, default,
// examples, deprecated, readOnly, writeOnly) are ignored. Any other keyword is an error naming it
// and where it sits.
//
// Object properties come in the schema's order, each optional one may be
// left out. Numbers without a range keep to 18 integer digits and a 2-digit
// exponent (so each parses to a finite double). A number at the top level is
// refused (the grammar could not tell where it ends).
//
// The parse state is a set of stacks of grammar positions (a nondeterministic
// pushdown automaton, like llama.cpp's GBNF matcher): Advance moves every
// stack over one byte and drops those that cannot take it.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lumen/core/status.h"

namespace lumen::engine {

class SchemaGrammar {
 public:
  // Positions into the flat symbol array; the top of a stack is its back.
  using Stack = std::vector<uint32_t>;
  using Stacks = std::vector<Stack>;  // sorted, unique
  using ByteSet = std::array<uint64_t, 4>;

  // The state before the first byte.
  Stacks Start() const;
  // The state after byte c; empty when c cannot come next.
  Stacks Advance(const Stacks& st, uint8_t c) const;
  // An accepted parse is an empty stack: a whole value has been read.
  static bool Accepted(const Stacks& st) { return !st.empty() && st.front().empty(); }
  // The bytes that may come next.
  ByteSet NextBytes(const Stacks& st) const;
  // Some stack sits between characters of a string without length bounds:
  // any run of whole UTF-8 characters without '"', '\\' or control bytes may
  // come next.
  bool InFreeString(const Stacks& st) const;

  size_t rule_count() const { return alts_.size(); }
  size_t symbol_count() const { return syms_.size(); }

 private:
  friend class SchemaBuilder;
  static constexpr int32_t kEnd = INT32_MIN;
  static constexpr size_t kMaxStack = 1024;   // nesting bound of a parse
  static constexpr size_t kMaxStacks = 1024;  // live parses kept per byte
  void Expand(Stack s, Stacks& out, int depth) const;
  bool Matches(int32_t sym, uint8_t c) const {
    const ByteSet& b = classes_[size_t(-(sym + 1))];
    return (b[c >> 6] >> (c & 63)) & 1;
  }

  // Each alternative: symbols then kEnd. A symbol >= 0 is a rule; < 0 (not
  // kEnd) is the byte class -(sym + 1).
  std::vector<int32_t> syms_;
  std::vector<std::vector<uint32_t>> alts_;  // [rule] -> start positions
  std::vector<ByteSet> classes_;
  int32_t root_ = 0;
  uint32_t free_char_pos_ = UINT32_MAX;  // the plain-character class of free strings
};

// Errors name the place in the schema as a dotted path ("properties.tags.items:
// ..."; "" is the root) and the keyword.
Result<std::shared_ptr<const SchemaGrammar>> CompileJsonSchema(
    const nlohmann::ordered_json& schema);

}  // namespace lumen::engine
