// OpenAI /v1/responses body -> GenRequest. Input items become OpenAI chat
// messages; function_call / function_call_output items become assistant
// tool_calls and role "tool" messages.
#include "lumen/serve/request.h"

namespace lumen::serve {

using ojson = nlohmann::ordered_json;

Status ParseChatMessage(const ojson& m, const std::string& at, ojson* out);  // parse_openai.cc

namespace {

Status ConvertItem(const ojson& item, const std::string& at, GenRequest& r) {
  if (!item.is_object()) return Errorf("{}: must be an object, got {}", at, TypeName(item));
  std::string type = "message";
  if (item.contains("type") && !item["type"].is_null())
    LUMEN_RETURN_IF_ERROR(ExpectString(item["type"], at + ".type", &type));
  if (type == "message") {
    ojson m;
    LUMEN_RETURN_IF_ERROR(ParseChatMessage(item, at, &m));
    if (m["role"] == "tool")
      return Errorf("{}.role: use a function_call_output item for tool results", at);
    r.messages.push_back(std::move(m));
  } else if (type == "function_call") {
    std::string call_id, name, args;
    LUMEN_RETURN_IF_ERROR(ExpectString(item.value("call_id", ojson()), at + ".call_id", &call_id));
    LUMEN_RETURN_IF_ERROR(ExpectString(item.value("name", ojson()), at + ".name", &name));
    LUMEN_RETURN_IF_ERROR(ExpectString(item.value("arguments", ojson()), at + ".arguments", &args));
    const ojson a = ToolArgumentsJson(args);
    ojson call = {
        {"id", call_id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", a}}}};
    // Consecutive calls join one assistant turn.
    if (!r.messages.empty() && r.messages.back()["role"] == "assistant" &&
        r.messages.back().contains("tool_calls"))
      r.messages.back()["tool_calls"].push_back(call);
    else
      r.messages.push_back(
          {{"role", "assistant"}, {"content", ""}, {"tool_calls", ojson::array({call})}});
  } else if (type == "function_call_output") {
    std::string call_id, output;
    LUMEN_RETURN_IF_ERROR(ExpectString(item.value("call_id", ojson()), at + ".call_id", &call_id));
    LUMEN_RETURN_IF_ERROR(ExpectString(item.value("output", ojson()), at + ".output", &output));
    r.messages.push_back({{"role", "tool"}, {"tool_call_id", call_id}, {"content", output}});
  } else if (type == "item_reference") {
    // Resolved from the response store by the server (it owns the store).
    std::string id;
    LUMEN_RETURN_IF_ERROR(ExpectString(item.value("id", ojson()), at + ".id", &id));
    r.messages.push_back({{kItemReferenceKey, id}, {"at", at + ".id"}});
  } else {
    return Errorf(
        "{}.type: '{}' is not supported (message, function_call, function_call_output, "
        "item_reference)",
        at, type);
  }
  return Status::Ok();
}

}  // namespace

Result<GenRequest> ParseResponses(const ojson& body) {
  if (!body.is_object()) return Errorf("body: must be a JSON object, got {}", TypeName(body));
  GenRequest r;
  r.api = Api::kResponses;
  if (body.contains("model") && !body["model"].is_null())
    LUMEN_RETURN_IF_ERROR(ExpectString(body["model"], "model", &r.model));
  LUMEN_RETURN_IF_ERROR(ExpectBool(body.value("stream", ojson()), "stream", &r.stream));
  LUMEN_RETURN_IF_ERROR(ExpectBool(body.value("store", ojson()), "store", &r.store));
  LUMEN_RETURN_IF_ERROR(
      ParseMaxTokens(body.value("max_output_tokens", ojson()), "max_output_tokens", r));
  LUMEN_RETURN_IF_ERROR(ParseAdapterField(body, r));
  LUMEN_RETURN_IF_ERROR(ParseSamplerFields(body, r));
  if (body.contains("previous_response_id") && !body["previous_response_id"].is_null())
    LUMEN_RETURN_IF_ERROR(ExpectString(body["previous_response_id"], "previous_response_id",
                                       &r.previous_response_id));
  if (body.contains("instructions") && !body["instructions"].is_null()) {
    std::string ins;
    LUMEN_RETURN_IF_ERROR(ExpectString(body["instructions"], "instructions", &ins));
    r.messages.push_back({{"role", "system"}, {"content", ins}});
    r.instructions = ins;
  }
  auto in = body.find("input");
  if (in == body.end() || in->is_null()) return Error("input: missing");
  if (in->is_string()) {
    r.messages.push_back({{"role", "user"}, {"content", in->get<std::string>()}});
  } else if (in->is_array()) {
    if (in->empty()) return Error("input: must not be empty");
    for (size_t i = 0; i < in->size(); ++i)
      LUMEN_RETURN_IF_ERROR(ConvertItem((*in)[i], fmt::format("input[{}]", i), r));
  } else {
    return Errorf("input: must be a string or an array of items, got {}", TypeName(*in));
  }
  if (body.contains("tools") && !body["tools"].is_null()) {
    const ojson& tools = body["tools"];
    if (!tools.is_array()) return Errorf("tools: must be an array, got {}", TypeName(tools));
    ojson fns = ojson::array();
    for (size_t i = 0; i < tools.size(); ++i) {
      const ojson& t = tools[i];
      const std::string at = fmt::format("tools[{}]", i);
      if (!t.is_object() || t.value("type", ojson()) != "function")
        return Errorf("{}.type: must be \"function\"", at);
      ojson fn = {{"name", t.value("name", ojson())}};
      if (t.contains("description")) fn["description"] = t["description"];
      if (t.contains("parameters")) fn["parameters"] = t["parameters"];
      fns.push_back({{"type", "function"}, {"function", fn}});
    }
    Status s = ValidateTools(fns, "tools");
    if (!s.ok()) {
      std::string msg = s.message();
      size_t p = msg.find(".function.");
      if (p != std::string::npos) msg.replace(p, 10, ".");
      return Error(msg);
    }
    if (!fns.empty()) r.tools = fns;
  }
  if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
    const ojson& tc = body["tool_choice"];
    if (tc.is_object() && tc.contains("name"))
      LUMEN_RETURN_IF_ERROR(ParseToolChoice({{"name", tc["name"]}}, "tool_choice", r));
    else
      LUMEN_RETURN_IF_ERROR(ParseToolChoice(tc, "tool_choice", r));
  }
  if (body.contains("text") && body["text"].is_object() && body["text"].contains("format"))
    LUMEN_RETURN_IF_ERROR(
        ParseResponseFormat(body["text"]["format"], "text.format", /*nested=*/false, r));
  return r;
}

}  // namespace lumen::serve
