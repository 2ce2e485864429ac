#include "lumen/serve/web_ui.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

#include <fmt/format.h>

#include "lumen/model/config.h"
#include "lumen/sample/config.h"
#include "lumen/sample/curve.h"
#include "lumen/serve/api_error.h"
#include "lumen/serve/body.h"
#include "lumen/serve/httplib_include.h"

namespace lumen::serve {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

constexpr size_t kMaxCurveInputs = 4096;
constexpr size_t kMaxEventLine = size_t(1) << 20;  // longer metrics lines are skipped

std::string Dump(const ojson& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void SendJsonError(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  if (e.retry_after > 0) res.set_header("Retry-After", std::to_string(e.retry_after));
  res.set_content(ErrorBody(e, ErrorShape::kOpenAI), "application/json");
}

constexpr std::string_view kNotBuiltPage = R"(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>lumen</title></head>
<body style="font-family: sans-serif; max-width: 40em; margin: 3em auto">
<h1>lumen: the web app was not built</h1>
<p>This <code>lumen</code> binary was configured without node or without
<code>web/node_modules</code>, so the browser app is not embedded. The HTTP API works
as usual (<a href="/v1">/v1</a> lists the endpoints).</p>
<p>To build it: run <code>bash scripts/setup.sh</code> (installs node and runs
<code>npm ci --prefix web</code>), then configure and build again.</p>
</body></html>
)";

// VmRSS of this process in bytes (0 when /proc is not readable).
int64_t RssBytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;
  }
  return 0;
}

ojson InfoJson(const WebUiContext& ctx) {
  const engine::Model& m = *ctx.model;
  const model::ModelConfig& c = m.config();
  const engine::SchedulerOptions& so = ctx.scheduler->options();
  const engine::SchedulerStats s = ctx.scheduler->stats();
  const int64_t ctx_len = ctx.scheduler->ctx();
  // K and V, every layer, the whole context of one slot.
  const int64_t kv_row =
      static_cast<int64_t>(RowBytes(so.session.kv_dtype, c.kv_dim()).value_or(0));
  const int64_t kv_per_slot = 2 * int64_t(c.n_layers) * ctx_len * kv_row;
  return ojson{
      {"model", ctx.model_name},
      {"format", m.format()},
      {"architecture",
       {{"family", std::string(model::FamilyName(c.family))},
        {"layers", c.n_layers},
        {"dim", c.dim},
        {"heads", c.n_heads},
        {"kv_heads", c.n_kv_heads},
        {"head_dim", c.head_dim},
        {"ffn_dim", c.ffn_dim},
        {"vocab_size", c.vocab_size},
        {"max_ctx", c.max_ctx},
        {"tied_embeddings", c.tied_embeddings}}},
      {"parameters", m.parameter_count()},
      {"adapter", m.adapter() != nullptr},
      {"memory",
       {{"weight_bytes", m.weight_bytes()},
        {"kv_bytes_per_slot", kv_per_slot},
        {"kv_bytes_active", s.kv_bytes_active},
        {"prompt_cache_bytes", s.cache_bytes},
        {"rss_bytes", RssBytes()}}},
      {"kv_type", std::string(Name(so.session.kv_dtype))},
      {"act_route", ctx.opts.act_route},
      {"adapter_dir", ctx.opts.adapter_dir.empty() ? ojson(nullptr) : ojson(ctx.opts.adapter_dir)},
      {"context", ctx_len},
      {"parallel", so.parallel},
      {"queue_limit", so.queue},
      {"active_slots", s.active_slots},
      {"queue_depth", s.queue_depth},
      {"runs_dir", ctx.opts.runs_dir.empty() ? ojson(nullptr) : ojson(ctx.opts.runs_dir)},
      {"train_data_dir",
       ctx.opts.train_data_dir.empty() ? ojson(nullptr) : ojson(ctx.opts.train_data_dir)},
  };
}

