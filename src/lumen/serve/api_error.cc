#include "lumen/serve/api_error.h"

#include <nlohmann/json.hpp>

namespace lumen::serve {

ApiError FieldError(std::string_view field, std::string_view reason) {
  ApiError e;
  e.param = std::string(field);
  e.message = fmt::format("{}: {}", field, reason);
  return e;
}

ApiError FromStatus(const Status& s, int status) {
  ApiError e;
  e.status = status;
  e.message = s.message();
  const size_t colon = e.message.find(": ");
  // A field path has no spaces: "messages[0].content", "hlg.width".
  if (colon != std::string::npos && e.message.substr(0, colon).find(' ') == std::string::npos)
    e.param = e.message.substr(0, colon);
  return e;
}

std::string ErrorType(int status, ErrorShape shape) {
  const bool a = shape == ErrorShape::kAnthropic;
  switch (status) {
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return a ? "not_found_error" : "not_found_error";
    case 405:
      return "invalid_request_error";
    case 413:
      return a ? "request_too_large" : "invalid_request_error";
    case 429:
      return "rate_limit_error";
    case 503:
      return a ? "overloaded_error" : "server_error";
    case 529:
      return "overloaded_error";
    default:
      break;
  }
  if (status >= 500) return a ? "api_error" : "server_error";
  return "invalid_request_error";
}

std::string ErrorBody(const ApiError& e, ErrorShape shape) {
  const std::string type = e.type.empty() ? ErrorType(e.status, shape) : e.type;
  nlohmann::json j;
  if (shape == ErrorShape::kAnthropic) {
    j = {{"type", "error"}, {"error", {{"type", type}, {"message", e.message}}}};
  } else {
    j = {{"error",
          {{"message", e.message},
           {"type", type},
           {"param", e.param.empty() ? nlohmann::json() : nlohmann::json(e.param)},
           {"code", !e.code.empty()   ? nlohmann::json(e.code)
                    : e.status == 401 ? nlohmann::json("invalid_api_key")
                                      : nlohmann::json()}}}};
  }
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace lumen::serve
