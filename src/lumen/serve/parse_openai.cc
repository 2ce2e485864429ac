// OpenAI /v1/chat/completions and /v1/completions bodies -> GenRequest.
#include "lumen/serve/request.h"

namespace lumen::serve {

using ojson = nlohmann::ordered_json;

namespace {

// Text of a content field: a string, or an array of {"type":"text","text":...}
// parts (concatenated). null gives "".
Status ContentText(const ojson& v, const std::string& field, std::string* out) {
  out->clear();
  if (v.is_null()) return Status::Ok();
  if (v.is_string()) {
    *out = v.get<std::string>();
    return Status::Ok();
  }
  if (!v.is_array())
    return Errorf("{}: must be a string or an array of content parts, got {}", field, TypeName(v));
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string at = fmt::format("{}[{}]", field, i);
    const ojson& p = v[i];
    if (!p.is_object()) return Errorf("{}: must be an object, got {}", at, TypeName(p));
    auto type = p.find("type");
    if (type == p.end() || !type->is_string()) return Errorf("{}.type: must be a string", at);
    const std::string t = type->get<std::string>();
    if (t != "text" && t != "input_text" && t != "output_text")
      return Errorf("{}.type: '{}' is not supported (this server handles text only)", at, t);
    auto text = p.find("text");
    if (text == p.end() || !text->is_string()) return Errorf("{}.text: must be a string", at);
    *out += text->get<std::string>();
  }
  return Status::Ok();
}

Status ParseToolCalls(const ojson& v, const std::string& field, ojson* out) {
  if (!v.is_array()) return Errorf("{}: must be an array, got {}", field, TypeName(v));
  *out = ojson::array();
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string at = fmt::format("{}[{}]", field, i);
    const ojson& c = v[i];
    if (!c.is_object()) return Errorf("{}: must be an object, got {}", at, TypeName(c));
    auto fn = c.find("function");
    if (fn == c.end() || !fn->is_object()) return Errorf("{}.function: must be an object", at);
    std::string name, id;
    LUMEN_RETURN_IF_ERROR(ExpectString(fn->value("name", ojson()), at + ".function.name", &name));
    if (c.contains("id") && !c["id"].is_null())
      LUMEN_RETURN_IF_ERROR(ExpectString(c["id"], at + ".id", &id));
    ojson args = ojson::object();
    auto a = fn->find("arguments");
    if (a != fn->end() && a->is_string()) {
      args = ToolArgumentsJson(a->get<std::string>());
    } else if (a != fn->end() && a->is_object()) {
      args = *a;
    } else if (a != fn->end() && !a->is_null()) {
      return Errorf("{}.function.arguments: must be a JSON string, got {}", at, TypeName(*a));
    }
    out->push_back(
        {{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", args}}}});
  }
  return Status::Ok();
}

}  // namespace

// One OpenAI chat message -> template form. Shared with the Responses parser.
Status ParseChatMessage(const ojson& m, const std::string& at, ojson* out) {
  if (!m.is_object()) return Errorf("{}: must be an object, got {}", at, TypeName(m));
  auto role_it = m.find("role");
  if (role_it == m.end()) return Errorf("{}.role: missing", at);
  std::string role;
  LUMEN_RETURN_IF_ERROR(ExpectString(*role_it, at + ".role", &role));
  if (role == "developer") role = "system";
  if (role != "system" && role != "user" && role != "assistant" && role != "tool")
    return Errorf(
        "{}.role: unknown role '{}' (expected system, developer, user, assistant or "
        "tool)",
        at, role);
  std::string text;
  auto content = m.find("content");
  const bool has_calls = m.contains("tool_calls") && !m["tool_calls"].is_null();
  if ((content == m.end() || content->is_null()) && !(role == "assistant" && has_calls))
    return Errorf("{}.content: missing", at);
  if (content != m.end()) LUMEN_RETURN_IF_ERROR(ContentText(*content, at + ".content", &text));
  ojson msg = {{"role", role}, {"content", text}};
  if (m.contains("name") && !m["name"].is_null()) {
    std::string name;
    LUMEN_RETURN_IF_ERROR(ExpectString(m["name"], at + ".name", &name));
    msg["name"] = name;
  }
  if (has_calls) {
    if (role != "assistant")
      return Errorf("{}.tool_calls: only assistant messages have tool calls", at);
    ojson calls;
    LUMEN_RETURN_IF_ERROR(ParseToolCalls(m["tool_calls"], at + ".tool_calls", &calls));
    msg["tool_calls"] = calls;
  }
  if (role == "tool") {
    auto id = m.find("tool_call_id");
    if (id == m.end() || id->is_null()) return Errorf("{}.tool_call_id: missing", at);
    std::string s;
    LUMEN_RETURN_IF_ERROR(ExpectString(*id, at + ".tool_call_id", &s));
    msg["tool_call_id"] = s;
  }
  *out = std::move(msg);
  return Status::Ok();
}

namespace {

Status ParseCommon(const ojson& body, GenRequest& r) {
  if (body.contains("model") && !body["model"].is_null())
    LUMEN_RETURN_IF_ERROR(ExpectString(body["model"], "model", &r.model));
  LUMEN_RETURN_IF_ERROR(ExpectBool(body.value("stream", ojson()), "stream", &r.stream));
  if (body.contains("stream_options") && !body["stream_options"].is_null()) {
    const ojson& so = body["stream_options"];
    if (!so.is_object()) return Errorf("stream_options: must be an object, got {}", TypeName(so));
    LUMEN_RETURN_IF_ERROR(ExpectBool(so.value("include_usage", ojson()),
                                     "stream_options.include_usage", &r.include_usage));
  }
  LUMEN_RETURN_IF_ERROR(ParseStop(body.value("stop", ojson()), "stop", r));
  LUMEN_RETURN_IF_ERROR(ParseMaxTokens(body.value("max_tokens", ojson()), "max_tokens", r));
  if (body.contains("n") && !body["n"].is_null()) {
    int64_t n;
    LUMEN_RETURN_IF_ERROR(ExpectInt(body["n"], "n", 1, 16, &n));
    r.n = static_cast<int>(n);
  }
  LUMEN_RETURN_IF_ERROR(ParseAdapterField(body, r));
  return ParseSamplerFields(body, r);
}

}  // namespace

Result<GenRequest> ParseChatCompletions(const ojson& body) {
  if (!body.is_object()) return Errorf("body: must be a JSON object, got {}", TypeName(body));
  GenRequest r;
  r.api = Api::kChat;
  LUMEN_RETURN_IF_ERROR(ParseCommon(body, r));
  LUMEN_RETURN_IF_ERROR(
      ParseMaxTokens(body.value("max_completion_tokens", ojson()), "max_completion_tokens", r));
  auto msgs = body.find("messages");
  if (msgs == body.end()) return Error("messages: missing");
  if (!msgs->is_array()) return Errorf("messages: must be an array, got {}", TypeName(*msgs));
  if (msgs->empty()) return Error("messages: must not be empty");
  for (size_t i = 0; i < msgs->size(); ++i) {
    ojson m;
    LUMEN_RETURN_IF_ERROR(ParseChatMessage((*msgs)[i], fmt::format("messages[{}]", i), &m));
    r.messages.push_back(std::move(m));
  }
  if (body.contains("tools") && !body["tools"].is_null()) {
    LUMEN_RETURN_IF_ERROR(ValidateTools(body["tools"], "tools"));
    if (!body["tools"].empty()) r.tools = body["tools"];
  }
  LUMEN_RETURN_IF_ERROR(ParseToolChoice(body.value("tool_choice", ojson()), "tool_choice", r));
  if (body.contains("chat_template_kwargs") && !body["chat_template_kwargs"].is_null()) {
    if (!body["chat_template_kwargs"].is_object())
      return Errorf("chat_template_kwargs: must be an object, got {}",
                    TypeName(body["chat_template_kwargs"]));
    r.template_kwargs = body["chat_template_kwargs"];
  }
  LUMEN_RETURN_IF_ERROR(ExpectBool(body.value("logprobs", ojson()), "logprobs", &r.logprobs));
  if (body.contains("top_logprobs") && !body["top_logprobs"].is_null()) {
    int64_t k;
    LUMEN_RETURN_IF_ERROR(ExpectInt(body["top_logprobs"], "top_logprobs", 0, 20, &k));
    if (!r.logprobs) return Error("top_logprobs: requires logprobs: true");
    r.top_logprobs = static_cast<int>(k);
  }
  if (body.contains("response_format") && !body["response_format"].is_null())
    LUMEN_RETURN_IF_ERROR(
        ParseResponseFormat(body["response_format"], "response_format", /*nested=*/true, r));
  return r;
}

Result<GenRequest> ParseCompletions(const ojson& body) {
  if (!body.is_object()) return Errorf("body: must be a JSON object, got {}", TypeName(body));
  GenRequest r;
  r.api = Api::kCompletions;
  r.raw_prompt = true;
  LUMEN_RETURN_IF_ERROR(ParseCommon(body, r));
  auto p = body.find("prompt");
  if (p == body.end() || p->is_null()) return Error("prompt: missing");
  if (p->is_string()) {
    r.prompt_text = p->get<std::string>();
  } else if (p->is_array()) {
    if (p->empty()) return Error("prompt: must not be empty");
    if ((*p)[0].is_string()) {
      if (p->size() != 1) return Error("prompt: only one prompt per request is supported");
      r.prompt_text = (*p)[0].get<std::string>();
    } else {
      if ((*p)[0].is_array()) return Error("prompt: only one prompt per request is supported");
      r.prompt_is_ids = true;
      for (size_t i = 0; i < p->size(); ++i) {
        int64_t id;
        LUMEN_RETURN_IF_ERROR(ExpectInt((*p)[i], fmt::format("prompt[{}]", i), 0, INT32_MAX, &id));
        r.prompt_ids.push_back(static_cast<int32_t>(id));
      }
    }
  } else {
    return Errorf("prompt: must be a string or an array of token ids, got {}", TypeName(*p));
  }
  LUMEN_RETURN_IF_ERROR(ExpectBool(body.value("echo", ojson()), "echo", &r.echo));
  if (body.contains("logprobs") && !body["logprobs"].is_null()) {
    int64_t k;
    LUMEN_RETURN_IF_ERROR(ExpectInt(body["logprobs"], "logprobs", 0, 20, &k));
    r.logprobs = true;
    r.top_logprobs = static_cast<int>(k);
  }
  if (body.contains("suffix") && body["suffix"].is_string() &&
      !body["suffix"].get<std::string>().empty())
    return Error("suffix: is not supported");
  if (body.contains("best_of") && !body["best_of"].is_null()) {
    int64_t b;
    LUMEN_RETURN_IF_ERROR(ExpectInt(body["best_of"], "best_of", 1, 16, &b));
    if (b != r.n) return Error("best_of: only best_of == n is supported");
  }
  return r;
}

}  // namespace lumen::serve
