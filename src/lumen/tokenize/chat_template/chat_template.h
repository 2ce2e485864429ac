// Chat templates: render a model's Jinja2 chat template (tokenizer_config.json
// "chat_template", GGUF "tokenizer.chat_template") exactly as Hugging Face
// transformers does with Python Jinja2.
//
// The interpreter implements the Jinja2 subset real chat templates use, with
// HF's environment: ImmutableSandboxedEnvironment(trim_blocks=True,
// lstrip_blocks=True, extensions=[loopcontrols]) plus the {% generation %}
// tag, `tojson` = json.dumps(ensure_ascii=False, indent, separators,
// sort_keys), and the globals raise_exception(msg) and strftime_now(fmt).
// Output is byte-identical to Jinja2 3.1 for supported templates.
//
// A template is untrusted input: it has no file system or process access; a
// construct outside the subset fails at Parse with its name and line:column;
// rendering is bounded (RenderLimits: output size, recursion, steps) and every
// failure is a Status, never a crash or hang.
//
//   LUMEN_ASSIGN_OR_RETURN(auto tmpl, ChatTemplate::Parse(config["chat_template"]));
//   ChatRequest req;
//   req.messages = nlohmann::ordered_json::parse(R"([{"role":"user","content":"Hi"}])");
//   req.add_generation_prompt = true;
//   req.eos_token = "<|im_end|>";
//   LUMEN_ASSIGN_OR_RETURN(std::string prompt, ApplyChatTemplate(tmpl, req));
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "lumen/core/status.h"
#include "lumen/tokenize/chat_template/interpreter.h"

namespace lumen::tokenize {

struct Template;

class ChatTemplate {
 public:
  // Lexes and parses; errors name the construct and line:column.
  static Result<ChatTemplate> Parse(std::string_view source);

  // Renders with `context` (a JSON object) as the template's variables.
  Result<std::string> Render(const nlohmann::ordered_json& context) const;
  Result<std::string> Render(const nlohmann::ordered_json& context,
                             const RenderOptions& options) const;

 private:
  std::shared_ptr<const Template> tmpl_;
};

struct ChatRequest {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;      // null if none
  nlohmann::ordered_json documents;  // null if none
  bool add_generation_prompt = false;
  // HF's continue_final_message: cut the render right after the final
  // message's text so the model continues it (assistant prefill).
  bool continue_final_message = false;
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();  // e.g. enable_thinking
  // Special tokens from tokenizer_config.json; an empty string means the
  // tokenizer has none, and the variable is left undefined as in HF.
  std::string bos_token, eos_token, pad_token, unk_token;
};

// Builds the context exactly like HF apply_chat_template: messages, tools,
// documents, add_generation_prompt, the special tokens, then kwargs (which
// override the special tokens), and applies continue_final_message.
Result<std::string> ApplyChatTemplate(const ChatTemplate& tmpl, const ChatRequest& request,
                                      const RenderOptions& options = {});

}  // namespace lumen::tokenize
