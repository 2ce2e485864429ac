// WebUi: the browser app that `lumen serve` serves at / (docs/reference/web.md)
// and the small endpoints its pages need beyond the OpenAI / Anthropic ones
// (docs/reference/server-api.md, "Web app endpoints"):
//   GET  /, /ui/app.js, /ui/app.css       the bundle built from web/ and embedded
//                                         at build time (or a page saying it was not)
//   GET  /lumen/info                      model, architecture, memory, context, slots
//   POST /lumen/curve                     a control-point curve evaluated at given
//                                         input probabilities by sample::Pchip
//   GET  /lumen/runs                      training runs under --runs DIR
//   GET  /lumen/runs/{name}/events        a run's metrics.jsonl as server-sent
//                                         events, followed while it grows
//   POST /lumen/runs                      start `lumen train` into --runs DIR/<name>
//                                         (train_jobs.h)
//   DELETE /lumen/runs/{name}             cancel it (SIGINT: checkpoint, exit 0)
// The static assets are public (a browser cannot attach a bearer token to a
// page load); every /lumen/ endpoint goes through the server's API-key gate.
// Run names are single path components confined to --runs (no '/', no '..',
// no symlink leaving the directory). POST / DELETE are refused cross-origin
// (CheckSameOrigin in train_jobs.h).
#pragma once

#include <atomic>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "lumen/core/status.h"
#include "lumen/engine/model.h"
#include "lumen/engine/scheduler.h"
#include "lumen/serve/train_jobs.h"

namespace httplib {
class Server;
}  // namespace httplib

namespace lumen::serve {

struct WebUiOptions {
  bool enabled = true;                        // --no-ui: false (/ and /ui/* answer 404)
  std::string runs_dir;                       // --runs DIR; empty: no runs listed
  std::string train_data_dir;                 // --train-data DIR; empty: runs cannot be started
  std::vector<std::string> train_model_args;  // the served model, for `lumen train`
  std::string act_route = "exact";            // --act-route (reported by /lumen/info)
  std::string adapter_dir;                    // --adapter (reported by /lumen/info)
};

// What the routes read; every pointer outlives the httplib::Server.
struct WebUiContext {
  const engine::Model* model = nullptr;
  const engine::Scheduler* scheduler = nullptr;
  const std::atomic<bool>* stopping = nullptr;  // ends event streams on shutdown
  TrainJobs* jobs = nullptr;                    // runs started from the page
  std::string bind_host;                        // --host (CheckSameOrigin)
  std::string model_name;
  WebUiOptions opts;
};

// One embedded file of the bundle.
struct WebAsset {
  std::string_view path;  // "/", "/ui/app.js", ...
  std::string_view content_type;
  std::string_view bytes;
};

// The embedded bundle; empty when the build had no node / web/node_modules.
std::span<const WebAsset> WebAssets();

// A hash of the embedded bundle (the ETag of its files); empty when not built.
std::string_view WebBundleHash();

// True for the paths of the static bundle (served without the API key).
bool IsWebUiPublicPath(std::string_view path);

void RegisterWebUi(httplib::Server& h, const WebUiContext& ctx);

// POST /lumen/curve: {"curve": {points, allow_nonmonotone}, "x": [pct, ...]}
// -> {"y": [pct, ...], "tangents": [...], "knots": [[X, Y], ...]} with y =
// 100 * exp(C(ln(x / 100))), the curve the sampler applies before it
// normalizes. Errors name the field ("curve.points[2]: ...", "x[3]: ...").
Result<nlohmann::ordered_json> EvalCurveRequest(const nlohmann::json& body);

// A run name from a URL: one path component of [A-Za-z0-9._-], not "." / "..".
bool IsValidRunName(std::string_view name);

}  // namespace lumen::serve
