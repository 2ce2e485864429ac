// libFuzzer target for the server's request path without a model (see
// serve/fuzz_entry.h): any input must end in a GenRequest or an
// ApiError/Status, never a crash, hang or leak.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "lumen/serve/fuzz_entry.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  lumen::serve::ParseAnyRequest(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
