#include "lumen/serve/adapters_api.h"

#include <memory>

#include "lumen/serve/body.h"
#include "lumen/serve/httplib_include.h"
#include "lumen/serve/request.h"
#include "lumen/serve/train_jobs.h"

namespace lumen::serve {

using ojson = nlohmann::ordered_json;

namespace {
constexpr const char* kEndpoint = "/v1/adapters";

std::string Dump(const ojson& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}
}  // namespace

ojson AdapterJson(const engine::MountedAdapter& a) {
  int layers = 0;
  for (const auto& l : a.weights.layers) {
    bool any = false;
    for (const auto& m : l) any |= m.valid();
    layers += any;
  }
  return {{"id", a.id},
          {"object", "adapter"},
          {"path", a.path},
          {"rank", a.adapter.rank},
          {"alpha", a.adapter.alpha},
          {"scale", a.adapter.Scale()},
          {"targets", a.targets},
          {"layers", layers},
          {"base_model", a.adapter.base_model}};
}

void RegisterAdapterRoutes(httplib::Server& h, AdapterRoutes routes) {
  auto r = std::make_shared<AdapterRoutes>(std::move(routes));
  auto same_origin = [r](const httplib::Request& req, ApiError* err) {
    return CheckSameOrigin(req.method, req.get_header_value("Origin"), req.get_header_value("Host"),
                           req.get_header_value("Sec-Fetch-Site"),
                           req.get_header_value("Content-Type"), r->bind_host, err);
  };

  h.Get(kEndpoint, [r](const httplib::Request&, httplib::Response& res) {
    ojson data = ojson::array();
    for (const auto& a : r->registry->List()) data.push_back(AdapterJson(*a));
    res.set_content(Dump({{"object", "list"}, {"data", data}}), "application/json");
    r->count(kEndpoint, 200);
  });

  h.Post(kEndpoint, [r, same_origin](const httplib::Request& req, httplib::Response& res) {
    ApiError err;
    if (!same_origin(req, &err)) return r->send_error(res, err, kEndpoint);
    ojson body;
    if (!ParseBody(req.body, size_t(1) << 16, &body, &err))
      return r->send_error(res, err, kEndpoint);
    if (!body.is_object())
      return r->send_error(res, FieldError("body", "must be a JSON object {id, path}"), kEndpoint);
    std::string id, path;
    bool replace = false;
    for (const auto& [field, out] : {std::pair{"id", &id}, std::pair{"path", &path}}) {
      auto it = body.find(field);
      if (it == body.end() || it->is_null())
        return r->send_error(res, FieldError(field, "missing"), kEndpoint);
      if (Status st = ExpectString(*it, field, out); !st.ok())
        return r->send_error(res, FromStatus(st), kEndpoint);
    }
    if (Status st = ExpectBool(body.value("replace", ojson()), "replace", &replace); !st.ok())
      return r->send_error(res, FromStatus(st), kEndpoint);
    if (!engine::ValidAdapterId(id))
      return r->send_error(
          res, FieldError("id", fmt::format("'{}': use 1-64 of A-Z a-z 0-9 _ . -", id)), kEndpoint);
    bool conflict = false;
    auto mounted = r->registry->Mount(id, path, replace, &conflict);
    if (!mounted.ok()) {
      ApiError e;
      e.status = conflict ? 409 : 400;
      e.param = conflict ? "id" : "path";
      e.message = mounted.status().message();
      return r->send_error(res, e, kEndpoint);
    }
    res.set_content(Dump(AdapterJson(**mounted)), "application/json");
    r->count(kEndpoint, 200);
  });

  h.Delete(R"(/v1/adapters/([^/]+))", [r, same_origin](const httplib::Request& req,
                                                       httplib::Response& res) {
    ApiError err;
    if (!same_origin(req, &err)) return r->send_error(res, err, kEndpoint);
    const std::string id = req.matches[1];
    if (!r->registry->Unmount(id)) {
      ApiError e;
      e.status = 404;
      e.param = "id";
      e.message = fmt::format("adapter '{}': not mounted (GET /v1/adapters lists them)", id);
      return r->send_error(res, e, kEndpoint);
    }
    res.set_content(Dump({{"id", id}, {"object", "adapter.deleted"}, {"deleted", true}}),
                    "application/json");
    r->count(kEndpoint, 200);
  });
}

}  // namespace lumen::serve
