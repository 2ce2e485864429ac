// GenRequest: the one internal request every protocol funnels into.
//
// OpenAI chat completions, OpenAI completions, Anthropic messages and OpenAI
// responses are parsed (parse_openai.cc, parse_anthropic.cc, parse_responses.cc)
// into this struct; engine_bridge.cc turns it into scheduler jobs. Messages are
// kept in OpenAI chat form (role system/user/assistant/tool, string content,
// assistant tool_calls with JSON-string arguments, tool_call_id) because that
// is what Hugging Face chat templates expect.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lumen/core/status.h"

namespace lumen::serve {

enum class Api { kChat, kCompletions, kMessages, kResponses };

struct GenRequest {
  Api api = Api::kChat;
  std::string model;

  // Completions: the raw prompt (text, or token ids), no template.
  bool raw_prompt = false;
  std::string prompt_text;
  std::vector<int32_t> prompt_ids;
  bool prompt_is_ids = false;
  bool echo = false;

  // Chat: OpenAI-form messages and function tools for the chat template.
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;      // null when none
  std::string tool_choice = "auto";  // "none", "auto", "required" or a function name
  bool tool_choice_named = false;    // tool_choice is a function name (binding)
  // response_format / text.format: "text", "json_object" (the reply is one
  // JSON object) or "json_schema" (one JSON value valid against json_schema).
  std::string response_format = "text";
  nlohmann::ordered_json json_schema;  // json_schema: the schema
  std::string json_schema_name;        // as sent (echoed by Responses)
  bool json_schema_strict = false;
  std::string json_schema_field;  // where the schema sits, for errors

  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();

  std::optional<int64_t> max_tokens;  // unset: until the context is full
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  // OpenAI stream_options.include_usage
  int n = 1;
  bool logprobs = false;
  int top_logprobs = 0;
  // Request fields for sample::ParseSamplerJson (temperature, top_p, top_k,
  // min_p, seed, penalties, logit_bias, hlg, curve, ...).
  nlohmann::json sampler_fields = nlohmann::json::object();

  // The adapter set spec ("", "a", "a+b", "a*0.5+b"); resolved against the
  // mounted adapters by EngineBridge::Prepare (engine/adapter_registry.h).
  std::string adapter;

  // Responses API.
  std::string previous_response_id;
  bool store = true;
  std::optional<std::string> instructions;  // echoed in the response object
};

// Parsers: `body` is the parsed JSON body. Errors start with the field path.
Result<GenRequest> ParseChatCompletions(const nlohmann::ordered_json& body);
Result<GenRequest> ParseCompletions(const nlohmann::ordered_json& body);
Result<GenRequest> ParseMessages(const nlohmann::ordered_json& body);
// Input items are appended to req.messages; the caller prepends the stored
// conversation of previous_response_id and replaces each item_reference,
// left as {kItemReferenceKey: id, "at": "input[i].id"}, with the stored item.
inline constexpr const char* kItemReferenceKey = "lumen_item_reference";
Result<GenRequest> ParseResponses(const nlohmann::ordered_json& body);

// Shared by the parsers (parse_common.cc).
Status ParseSamplerFields(const nlohmann::ordered_json& body, GenRequest& r);
Status ParseStop(const nlohmann::ordered_json& v, const char* field, GenRequest& r);
Status ParseMaxTokens(const nlohmann::ordered_json& v, const char* field, GenRequest& r);
// The body's "adapter" (a set spec string, or null / absent: none).
Status ParseAdapterField(const nlohmann::ordered_json& body, GenRequest& r);
// OpenAI function tools: [{"type":"function","function":{name, description, parameters}}].
Status ValidateTools(const nlohmann::ordered_json& tools, const char* field);
Status ParseToolChoice(const nlohmann::ordered_json& v, const char* field, GenRequest& r);
// response_format (chat; `f` is the object, `field` its path) and Responses
// text.format: type text, json_object or json_schema. `nested`: the schema
// sits under f.json_schema (chat) instead of beside type (Responses).
Status ParseResponseFormat(const nlohmann::ordered_json& f, const std::string& field, bool nested,
                           GenRequest& r);
// Type checks naming the field.
Status ExpectBool(const nlohmann::ordered_json& v, const std::string& field, bool* out);
Status ExpectString(const nlohmann::ordered_json& v, const std::string& field, std::string* out);
Status ExpectInt(const nlohmann::ordered_json& v, const std::string& field, int64_t lo, int64_t hi,
                 int64_t* out);
std::string TypeName(const nlohmann::ordered_json& v);
// A tool call's arguments string as the chat templates take them: the parsed
// JSON, or the string itself where it is not JSON. OpenAI's field is any
// string, and lumen's own replies carry a JSON prefix (or "") when max_tokens
// cut a call, so a client that sends its history back must not be refused.
nlohmann::ordered_json ToolArgumentsJson(const std::string& arguments);

}  // namespace lumen::serve
