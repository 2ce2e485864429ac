// libFuzzer target for the server's request path without a model: the body
// gate (size, UTF-8, JSON), the four protocol parsers (the first byte picks
// the endpoint), the sampler fields of the request, and the tool-call parser
// on the same bytes as model output. Any input must end in a GenRequest or an
// ApiError/Status, never a crash, hang or leak.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "lumen/sample/config.h"
#include "lumen/serve/body.h"
#include "lumen/serve/request.h"
#include "lumen/serve/tool_calls.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lumen::serve;
  if (size == 0) return 0;
  const uint8_t which = data[0] % 4;
  std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  ParseToolCalls(body, {"get_weather", "search"});
  nlohmann::ordered_json j;
  ApiError err;
  if (!ParseBody(body, size_t(1) << 20, &j, &err)) return 0;
  lumen::Result<GenRequest> r = lumen::Error("none");
  switch (which) {
    case 0:
      r = ParseChatCompletions(j);
      break;
    case 1:
      r = ParseCompletions(j);
      break;
    case 2:
      r = ParseMessages(j);
      break;
    default:
      r = ParseResponses(j);
      break;
  }
  if (!r.ok()) {
    FromStatus(r.status());
    return 0;
  }
  auto cfg = lumen::sample::ParseSamplerJson(r->sampler_fields, {});
  if (cfg.ok()) (void)lumen::sample::ValidateForVocab(*cfg, 512);
  return 0;
}
