// The embedded default model: stories260K (Karpathy's TinyStories Llama, MIT;
// models/LICENSE-stories260K), converted by `lumen convert` to GGUF and linked
// into the library, so every verb works from a fresh clone with no MODEL.
#pragma once

#include <memory>

#include "lumen/engine/model.h"

namespace lumen::engine {

inline constexpr const char* kDefaultModelName = "stories260K (embedded)";

Result<std::unique_ptr<Model>> LoadDefaultModel(const LoadOptions& opts = {});

// Loads `path`, or the embedded model when path is empty.
Result<std::unique_ptr<Model>> LoadModelOrDefault(const std::string& path,
                                                  const LoadOptions& opts = {});

}  // namespace lumen::engine