// Directories under --train-data (3 levels deep, at most 200) that hold a
// train.jsonl, relative to it: what the page offers as `data`.
ojson TrainDataDirs(const std::string& root_dir) {
  ojson list = ojson::array();
  std::error_code ec;
  const fs::path root = fs::canonical(root_dir, ec);
  if (ec) return list;
  std::vector<std::string> found;
  fs::recursive_directory_iterator it(root, fs::directory_options::skip_permission_denied, ec), end;
  for (; !ec && it != end && found.size() < 200; it.increment(ec)) {
    if (it.depth() >= 3) it.disable_recursion_pending();
    if (it->is_directory(ec) && fs::is_regular_file(it->path() / "train.jsonl", ec))
      found.push_back(it->path().lexically_relative(root).string());
  }
  if (fs::is_regular_file(root / "train.jsonl", ec)) found.push_back(".");
  std::sort(found.begin(), found.end());
  for (auto& f : found) list.push_back(f);
  return list;
}

// The run directory for `name`, confined to runs_dir; empty on any violation.
fs::path RunPath(const std::string& runs_dir, const std::string& name) {
  if (runs_dir.empty() || !IsValidRunName(name)) return {};
  std::error_code ec;
  const fs::path root = fs::canonical(runs_dir, ec);
  if (ec) return {};
  const fs::path dir = fs::canonical(root / name, ec);
  if (ec || dir.parent_path() != root || !fs::is_directory(dir, ec)) return {};
  if (!fs::is_regular_file(dir / "metrics.jsonl", ec)) return {};
  return dir;
}

ojson RunSummary(const fs::path& dir) {
  ojson run = {{"name", dir.filename().string()}};
  std::error_code ec;
  const fs::path metrics = dir / "metrics.jsonl";
  const auto mtime = fs::last_write_time(metrics, ec);
  double age_s = 1e9;
  if (!ec) {
    const auto now = fs::file_time_type::clock::now();
    age_s = std::chrono::duration<double>(now - mtime).count();
  }
  run["bytes"] = ec ? 0 : fs::file_size(metrics, ec);
  run["seconds_since_update"] = age_s;
  int64_t reports = 0;
  ojson last = nullptr;
  std::ifstream f(metrics);
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty() || line.size() > kMaxEventLine) continue;
    ojson j = ojson::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) continue;
    if (j.value("kind", "") == "train") {
      ++reports;
      last = std::move(j);
    }
  }
  run["reports"] = reports;
  run["last"] = last;
  std::ifstream cf(dir / "config.json");
  if (cf) {
    ojson cfg = ojson::parse(cf, nullptr, /*allow_exceptions=*/false);
    if (cfg.is_object()) {
      for (const char* k : {"method", "iters", "lr", "batch_size", "data"})
        if (cfg.contains(k)) run[k] = cfg[k];
    }
  }
  return run;
}

ojson RunsJson(const WebUiContext& ctx) {
  const std::string& runs_dir = ctx.opts.runs_dir;
  ojson list = ojson::array();
  std::error_code ec;
  if (!runs_dir.empty()) {
    std::vector<fs::path> dirs;
    for (const auto& e : fs::directory_iterator(runs_dir, ec)) {
      const std::string name = e.path().filename().string();
      if (!RunPath(runs_dir, name).empty()) dirs.push_back(e.path());
    }
    std::sort(dirs.begin(), dirs.end());
    const fs::path adapter =
        ctx.opts.adapter_dir.empty() ? fs::path() : fs::canonical(ctx.opts.adapter_dir, ec);
    for (const auto& d : dirs) {
      ojson run = RunSummary(d);
      run["served"] = !adapter.empty() && fs::canonical(d, ec) == adapter;
      run["job"] = ctx.jobs ? ctx.jobs->Find(run["name"].get<std::string>()) : ojson(nullptr);
      list.push_back(std::move(run));
    }
  }
  return ojson{
      {"object", "list"},
      {"runs_dir", runs_dir.empty() ? ojson(nullptr) : ojson(runs_dir)},
      {"data", list},
      {"jobs", ctx.jobs ? ctx.jobs->List() : ojson::array()},
      {"train_data_dir",
       ctx.opts.train_data_dir.empty() ? ojson(nullptr) : ojson(ctx.opts.train_data_dir)},
      {"train_data",
       ctx.opts.train_data_dir.empty() ? ojson::array() : TrainDataDirs(ctx.opts.train_data_dir)}};
}

