// Tool-call extraction from a model's native output formats:
//   Qwen / Hermes:  <tool_call>{"name": ..., "arguments": {...}}</tool_call> (repeatable)
//   Llama 3:        [<|python_tag|>]{"name": ..., "parameters": {...}} as the whole reply
//                   (several separated by ';' allowed)
//   Mistral:        [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]
//                   or [TOOL_CALLS]name[ARGS]{...} (newer templates)
// Text outside the calls stays content. Only names among the request's tools
// count as calls (a reply that merely looks like JSON is left as text).
//
// Binding tool_choice (required / a named tool): ToolCallGrammar gives the
// token-constraint grammar that makes the reply exactly one call in the
// model's format; ScanForcedCall reads such a reply, also while it streams
// and when max_tokens cut it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "lumen/engine/constraint.h"

namespace lumen::serve {

struct ToolCall {
  std::string id;  // "call_<n>" style, unique within a reply
  std::string name;
  std::string arguments;  // JSON object text
};

struct ParsedReply {
  std::string content;  // text with the calls removed (trimmed when calls were found)
  std::vector<ToolCall> calls;
  // A forced call cut before its arguments closed: calls[0].arguments is a
  // JSON prefix and the finish reason stays length / max_tokens.
  bool truncated = false;
};

// `tool_names` empty: any name is accepted.
ParsedReply ParseToolCalls(std::string_view text, const std::vector<std::string>& tool_names,
                           std::string_view id_prefix = "call_");

// The call format a chat template writes, told from a rendering of one
// assistant tool call (`rendered`), else from the template source; Hermes
// when neither says.
enum class ToolFormat { kHermes, kLlama3, kMistral };
ToolFormat DetectToolFormat(std::string_view rendered, std::string_view template_source);
std::string_view ToolFormatName(ToolFormat f);

// One call to one of `names` (non-empty, valid tool names):
//   Hermes   <tool_call>\n{"name": "<name>", "arguments": {...}}\n</tool_call>
//   Llama 3  {"name": "<name>", "parameters": {...}}
//   Mistral  [TOOL_CALLS] [{"name": "<name>", "arguments": {...}}]
// The opening up to the name and the separator up to the arguments' colon
// are forced; the name is chosen among `names`; the arguments are one JSON
// object (leading blanks allowed); the close is forced.
std::vector<engine::GrammarSegment> ToolCallGrammar(ToolFormat f,
                                                    const std::vector<std::string>& names);

// What a forced reply holds so far. args is the raw arguments text from its
// '{' on, ending where the object closes (args_done) or where the text ends.
struct ForcedCall {
  bool name_done = false;
  std::string name;  // whole when name_done, else the part generated
  std::string args;
  bool args_done = false;
};
ForcedCall ScanForcedCall(std::string_view text);
// The reply of a forced generation: always exactly one call, named after the
// offered tool the (possibly cut) name starts; arguments as generated.
ParsedReply ForcedReply(std::string_view text, const std::vector<std::string>& tool_names,
                        std::string_view id_prefix);

}  // namespace lumen::serve
