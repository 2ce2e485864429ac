#include "lumen/serve/server.h"

#include <strings.h>

#include <ctime>
#include <random>
#include <string_view>
#include <thread>

#include "lumen/core/log.h"
#include "lumen/serve/adapters_api.h"
#include "lumen/serve/admission.h"
#include "lumen/serve/body.h"
#include "lumen/serve/httplib_include.h"
#include "lumen/serve/peer_socket.h"
#include "lumen/serve/protocol.h"

namespace lumen::serve {

namespace {
// "2025-01-31T12:00:00Z" (Anthropic's created_at) for a Unix time.
std::string Rfc3339Utc(int64_t unix_seconds) {
  const auto t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}
}  // namespace

using ojson = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr const char* kEndpoints[][3] = {
    {"GET", "/health", "liveness: {\"status\":\"ok\"}"},
    {"GET", "/v1", "this index"},
    {"GET", "/v1/models", "the served model (OpenAI and Anthropic list shapes)"},
    {"GET", "/stats", "requests, tokens, prompt cache, queue, slots, response store, uptime"},
    {"GET", "/metrics", "Prometheus text format"},
    {"GET", "/fit", "the memory check of the running configuration (lumen fit --json)"},
    {"POST", "/v1/chat/completions", "OpenAI chat completions (stream, tools, logprobs, n)"},
    {"POST", "/v1/completions", "OpenAI text completions (stream, echo, logprobs)"},
    {"POST", "/v1/messages", "Anthropic messages (stream, tools)"},
    {"POST", "/v1/responses", "OpenAI Responses (stream, previous_response_id)"},
    {"POST", "/v1/embeddings", "OpenAI embeddings (embedding models: dimensions, base64)"},
    {"GET", "/v1/adapters", "the mounted LoRA adapters"},
    {"POST", "/v1/adapters", "mount a LoRA adapter {id, path, replace}"},
    {"DELETE", "/v1/adapters/{id}", "unmount a LoRA adapter"},
    {"GET", "/lumen/info", "model, architecture, memory, context and slots (web app)"},
    {"POST", "/lumen/curve", "evaluate a control-point curve at input probabilities (web app)"},
    {"GET", "/lumen/runs", "training runs under --runs (web app)"},
    {"GET", "/lumen/runs/{name}/events", "a run's metrics.jsonl as server-sent events"},
    {"POST", "/lumen/runs", "start lumen train into --runs DIR/<name> (web app)"},
    {"DELETE", "/lumen/runs/{name}", "cancel a run started by this server (SIGINT: checkpoint)"},
};

const char* EndpointName(Api api) {
  switch (api) {
    case Api::kChat:
      return "/v1/chat/completions";
    case Api::kCompletions:
      return "/v1/completions";
    case Api::kMessages:
      return "/v1/messages";
    case Api::kResponses:
      return "/v1/responses";
  }
  return "?";
}

constexpr Api kGenerateApis[] = {Api::kChat, Api::kCompletions, Api::kMessages, Api::kResponses};
constexpr const char* kEmbeddingsPath = "/v1/embeddings";

// The generation and embedding endpoints, which exist for POST only.
bool PostOnly(std::string_view path) {
  for (Api api : kGenerateApis)
    if (path == EndpointName(api)) return true;
  return path == kEmbeddingsPath;
}

ErrorShape ShapeForPath(const std::string& path) {
  return path.rfind("/v1/messages", 0) == 0 ? ErrorShape::kAnthropic : ErrorShape::kOpenAI;
}

std::string DumpJson(const ojson& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

Server::Server(EngineBridge& engine, ServerOptions opts)
    : engine_(engine),
      opts_(std::move(opts)),
      http_(std::make_unique<httplib::Server>()),
      store_(opts_.store),
      jobs_(std::make_unique<TrainJobs>(TrainJobsOptions{
          .runs_dir = opts_.ui.runs_dir,
          .train_data_dir = opts_.ui.train_data_dir,
          .model_args = opts_.ui.train_model_args,
      })),
      embeddings_(std::make_unique<EmbeddingService>(engine.model(), engine.scheduler().ctx(),
                                                     opts_.model_name, opts_.pooling)),
      started_(Clock::now()) {
  std::random_device rd;
  id_salt_ = (uint64_t(rd()) << 32) ^ rd();
  created_unix_ = std::chrono::duration_cast<std::chrono::seconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  const auto& so = engine_.scheduler().options();
  const int threads =
      opts_.http_threads > 0 ? opts_.http_threads : std::min(512, so.parallel + so.queue + 8);
  http_->new_task_queue = [threads] {
    return new httplib::ThreadPool(static_cast<size_t>(threads));
  };
  http_->set_payload_max_length(opts_.max_body_bytes);
  http_->set_read_timeout(30, 0);
  http_->set_write_timeout(30, 0);
  Routes();
}

Server::~Server() = default;

std::string Server::NewId(const char* prefix) {
  const uint64_t n = next_id_.fetch_add(1);
  return fmt::format("{}{:016x}{:08x}", prefix, id_salt_ ^ (n * 0x9E3779B97F4A7C15ull), n);
}

void Server::SendError(httplib::Response& res, const ApiError& e, ErrorShape shape,
                       const std::string& endpoint) {
  res.status = e.status;
  if (e.retry_after > 0) res.set_header("Retry-After", std::to_string(e.retry_after));
  res.set_content(ErrorBody(e, shape), "application/json");
  metrics_.CountRequest(endpoint, e.status);
}

std::string Server::StatsJson() const {
  const engine::SchedulerStats s = engine_.scheduler().stats();
  const auto& so = engine_.scheduler().options();
  const double up = std::chrono::duration<double>(Clock::now() - started_).count();
  ojson by = ojson::object();
  for (const auto& [k, v] : metrics_.requests_by_endpoint()) by[k] = v;
  ojson j = {
      {"model", opts_.model_name},
      {"uptime_seconds", up},
      {"requests", {{"total", metrics_.requests_total()}, {"by_endpoint", by}}},
      {"jobs",
       {{"started", s.jobs_started},
        {"finished", s.jobs_finished},
        {"cancelled", s.jobs_cancelled}}},
      {"tokens", {{"prompt", s.prompt_tokens}, {"completion", s.completion_tokens}}},
      {"prompt_cache",
       {{"hits", s.cache_hits},
        {"misses", s.cache_misses},
        {"cached_tokens", s.cached_tokens},
        {"entries", s.cache_entries},
        {"bytes", s.cache_bytes},
        {"limit_bytes", so.prompt_cache_bytes}}},
      {"queue_depth", s.queue_depth},
      {"queue_limit", so.queue},
      {"active_slots", s.active_slots},
      {"parallel", so.parallel},
      {"kv_bytes_active", s.kv_bytes_active},
      {"batching",
       {{"decode_steps", s.steps},
        {"rows", s.batched_rows},
        {"mean_rows_per_step", s.steps ? double(s.batched_rows) / s.steps : 0.0}}},
      {"response_store",
       {{"entries", store_.entries()},
        {"bytes", store_.bytes()},
        {"max_entries", store_.limits().max_entries},
        {"max_bytes", store_.limits().max_bytes},
        {"ttl_seconds", store_.limits().ttl.count()}}},
      {"context", engine_.scheduler().ctx()},
      {"admission",
       {{"safe_context", engine_.scheduler().ctx()},
        {"parallel", so.parallel},
        {"kv_bytes_per_seq", opts_.fit.kv_bytes_per_seq},
        {"total_bytes", opts_.fit.total_bytes},
        {"budget_bytes", opts_.fit.budget_bytes},
        {"refused_context", refused_context_.load()}}},
  };
  return DumpJson(j);
}

void Server::Routes() {
  httplib::Server& h = *http_;
  if (!opts_.cors_origin.empty()) {
    h.set_default_headers({{"Access-Control-Allow-Origin", opts_.cors_origin},
                           {"Access-Control-Allow-Headers",
                            "Authorization, Content-Type, x-api-key, anthropic-version, "
                            "anthropic-beta, OpenAI-Organization, OpenAI-Project"},
                           {"Access-Control-Allow-Methods", "GET, POST, OPTIONS"},
                           {"Vary", "Origin"}});
  }
  // A preflight is granted the headers it asks for: the browser SDKs send
  // their own (openai-node's x-stainless-*, Anthropic's
  // anthropic-dangerous-direct-browser-access), beyond the fixed list.
  h.Options(R"(/.*)", [this](const httplib::Request& req, httplib::Response& res) {
    const std::string asked = req.get_header_value("Access-Control-Request-Headers");
    if (!opts_.cors_origin.empty() && !asked.empty()) {
      res.headers.erase("Access-Control-Allow-Headers");
      res.set_header("Access-Control-Allow-Headers", asked);
    }
    res.status = 204;
  });

  h.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (opts_.api_key.empty() || req.method == "OPTIONS" || req.path == "/health" ||
        (opts_.ui.enabled && req.method == "GET" && IsWebUiPublicPath(req.path)))
      return httplib::Server::HandlerResponse::Unhandled;
    std::string got;
    const std::string auth = req.get_header_value("Authorization");
    // The scheme is case-insensitive (RFC 7235).
    if (auth.size() > 7 && strncasecmp(auth.c_str(), "Bearer ", 7) == 0) got = auth.substr(7);
    if (got != opts_.api_key) got = req.get_header_value("x-api-key");
    if (got == opts_.api_key) return httplib::Server::HandlerResponse::Unhandled;
    ApiError e;
    e.status = 401;
    e.message =
        "invalid or missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'";
    SendError(res, e, ShapeForPath(req.path), req.path);
    return httplib::Server::HandlerResponse::Handled;
  });

