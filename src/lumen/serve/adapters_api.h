// The adapter endpoints of `lumen serve` (docs/reference/server-api.md,
// "Adapters"), over the engine's AdapterRegistry:
//   GET    /v1/adapters        the mounted adapters: id, path, rank, alpha,
//                              scale, targets, layers, base_model
//   POST   /v1/adapters        {id, path, replace?}: load and mount (400 with
//                              the reason on a bad adapter, the registry
//                              unchanged; 409 for a mounted id unless
//                              replace is true, which swaps it in atomically)
//   DELETE /v1/adapters/{id}   unmount (404 for an unknown id)
// Requests already running keep the adapters they started with (the registry
// hands out shared_ptrs); requests after a change see it. POST and DELETE
// read server-side paths and change state, so a browser may send them only
// from the server's own origin (CheckSameOrigin, train_jobs.h), and the API
// key gate applies as for every /v1/ route.
#pragma once

#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "lumen/engine/adapter_registry.h"
#include "lumen/serve/api_error.h"

namespace httplib {
class Server;
class Response;
}  // namespace httplib

namespace lumen::serve {

// The JSON object of one mounted adapter ("object": "adapter").
nlohmann::ordered_json AdapterJson(const engine::MountedAdapter& a);

struct AdapterRoutes {
  engine::AdapterRegistry* registry = nullptr;
  std::string bind_host;  // for CheckSameOrigin
  // Sends an error response in the OpenAI shape and counts it.
  std::function<void(httplib::Response&, const ApiError&, const std::string& endpoint)> send_error;
  // Counts a successful request.
  std::function<void(const std::string& endpoint, int status)> count;
};

void RegisterAdapterRoutes(httplib::Server& h, AdapterRoutes routes);

}  // namespace lumen::serve
