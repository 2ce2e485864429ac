// lumen serve [MODEL]: the OpenAI / Anthropic / Responses HTTP server
// (docs/reference/server-api.md). Prints "lumen: listening on http://HOST:PORT"
// on stderr once bound (with the real port when --port 0), serves until
// SIGINT/SIGTERM, then shuts down gracefully and exits 0.
#include <pthread.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include <fmt/format.h>

#include "lumen/cli/common.h"
#include "lumen/cli/routes.h"
#include "lumen/cli/verbs.h"
#include "lumen/engine/adapter_registry.h"
#include "lumen/engine/chat.h"
#include "lumen/engine/default_model.h"
#include "lumen/engine/fit.h"
#include "lumen/engine/scheduler.h"
#include "lumen/model/kv_cache.h"
#include "lumen/serve/engine_bridge.h"
#include "lumen/serve/server.h"

namespace lumen::cli {
namespace {

struct ServeArgs {
  ModelArgs model;
  SamplerArgs sampler;
  std::string host = "127.0.0.1";
  int port = 8080;
  int parallel = 4;
  int queue = 64;
  std::string api_key;
  std::string cors;
  double max_body_mb = 16;
  double prompt_cache_mb = 256;
  std::string chat_template;
  std::string alias;
  int store_entries = 1000;
  double store_mb = 64;
  int store_ttl_s = 3600;
  bool no_ui = false;
  std::string runs_dir;
  std::string train_data_dir;
  double memory_budget_gb = 0;
  bool clamp_max_tokens = false;
  std::string pooling;  // --pooling: /v1/embeddings pools this way (overrides the model's)
  std::vector<std::string> adapters;  // --adapter: NAME=DIR (mounted) or DIR (whole model)
};

// --adapter values: NAME=DIR mounts DIR as NAME (requests pick it by its
// "adapter" field); a bare DIR (or an existing directory whose name holds
// '=') is applied to the whole model, as on every other verb.
struct AdapterFlags {
  std::string model_wide;
  std::vector<std::pair<std::string, std::string>> named;
};

Result<AdapterFlags> SplitAdapterFlags(const std::vector<std::string>& values) {
  AdapterFlags f;
  for (const std::string& v : values) {
    const size_t eq = v.find('=');
    std::error_code ec;
    if (eq == std::string::npos || std::filesystem::is_directory(v, ec)) {
      if (!f.model_wide.empty())
        return Errorf(
            "--adapter: two whole-model adapters ('{}' and '{}'); name them (NAME=DIR) to "
            "mount both",
            f.model_wide, v);
      f.model_wide = v;
      continue;
    }
    const std::string name = v.substr(0, eq), dir = v.substr(eq + 1);
    if (!engine::ValidAdapterId(name))
      return Errorf("--adapter {}: the name '{}' must be 1-64 of A-Z a-z 0-9 _ . -", v, name);
    for (const auto& [n, d] : f.named)
      if (n == name) return Errorf("--adapter: the name '{}' is given twice", name);
    f.named.emplace_back(name, dir);
  }
  return f;
}

// Sampler defaults: built-in < generation_config.json < server flags
// (requests override on top, in EngineBridge::Prepare).
Result<sample::SamplerConfig> BaseSampler(CLI::App* cmd, ServeArgs& a, const engine::Model& m) {
  sample::SamplerConfig base;
  const nlohmann::json& gc = m.generation_config();
  nlohmann::json fields = nlohmann::json::object();
  for (const char* k : {"temperature", "top_p", "top_k", "min_p", "repetition_penalty"})
    if (gc.contains(k) && gc[k].is_number()) fields[k] = gc[k];
  if (gc.contains("do_sample") && gc["do_sample"].is_boolean() && !gc["do_sample"].get<bool>())
    fields["temperature"] = 0;
  auto from_model = sample::ParseSamplerJson(fields, base);
  if (from_model.ok())
    base = *from_model;
  else
    std::fprintf(stderr, "lumen: warning: generation_config.json ignored: %s\n",
                 from_model.status().message().c_str());
  return BuildSamplerConfig(cmd, a.sampler, base);
}

void RunServe(CLI::App* cmd, ServeArgs& a) {
  if (a.api_key.empty())
    if (const char* k = std::getenv("LUMEN_API_KEY")) a.api_key = k;
  // Signals go to one waiting thread (sigwait), never to a handler: block them
  // before any thread starts so every thread inherits the mask.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  auto adapter_flags = SplitAdapterFlags(a.adapters);
  if (!adapter_flags.ok()) return ReportError(adapter_flags.status());
  a.model.adapter = adapter_flags->model_wide;
  auto m = LoadModel(a.model);
  if (!m.ok()) return ReportError(m.status());
  // Embeddings take the exact products by default, as `lumen embed` does
  // (they are held to sentence-transformers' vectors, embeddings_test.cc): an
  // embedding model, or --pooling, with no route flag given switches to them.
  const bool preset = a.model.act_route.empty() && a.model.tier.empty() && !a.model.exact;
  if (preset && ((*m)->config().pooling != model::Pooling::kNone || !a.pooling.empty())) {
    a.model.default_act_route = "exact";
    (*m)->SetActRoute(kernels::ActRoute::kExact);
  }
  const engine::Model& model = **m;
  AnnounceRoutes(a.model, model, "serve");
  engine::AdapterRegistry adapters(model);
  for (const auto& [name, dir] : adapter_flags->named) {
    auto mounted = adapters.Mount(name, dir, /*replace=*/false);
    if (!mounted.ok())
      return ReportError(mounted.status().WithContext(fmt::format("--adapter {}={}", name, dir)));
  }
  auto base = BaseSampler(cmd, a, model);
  if (!base.ok()) return ReportError(base.status());
  auto sopts = SessionOptionsFrom(a.model);
  if (!sopts.ok()) return ReportError(sopts.status());
  // No --ctx: the model's whole context when every slot's KV cache fits in a
  // quarter of the available memory (server-api.md, "Context and max_tokens").
  if (sopts->ctx <= 0)
    sopts->ctx = engine::AutoContext(model.config(), sopts->kv_dtype, a.parallel,
                                     engine::MemAvailableBytes());

  // Refuse a configuration that cannot hold every slot's context (fit.h's
  // arithmetic) before anything starts.
  auto fit = engine::Fit(model, {.ctx = sopts->ctx,
                                 .parallel = a.parallel,
                                 .kv_dtype = sopts->kv_dtype,
                                 .budget_bytes = uint64_t(a.memory_budget_gb * 1e9),
                                 .beyond_model_ctx = true});
  if (!fit.ok()) return ReportError(fit.status());
  if (!fit->fits)
    return ReportError(
        Errorf("serve: --ctx {} with --parallel {} needs {} bytes (weights {} + {} x (KV {} + "
               "transient {})), more than the memory budget of {} bytes ({}); the largest context "
               "that fits is {}{}",
               fit->ctx, fit->parallel, fit->total_bytes, fit->weight_bytes, fit->parallel,
               fit->kv_bytes_per_seq, fit->transient_bytes_per_seq, fit->budget_bytes,
               a.memory_budget_gb > 0 ? "--memory-budget" : "MemAvailable", fit->max_ctx,
               fit->max_ctx > 0 ? fmt::format(" (--ctx {})", fit->max_ctx)
                                : std::string(": lower --parallel or raise --memory-budget")));

  engine::SchedulerOptions so;
  so.parallel = a.parallel;
  so.queue = a.queue;
  so.session = *sopts;
  so.prompt_cache_bytes = static_cast<size_t>(a.prompt_cache_mb * 1024 * 1024);
  auto sched = engine::Scheduler::Create(model, so);
  if (!sched.ok()) return ReportError(sched.status());

  std::string tmpl;
  if (!a.chat_template.empty()) {
    auto t = ReadFile(a.chat_template);
    if (!t.ok()) return ReportError(t.status().WithContext("--chat-template"));
    tmpl = *t;
  }
  auto fmt = engine::ChatFormatter::Create(model, tmpl);
  if (!fmt.ok()) return ReportError(fmt.status());
  if (fmt->is_fallback())
    std::fprintf(stderr,
                 "lumen: warning: the model has no chat template; chat endpoints use the "
                 "fallback template (docs/reference/server-api.md)\n");

  serve::EngineBridge bridge(model, **sched, std::move(*fmt), *base);
  bridge.set_adapters(&adapters);
  serve::ServerOptions opts;
  opts.host = a.host;
  opts.port = a.port;
  opts.api_key = a.api_key;
  opts.cors_origin = a.cors;
  opts.max_body_bytes = static_cast<size_t>(a.max_body_mb * 1024 * 1024);
  opts.model_name = !a.alias.empty()        ? a.alias
                    : a.model.model.empty() ? std::string("stories260K")
                                            : model.name();
  opts.store.max_entries = static_cast<size_t>(a.store_entries);
  opts.store.max_bytes = static_cast<size_t>(a.store_mb * 1024 * 1024);
  opts.store.ttl = std::chrono::seconds(a.store_ttl_s);
  opts.fit = *fit;
  opts.clamp_max_tokens = a.clamp_max_tokens;
  if (!a.pooling.empty()) opts.pooling = *model::ParsePooling(a.pooling);  // checked by CLI11
  opts.ui.enabled = !a.no_ui;
  opts.ui.runs_dir = a.runs_dir;
  opts.ui.train_data_dir = a.train_data_dir;
  opts.ui.act_route = ResolveRouteChoice(a.model)->act_route;  // LoadModel checked it
  opts.ui.adapter_dir = a.model.adapter;
  // Runs started from the web app train the served model (not its adapter).
  if (!a.model.model.empty()) opts.ui.train_model_args.push_back(a.model.model);
  if (!a.model.tokenizer.empty()) {
    opts.ui.train_model_args.push_back("--tokenizer");
    opts.ui.train_model_args.push_back(a.model.tokenizer);
  }
  if (!a.train_data_dir.empty() && a.runs_dir.empty())
    return ReportError(Error("--train-data needs --runs DIR (where started runs are written)"));
  serve::Server server(bridge, opts);
  auto port = server.Bind();
  if (!port.ok()) return ReportError(port.status());
  std::fprintf(stderr, "lumen: serving %s (ctx %lld, %d slots) on http://%s:%d\n",
               opts.model_name.c_str(), static_cast<long long>((*sched)->ctx()), a.parallel,
               a.host.c_str(), *port);
  for (const auto& ad : adapters.List())
    std::fprintf(stderr, "lumen: adapter '%s' mounted from %s (rank %d)\n", ad->id.c_str(),
                 ad->path.c_str(), ad->adapter.rank);
  std::fprintf(stderr, "lumen: listening on http://%s:%d\n", a.host.c_str(), *port);
  std::fflush(stderr);

  std::atomic<bool> listener_done{false};
  std::thread waiter([&server, &listener_done, sigs] {
    int sig = 0;
    sigwait(&sigs, &sig);
    if (!listener_done) std::fprintf(stderr, "lumen: signal %d: shutting down\n", sig);
    server.Stop();
  });
  Status st = server.Run();
  listener_done = true;
  server.Stop();
  // Wake the waiter if the listener ended on its own.
  pthread_kill(waiter.native_handle(), SIGTERM);
  waiter.join();
  (*sched)->Shutdown(true);
  if (!st.ok()) return ReportError(st);
  std::fprintf(stderr, "lumen: server stopped\n");
}

}  // namespace

void RegisterServe(CLI::App& app) {
  auto* cmd = app.add_subcommand("serve", "OpenAI / Anthropic / Responses HTTP server");
  auto a = std::make_shared<ServeArgs>();
  // The default routes (bf16 prefill, int8x2 decode), as generate and bench:
  // their arithmetic depends on a product's row count, so the prompt cache
  // restores whole prefill chunks only and a warm request gives the cold
  // one's tokens bit for bit (engine/scheduler.h RestoreLength). --exact or
  // --act-route exact keep the exact products (and the whole common prefix).
  AddModelArgs(cmd, a->model);
  // serve's --adapter repeats and may name adapters (SplitAdapterFlags).
  cmd->remove_option(cmd->get_option("--adapter"));
  cmd->add_option("--adapter", a->adapters,
                  "LoRA adapter (PEFT layout), repeatable: NAME=DIR mounts DIR as NAME for "
                  "requests that name it (\"adapter\" field; GET /v1/adapters); a bare DIR is "
                  "applied to the whole model under every request");
  cmd->add_option("--host", a->host, "address to bind (default 127.0.0.1: this machine only)");
  cmd->add_option("--port", a->port, "TCP port (0: any free port, printed on stderr)")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("-P,--parallel", a->parallel, "sequences decoded together (continuous batching)")
      ->check(CLI::Range(int64_t(1), model::kMaxChunk));
  cmd->add_option("--queue", a->queue, "requests that may wait for a slot; beyond: 429 / 529")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--api-key", a->api_key,
                  "require this key (Bearer or x-api-key); or LUMEN_API_KEY");
  cmd->add_option("--cors", a->cors,
                  "allow browser requests from this origin (e.g. http://localhost:3000 or *)");
  cmd->add_option("--max-body-mb", a->max_body_mb, "largest request body in MiB")
      ->check(FiniteRange(0.001, 4096.0));
  cmd->add_option("--prompt-cache-mb", a->prompt_cache_mb, "KV kept for prefix reuse, MiB (0: off)")
      ->check(FiniteRange(0.0, 1048576.0));
  cmd->add_option("--chat-template", a->chat_template,
                  "Jinja chat template file (overrides the model's)");
  cmd->add_option("--alias", a->alias, "model name reported to clients");
  cmd->add_option("--store-entries", a->store_entries, "Responses store: most responses kept")
      ->check(CLI::Range(0, 1 << 24));
  cmd->add_option("--store-mb", a->store_mb, "Responses store: most MiB kept")
      ->check(FiniteRange(0.0, 1048576.0));
  cmd->add_option("--store-ttl", a->store_ttl_s, "Responses store: seconds a response is kept")
      ->check(CLI::Range(1, 1 << 30));
  cmd->add_flag("--no-ui", a->no_ui, "do not serve the web app at / (docs/reference/web.md)");
  cmd->add_option("--runs", a->runs_dir,
                  "directory whose subdirectories hold training runs (metrics.jsonl) for the "
                  "web app's training watch")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--train-data", a->train_data_dir,
                  "let the web app start lumen train runs (into --runs) on data directories "
                  "under DIR; without it starting runs is refused")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--memory-budget", a->memory_budget_gb,
                  "memory budget in GB (1e9 bytes) that weights + --parallel x (KV + scratch) "
                  "must fit, checked at start (default: MemAvailable; see lumen fit)")
      ->check(FiniteRange(1e-9, 1e9));
  cmd->add_flag("--clamp-max-tokens", a->clamp_max_tokens,
                "cut a max_tokens that does not fit beside the prompt to the room left (as "
                "llama-server does) instead of refusing the request with "
                "context_length_exceeded");
  cmd->add_option("--pooling", a->pooling,
                  "mean, cls or last: /v1/embeddings pools this way instead of the model's "
                  "pooling (as llama-server's --pooling; also embeds with a generative model)")
      ->check(CLI::IsMember({"mean", "cls", "last"}));
  AddSamplerFlags(cmd, a->sampler);
  cmd->callback([cmd, a] { RunServe(cmd, *a); });
}

}  // namespace lumen::cli
