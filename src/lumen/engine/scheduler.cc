#include "lumen/engine/scheduler.h"

#include <algorithm>
#include <optional>

#include "lumen/core/log.h"
#include "lumen/core/route.h"
#include "lumen/engine/stop.h"
#include "lumen/sample/sampler.h"
#include "lumen/tokenize/tokenizer.h"

namespace lumen::engine {

LUMEN_ROUTE(
    prompt_cache_restore,
    {.node = "prompt_cache.restore",
     .name = "adopt-longest-prefix",
     .tier = Tier::kL1,
     .oracle = "a fresh prefill of the whole prompt",
     .bound =
         "identical tokens on the exact route (the whole common prefix kept); on int8 and bf16 "
         "routes, whose arithmetic depends on a product's row count, whole kMaxChunk chunks kept "
         "and the rest chunked as a fresh prefill: bit-identical logits (RestoreLength)",
     .tests = "SchedulerTest.PromptCacheReusesPrefix;SchedulerTest.FastRoutesRestoreWholeChunks;"
              "RestoreLength.KeepsWholeChunksOnFastRoutes;"
              "EmbeddedServer.PromptCacheReusesConversationPrefix;"
              "SessionTest.TruncateAndReappendReusesThePrefix;SessionTest."
              "PiecewiseAppendEqualsOneAppend;SessionTest.WholeChunksGiveTheFreshPrefillBits",
     .when = "prompt_cache=on",
     .priority = 10});

struct Scheduler::Slot {
  std::shared_ptr<Job> job;
  std::unique_ptr<Session> session;
  std::optional<sample::Sampler> sampler;
  std::optional<tokenize::StreamingDetokenizer> detok;
  std::optional<StopMatcher> stops;
  std::vector<int32_t> pending;  // prompt tokens still to prefill
  size_t prefilled = 0;
  int64_t prompt_tokens = 0, cached_tokens = 0;
  int generated = 0;
  bool done = false;
  bool prefilling() const { return prefilled < pending.size(); }
};

Result<std::unique_ptr<Scheduler>> Scheduler::Create(const Model& model, SchedulerOptions opts) {
  if (opts.parallel < 1 || opts.parallel > model::kMaxChunk)
    return Errorf("--parallel: must be in [1, {}], got {}", model::kMaxChunk, opts.parallel);
  if (opts.queue < 0) return Errorf("--queue: must be >= 0, got {}", opts.queue);
  // Probe the context size (and that a KV cache of that size can be made).
  LUMEN_ASSIGN_OR_RETURN(auto probe, Session::Create(model, opts.session));
  const int64_t ctx = probe->ctx();
  auto s = std::unique_ptr<Scheduler>(new Scheduler(model, opts, ctx));
  s->worker_ = std::thread([p = s.get()] { p->Loop(); });
  return s;
}

Scheduler::Scheduler(const Model& model, SchedulerOptions opts, int64_t ctx)
    : model_(model),
      opts_(opts),
      ctx_(ctx),
      forward_(model.config(), model.weights(), model.pool()),
      batch_logits_(size_t(opts_.parallel) * model.config().vocab_size) {}

Scheduler::~Scheduler() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = cancel_all_ = exit_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

std::shared_ptr<Job> Scheduler::Submit(JobRequest req, SubmitError* err) {
  auto job = std::make_shared<Job>();
  job->req_ = std::move(req);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      *err = SubmitError::kStopped;
      return nullptr;
    }
    // Free slots take jobs at once; only jobs beyond them wait in the queue.
    const int free_slots = opts_.parallel - stats_.active_slots;
    if (static_cast<int>(queue_.size()) >= opts_.queue + std::max(0, free_slots)) {
      *err = SubmitError::kQueueFull;
      return nullptr;
    }
    queue_.push_back(job);
    stats_.queue_depth = static_cast<int>(queue_.size());
  }
  *err = SubmitError::kNone;
  cv_.notify_all();
  return job;
}

void Scheduler::Shutdown(bool cancel) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    if (cancel) cancel_all_ = true;
  }
  cv_.notify_all();
}

void Scheduler::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [&] { return queue_.empty() && stats_.active_slots == 0; });
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

std::unique_ptr<Session> Scheduler::TakeCached(const std::vector<int32_t>& prompt,
                                               const std::string& key, int64_t* kept) {
  *kept = 0;
  auto best = cache_.end();
  size_t best_len = 0;
  for (auto it = cache_.begin(); it != cache_.end(); ++it) {
    if (it->key != key) continue;
    const auto& have = it->session->tokens();
    size_t n = 0;
    const size_t lim = std::min(have.size(), prompt.size());
    while (n < lim && have[n] == prompt[n]) ++n;
    if (n > best_len) {
      best_len = n;
      best = it;
    }
  }
  if (best == cache_.end()) return nullptr;
  std::unique_ptr<Session> s = std::move(best->session);
  cache_.erase(best);
  const kernels::ActRoute route = model_.act_route();
  const bool row_dependent = kernels::RouteHasInt8(route) || kernels::RouteHasBf16(route);
  *kept = s->Truncate(
      RestoreLength(int64_t(best_len), int64_t(prompt.size()), s->whole_chunks(), row_dependent));
  return s;
}

