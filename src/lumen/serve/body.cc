#include "lumen/serve/body.h"

#include <fmt/format.h>

namespace lumen::serve {

bool ValidUtf8(std::string_view s, size_t* bad_offset) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF)
      len = 2, cp = c & 0x1F;
    else if (c >= 0xE0 && c <= 0xEF)
      len = 3, cp = c & 0x0F;
    else if (c >= 0xF0 && c <= 0xF4)
      len = 4, cp = c & 0x07;
    else {
      *bad_offset = i;
      return false;
    }
    if (i + len > n) {
      *bad_offset = i;
      return false;
    }
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) {
        *bad_offset = i;
        return false;
      }
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
        (len == 4 && (cp < 0x10000 || cp > 0x10FFFF))) {
      *bad_offset = i;
      return false;
    }
    i += len;
  }
  return true;
}

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
