// Strict UTF-8 validation (RFC 3629): no overlong forms, no surrogates, nothing
// above U+10FFFF. The one validator every parser of untrusted bytes uses.
#pragma once

#include <cstddef>
#include <string_view>

namespace lumen {

// True if `s` is valid UTF-8; otherwise *bad_offset (when given) is the byte
// offset of the first invalid sequence.
bool ValidUtf8(std::string_view s, size_t* bad_offset = nullptr);

}  // namespace lumen
