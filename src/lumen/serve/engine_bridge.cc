#include "lumen/serve/engine_bridge.h"

#include <algorithm>

namespace lumen::serve {

bool RunState::Pop(ChoiceEvent* out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return false;
  *out = std::move(events_.front());
  events_.pop_front();
  return true;
}

void RunState::Cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& j : jobs_) j->Cancel();
}

bool RunState::finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return open_ == 0 && events_.empty();
}

void RunState::Push(int index, const engine::JobEvent& e) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back({index, e});
    if (e.kind == engine::JobEvent::kDone || e.kind == engine::JobEvent::kError) --open_;
  }
  cv_.notify_all();
}

EngineBridge::EngineBridge(const engine::Model& model, engine::Scheduler& sched,
                           engine::ChatFormatter formatter, sample::SamplerConfig base_sampler)
    : model_(model),
      sched_(sched),
      formatter_(std::move(formatter)),
      base_(std::move(base_sampler)) {
  // How this template writes a call: render one (no tool list, so the text
  // holds nothing but the call's own markers and keys).
  using ojson = nlohmann::ordered_json;
  const ojson probe =
      ojson::array({{{"role", "user"}, {"content", "x"}},
                    {{"role", "assistant"},
                     {"content", ""},
                     {"tool_calls",
                      {{{"id", "lumenprob"},
                        {"type", "function"},
                        {"function", {{"name", "lumen_probe"}, {"arguments", "{\"x\": 1}"}}}}}}}});
  auto text = formatter_.Render(probe, ojson(), /*add_generation_prompt=*/false, ojson::object());
  tool_format_ =
      DetectToolFormat(text.ok() ? *text : std::string(), model_.tokenizer().chat_template());
}

std::shared_ptr<const engine::TokenTable> EngineBridge::Table() const {
  std::call_once(table_once_, [&] { table_ = engine::TokenTable::Build(model_.tokenizer()); });
  return table_;
}