  h.set_error_handler(httplib::Server::HandlerWithResponse(
      [this](const httplib::Request& req,
             httplib::Response& res) -> httplib::Server::HandlerResponse {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        ApiError e;
        // Another method on a POST endpoint is a 405 that says so, not a
        // missing endpoint.
        if (res.status == 404 && req.method != "POST" && PostOnly(req.path)) {
          res.status = 405;
          res.set_header("Allow", "POST");
        }
        e.status = res.status;
        if (res.status == 404)
          e.message =
              fmt::format("{} {}: no such endpoint (GET /v1 lists them)", req.method, req.path);
        else if (res.status == 413)
          e.message = fmt::format("body: exceeds the limit of {} bytes (--max-body-mb)",
                                  opts_.max_body_bytes);
        else if (res.status == 405)
          e.message = fmt::format("{} {}: method not allowed (use POST)", req.method, req.path);
        else if (res.status == 400)
          e.message = fmt::format(
              "{} {}: the request could not be read (malformed headers, or a body sent "
              "without Content-Length or chunked encoding)",
              req.method, req.path);
        else
          e.message = fmt::format("HTTP {}", res.status);
        res.set_content(ErrorBody(e, ShapeForPath(req.path)), "application/json");
        metrics_.CountRequest(req.path.rfind("/v1/", 0) == 0 ? req.path : "other", res.status);
        return httplib::Server::HandlerResponse::Handled;
      }));

