// EngineBridge: turns a GenRequest into scheduler jobs and their events.
//
// Prepare renders the chat template (or takes the raw prompt), tokenizes, and
// resolves sampler settings with the documented precedence: request field >
// server flag > the model's generation_config.json > built-in defaults (the
// last three are folded into `base_sampler` by the caller). Every problem is a
// Status naming the request field (-> HTTP 400). Start submits one job per
// choice (n) and funnels their events into one RunState queue that the HTTP
// thread drains.
//
// Binding choices: tool_choice "required" (Anthropic "any") or a named tool
// make every job carry a GrammarConstraint (tool_calls.h ToolCallGrammar) in
// the model's tool-call format, detected once from the chat template;
// response_format json_object makes the reply one JSON object. The token
// table those need is built on the first such request.
//
// The request's "adapter" set spec is resolved against the registry in
// Prepare (an unknown id: a 400 naming it) and rides with every job.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "lumen/engine/chat.h"
#include "lumen/engine/scheduler.h"
#include "lumen/serve/request.h"
#include "lumen/serve/tool_calls.h"

namespace lumen::serve {

struct Prepared {
  std::vector<int32_t> prompt;
  std::string prompt_text;  // what was tokenized (echo)
  sample::SamplerConfig sampler;
  int max_tokens = -1;
  const char* prompt_field = "messages";  // "prompt" / "input": the field admission names
  std::vector<std::string> tool_names;    // tools the reply may call
  // Binding tool_choice / json_object: each job gets a copy (null: free text).
  std::shared_ptr<const engine::GrammarConstraint> constraint;
  bool forced_call = false;  // the reply is exactly one call to one of tool_names
  // The request's adapter set (null: none); held until its jobs end.
  std::shared_ptr<const engine::AdapterSet> adapters;
};

struct ChoiceEvent {
  int index = 0;
  engine::JobEvent ev;
};

// Events of one HTTP request's jobs, in arrival order.
class RunState {
 public:
  // Waits up to `timeout` for an event; false on timeout.
  bool Pop(ChoiceEvent* out, std::chrono::milliseconds timeout);
  void Cancel();
  bool finished() const;  // every job reported kDone / kError and the queue is empty
  int choices() const { return static_cast<int>(jobs_.size()); }

 private:
  friend class EngineBridge;
  void Push(int index, const engine::JobEvent& e);
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<ChoiceEvent> events_;
  std::vector<std::shared_ptr<engine::Job>> jobs_;
  int open_ = 0;
};

class EngineBridge {
 public:
  EngineBridge(const engine::Model& model, engine::Scheduler& sched,
               engine::ChatFormatter formatter, sample::SamplerConfig base_sampler);

  Result<Prepared> Prepare(const GenRequest& r) const;
  // nullptr with *err set when the queue is full or the server is stopping.
  std::shared_ptr<RunState> Start(const GenRequest& r, const Prepared& p,
                                  engine::Scheduler::SubmitError* err);

  const engine::Model& model() const { return model_; }
  engine::Scheduler& scheduler() { return sched_; }
  // The mounted adapters requests may name (null: none can be mounted).
  void set_adapters(engine::AdapterRegistry* registry) { adapters_ = registry; }
  engine::AdapterRegistry* adapters() const { return adapters_; }
  const sample::SamplerConfig& base_sampler() const { return base_; }
  ToolFormat tool_format() const { return tool_format_; }

 private:
  std::shared_ptr<const engine::TokenTable> Table() const;

  const engine::Model& model_;
  engine::Scheduler& sched_;
  engine::ChatFormatter formatter_;
  sample::SamplerConfig base_;
  ToolFormat tool_format_ = ToolFormat::kHermes;
  engine::AdapterRegistry* adapters_ = nullptr;
  mutable std::once_flag table_once_;
  mutable std::shared_ptr<const engine::TokenTable> table_;
};

}  // namespace lumen::serve
