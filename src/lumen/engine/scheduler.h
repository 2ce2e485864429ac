// Scheduler: continuous batching of many generation requests over one Model.
//
// One worker thread owns every Session. Each step it
//   1. admits queued jobs into free slots (up to `parallel`), taking the KV of
//      the longest common token prefix from the prompt cache when one matches,
//   2. prefills one chunk (<= model::kMaxChunk tokens) of one joining job,
//   3. samples the next token of every decoding slot with that job's own
//      Sampler, streams its text (stop strings held back as in Generate), and
//      runs ONE model::Forward::RunBatch over all slots that continue, so the
//      weights are read once per step for every sequence.
// Jobs join and leave between steps. A job's tokens depend only on its own
// prompt, sampler seed and cache state, never on its neighbours: RunBatch rows
// are computed exactly as alone (L1) and prefill chunking depends only on the
// job itself.
//
// Prompt cache: a finished job's Session (KV + token list) is kept in an LRU
// bounded by bytes; a new job adopts the entry with the longest common prefix
// (>= 1 token), truncates it there (RestoreLength) and prefills only the rest. An adopted entry
// leaves the cache (two concurrent jobs cannot share one KV). Entries are
// keyed by the adapter set they were computed with (AdapterSet::key): a job
// only adopts an entry of its own set.
//
// Adapters (adapter_registry.h): a job's adapter set rides with it; its
// prefill runs with the set and its decode rows carry it, so jobs with
// different sets share one RunBatch (the base product once for all rows,
// each row's low-rank updates on top, L1 per row as alone).
//
// Constraints (constraint.h): a job with a TokenConstraint takes its forced
// tokens without sampling (appended to its session in one forward, so that
// step it is not in the batch), has disallowed logits set to -inf before its
// Sampler runs, and ends with kEos once the constraint is done. Jobs without
// one take exactly the unconstrained path.
//
// Callbacks run on the worker thread and must return quickly; returning false
// (or Job::Cancel) frees the slot before the next step.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "lumen/engine/adapter_registry.h"
#include "lumen/engine/constraint.h"
#include "lumen/engine/generate.h"
#include "lumen/engine/model.h"
#include "lumen/engine/session.h"
#include "lumen/sample/config.h"

namespace lumen::engine {

struct SchedulerOptions {
  int parallel = 1;               // slots decoding together
  int queue = 64;                 // jobs waiting for a slot beyond which Submit refuses
  SessionOptions session;         // ctx and KV type of every slot
  size_t prompt_cache_bytes = 0;  // 0: no prompt cache
};

// What a job reports. kToken carries newly safe text (may be empty while text
// is held back) and the token; kDone ends the job (finish set); kError too.
struct JobEvent {
  enum Kind { kStarted, kToken, kDone, kError } kind = kToken;
  std::string text;
  GeneratedToken token{};
  FinishReason finish = FinishReason::kLength;
  std::string error;
  std::string stop_matched;       // kDone with finish kStop: the stop string that matched
  int64_t prompt_tokens = 0;      // kStarted / kDone
  int64_t cached_tokens = 0;      // prompt tokens taken from the prompt cache
  int64_t completion_tokens = 0;  // kDone
};

// How many tokens a job keeps of a cached session that shares `common`
// tokens with its prompt of `prompt_len`: the common prefix less at least one
// prompt token (its logits start the decode). On a route that switches by a
// product's row count (`row_dependent`: any int8 or bf16 route, where a
// 1-token suffix takes another route than its place in a prefill chunk did,
// not only the exact route's other summation order at 4 rows or fewer) a
// restored suffix chunked differently from a fresh prefill would round
// differently, so only whole chunks are kept (Session::whole_chunks, rounded
// down to kMaxChunk): the rest is then chunked exactly as a fresh prefill of
// the prompt, and the job's tokens are the cold run's bit for bit.
int64_t RestoreLength(int64_t common, int64_t prompt_len, int64_t whole_chunks, bool row_dependent);

struct JobRequest {
  std::vector<int32_t> prompt;  // non-empty
  sample::SamplerConfig sampler;
  int max_tokens = 256;  // < 0: until the context is full
  bool ignore_eos = false;
  std::vector<std::string> stop;
  bool want_logprobs = false;
  // Null: unconstrained. Stateful: one per job; only the worker touches it.
  std::shared_ptr<TokenConstraint> constraint;
  // Null: no adapter beyond the model-wide one. Kept alive by the job.
  std::shared_ptr<const AdapterSet> adapters;
  std::function<bool(const JobEvent&)> on_event;  // false: cancel
};

class Job {
 public:
  void Cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }

 private:
  friend class Scheduler;
  JobRequest req_;
  std::atomic<bool> cancelled_{false};
};

struct SchedulerStats {
  int64_t jobs_started = 0, jobs_finished = 0, jobs_cancelled = 0;
  int64_t prompt_tokens = 0, completion_tokens = 0;
  int64_t cache_hits = 0, cache_misses = 0, cached_tokens = 0;
  int64_t cache_entries = 0;
  size_t cache_bytes = 0;      // KV bytes held by the prompt cache
  size_t kv_bytes_active = 0;  // KV bytes of the slots in use
  int queue_depth = 0, active_slots = 0;
  int64_t steps = 0, batched_rows = 0;  // decode steps and rows over them
};

class Scheduler {
 public:
  static Result<std::unique_ptr<Scheduler>> Create(const Model& model, SchedulerOptions opts);
  ~Scheduler();  // cancels every job, joins the worker

  enum class SubmitError { kNone, kQueueFull, kStopped };
  // Queues a job; nullptr with *err set when the queue is full or stopping.
  std::shared_ptr<Job> Submit(JobRequest req, SubmitError* err);

  // Stops admitting jobs; with cancel, running ones end as kCancelled.
  void Shutdown(bool cancel);
  // Waits until no job is queued or running (after Shutdown(false)).
  void Drain();

  SchedulerStats stats() const;
  int64_t ctx() const { return ctx_; }
  const Model& model() const { return model_; }
  const SchedulerOptions& options() const { return opts_; }

  struct Slot;  // one running job (scheduler.cc)

 private:
  Scheduler(const Model& model, SchedulerOptions opts, int64_t ctx);
  void Loop();
  bool Admit(std::unique_lock<std::mutex>& lock);
  void PrefillStep();
  void DecodeStep();
  // A constrained slot's forced tokens: emitted and appended; false when the
  // slot finished (or failed) on the way.
  bool ForceTokens(Slot& s, std::vector<int32_t> forced);
  void Finish(Slot& s, FinishReason why, const std::string& error = "");
  // The entry of adapter set `key` sharing the longest prefix with prompt.
  std::unique_ptr<Session> TakeCached(const std::vector<int32_t>& prompt, const std::string& key,
                                      int64_t* kept);
  void PutCached(std::unique_ptr<Session> s, std::string key);

  const Model& model_;
  const SchedulerOptions opts_;
  const int64_t ctx_;
  model::Forward forward_;  // the batched decode pass (sessions prefill with their own)
  std::vector<float> batch_logits_;

  mutable std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool stopping_ = false, cancel_all_ = false, exit_ = false;
  SchedulerStats stats_;  // guarded by mu_

  std::vector<std::unique_ptr<Slot>> slots_;  // worker thread only
  struct CacheEntry {
    std::unique_ptr<Session> session;
    std::string key;  // AdapterSet::key of the set its KV was made with ("" : none)
  };
  std::list<CacheEntry> cache_;  // front: most recently used; worker thread only
  std::thread worker_;
};

}  // namespace lumen::engine
