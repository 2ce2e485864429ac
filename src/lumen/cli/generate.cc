// lumen generate [MODEL] "prompt": stream a continuation to stdout.
// lumen chat [MODEL]: interactive multi-turn chat with the model's template.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>

#include <fmt/format.h>

#include "lumen/cli/common.h"
#include "lumen/cli/routes.h"
#include "lumen/cli/verbs.h"
#include "lumen/engine/chat.h"
#include "lumen/engine/generate.h"

namespace lumen::cli {
namespace {

struct GenerateArgs {
  ModelArgs model;
  SamplerArgs sampler;
  std::vector<std::string> positionals;
  std::string prompt;
  int n = 256;
  bool no_echo = false;
  bool ignore_eos = false;
  bool no_bos = false;
  std::vector<std::string> stop;
  std::string chat_template;
};

bool WriteOut(std::string_view s) {
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fflush(stdout);
  return true;
}

void PrintStats(const engine::GenerateResult& r) {
  const double pre = r.prefill_seconds > 0 ? r.prompt_tokens / r.prefill_seconds : 0;
  const double dec = r.decode_seconds > 0 ? r.tokens.size() / r.decode_seconds : 0;
  std::fprintf(stderr,
               "\nprompt: %lld tokens, %.1f tok/s | generated: %zu tokens, %.1f tok/s | %s\n",
               static_cast<long long>(r.prompt_tokens), pre, r.tokens.size(), dec,
               std::string(engine::FinishReasonName(r.finish)).c_str());
}

// One positional: the model when -p gives the prompt (llama.cpp users'
// habit), else the prompt unless it names an existing model file/dir.
Status ResolvePositionals(GenerateArgs& a) {
  auto& p = a.positionals;
  if (p.size() > 2) return Error("expected at most MODEL and PROMPT");
  if (p.size() == 2) {
    if (!a.model.model.empty() || !a.prompt.empty())
      return Errorf("'{}' '{}': {} already given; give the model and prompt once each", p[0], p[1],
                    !a.model.model.empty() && !a.prompt.empty() ? "--model and --prompt are"
                    : !a.model.model.empty()                    ? "--model is"
                                                                : "--prompt is");
    a.model.model = p[0];
    a.prompt = p[1];
  } else if (p.size() == 1) {
    std::error_code ec;
    if (a.model.model.empty() && (!a.prompt.empty() || std::filesystem::exists(p[0], ec)))
      a.model.model = p[0];
    else if (a.prompt.empty())
      a.prompt = p[0];
    else
      return Errorf("'{}': --model and --prompt are both given; nothing is left for it", p[0]);
  }
  return Status::Ok();
}

// What both verbs need: the model, one session and the sampler.
struct Runtime {
  std::unique_ptr<engine::Model> model;
  std::unique_ptr<engine::Session> session;
  std::optional<sample::Sampler> sampler;
};

Result<Runtime> Start(CLI::App* cmd, GenerateArgs& a) {
  Runtime rt;
  LUMEN_ASSIGN_OR_RETURN(sample::SamplerConfig cfg, BuildSamplerConfig(cmd, a.sampler, {}));
  LUMEN_ASSIGN_OR_RETURN(rt.model, LoadModel(a.model));
  LUMEN_RETURN_IF_ERROR(sample::ValidateForVocab(cfg, rt.model->tokenizer().vocab_size()));
  WarnBeyondModelContext(*rt.model, a.model.ctx);
  AnnounceRoutes(a.model, *rt.model, "generate");
  LUMEN_ASSIGN_OR_RETURN(engine::SessionOptions sopts, SessionOptionsFrom(a.model));
  LUMEN_ASSIGN_OR_RETURN(rt.session, engine::Session::Create(*rt.model, sopts));
  LUMEN_ASSIGN_OR_RETURN(sample::Sampler sampler, sample::Sampler::Create(cfg));
  rt.sampler.emplace(std::move(sampler));
  return rt;
}

void RunGenerate(CLI::App* cmd, GenerateArgs& a) {
  if (Status s = ResolvePositionals(a); !s.ok()) return ReportError(s);
  auto rt = Start(cmd, a);
  if (!rt.ok()) return ReportError(rt.status());
  const engine::Model& model = *rt->model;
  engine::Session& session = *rt->session;
  sample::Sampler& sampler = *rt->sampler;

  std::vector<int32_t> prompt = model.tokenizer().Encode(a.prompt, /*add_special=*/!a.no_bos);
  if (prompt.empty()) {
    const int32_t bos = model.tokenizer().bos();
    if (bos < 0) return ReportError(Error("empty prompt and the model has no BOS token"));
    prompt.push_back(bos);
  }
  if (!a.no_echo) WriteOut(a.prompt);
  engine::GenerateOptions g;
  g.max_tokens = a.n;
  g.ignore_eos = a.ignore_eos;
  g.stop = a.stop;
  auto r = engine::Generate(session, sampler, prompt, g, WriteOut);
  if (!r.ok()) return ReportError(r.status());
  WriteOut("\n");
  PrintStats(*r);
}

void RunChat(CLI::App* cmd, GenerateArgs& a) {
  if (Status s = ResolvePositionals(a); !s.ok()) return ReportError(s);
  if (!a.prompt.empty() && a.model.model.empty()) a.model.model = a.prompt;
  auto rt = Start(cmd, a);
  if (!rt.ok()) return ReportError(rt.status());
  const engine::Model& model = *rt->model;
  engine::Session& session = *rt->session;
  sample::Sampler& sampler = *rt->sampler;
  std::string tmpl_src;
  if (!a.chat_template.empty()) {
    auto t = ReadFile(a.chat_template);
    if (!t.ok()) return ReportError(t.status());
    tmpl_src = *t;
  }
  auto fmt = engine::ChatFormatter::Create(model, tmpl_src);
  if (!fmt.ok()) return ReportError(fmt.status());
  if (fmt->is_fallback())
    std::fprintf(stderr, "lumen: warning: the model has no chat template; using the fallback\n");
  std::fprintf(stderr, "chat with %s; end with Ctrl-D\n", model.name().c_str());

  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  engine::Session& s = session;
  std::string line;
  for (;;) {
    std::fprintf(stderr, "> ");
    if (!std::getline(std::cin, line)) break;
    if (line.empty()) continue;
    messages.push_back({{"role", "user"}, {"content", line}});
    auto text = fmt->Render(messages, nullptr, true, nlohmann::ordered_json::object());
    if (!text.ok()) return ReportError(text.status());
    std::vector<int32_t> ids = model.tokenizer().Encode(*text, /*add_special=*/false);
    // Reuse the KV cache for the common prefix; prefill only the new turn.
    const auto& have = s.tokens();
    size_t common = 0;
    while (common < have.size() && common < ids.size() && have[common] == ids[common]) ++common;
    if (common == ids.size() && common > 0) --common;  // need logits of the last token
    const int64_t kept = s.Truncate(static_cast<int64_t>(common));
    std::span<const int32_t> fresh(ids.data() + kept, ids.size() - kept);
    engine::GenerateOptions g;
    g.max_tokens = a.n;
    g.stop = a.stop;
    auto r = engine::Generate(s, sampler, fresh, g, WriteOut);
    if (!r.ok()) return ReportError(r.status());
    WriteOut("\n");
    messages.push_back({{"role", "assistant"}, {"content", r->text}});
  }
}

void AddCommon(CLI::App* cmd, GenerateArgs& a) {
  AddModelArgs(cmd, a.model, /*positional=*/false);
  cmd->add_option("-m,--model", a.model.model, "model path (default: the embedded stories260K)");
  cmd->add_option("-n,--n-predict", a.n, "new tokens to generate (-1: until the context is full)")
      ->check(CLI::Range(-1, 1 << 24));
  cmd->add_option("--stop", a.stop, "stop string (repeatable); never printed");
  AddSamplerFlags(cmd, a.sampler);
}

}  // namespace

void RegisterGenerate(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  auto* cmd = app.add_subcommand("generate", "generate text from a prompt");
  cmd->add_option("args", a->positionals, "[MODEL] PROMPT");
  cmd->add_option("-p,--prompt", a->prompt, "the prompt");
  cmd->add_flag("--no-echo", a->no_echo, "print only the continuation");
  cmd->add_flag("--ignore-eos", a->ignore_eos, "keep going past end-of-sequence tokens");
  cmd->add_flag("--no-bos", a->no_bos, "do not add BOS/EOS special tokens to the prompt");
  AddCommon(cmd, *a);
  cmd->callback([cmd, a] { RunGenerate(cmd, *a); });

  auto c = std::make_shared<GenerateArgs>();
  auto* chat = app.add_subcommand("chat", "interactive chat using the model's chat template");
  chat->add_option("args", c->positionals, "[MODEL]");
  chat->add_option("--chat-template", c->chat_template, "Jinja chat template file to use instead");
  AddCommon(chat, *c);
  chat->callback([chat, c] { RunChat(chat, *c); });
}

}  // namespace lumen::cli