// Follows a metrics.jsonl: every complete line that is a JSON object becomes
// one `data:` event; a `: keepalive` comment every 10 s of silence.
struct RunFollower {
  fs::path file;
  std::streamoff offset = 0;
  std::string partial;
  std::chrono::steady_clock::time_point last_write = std::chrono::steady_clock::now();

  std::string Poll() {
    std::ifstream f(file, std::ios::binary);
    if (!f) return {};
    f.seekg(0, std::ios::end);
    const std::streamoff end = f.tellg();
    if (end < offset) offset = 0, partial.clear();  // truncated: start over
    if (end == offset) return {};
    f.seekg(offset);
    std::string chunk(static_cast<size_t>(end - offset), '\0');
    f.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    chunk.resize(static_cast<size_t>(f.gcount()));
    offset += static_cast<std::streamoff>(chunk.size());
    partial += chunk;
    std::string out;
    size_t start = 0;
    for (size_t nl; (nl = partial.find('\n', start)) != std::string::npos; start = nl + 1) {
      const std::string_view line(partial.data() + start, nl - start);
      if (line.empty() || line.size() > kMaxEventLine) continue;
      const ojson j = ojson::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_object()) out += "data: " + Dump(j) + "\n\n";
    }
    partial.erase(0, start);
    if (partial.size() > kMaxEventLine) partial.clear();
    return out;
  }
};

}  // namespace