Result<Prepared> EngineBridge::Prepare(const GenRequest& r) const {
  Prepared p;
  const tokenize::Tokenizer& tok = model_.tokenizer();
  const int32_t V = tok.vocab_size();
  const char* prompt_field =
      r.raw_prompt ? "prompt" : (r.api == Api::kResponses ? "input" : "messages");
  if (r.raw_prompt) {
    if (r.prompt_is_ids) {
      for (size_t i = 0; i < r.prompt_ids.size(); ++i)
        if (r.prompt_ids[i] < 0 || r.prompt_ids[i] >= V)
          return Errorf("prompt[{}]: token id {} is outside the vocabulary (size {})", i,
                        r.prompt_ids[i], V);
      p.prompt = r.prompt_ids;
      p.prompt_text = tok.Decode(p.prompt);
    } else {
      p.prompt_text = r.prompt_text;
      p.prompt = tok.Encode(r.prompt_text, /*add_special=*/true);
    }
  } else {
    nlohmann::ordered_json tools = r.tool_choice == "none" ? nlohmann::ordered_json() : r.tools;
    auto text =
        formatter_.Render(r.messages, tools, /*add_generation_prompt=*/true, r.template_kwargs);
    if (!text.ok())
      return Errorf("{}: the chat template failed: {}", prompt_field, text.status().message());
    p.prompt_text = *text;
    p.prompt = tok.Encode(*text, /*add_special=*/false);
    if (r.tools.is_array() && r.tool_choice != "none")
      for (const auto& t : r.tools)
        p.tool_names.push_back(t["function"]["name"].get<std::string>());
  }
  if (p.prompt.empty()) {
    if (tok.bos() < 0)
      return Errorf("{}: the prompt is empty and the model has no BOS token", prompt_field);
    p.prompt.push_back(tok.bos());
  }
  // Whether prompt + max_tokens fits the context is the server's admission
  // (admission.h), a 400 with its own code; an unset max_tokens runs until
  // the context is full.
  p.prompt_field = prompt_field;
  if (r.max_tokens) p.max_tokens = static_cast<int>(*r.max_tokens);
  // Binding choices. Checked here, so a vocabulary that cannot spell the
  // format is a 400 naming the field, not a failed job.
  std::vector<engine::GrammarSegment> grammar;
  const char* constraint_field = "response_format";
  if (!r.raw_prompt && !p.tool_names.empty() &&
      (r.tool_choice_named || r.tool_choice == "required")) {
    std::vector<std::string> names = p.tool_names;
    if (r.tool_choice_named) names = {r.tool_choice};
    grammar = ToolCallGrammar(tool_format_, names);
    p.tool_names = names;
    p.forced_call = true;
    constraint_field = "tool_choice";
  } else if (!r.raw_prompt && r.response_format == "json_object") {
    grammar = {engine::GrammarSegment::JsonObject()};
  } else if (!r.raw_prompt && r.response_format == "json_schema") {
    constraint_field = r.json_schema_field.c_str();
    auto schema = engine::CompileJsonSchema(r.json_schema);
    if (!schema.ok()) {
      // "path: why" within the schema, "schema: why" for the whole of it.
      std::string msg = schema.status().message();
      if (msg.starts_with("schema: ")) return Errorf("{}: {}", r.json_schema_field, msg.substr(8));
      return Errorf("{}.{}", r.json_schema_field, msg);
    }
    grammar = {engine::GrammarSegment::Schema(*schema)};
  }
  if (!grammar.empty()) {
    auto table = Table();
    for (const auto& g : grammar) {
      std::vector<std::string> texts = g.options;
      if (g.kind == engine::GrammarSegment::kLiteral) texts = {g.text};
      if (g.kind == engine::GrammarSegment::kJsonObject ||
          g.kind == engine::GrammarSegment::kSchema)
        texts = {"{\"\": 0}"};
      for (const auto& t : texts)
        if (!table->EncodeExact(t))
          return Errorf("{}: the model's vocabulary cannot spell '{}'{}", constraint_field, t,
                        p.forced_call ? fmt::format(" (the {} tool-call format)",
                                                    ToolFormatName(tool_format_))
                                      : std::string());
    }
    auto c = engine::GrammarConstraint::Create(table, std::move(grammar));
    if (!c.ok()) return Errorf("{}: {}", constraint_field, c.status().message());
    p.constraint = std::shared_ptr<const engine::GrammarConstraint>(std::move(*c));
  }
  if (!r.adapter.empty()) {
    if (!adapters_) return Errorf("adapter: this server cannot mount adapters");
    LUMEN_ASSIGN_OR_RETURN(p.adapters, adapters_->Resolve(r.adapter));
  }
  nlohmann::json fields = r.sampler_fields;
  auto cfg = sample::ParseSamplerJson(fields, base_);
  if (!cfg.ok()) return cfg.status();
  p.sampler = *cfg;
  p.sampler.top_logprobs = r.logprobs ? r.top_logprobs : 0;
  LUMEN_RETURN_IF_ERROR(sample::ValidateForVocab(p.sampler, V));
  return p;
}

std::shared_ptr<RunState> EngineBridge::Start(const GenRequest& r, const Prepared& p,
                                              engine::Scheduler::SubmitError* err) {
  auto run = std::make_shared<RunState>();
  run->open_ = r.n;
  for (int i = 0; i < r.n; ++i) {
    engine::JobRequest j;
    j.prompt = p.prompt;
    j.sampler = p.sampler;
    // n choices with a fixed seed stay reproducible and distinct.
    if (j.sampler.seed && i > 0) j.sampler.seed = *j.sampler.seed + static_cast<uint64_t>(i);
    j.max_tokens = p.max_tokens;
    j.stop = r.stop;
    j.want_logprobs = r.logprobs;
    if (p.constraint) j.constraint = std::make_shared<engine::GrammarConstraint>(*p.constraint);
    j.adapters = p.adapters;
    std::weak_ptr<RunState> weak = run;
    j.on_event = [weak, i](const engine::JobEvent& e) {
      auto s = weak.lock();
      if (!s) return false;  // the HTTP side is gone
      s->Push(i, e);
      return true;
    };
    auto job = sched_.Submit(std::move(j), err);
    if (!job) {
      run->Cancel();
      return nullptr;
    }
    std::lock_guard<std::mutex> lock(run->mu_);
    run->jobs_.push_back(std::move(job));
  }
  return run;
}

}  // namespace lumen::serve