int64_t RestoreLength(int64_t common, int64_t prompt_len, int64_t whole_chunks,
                      bool row_dependent) {
  int64_t n = std::min(common, prompt_len - 1);
  if (row_dependent) n = std::min(n - n % model::kMaxChunk, whole_chunks);
  return std::max<int64_t>(n, 0);
}

void Scheduler::PutCached(std::unique_ptr<Session> s, std::string key) {
  if (opts_.prompt_cache_bytes == 0 || !s || s->tokens().empty()) return;
  if (s->touched_kv_bytes() > opts_.prompt_cache_bytes) return;
  s->SetLora(nullptr);  // its job's set may go; the key remembers which it was
  cache_.push_front({std::move(s), std::move(key)});
  size_t total = 0;
  for (const auto& e : cache_) total += e.session->touched_kv_bytes();
  while (total > opts_.prompt_cache_bytes) {
    total -= cache_.back().session->touched_kv_bytes();
    cache_.pop_back();
  }
}

bool Scheduler::Admit(std::unique_lock<std::mutex>& lock) {
  bool any = false;
  while (static_cast<int>(slots_.size()) < opts_.parallel && !queue_.empty()) {
    std::shared_ptr<Job> job = std::move(queue_.front());
    queue_.pop_front();
    any = true;
    auto slot = std::make_unique<Slot>();
    slot->job = job;
    const JobRequest& r = job->req_;
    auto fail = [&](const std::string& msg) {
      JobEvent e;
      e.kind = JobEvent::kError;
      e.error = msg;
      if (r.on_event) r.on_event(e);
    };
    if (job->cancelled() || cancel_all_) {
      JobEvent e;
      e.kind = JobEvent::kDone;
      e.finish = FinishReason::kCancelled;
      if (r.on_event) r.on_event(e);
      ++stats_.jobs_cancelled;
      continue;
    }
    if (r.prompt.empty()) {
      fail("prompt: no tokens");
      continue;
    }
    if (static_cast<int64_t>(r.prompt.size()) > ctx_) {
      fail(fmt::format("prompt too long: {} tokens exceed the context size {}", r.prompt.size(),
                       ctx_));
      continue;
    }
    auto sampler = sample::Sampler::Create(r.sampler);
    if (!sampler.ok()) {
      fail(sampler.status().message());
      continue;
    }
    slot->sampler.emplace(std::move(*sampler));
    int64_t kept = 0;
    const std::string key = r.adapters ? r.adapters->key : std::string();
    slot->session = TakeCached(r.prompt, key, &kept);
    if (!slot->session) {
      auto s = Session::Create(model_, opts_.session);
      if (!s.ok()) {
        fail(s.status().message());
        continue;
      }
      slot->session = std::move(*s);
    }
    slot->session->SetLora(r.adapters ? &r.adapters->lora : nullptr);
    if (kept > 0) {
      ++stats_.cache_hits;
      stats_.cached_tokens += kept;
    } else {
      ++stats_.cache_misses;
    }
    slot->cached_tokens = kept;
    slot->prompt_tokens = static_cast<int64_t>(r.prompt.size());
    slot->pending.assign(r.prompt.begin() + kept, r.prompt.end());
    slot->detok.emplace(model_.tokenizer(), /*skip_special=*/true);
    // Decode in context: a SentencePiece "▁word" after the prompt keeps its
    // space, which a fresh detokenizer would strip as a text start.
    slot->detok->Push(r.prompt.back());
    slot->stops.emplace(r.stop);
    ++stats_.jobs_started;
    stats_.prompt_tokens += slot->prompt_tokens;
    JobEvent e;
    e.kind = JobEvent::kStarted;
    e.prompt_tokens = slot->prompt_tokens;
    e.cached_tokens = kept;
    slots_.push_back(std::move(slot));
    // Counted before the lock is released, so Submit never sees a slot free
    // that this job already holds.
    stats_.active_slots = static_cast<int>(slots_.size());
    stats_.queue_depth = static_cast<int>(queue_.size());
    lock.unlock();
    const bool go = !r.on_event || r.on_event(e);
    lock.lock();
    if (!go) job->Cancel();
  }
  stats_.queue_depth = static_cast<int>(queue_.size());
  stats_.active_slots = static_cast<int>(slots_.size());
  return any;
}

