// Lexer for the Jinja2 subset: splits template source into data and tag tokens
// exactly as Jinja2 3.1's lexer does with trim_blocks=True, lstrip_blocks=True
// (Hugging Face's settings): newlines normalized to "\n", one trailing newline
// dropped, `{%- -%}` / `{{- -}}` / `{#- -#}` strip Unicode whitespace, `+`
// disables lstrip/trim, `{% raw %}` passes text through, comments vanish.
// Positions are reported as 1-based line:column of the source.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "lumen/core/status.h"

namespace lumen::tokenize {

enum class TokenType {
  kData,
  kVarBegin,
  kVarEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,
  kInt,
  kFloat,
  kOperator,
  kEof
};

struct Token {
  TokenType type;
  std::string text;  // data text, name, operator, or unescaped string literal
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;
  int column = 1;
};

// Tokenizes `source`; errors name the reason and line:column.
Result<std::vector<Token>> Lex(std::string_view source);

}  // namespace lumen::tokenize