  h.set_exception_handler(
      [this](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
        ApiError e;
        e.status = 500;
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& x) {
          e.message = fmt::format("internal error: {}", x.what());
        } catch (...) {
          e.message = "internal error";
        }
        res.set_content(ErrorBody(e, ShapeForPath(req.path)), "application/json");
        res.status = 500;
      });

  h.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (stopping_) {
      res.status = 503;
      res.set_content(R"({"status":"shutting_down"})", "application/json");
      return;
    }
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  h.Get("/v1", [](const httplib::Request&, httplib::Response& res) {
    ojson list = ojson::array();
    for (const auto& e : kEndpoints)
      list.push_back({{"method", e[0]}, {"path", e[1]}, {"description", e[2]}});
    res.set_content(DumpJson({{"object", "list"}, {"data", list}}), "application/json");
  });
  auto model_obj = [this] {
    return ojson{{"id", opts_.model_name},
                 {"object", "model"},
                 {"created", created_unix_},
                 {"owned_by", "lumen"},
                 {"type", "model"},
                 {"display_name", opts_.model_name},
                 {"created_at", Rfc3339Utc(created_unix_)}};
  };
  h.Get("/v1/models", [this, model_obj](const httplib::Request&, httplib::Response& res) {
    res.set_content(DumpJson({{"object", "list"},
                              {"data", ojson::array({model_obj()})},
                              {"has_more", false},
                              {"first_id", opts_.model_name},
                              {"last_id", opts_.model_name}}),
                    "application/json");
    metrics_.CountRequest("/v1/models", 200);
  });
  h.Get(R"(/v1/models/(.+))",
        [this, model_obj](const httplib::Request& req, httplib::Response& res) -> void {
          if (req.matches[1] != opts_.model_name) {
            ApiError e;
            e.status = 404;
            e.param = "model";
            e.message = fmt::format("model: '{}' is not served here (this server has '{}')",
                                    std::string(req.matches[1]), opts_.model_name);
            SendError(res, e, ErrorShape::kOpenAI, "/v1/models");
            return;
          }
          res.set_content(DumpJson(model_obj()), "application/json");
        });
  h.Get("/stats", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(StatsJson(), "application/json");
  });
  h.Get("/fit", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(DumpJson(engine::FitReportJson(opts_.fit)), "application/json");
  });
  h.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    const engine::SchedulerStats s = engine_.scheduler().stats();
    Metrics::Gauges g;
    g.queue_depth = s.queue_depth;
    g.active_slots = s.active_slots;
    g.parallel = engine_.scheduler().options().parallel;
    g.kv_bytes = double(s.kv_bytes_active);
    g.prompt_cache_bytes = double(s.cache_bytes);
    g.response_store_bytes = double(store_.bytes());
    g.cache_hits = double(s.cache_hits);
    g.cache_misses = double(s.cache_misses);
    g.cached_tokens = double(s.cached_tokens);
    g.uptime_seconds = std::chrono::duration<double>(Clock::now() - started_).count();
    res.set_content(metrics_.RenderPrometheus(g), "text/plain; version=0.0.4");
  });
  if (engine_.adapters()) {
    AdapterRoutes ar;
    ar.registry = engine_.adapters();
    ar.bind_host = opts_.host;
    ar.send_error = [this](httplib::Response& res, const ApiError& e, const std::string& ep) {
      SendError(res, e, ErrorShape::kOpenAI, ep);
    };
    ar.count = [this](const std::string& ep, int status) { metrics_.CountRequest(ep, status); };
    RegisterAdapterRoutes(h, std::move(ar));
  }
  WebUiContext ui;
  ui.model = &engine_.model();
  ui.scheduler = &engine_.scheduler();
  ui.stopping = &stopping_;
  ui.jobs = jobs_.get();
  ui.bind_host = opts_.host;
  ui.model_name = opts_.model_name;
  ui.opts = opts_.ui;
  RegisterWebUi(h, ui);
  h.Post(kEmbeddingsPath, [this](const httplib::Request& req, httplib::Response& res) {
    HandleEmbeddings(req, res);
  });
  for (Api api : kGenerateApis) {
    h.Post(EndpointName(api), [this, api](const httplib::Request& req, httplib::Response& res) {
      HandleGenerate(api, req, res);
    });
  }
}

