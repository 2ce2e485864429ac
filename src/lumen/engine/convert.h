// ConvertModel: a loaded Model (GGUF, HF, MLX, llama2.c) written as GGUF or a
// Hugging Face directory, optionally re-typed (f32/f16/bf16 or, for GGUF, any
// quant type). Converts between the two files' conventions: q/k row order for
// adjacent-pair vs rotate_half RoPE (GGUF llama/mistral/minicpm use pairs) and
// Gemma's norm weights (HF stores w, GGUF stores 1 + w).
#pragma once

#include <optional>
#include <string>

#include "lumen/engine/model.h"
#include "lumen/engine/writer.h"

namespace lumen::engine {

enum class OutputFormat { kGguf, kHf };

Status ConvertModel(const Model& m, OutputFormat format, const std::string& out,
                    std::optional<DType> dtype);

// Builds plans for `m` as stored in `format`; `target` receives the config in
// that format's conventions. Shared with tests.
std::vector<TensorPlan> PlansFor(const Model& m, OutputFormat format, model::ModelConfig& target);

}  // namespace lumen::engine
