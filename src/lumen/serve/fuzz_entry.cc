#include "lumen/serve/fuzz_entry.h"

#include "lumen/engine/constraint_schema.h"
#include "lumen/sample/config.h"
#include "lumen/serve/body.h"
#include "lumen/serve/request.h"
#include "lumen/serve/tool_calls.h"

namespace lumen::serve {

bool ParseAnyRequest(std::string_view in) {
  if (in.empty()) return false;
  const std::string_view body = in.substr(1);
  ParseToolCalls(body, {"get_weather", "search"});
  nlohmann::ordered_json j;
  ApiError err;
  if (!ParseBody(body, size_t(1) << 20, &j, &err)) return false;
  Result<GenRequest> r = Error("none");
  switch (static_cast<uint8_t>(in[0]) % 4) {
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
    (void)FromStatus(r.status());
    return false;
  }
  if (r->response_format == "json_schema") {
    // The schema compiler and a short walk of its grammar (every byte 0..255
    // tried at each step, the first accepted one taken).
    auto g = engine::CompileJsonSchema(r->json_schema);
    if (g.ok()) {
      auto st = (*g)->Start();
      for (int step = 0; step < 64 && !st.empty() && !engine::SchemaGrammar::Accepted(st); ++step) {
        const auto next = (*g)->NextBytes(st);
        int c = 0;
        while (c < 256 && !((next[size_t(c) >> 6] >> (c & 63)) & 1)) ++c;
        if (c == 256) break;
        st = (*g)->Advance(st, static_cast<uint8_t>(c));
      }
    }
  }
  auto cfg = sample::ParseSamplerJson(r->sampler_fields, {});
  if (cfg.ok()) (void)sample::ValidateForVocab(*cfg, 512);
  return true;
}

}  // namespace lumen::serve
