// Anthropic /v1/messages body -> GenRequest (messages converted to OpenAI form:
// tool_use blocks become assistant tool_calls, tool_result blocks become role
// "tool" messages, so one chat template path serves both).
#include "lumen/serve/request.h"

namespace lumen::serve {

using ojson = nlohmann::ordered_json;

namespace {

Status BlockText(const ojson& v, const std::string& at, std::string* out) {
  // tool_result content: a string or an array of text blocks.
  out->clear();
  if (v.is_null()) return Status::Ok();
  if (v.is_string()) {
    *out = v.get<std::string>();
    return Status::Ok();
  }
  if (!v.is_array())
    return Errorf("{}: must be a string or an array of blocks, got {}", at, TypeName(v));
  for (size_t i = 0; i < v.size(); ++i) {
    const ojson& b = v[i];
    const std::string bat = fmt::format("{}[{}]", at, i);
    if (!b.is_object() || !b.contains("type") || !b["type"].is_string())
      return Errorf("{}.type: must be a string", bat);
    if (b["type"] != "text")
      return Errorf("{}.type: '{}' is not supported (text only)", bat,
                    b["type"].get<std::string>());
    if (!b.contains("text") || !b["text"].is_string())
      return Errorf("{}.text: must be a string", bat);
    *out += b["text"].get<std::string>();
  }
  return Status::Ok();
}

Status ConvertMessage(const ojson& m, const std::string& at, ojson& out) {
  if (!m.is_object()) return Errorf("{}: must be an object, got {}", at, TypeName(m));
  std::string role;
  if (!m.contains("role")) return Errorf("{}.role: missing", at);
  LUMEN_RETURN_IF_ERROR(ExpectString(m["role"], at + ".role", &role));
  if (role != "user" && role != "assistant")
    return Errorf("{}.role: unknown role '{}' (expected user or assistant)", at, role);
  if (!m.contains("content")) return Errorf("{}.content: missing", at);
  const ojson& c = m["content"];
  if (c.is_string()) {
    out.push_back({{"role", role}, {"content", c.get<std::string>()}});
    return Status::Ok();
  }
  if (!c.is_array())
    return Errorf("{}.content: must be a string or an array of blocks, got {}", at, TypeName(c));
  std::string text;
  ojson calls = ojson::array();
  ojson tool_msgs = ojson::array();
  for (size_t i = 0; i < c.size(); ++i) {
    const std::string bat = fmt::format("{}.content[{}]", at, i);
    const ojson& b = c[i];
    if (!b.is_object()) return Errorf("{}: must be an object, got {}", bat, TypeName(b));
    if (!b.contains("type") || !b["type"].is_string())
      return Errorf("{}.type: must be a string", bat);
    const std::string type = b["type"].get<std::string>();
    if (type == "text") {
      if (!b.contains("text") || !b["text"].is_string())
        return Errorf("{}.text: must be a string", bat);
      text += b["text"].get<std::string>();
    } else if (type == "tool_use") {
      if (role != "assistant")
        return Errorf("{}: tool_use blocks belong to assistant messages", bat);
      std::string id, name;
      LUMEN_RETURN_IF_ERROR(ExpectString(b.value("id", ojson()), bat + ".id", &id));
      LUMEN_RETURN_IF_ERROR(ExpectString(b.value("name", ojson()), bat + ".name", &name));
      ojson input = b.value("input", ojson::object());
      if (!input.is_object())
        return Errorf("{}.input: must be an object, got {}", bat, TypeName(input));
      calls.push_back(
          {{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", input}}}});
    } else if (type == "tool_result") {
      if (role != "user") return Errorf("{}: tool_result blocks belong to user messages", bat);
      std::string id, content;
      LUMEN_RETURN_IF_ERROR(
          ExpectString(b.value("tool_use_id", ojson()), bat + ".tool_use_id", &id));
      LUMEN_RETURN_IF_ERROR(BlockText(b.value("content", ojson()), bat + ".content", &content));
      tool_msgs.push_back({{"role", "tool"}, {"tool_call_id", id}, {"content", content}});
    } else {
      return Errorf("{}.type: '{}' is not supported (text, tool_use, tool_result)", bat, type);
    }
  }
  for (auto& t : tool_msgs) out.push_back(std::move(t));
  if (role == "assistant") {
    ojson msg = {{"role", "assistant"}, {"content", text}};
    if (!calls.empty()) msg["tool_calls"] = calls;
    out.push_back(std::move(msg));
  } else if (!text.empty() || tool_msgs.empty()) {
    out.push_back({{"role", "user"}, {"content", text}});
  }
  return Status::Ok();
}

}  // namespace

Result<GenRequest> ParseMessages(const ojson& body) {
  if (!body.is_object()) return Errorf("body: must be a JSON object, got {}", TypeName(body));
  GenRequest r;
  r.api = Api::kMessages;
  if (body.contains("model") && !body["model"].is_null())
    LUMEN_RETURN_IF_ERROR(ExpectString(body["model"], "model", &r.model));
  if (!body.contains("max_tokens") || body["max_tokens"].is_null())
    return Error("max_tokens: missing (required)");
  LUMEN_RETURN_IF_ERROR(ParseMaxTokens(body["max_tokens"], "max_tokens", r));
  LUMEN_RETURN_IF_ERROR(ExpectBool(body.value("stream", ojson()), "stream", &r.stream));
  LUMEN_RETURN_IF_ERROR(ParseStop(body.value("stop_sequences", ojson()), "stop_sequences", r));
  LUMEN_RETURN_IF_ERROR(ParseAdapterField(body, r));
  LUMEN_RETURN_IF_ERROR(ParseSamplerFields(body, r));
  if (body.contains("system") && !body["system"].is_null()) {
    std::string sys;
    LUMEN_RETURN_IF_ERROR(BlockText(body["system"], "system", &sys));
    r.messages.push_back({{"role", "system"}, {"content", sys}});
  }
  auto msgs = body.find("messages");
  if (msgs == body.end()) return Error("messages: missing");
  if (!msgs->is_array()) return Errorf("messages: must be an array, got {}", TypeName(*msgs));
  if (msgs->empty()) return Error("messages: must not be empty");
  for (size_t i = 0; i < msgs->size(); ++i)
    LUMEN_RETURN_IF_ERROR(ConvertMessage((*msgs)[i], fmt::format("messages[{}]", i), r.messages));
  if (body.contains("tools") && !body["tools"].is_null()) {
    const ojson& tools = body["tools"];
    if (!tools.is_array()) return Errorf("tools: must be an array, got {}", TypeName(tools));
    ojson fns = ojson::array();
    for (size_t i = 0; i < tools.size(); ++i) {
      const ojson& t = tools[i];
      const std::string at = fmt::format("tools[{}]", i);
      if (!t.is_object()) return Errorf("{}: must be an object, got {}", at, TypeName(t));
      if (!t.contains("name") || !t["name"].is_string())
        return Errorf("{}.name: must be a string", at);
      if (!t.contains("input_schema")) return Errorf("{}.input_schema: missing", at);
      ojson fn = {{"name", t["name"]}, {"parameters", t["input_schema"]}};
      if (t.contains("description")) fn["description"] = t["description"];
      fns.push_back({{"type", "function"}, {"function", fn}});
    }
    // Reuse the OpenAI checks, then rename the fields in errors.
    Status s = ValidateTools(fns, "tools");
    if (!s.ok()) {
      std::string msg = s.message();
      for (auto [from, to] :
           {std::pair<std::string, std::string>{".function.parameters", ".input_schema"},
            {".function.", "."}}) {
        size_t p = msg.find(from);
        if (p != std::string::npos) msg.replace(p, from.size(), to);
      }
      return Error(msg);
    }
    if (!fns.empty()) r.tools = fns;
  }
  if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
    const ojson& tc = body["tool_choice"];
    if (!tc.is_object() || !tc.contains("type") || !tc["type"].is_string())
      return Error("tool_choice.type: must be a string");
    const std::string t = tc["type"].get<std::string>();
    if (t == "auto" || t == "none") {
      r.tool_choice = t;
    } else if (t == "any") {
      LUMEN_RETURN_IF_ERROR(ParseToolChoice(ojson("required"), "tool_choice", r));
    } else if (t == "tool") {
      LUMEN_RETURN_IF_ERROR(
          ParseToolChoice({{"name", tc.value("name", ojson())}}, "tool_choice", r));
    } else {
      return Errorf("tool_choice.type: unknown type '{}' (auto, any, tool, none)", t);
    }
  }
  return r;
}

}  // namespace lumen::serve
