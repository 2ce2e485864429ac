#include "lumen/engine/chat.h"

namespace lumen::engine {

Result<ChatFormatter> ChatFormatter::Create(const Model& model, const std::string& source) {
  ChatFormatter f;
  std::string src = source.empty() ? model.chat_template() : source;
  if (src.empty()) {
    src = kFallbackChatTemplate;
    f.fallback_ = true;
  }
  LUMEN_ASSIGN_OR_RETURN(tokenize::ChatTemplate t,
                         tokenize::ChatTemplate::Parse(src).WithContext("chat template"));
  f.tmpl_ = std::make_shared<const tokenize::ChatTemplate>(std::move(t));
  f.bos_ = model.tokenizer().bos_text();
  f.eos_ = model.tokenizer().eos_text();
  return f;
}

Result<std::string> ChatFormatter::Render(const nlohmann::ordered_json& messages,
                                          const nlohmann::ordered_json& tools,
                                          bool add_generation_prompt,
                                          const nlohmann::ordered_json& kwargs) const {
  tokenize::ChatRequest req;
  req.messages = messages;
  req.tools = tools;
  req.add_generation_prompt = add_generation_prompt;
  req.kwargs = kwargs.is_null() ? nlohmann::ordered_json::object() : kwargs;
  req.bos_token = bos_;
  req.eos_token = eos_;
  return tokenize::ApplyChatTemplate(*tmpl_, req);
}

}  // namespace lumen::engine