bool IsValidRunName(std::string_view name) {
  if (name.empty() || name.size() > 200 || name == "." || name == "..") return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

bool IsWebUiPublicPath(std::string_view path) {
  return path == "/" || path == "/index.html" || path.rfind("/ui/", 0) == 0;
}

Result<ojson> EvalCurveRequest(const nlohmann::json& body) {
  if (!body.is_object()) return Error("body: must be a JSON object with curve and x");
  if (!body.contains("curve")) return Error("curve: missing");
  LUMEN_ASSIGN_OR_RETURN(sample::CurveConfig curve, sample::ParseCurveJson(body["curve"]));
  const nlohmann::json* xs = body.contains("x") ? &body["x"] : nullptr;
  if (xs == nullptr || !xs->is_array())
    return Error("x: must be an array of input probabilities in percent");
  if (xs->size() > kMaxCurveInputs)
    return Errorf("x: at most {} values, got {}", kMaxCurveInputs, xs->size());
  const sample::Pchip pchip(curve);
  ojson y = ojson::array();
  for (size_t i = 0; i < xs->size(); ++i) {
    const auto& v = (*xs)[i];
    const double x = v.is_number() ? v.get<double>() : std::nan("");
    if (!(x > 0 && x <= 100))
      return Errorf("x[{}]: must be a number in (0, 100], got {}", i, v.dump());
    y.push_back(100.0 * std::exp(pchip.Eval(std::log(x / 100.0))));
  }
  ojson knots = ojson::array();
  const auto kx = pchip.knots_x();
  const auto ky = pchip.knots_y();
  for (size_t k = 0; k < kx.size(); ++k) knots.push_back({kx[k], ky[k]});
  ojson tangents = ojson::array();
  for (double m : pchip.tangents()) tangents.push_back(m);
  return ojson{{"y", y}, {"knots", knots}, {"tangents", tangents}};
}

void RegisterWebUi(httplib::Server& h, const WebUiContext& ctx_in) {
  auto ctx = std::make_shared<const WebUiContext>(ctx_in);
  if (ctx->opts.enabled) {
    const auto assets = WebAssets();
    if (assets.empty()) {
      h.Get("/", [](const httplib::Request&, httplib::Response& res) {
        res.set_content(std::string(kNotBuiltPage), "text/html; charset=utf-8");
      });
    }
    for (const WebAsset& a : assets) {
      auto handler = [a](const httplib::Request&, httplib::Response& res) {
        res.set_content(a.bytes.data(), a.bytes.size(), std::string(a.content_type).c_str());
        res.set_header("Cache-Control", "no-cache");
        res.set_header("ETag", fmt::format("\"{}\"", WebBundleHash()));
        res.set_header("X-Content-Type-Options", "nosniff");
        // Scripts, styles, images and fetches from this server only.
        res.set_header("Content-Security-Policy",
                       "default-src 'self'; img-src 'self' data:; style-src 'self' "
                       "'unsafe-inline'; frame-ancestors 'none'");
      };
      h.Get(std::string(a.path), handler);
      if (a.path == "/") h.Get("/index.html", handler);
    }
  }

  h.Get("/lumen/info", [ctx](const httplib::Request&, httplib::Response& res) {
    res.set_content(Dump(InfoJson(*ctx)), "application/json");
  });

  h.Post("/lumen/curve", [ctx](const httplib::Request& req, httplib::Response& res) {
    nlohmann::ordered_json body;
    ApiError err;
    if (!ParseBody(req.body, size_t(1) << 20, &body, &err)) return SendJsonError(res, err);
    auto r = EvalCurveRequest(body);
    if (!r.ok()) return SendJsonError(res, FromStatus(r.status()));
    res.set_content(Dump(*r), "application/json");
  });

  h.Get("/lumen/runs", [ctx](const httplib::Request&, httplib::Response& res) {
    res.set_content(Dump(RunsJson(*ctx)), "application/json");
  });

  // Starting and cancelling runs change state: same origin only.
  auto same_origin = [ctx](const httplib::Request& req, ApiError* err) {
    return CheckSameOrigin(req.method, req.get_header_value("Origin"), req.get_header_value("Host"),
                           req.get_header_value("Sec-Fetch-Site"),
                           req.get_header_value("Content-Type"), ctx->bind_host, err);
  };
  h.Post("/lumen/runs", [ctx, same_origin](const httplib::Request& req, httplib::Response& res) {
    ApiError err;
    if (!same_origin(req, &err)) return SendJsonError(res, err);
    nlohmann::ordered_json body;
    if (!ParseBody(req.body, size_t(1) << 16, &body, &err)) return SendJsonError(res, err);
    if (ctx->jobs == nullptr) {
      err.status = 403;
      err.message = "starting runs is not available on this server";
      return SendJsonError(res, err);
    }
    ojson job;
    if (!ctx->jobs->Start(body, &job, &err)) return SendJsonError(res, err);
    res.status = 201;
    res.set_content(Dump(job), "application/json");
  });
  h.Delete(R"(/lumen/runs/([^/]+))",
           [ctx, same_origin](const httplib::Request& req, httplib::Response& res) {
             ApiError err;
             if (!same_origin(req, &err)) return SendJsonError(res, err);
             ojson job;
             if (ctx->jobs == nullptr || !ctx->jobs->Cancel(req.matches[1], &job, &err)) {
               if (ctx->jobs == nullptr) {
                 err.status = 404;
                 err.param = "name";
                 err.message = "name: no run was started by this server";
               }
               return SendJsonError(res, err);
             }
             res.status = 202;
             res.set_content(Dump(job), "application/json");
           });

  h.Get(
      R"(/lumen/runs/([^/]+)/events)", [ctx](const httplib::Request& req, httplib::Response& res) {
        const std::string name = req.matches[1];
        const fs::path dir = RunPath(ctx->opts.runs_dir, name);
        if (dir.empty()) {
          ApiError e;
          e.status = 404;
          e.param = "name";
          e.message =
              ctx->opts.runs_dir.empty()
                  ? std::string("name: no --runs directory was given to lumen serve")
                  : fmt::format(
                        "name: no run '{}' under --runs (a directory holding metrics.jsonl)", name);
          return SendJsonError(res, e);
        }
        auto follow = std::make_shared<RunFollower>();
        follow->file = dir / "metrics.jsonl";
        res.set_header("Cache-Control", "no-cache");
        res.set_header("X-Accel-Buffering", "no");
        res.set_chunked_content_provider(
            "text/event-stream", [ctx, follow](size_t, httplib::DataSink& sink) {
              if (ctx->stopping->load()) {
                sink.done();
                return true;
              }
              std::string out = follow->Poll();
              const auto now = std::chrono::steady_clock::now();
              if (out.empty() && now - follow->last_write > std::chrono::seconds(10))
                out = ": keepalive\n\n";
              if (out.empty()) {
                if (!sink.is_writable()) return false;
                std::this_thread::sleep_for(std::chrono::milliseconds(250));
                return true;
              }
              follow->last_write = now;
              return sink.write(out.data(), out.size());
            });
      });
}

}  // namespace lumen::serve
