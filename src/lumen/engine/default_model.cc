#include "lumen/engine/default_model.h"

#include <cstdint>

// The GGUF bytes, 64-byte aligned so tensor views keep their alignment.
asm(".section .rodata\n"
    ".balign 64\n"
    ".global lumen_default_model_begin\n"
    "lumen_default_model_begin:\n"
    ".incbin \"" LUMEN_DEFAULT_MODEL_FILE
    "\"\n"
    ".global lumen_default_model_end\n"
    "lumen_default_model_end:\n"
    ".previous\n");
extern "C" const uint8_t lumen_default_model_begin[];
extern "C" const uint8_t lumen_default_model_end[];

namespace lumen::engine {

Result<std::unique_ptr<Model>> LoadDefaultModel(const LoadOptions& opts) {
  const size_t size = static_cast<size_t>(lumen_default_model_end - lumen_default_model_begin);
  return Model::LoadGgufBytes(lumen_default_model_begin, size, kDefaultModelName, opts);
}

Result<std::unique_ptr<Model>> LoadModelOrDefault(const std::string& path,
                                                  const LoadOptions& opts) {
  if (path.empty()) return LoadDefaultModel(opts);
  return Model::Load(path, opts);
}

}  // namespace lumen::engine
