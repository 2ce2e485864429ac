// Server: the HTTP front of `lumen serve` (cpp-httplib). Routes
//   GET  /health, /v1, /v1/models, /v1/models/{id}, /stats, /metrics, /fit
//   POST /v1/chat/completions, /v1/completions, /v1/messages, /v1/responses,
//        /v1/embeddings (embeddings.h)
//   GET/POST /v1/adapters, DELETE /v1/adapters/{id} (adapters_api.h; when the
//   EngineBridge has an AdapterRegistry)
// Generation requests pass admission (admission.h): prompt + max_tokens must
// fit the context.
// Every POST body passes the same gate (size, UTF-8, JSON, API key) and its
// protocol parser, then EngineBridge; errors come back as 4xx in the error
// shape of the endpoint's protocol (api_error.h). docs/reference/server-api.md
// is the user-facing description.
//
// Shutdown: Stop() refuses new requests (503), cancels running jobs so their
// streams end properly, waits for streams to close, sends SIGINT to training
// runs started from the web app and waits for them, then stops listening.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "lumen/engine/fit.h"
#include "lumen/serve/api_error.h"
#include "lumen/serve/embeddings.h"
#include "lumen/serve/engine_bridge.h"
#include "lumen/serve/metrics.h"
#include "lumen/serve/response_store.h"
#include "lumen/serve/web_ui.h"

namespace httplib {
class Server;
class Request;
class Response;
}  // namespace httplib

namespace lumen::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;          // 0: any free port
  std::string api_key;      // empty: no auth
  std::string cors_origin;  // empty: no CORS headers
  size_t max_body_bytes = size_t(16) << 20;
  std::string model_name;  // reported in responses and /v1/models
  ResponseStoreLimits store;
  int http_threads = 0;  // 0: parallel + queue + 8
  WebUiOptions ui;       // the web app at / and its /lumen/ endpoints (web_ui.h)
  // The memory check the server started with (cli/serve.cc): GET /fit and
  // /stats "admission" report it.
  engine::FitReport fit;
  bool clamp_max_tokens = false;  // llama-server's rule instead of the 400 (admission.h)
  model::Pooling pooling = model::Pooling::kNone;  // --pooling: overrides the model's
};

class Server {
 public:
  Server(EngineBridge& engine, ServerOptions opts);
  ~Server();

  // Binds; returns the port actually bound.
  Result<int> Bind();
  // Serves until Stop(); returns after the listener has closed.
  Status Run();
  // Graceful: see the file comment. Safe to call from any thread, repeatedly.
  void Stop();

 private:
  void Routes();
  void HandleGenerate(Api api, const httplib::Request& req, httplib::Response& res);
  void HandleEmbeddings(const httplib::Request& req, httplib::Response& res);
  void SendError(httplib::Response& res, const ApiError& e, ErrorShape shape,
                 const std::string& endpoint);
  std::string NewId(const char* prefix);
  std::string StatsJson() const;

  EngineBridge& engine_;
  ServerOptions opts_;
  std::unique_ptr<httplib::Server> http_;
  Metrics metrics_;
  ResponseStore store_;
  std::unique_ptr<TrainJobs> jobs_;  // runs started from the web app
  std::unique_ptr<EmbeddingService> embeddings_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> open_streams_{0};
  std::atomic<uint64_t> next_id_{1};
  std::atomic<uint64_t> refused_context_{0};  // 400 context_length_exceeded
  uint64_t id_salt_ = 0;
  std::chrono::steady_clock::time_point started_;
  int64_t created_unix_ = 0;
};

}  // namespace lumen::serve
