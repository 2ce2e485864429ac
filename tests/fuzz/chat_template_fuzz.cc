// libFuzzer target for the chat-template interpreter: the input bytes are a
// template; when they parse, render them with a small fixed conversation
// (messages with tool calls, tools, kwargs) under tight limits. Any input
// must end in a rendered string or a Status, never a crash, hang or leak.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <nlohmann/json.hpp>

#include "lumen/tokenize/chat_template/chat_template.h"

namespace {

const nlohmann::ordered_json& Messages() {
  static const nlohmann::ordered_json kMessages = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris? 🌍"},
    {"role": "assistant", "content": "<think>\nlook up\n</think>\n\n",
     "tool_calls": [{"id": "call12345", "type": "function",
                     "function": {"name": "get_weather",
                                  "arguments": {"city": "Paris", "days": 2, "x": 1.5}}}]},
    {"role": "tool", "tool_call_id": "call12345", "content": "{\"t\": 21}"},
    {"role": "user", "content": [{"type": "text", "text": "and "}, {"type": "image"}]}
  ])");
  return kMessages;
}

const nlohmann::ordered_json& Tools() {
  static const nlohmann::ordered_json kTools = nlohmann::ordered_json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "description": "Weather.",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                    "required": ["city"]}}}
  ])");
  return kTools;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view source(reinterpret_cast<const char*>(data), size);
  auto tmpl = lumen::tokenize::ChatTemplate::Parse(source);
  if (!tmpl.ok()) return 0;
  lumen::tokenize::ChatRequest req;
  req.messages = Messages();
  req.tools = Tools();
  req.add_generation_prompt = size % 2 == 0;
  req.kwargs = {{"enable_thinking", false}};
  req.bos_token = "<s>";
  req.eos_token = "</s>";
  lumen::tokenize::RenderOptions options;
  options.limits.max_output_bytes = 1 << 20;
  options.limits.max_steps = 200'000;
  options.now = 1'700'000'000;
  auto out = lumen::tokenize::ApplyChatTemplate(*tmpl, req, options);
  volatile size_t sink = out.ok() ? out->size() : out.status().message().size();
  (void)sink;
  return 0;
}