void Scheduler::Finish(Slot& s, FinishReason why, const std::string& error) {
  if (s.done) return;
  s.done = true;
  const JobRequest& r = s.job->req_;
  JobEvent e;
  if (!error.empty()) {
    e.kind = JobEvent::kError;
    e.error = error;
  } else {
    e.kind = JobEvent::kDone;
    if (why != FinishReason::kStop && why != FinishReason::kCancelled) {
      e.text = s.stops->Push(s.detok->Flush());
      if (!s.stops->stopped()) e.text += s.stops->Flush();
      if (s.stops->stopped()) why = FinishReason::kStop;
    }
  }
  e.finish = why;
  if (why == FinishReason::kStop) e.stop_matched = s.stops->matched();
  e.prompt_tokens = s.prompt_tokens;
  e.cached_tokens = s.cached_tokens;
  e.completion_tokens = s.generated;
  // The session goes to the prompt cache and the counters are updated before
  // the job hears it is done, so /stats read after a response includes it.
  if (why != FinishReason::kCancelled && error.empty())
    PutCached(std::move(s.session), r.adapters ? r.adapters->key : std::string());
  s.session.reset();
  {
    size_t cache_bytes = 0;
    for (const auto& c : cache_) cache_bytes += c.session->touched_kv_bytes();
    std::lock_guard<std::mutex> lock(mu_);
    stats_.completion_tokens += s.generated;
    if (why == FinishReason::kCancelled)
      ++stats_.jobs_cancelled;
    else
      ++stats_.jobs_finished;
    stats_.cache_bytes = cache_bytes;
    stats_.cache_entries = static_cast<int64_t>(cache_.size());
  }
  if (r.on_event) r.on_event(e);
}

void Scheduler::PrefillStep() {
  for (auto& sp : slots_) {
    Slot& s = *sp;
    if (s.done || !s.prefilling()) continue;
    if (s.job->cancelled()) {
      Finish(s, FinishReason::kCancelled);
      continue;
    }
    const size_t len = std::min<size_t>(model::kMaxChunk, s.pending.size() - s.prefilled);
    Status st = s.session->Append(std::span<const int32_t>(s.pending.data() + s.prefilled, len));
    if (!st.ok()) {
      Finish(s, FinishReason::kCancelled, st.message());
      continue;
    }
    s.prefilled += len;
    return;  // one chunk per step keeps decoding slots moving
  }
}

bool Scheduler::ForceTokens(Slot& s, std::vector<int32_t> forced) {
  const JobRequest& r = s.job->req_;
  size_t n = forced.size();
  if (r.max_tokens >= 0) n = std::min<size_t>(n, size_t(r.max_tokens - s.generated));
  n = std::min<size_t>(n, size_t(s.session->ctx() - s.session->next_pos()));
  for (size_t i = 0; i < n; ++i) {
    const int32_t id = forced[i];
    if (!r.constraint->Accept(id)) {
      Finish(s, FinishReason::kCancelled,
             fmt::format("constraint: its own forced token {} was refused", id));
      return false;
    }
    JobEvent e;
    e.kind = JobEvent::kToken;
    e.token.id = id;
    // Forced tokens are not drawn: reported as certain.
    e.token.logprobs.chosen = {id, 0.0f};
    ++s.generated;
    e.text = s.stops->Push(s.detok->Push(id));
    if (r.on_event && !r.on_event(e)) {
      s.job->Cancel();
      Finish(s, FinishReason::kCancelled);
      return false;
    }
    if (s.stops->stopped()) {
      Finish(s, FinishReason::kStop);
      return false;
    }
  }
  if (r.constraint->done()) {
    Finish(s, FinishReason::kEos);
    return false;
  }
  if (r.max_tokens >= 0 && s.generated >= r.max_tokens) {
    Finish(s, FinishReason::kLength);
    return false;
  }
  if (n < forced.size()) {
    Finish(s, FinishReason::kContext);
    return false;
  }
  // One forward over the whole run, like a prefill chunk.
  Status st = s.session->Append(std::span<const int32_t>(forced.data(), n));
  if (!st.ok()) {
    Finish(s, FinishReason::kCancelled, st.message());
    return false;
  }
  return true;
}

