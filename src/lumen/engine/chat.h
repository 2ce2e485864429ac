// Chat formatting: a model's chat template (or the documented fallback for
// models without one) applied to OpenAI-style messages, producing the prompt
// text the model was trained on. Shared by `lumen chat`, `lumen template` and
// the server.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "lumen/core/status.h"
#include "lumen/engine/model.h"
#include "lumen/tokenize/chat_template/chat_template.h"

namespace lumen::engine {

// Used when a model has no chat template: each turn as "<role>: <content>\n"
// after the BOS text, then "assistant:" when a generation prompt is wanted.
inline constexpr const char* kFallbackChatTemplate =
    "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}";

class ChatFormatter {
 public:
  // template_source empty: the model's template, else the fallback.
  static Result<ChatFormatter> Create(const Model& model, const std::string& template_source = "");

  Result<std::string> Render(const nlohmann::ordered_json& messages,
                             const nlohmann::ordered_json& tools, bool add_generation_prompt,
                             const nlohmann::ordered_json& kwargs) const;
  bool is_fallback() const { return fallback_; }

 private:
  std::shared_ptr<const tokenize::ChatTemplate> tmpl_;
  std::string bos_, eos_;
  bool fallback_ = false;
};

}  // namespace lumen::engine
