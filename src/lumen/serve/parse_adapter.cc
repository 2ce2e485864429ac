// The request's "adapter" field, shared by the OpenAI, Anthropic and
// Responses parsers. Only its type is checked here; which adapters exist is
// the engine's to say (EngineBridge::Prepare), so an unknown id is a 400
// that names it there.
#include "lumen/serve/request.h"

namespace lumen::serve {

Status ParseAdapterField(const nlohmann::ordered_json& body, GenRequest& r) {
  auto it = body.find("adapter");
  if (it == body.end() || it->is_null()) return Status::Ok();
  if (!it->is_string())
    return Errorf("adapter: must be a string (an adapter id, \"a+b\" or \"a*0.5+b\"), got {}",
                  TypeName(*it));
  r.adapter = it->get<std::string>();
  return Status::Ok();
}

}  // namespace lumen::serve
