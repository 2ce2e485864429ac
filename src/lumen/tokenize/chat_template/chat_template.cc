#include "lumen/tokenize/chat_template/chat_template.h"

#include "lumen/tokenize/chat_template/parser.h"
#include "lumen/tokenize/chat_template/pystr.h"

namespace lumen::tokenize {

Result<ChatTemplate> ChatTemplate::Parse(std::string_view source) {
  LUMEN_ASSIGN_OR_RETURN(Template t, ParseTemplate(source));
  ChatTemplate ct;
  ct.tmpl_ = std::make_shared<const Template>(std::move(t));
  return ct;
}

Result<std::string> ChatTemplate::Render(const nlohmann::ordered_json& context) const {
  return Render(context, RenderOptions{});
}

Result<std::string> ChatTemplate::Render(const nlohmann::ordered_json& context,
                                         const RenderOptions& options) const {
  if (!context.is_object()) return Error("chat template context must be a JSON object");
  LUMEN_ASSIGN_OR_RETURN(Value ctx, FromJson(context));
  Interpreter interp(options);
  return interp.Render(*tmpl_, ctx);
}

Result<std::string> ApplyChatTemplate(const ChatTemplate& tmpl, const ChatRequest& request,
                                      const RenderOptions& options) {
  if (request.continue_final_message && request.add_generation_prompt)
    return Error(
        "continue_final_message and add_generation_prompt are not compatible: use "
        "continue_final_message to continue the final message, add_generation_prompt to start "
        "a new assistant message");
  if (!request.messages.is_array()) return Error("messages must be a JSON array");
  if (!request.kwargs.is_null() && !request.kwargs.is_object())
    return Error("chat template kwargs must be a JSON object");
  nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
  ctx["messages"] = request.messages;
  ctx["tools"] = request.tools;
  ctx["documents"] = request.documents;
  ctx["add_generation_prompt"] = request.add_generation_prompt;
  const std::pair<const char*, const std::string*> specials[] = {{"bos_token", &request.bos_token},
                                                                 {"eos_token", &request.eos_token},
                                                                 {"unk_token", &request.unk_token},
                                                                 {"pad_token", &request.pad_token}};
  for (const auto& [name, value] : specials)
    if (!value->empty()) ctx[name] = *value;
  if (request.kwargs.is_object()) {
    for (auto it = request.kwargs.begin(); it != request.kwargs.end(); ++it) {
      const std::string& k = it.key();
      if (k == "messages" || k == "tools" || k == "documents" || k == "add_generation_prompt")
        return Errorf("chat template kwarg '{}' collides with a built-in variable", k);
      ctx[k] = it.value();
    }
  }
  LUMEN_ASSIGN_OR_RETURN(std::string rendered, tmpl.Render(ctx, options));
  if (!request.continue_final_message) return rendered;

  // HF: cut right after the final message's content, keeping its own trailing space.
  if (request.messages.empty()) return Error("continue_final_message needs at least one message");
  const auto& last = request.messages.back();
  if (!last.is_object() || !last.contains("content"))
    return Error("continue_final_message: the final message has no content");
  const auto& content = last["content"];
  std::string final_message;
  if (content.is_string()) {
    final_message = content.get<std::string>();
  } else if (content.is_array()) {
    bool found = false;
    for (auto it = content.rbegin(); it != content.rend(); ++it) {
      if (it->is_object() && it->contains("text") && (*it)["text"].is_string()) {
        final_message = (*it)["text"].get<std::string>();
        found = true;
        break;
      }
    }
    if (!found)
      return Error("continue_final_message is set but the final message has no text content block");
  } else {
    return Error("continue_final_message: the final message content must be text");
  }
  std::string stripped = pystr::Strip(final_message, std::nullopt, true, true);
  size_t loc = rendered.rfind(stripped);
  if (loc == std::string::npos)
    return Error(
        "continue_final_message is set but the final message does not appear in the chat after "
        "applying the chat template");
  std::string lstripped = pystr::Strip(final_message, std::nullopt, true, false);
  // Python compares rendered[loc:loc+len(lstrip)] == final_message: equal only when
  // the message has no leading space and the template kept its trailing space.
  if (rendered.substr(loc, lstripped.size()) == final_message)
    return rendered.substr(0, loc + lstripped.size());
  return rendered.substr(0, loc + stripped.size());
}

}  // namespace lumen::tokenize
