// Parser for the chat-template Jinja2 subset: tokens -> Template (ast.h).
//
// Follows Jinja2 3.1's grammar and operator precedence (filters bind tighter
// than arithmetic, `**` is left-associative, `a if c` without else yields
// undefined). Constructs outside the subset (include, extends, block, import,
// recursive loops, unknown filters or tests, ...) fail here with the construct
// and its line:column, so a template never renders silently wrong.
#pragma once

#include <string_view>

#include "lumen/core/status.h"
#include "lumen/tokenize/chat_template/ast.h"

namespace lumen::tokenize {

Result<Template> ParseTemplate(std::string_view source);

// Filter and test names the evaluator implements (parse rejects others).
bool IsSupportedFilter(std::string_view name);
bool IsSupportedTest(std::string_view name);

}  // namespace lumen::tokenize