void Server::HandleGenerate(Api api, const httplib::Request& req, httplib::Response& res) {
  const auto t0 = Clock::now();
  const ErrorShape shape = api == Api::kMessages ? ErrorShape::kAnthropic : ErrorShape::kOpenAI;
  const std::string endpoint = EndpointName(api);
  if (stopping_) {
    ApiError e;
    e.status = 503;
    e.message = "the server is shutting down";
    return SendError(res, e, shape, endpoint);
  }
  ojson body;
  ApiError err;
  if (!ParseBody(req.body, opts_.max_body_bytes, &body, &err))
    return SendError(res, err, shape, endpoint);
  Result<GenRequest> parsed = Error("unreachable");
  switch (api) {
    case Api::kChat:
      parsed = ParseChatCompletions(body);
      break;
    case Api::kCompletions:
      parsed = ParseCompletions(body);
      break;
    case Api::kMessages:
      parsed = ParseMessages(body);
      break;
    case Api::kResponses:
      parsed = ParseResponses(body);
      break;
  }
  if (!parsed.ok()) return SendError(res, FromStatus(parsed.status()), shape, endpoint);
  GenRequest& r = *parsed;

  // Responses: the stored conversation goes before this input; instructions
  // apply to this response only (they are not stored).
  ojson conversation = ojson::array();
  if (api == Api::kResponses) {
    const bool has_instructions = body.contains("instructions") && body["instructions"].is_string();
    ojson input = ojson::array();
    for (size_t i = has_instructions ? 1 : 0; i < r.messages.size(); ++i)
      input.push_back(r.messages[i]);
    if (!r.previous_response_id.empty()) {
      auto prev = store_.Get(r.previous_response_id);
      if (!prev) {
        ApiError e;
        e.status = 404;
        e.param = "previous_response_id";
        e.message = fmt::format(
            "previous_response_id: no stored response '{}' (expired, evicted "
            "or never stored)",
            r.previous_response_id);
        return SendError(res, e, shape, endpoint);
      }
      conversation = *prev;
    }
    for (auto& m : input) {
      if (!m.contains(kItemReferenceKey)) {
        conversation.push_back(std::move(m));
        continue;
      }
      // An item_reference: one of lumen's own stored output items. A call
      // joins the assistant turn before it, as in the stored conversation.
      const std::string id = m[kItemReferenceKey].get<std::string>();
      auto item = store_.GetItem(id);
      if (!item) {
        ApiError e;
        e.status = 404;
        e.param = m["at"].get<std::string>();
        e.message = fmt::format(
            "{}: no stored output item '{}' (expired, evicted, never stored, or not an id "
            "this server gave)",
            e.param, id);
        return SendError(res, e, shape, endpoint);
      }
      if (!item->contains("tool_call")) {
        conversation.push_back(std::move(*item));
      } else if (!conversation.empty() && conversation.back()["role"] == "assistant") {
        ojson& turn = conversation.back();
        if (!turn.contains("tool_calls")) turn["tool_calls"] = ojson::array();
        turn["tool_calls"].push_back((*item)["tool_call"]);
      } else {
        conversation.push_back({{"role", "assistant"},
                                {"content", ""},
                                {"tool_calls", ojson::array({(*item)["tool_call"]})}});
      }
    }
    ojson msgs = ojson::array();
    if (has_instructions) msgs.push_back(r.messages[0]);
    for (const auto& m : conversation) msgs.push_back(m);
    r.messages = std::move(msgs);
  }

  Result<Prepared> prep = engine_.Prepare(r);
  if (!prep.ok()) return SendError(res, FromStatus(prep.status()), shape, endpoint);
  if (auto refused =
          AdmitContext(api, prep->prompt_field, int64_t(prep->prompt.size()), &prep->max_tokens,
                       engine_.scheduler().ctx(), opts_.clamp_max_tokens)) {
    ++refused_context_;
    return SendError(res, *refused, shape, endpoint);
  }

  // n choices run as n jobs: more than the slots and the queue hold can never
  // be admitted, so that is the request's error (400), not a busy server (429).
  const engine::SchedulerOptions& so = engine_.scheduler().options();
  if (r.n > so.parallel + so.queue) {
    ApiError e;
    e.param = "n";
    e.message = fmt::format(
        "n: {} choices can never run here: the server has {} slots and a queue of {} "
        "(--parallel, --queue), so at most {} choices per request",
        r.n, so.parallel, so.queue, so.parallel + so.queue);
    return SendError(res, e, shape, endpoint);
  }
  engine::Scheduler::SubmitError serr;
  std::shared_ptr<RunState> run = engine_.Start(r, *prep, &serr);
  if (!run) {
    ApiError e;
    if (serr == engine::Scheduler::SubmitError::kQueueFull) {
      e.status = api == Api::kMessages ? 529 : 429;
      e.message =
          "the server is busy: every slot is in use and the queue is full (--queue); retry later";
      e.retry_after = 1;
    } else {
      e.status = 503;
      e.message = "the server is shutting down";
    }
    return SendError(res, e, shape, endpoint);
  }

  ExchangeInfo info;
  const char* prefix = api == Api::kChat          ? "chatcmpl-"
                       : api == Api::kCompletions ? "cmpl-"
                       : api == Api::kMessages    ? "msg_"
                                                  : "resp_";
  info.id = NewId(prefix);
  info.created = std::chrono::duration_cast<std::chrono::seconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count();
  info.model = opts_.model_name;
  info.tok = &engine_.model().tokenizer();
  info.previous_response_id = r.previous_response_id;
  const bool store = api == Api::kResponses && r.store;
  info.req = std::move(r);
  info.prep = std::move(*prep);
  std::shared_ptr<ProtocolWriter> writer;
  switch (api) {
    case Api::kChat:
      writer = MakeChatWriter(std::move(info));
      break;
    case Api::kCompletions:
      writer = MakeCompletionWriter(std::move(info));
      break;
    case Api::kMessages:
      writer = MakeMessagesWriter(std::move(info));
      break;
    case Api::kResponses:
      writer = MakeResponsesWriter(std::move(info));
      break;
  }

  // Timing and bookkeeping shared by both paths.
  struct Track {
    Clock::time_point t0, last;
    bool first = true;
  };
  auto track = std::make_shared<Track>();
  track->t0 = t0;
  auto observe = [this, track](const ChoiceEvent& e) {
    if (e.ev.kind != engine::JobEvent::kToken || e.index != 0) return;
    const auto now = Clock::now();
    if (track->first)
      metrics_.ObserveTtft(std::chrono::duration<double>(now - track->t0).count());
    else
      metrics_.ObserveInterToken(std::chrono::duration<double>(now - track->last).count());
    track->first = false;
    track->last = now;
  };
  auto finish = [this, writer, store, conversation]() {
    int64_t completion = 0;
    for (const auto& c : writer->choices()) completion += c.completion_tokens;
    const auto& cs = writer->choices();
    metrics_.AddTokens(cs.empty() ? 0 : cs[0].prompt_tokens, completion);
    if (store && !cs.empty() && writer->error().empty()) {
      ojson conv = conversation;
      conv.push_back(ReplyAsMessage(cs[0]));
      store_.Put(writer->info().id, std::move(conv));
    }
  };

  if (!writer->info().req.stream) {
    // A client that hangs up (an SDK's timeout) frees its slots as a stream's
    // does: its socket is asked between events, at most every 200 ms.
    const PeerSocket peer(req.remote_addr, req.remote_port, req.local_port);
    auto asked = Clock::now();
    ChoiceEvent e;
    while (!run->finished()) {
      if (run->Pop(&e, std::chrono::milliseconds(200))) {
        observe(e);
        writer->Feed(e);
      }
      if (Clock::now() - asked < std::chrono::milliseconds(200)) continue;
      asked = Clock::now();
      if (peer.Closed()) {
        run->Cancel();
        metrics_.CountRequest(endpoint, 499);  // nginx's "client closed request"
        return;
      }
    }
    if (!writer->error().empty()) {
      ApiError x;
      x.status = 500;
      x.message = writer->error();
      return SendError(res, x, shape, endpoint);
    }
    finish();
    res.set_content(DumpJson(writer->Body()), "application/json");
    metrics_.CountRequest(endpoint, 200);
    return;
  }

  metrics_.CountRequest(endpoint, 200);
  ++open_streams_;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  auto started = std::make_shared<bool>(false);
  res.set_chunked_content_provider(
      "text/event-stream",
      [writer, run, started, observe, finish](size_t, httplib::DataSink& sink) {
        auto send = [&](const std::string& s) {
          return s.empty() || sink.write(s.data(), s.size());
        };
        if (!*started) {
          *started = true;
          if (!send(writer->StreamStart())) {
            run->Cancel();
            return false;
          }
          return true;
        }
        ChoiceEvent e;
        std::string out;
        if (run->Pop(&e, std::chrono::milliseconds(100))) {
          observe(e);
          out = writer->Feed(e);
          // Drain what is already queued into one write.
          while (run->Pop(&e, std::chrono::milliseconds(0))) {
            observe(e);
            out += writer->Feed(e);
          }
        } else if (!sink.is_writable()) {
          run->Cancel();
          return false;
        }
        const bool done = run->finished();
        if (done) out += writer->StreamEnd();
        if (!send(out)) {
          run->Cancel();  // the client went away: free its slot
          return false;
        }
        if (done) {
          finish();
          sink.done();
        }
        return true;
      },
      [this, run](bool) {
        run->Cancel();  // no-op when finished
        --open_streams_;
      });
}

