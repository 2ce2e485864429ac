// ApiError: one client-visible failure (HTTP status, error type, the request
// field it concerns and why), rendered in the error shape of the protocol the
// client speaks: OpenAI {"error": {message, type, param, code}} (also used by
// the Responses API) or Anthropic {"type": "error", "error": {type, message}}.
#pragma once

#include <string>
#include <string_view>

#include "lumen/core/status.h"

namespace lumen::serve {

enum class ErrorShape { kOpenAI, kAnthropic };

struct ApiError {
  int status = 400;
  std::string type;     // empty: derived from status and shape
  std::string param;    // the request field, e.g. "messages[2].role"
  std::string message;  // "messages[2].role: unknown role 'robot'"
  std::string code;     // OpenAI error.code ("context_length_exceeded"); empty: derived
  int retry_after = 0;  // seconds, for 429 / 529
};

// A 400 whose message is "<field>: <reason>".
ApiError FieldError(std::string_view field, std::string_view reason);
// From a Status whose message starts with "<field>: ": param = that field.
ApiError FromStatus(const Status& s, int status = 400);

std::string ErrorBody(const ApiError& e, ErrorShape shape);
// The type string for a status in a shape ("invalid_request_error",
// "authentication_error", "overloaded_error", ...).
std::string ErrorType(int status, ErrorShape shape);

}  // namespace lumen::serve
