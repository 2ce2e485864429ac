// Tool-call extraction from a model's native output formats:
//   Qwen / Hermes:  <tool_call>{"name": ..., "arguments": {...}}</tool_call> (repeatable)
//   Llama 3:        [<|python_tag|>]{"name": ..., "parameters": {...}} as the whole reply
//                   (several separated by ';' allowed)
//   Mistral:        [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]
//                   or [TOOL_CALLS]name[ARGS]{...} (newer templates)
// Text outside the calls stays content. Only names among the request's tools
// count as calls (a reply that merely looks like JSON is left as text).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace lumen::serve {

struct ToolCall {
  std::string id;  // "call_<n>" style, unique within a reply
  std::string name;
  std::string arguments;  // JSON object text
};

struct ParsedReply {
  std::string content;  // text with the calls removed (trimmed when calls were found)
  std::vector<ToolCall> calls;
};

// `tool_names` empty: any name is accepted.
ParsedReply ParseToolCalls(std::string_view text, const std::vector<std::string>& tool_names,
                           std::string_view id_prefix = "call_");

}  // namespace lumen::serve