void Server::HandleEmbeddings(const httplib::Request& req, httplib::Response& res) {
  const std::string endpoint = "/v1/embeddings";
  ApiError err;
  if (stopping_) {
    err.status = 503;
    err.message = "the server is shutting down";
    return SendError(res, err, ErrorShape::kOpenAI, endpoint);
  }
  ojson body, out;
  if (!ParseBody(req.body, opts_.max_body_bytes, &body, &err) ||
      !embeddings_->Handle(body, &out, &err)) {
    if (err.code == kContextLengthExceeded) ++refused_context_;
    return SendError(res, err, ErrorShape::kOpenAI, endpoint);
  }
  metrics_.AddTokens(out["usage"]["prompt_tokens"].get<int64_t>(), 0);
  res.set_content(DumpJson(out), "application/json");
  metrics_.CountRequest(endpoint, 200);
}

Result<int> Server::Bind() {
  int port = opts_.port;
  if (port == 0) {
    port = http_->bind_to_any_port(opts_.host);
    if (port < 0) return Errorf("--host {}: cannot bind any port", opts_.host);
  } else if (!http_->bind_to_port(opts_.host, port)) {
    return Errorf("--host {} --port {}: cannot bind (in use, or no permission)", opts_.host, port);
  }
  return port;
}

Status Server::Run() {
  if (!http_->listen_after_bind() && !stopping_)
    return Error("the HTTP listener stopped unexpectedly");
  return Status::Ok();
}

void Server::Stop() {
  if (stopping_.exchange(true)) return;
  engine_.scheduler().Shutdown(/*cancel=*/true);
  // Streams end with their protocol's final events once their jobs report.
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (open_streams_ > 0 && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  jobs_->Shutdown();
  http_->stop();
}

}  // namespace lumen::serve
