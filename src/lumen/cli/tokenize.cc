// lumen tokenize MODEL "text" | lumen detokenize MODEL ids... | lumen template MODEL --messages F
// MODEL may also be a bare tokenizer.json or a tokenizer directory.
#include <filesystem>

#include <fmt/format.h>

#include "lumen/cli/common.h"
#include "lumen/cli/verbs.h"
#include "lumen/core/buffer.h"
#include "lumen/engine/chat.h"
#include "lumen/engine/default_model.h"

namespace lumen::cli {
namespace {

// A tokenizer-only path (tokenizer.json or a directory with it but no weights)
// loads just the tokenizer; anything else loads the model.
struct Loaded {
  std::unique_ptr<engine::Model> model;
  std::optional<tokenize::Tokenizer> tok;
  const tokenize::Tokenizer& get() const { return model ? model->tokenizer() : *tok; }
  std::string chat_template() const {
    return model ? model->chat_template() : tok->chat_template();
  }
};

Result<Loaded> LoadTok(const ModelArgs& a) {
  namespace fs = std::filesystem;
  Loaded l;
  std::error_code ec;
  const bool json = a.model.ends_with(".json");
  const bool tok_dir = fs::is_directory(a.model, ec) &&
                       fs::exists(a.model + "/tokenizer.json", ec) &&
                       !fs::exists(a.model + "/config.json", ec);
  if (json || tok_dir) {
    LUMEN_ASSIGN_OR_RETURN(tokenize::Tokenizer t, tokenize::Tokenizer::FromHf(a.model));
    l.tok.emplace(std::move(t));
    return l;
  }
  LUMEN_ASSIGN_OR_RETURN(l.model, LoadModel(a));
  return l;
}

}  // namespace

void RegisterTokenize(CLI::App& app) {
  struct Args {
    ModelArgs model;
    std::vector<std::string> pos;
    std::string file, messages, kwargs, chat_template;
    bool ids_only = false, no_special = false, add_special = false, gen_prompt = false;
    bool skip_special = false;
  };
  auto a = std::make_shared<Args>();
  auto* tok = app.add_subcommand("tokenize", "print the token ids and pieces of a text");
  tok->add_option("args", a->pos, "[MODEL] TEXT");
  tok->add_option("--file", a->file, "read the text from a file");
  tok->add_flag("--ids", a->ids_only, "print only the ids, space-separated, on one line");
  tok->add_flag("--no-special", a->no_special, "do not add BOS/EOS");
  tok->add_flag("--add-special", a->add_special, "add BOS/EOS as the tokenizer does (default)");
  tok->add_option("--tokenizer", a->model.tokenizer, "tokenizer file for llama2.c .bin models");
  tok->callback([a] {
    std::string text;
    if (!a->file.empty()) {
      auto t = ReadFile(a->file);
      if (!t.ok()) return ReportError(t.status());
      text = *t;
      if (a->pos.size() > 1)
        return ReportError(
            Errorf("tokenize: '{}': the text comes from --file {}; give MODEL "
                   "alone with it",
                   a->pos[1], a->file));
      if (!a->pos.empty()) a->model.model = a->pos[0];
    } else if (a->pos.size() == 2) {
      a->model.model = a->pos[0];
      text = a->pos[1];
    } else if (a->pos.size() == 1) {
      text = a->pos[0];
    } else {
      return ReportError(Error("tokenize: expected [MODEL] TEXT or --file F"));
    }
    auto l = LoadTok(a->model);
    if (!l.ok()) return ReportError(l.status());
    const auto& t = l->get();
    const auto ids = t.Encode(text, !a->no_special);
    if (a->ids_only) {
      std::string line;
      for (size_t i = 0; i < ids.size(); ++i) line += fmt::format("{}{}", i ? " " : "", ids[i]);
      fmt::print("{}\n", line);
      return;
    }
    for (int32_t id : ids) fmt::print("{:>8} {:?}\n", id, std::string(t.Piece(id)));
  });

  auto d = std::make_shared<Args>();
  auto* det = app.add_subcommand("detokenize", "turn token ids back into text");
  det->add_option("args", d->pos, "[MODEL] IDS...");
  det->add_flag("--skip-special", d->skip_special, "drop special tokens");
  det->add_option("--tokenizer", d->model.tokenizer, "tokenizer file for llama2.c .bin models");
  det->callback([d] {
    std::vector<int32_t> ids;
    size_t first = 0;
    if (!d->pos.empty()) {
      char* end = nullptr;
      std::strtol(d->pos[0].c_str(), &end, 10);
      if (*end != '\0') {
        d->model.model = d->pos[0];
        first = 1;
      }
    }
    for (size_t i = first; i < d->pos.size(); ++i) {
      char* end = nullptr;
      const long v = std::strtol(d->pos[i].c_str(), &end, 10);
      if (*end != '\0' || v < 0 || v > INT32_MAX)
        return ReportError(Errorf("detokenize: '{}' is not a token id", d->pos[i]));
      ids.push_back(int32_t(v));
    }
    auto l = LoadTok(d->model);
    if (!l.ok()) return ReportError(l.status());
    for (int32_t id : ids)
      if (id >= l->get().vocab_size())
        return ReportError(Errorf("detokenize: id {} is outside the vocabulary (size {})", id,
                                  l->get().vocab_size()));
    fmt::print("{}\n", l->get().Decode(ids, d->skip_special));
  });

  auto t = std::make_shared<Args>();
  auto* tpl = app.add_subcommand("template", "render a conversation with the chat template");
  tpl->add_option("model", t->model.model, "model, tokenizer.json or tokenizer directory");
  tpl->add_option("--messages", t->messages,
                  "JSON file: an array of messages, or {messages, tools}")
      ->required();
  tpl->add_flag("--add-generation-prompt", t->gen_prompt, "end with the assistant prompt");
  tpl->add_option("--kwargs", t->kwargs, "JSON object of extra template variables");
  tpl->add_option("--chat-template", t->chat_template, "template file to use instead");
  tpl->callback([t] {
    auto l = LoadTok(t->model);
    if (!l.ok()) return ReportError(l.status());
    auto raw = ReadFile(t->messages);
    if (!raw.ok()) return ReportError(raw.status());
    nlohmann::ordered_json doc = nlohmann::ordered_json::parse(*raw, nullptr, false);
    if (doc.is_discarded()) return ReportError(Errorf("{}: not valid JSON", t->messages));
    nlohmann::ordered_json messages = doc, tools = nullptr;
    if (doc.is_object()) {
      messages = doc.value("messages", nlohmann::ordered_json::array());
      if (doc.contains("tools")) tools = doc["tools"];
    }
    if (!messages.is_array())
      return ReportError(Errorf("{}: messages must be an array", t->messages));
    nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
    if (!t->kwargs.empty()) {
      kwargs = nlohmann::ordered_json::parse(t->kwargs, nullptr, false);
      if (kwargs.is_discarded() || !kwargs.is_object())
        return ReportError(Error("--kwargs: must be a JSON object"));
    }
    std::string src = l->chat_template();
    if (!t->chat_template.empty()) {
      auto f = ReadFile(t->chat_template);
      if (!f.ok()) return ReportError(f.status());
      src = *f;
    }
    if (src.empty()) src = engine::kFallbackChatTemplate;
    auto tmpl = tokenize::ChatTemplate::Parse(src);
    if (!tmpl.ok()) return ReportError(tmpl.status());
    tokenize::ChatRequest req;
    req.messages = messages;
    req.tools = tools;
    req.add_generation_prompt = t->gen_prompt;
    req.kwargs = kwargs;
    req.bos_token = l->get().bos_text();
    req.eos_token = l->get().eos_text();
    auto out = tokenize::ApplyChatTemplate(*tmpl, req);
    if (!out.ok()) return ReportError(out.status());
    fmt::print("{}", *out);
  });
}

}  // namespace lumen::cli