void Scheduler::DecodeStep() {
  const tokenize::Tokenizer& tok = model_.tokenizer();
  std::vector<model::BatchRow> rows;
  std::vector<Slot*> row_slots;
  for (auto& sp : slots_) {
    Slot& s = *sp;
    if (s.done || s.prefilling()) continue;
    const JobRequest& r = s.job->req_;
    if (s.job->cancelled()) {
      Finish(s, FinishReason::kCancelled);
      continue;
    }
    if (r.max_tokens >= 0 && s.generated >= r.max_tokens) {
      Finish(s, FinishReason::kLength);
      continue;
    }
    if (s.session->next_pos() >= s.session->ctx()) {
      Finish(s, FinishReason::kContext);
      continue;
    }
    JobEvent e;
    e.kind = JobEvent::kToken;
    if (r.constraint) {
      TokenConstraint& c = *r.constraint;
      std::vector<int32_t> forced;
      std::string why;
      if (!c.Forced(&forced, &why)) {
        Finish(s, FinishReason::kCancelled, why);
        continue;
      }
      if (!forced.empty()) {
        ForceTokens(s, std::move(forced));
        continue;
      }
      if (c.Mask(s.session->logits()) == 0) {
        Finish(s, FinishReason::kCancelled, "constraint: no token of the vocabulary may come next");
        continue;
      }
    }
    e.token.id = s.sampler->Sample(s.session->logits(), s.session->tokens(),
                                   r.want_logprobs ? &e.token.logprobs : nullptr);
    if (r.constraint && !r.constraint->Accept(e.token.id)) {
      Finish(s, FinishReason::kCancelled,
             fmt::format("constraint: the sampler chose token {}, which the constraint does not "
                         "allow (does logit_bias ban every allowed token?)",
                         e.token.id));
      continue;
    }
    if (tok.IsEog(e.token.id) && !r.ignore_eos) {
      Finish(s, FinishReason::kEos);
      continue;
    }
    ++s.generated;
    e.text = s.stops->Push(s.detok->Push(e.token.id));
    if (r.on_event && !r.on_event(e)) {
      s.job->Cancel();
      Finish(s, FinishReason::kCancelled);
      continue;
    }
    if (s.stops->stopped()) {
      Finish(s, FinishReason::kStop);
      continue;
    }
    if (r.constraint && r.constraint->done()) {
      Finish(s, FinishReason::kEos);
      continue;
    }
    if (r.max_tokens >= 0 && s.generated >= r.max_tokens) {
      Finish(s, FinishReason::kLength);
      continue;
    }
    rows.push_back(
        {&s.session->batch_cache(), e.token.id, s.session->next_pos(), s.session->lora()});
    row_slots.push_back(&s);
  }
  if (rows.empty()) return;
  const int64_t V = model_.config().vocab_size;
  Status st = forward_.RunBatch(rows, batch_logits_.data());
  for (size_t i = 0; i < rows.size(); ++i) {
    Slot& s = *row_slots[i];
    if (!st.ok()) {
      Finish(s, FinishReason::kCancelled, st.message());
      continue;
    }
    s.session->CommitBatchToken(rows[i].token,
                                std::span<const float>(batch_logits_.data() + i * V, size_t(V)));
  }
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.steps;
  stats_.batched_rows += static_cast<int64_t>(rows.size());
}

void Scheduler::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return exit_ || !queue_.empty() || !slots_.empty(); });
    if (exit_ && slots_.empty() && queue_.empty()) break;
    if (cancel_all_)
      for (auto& s : slots_) s->job->Cancel();
    Admit(lock);
    lock.unlock();
    for (auto& s : slots_)
      if (!s->done && s->job->cancelled()) Finish(*s, FinishReason::kCancelled);
    // A step that throws (a defect, or memory running out) ends the jobs in
    // flight with an error the clients see; the server and the queue go on.
    try {
      PrefillStep();
      DecodeStep();
    } catch (const std::exception& x) {
      LUMEN_LOG_ERROR("scheduler: a step failed ({}); its {} job(s) end with an error", x.what(),
                      slots_.size());
      for (auto& s : slots_)
        Finish(*s, FinishReason::kCancelled, std::string("internal error: ") + x.what());
    }
    // Finished slots leave; their sessions go to the prompt cache.
    size_t kv_active = 0;
    for (auto& sp : slots_) {
      if (!sp->done) {
        kv_active += sp->session->cache().bytes();
        continue;
      }
      sp.reset();  // its session went to the prompt cache in Finish
    }
    slots_.erase(std::remove(slots_.begin(), slots_.end(), nullptr), slots_.end());
    size_t cache_bytes = 0;
    for (const auto& e : cache_) cache_bytes += e.session->touched_kv_bytes();
    lock.lock();
    stats_.active_slots = static_cast<int>(slots_.size());
    stats_.queue_depth = static_cast<int>(queue_.size());
    stats_.cache_bytes = cache_bytes;
    stats_.cache_entries = static_cast<int64_t>(cache_.size());
    stats_.kv_bytes_active = kv_active;
    if (slots_.empty() && queue_.empty()) idle_cv_.notify_all();
  }
  idle_cv_.notify_all();
}

}  // namespace lumen::engine
