#include "lumen/serve/body.h"

#include <fmt/format.h>

namespace lumen::serve {

bool ParseBody(std::string_view body, size_t max_bytes, nlohmann::ordered_json* out,
               ApiError* err) {
  if (body.size() > max_bytes) {
    err->status = 413;
    err->param.clear();
    err->message = fmt::format("body: {} bytes exceed the limit of {} bytes (--max-body-mb)",
                               body.size(), max_bytes);
    return false;
  }
  size_t bad = 0;
  if (!ValidUtf8(body, &bad)) {
    *err = FieldError("body", fmt::format("invalid UTF-8 at byte offset {}", bad));
    return false;
  }
  try {
    *out = nlohmann::ordered_json::parse(body);
  } catch (const nlohmann::json::exception& e) {
    *err = FieldError("body", fmt::format("invalid JSON: {}", e.what()));
    return false;
  }
  return true;
}

}  // namespace lumen::serve
