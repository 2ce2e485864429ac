// Writing models: GGUF or a Hugging Face directory (optionally MLX-quantized) from a list of tensor
// plans, each producing its rows as f32 on demand. `lumen convert` builds plans from a loaded Model
// (with the layout transforms between conventions); `lumen synth` builds them from a seeded RNG.
// Rows are encoded to the target dtype one at a time per thread, so no whole tensor is ever held
// dequantized.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "lumen/core/dtype.h"
#include "lumen/core/status.h"
#include "lumen/model/config.h"
#include "lumen/tokenize/tokenizer.h"

namespace lumen::engine {

struct TensorPlan {
  std::string name;            // canonical (GGUF-style)
  std::vector<int64_t> shape;  // row-major; 1-D for norms and biases
  DType source_dtype = DType::kF32;
  std::optional<DType> dtype;  // GGUF: overrides WriteOptions::dtype (mixes like Q4_K_M)
  std::function<void(int64_t row, float* out)> row;  // fills shape.back() floats
};

struct WriteOptions {
  // Target dtype of matrices; nullopt keeps each tensor's source dtype when the
  // target format can hold it (else f16). 1-D tensors are always f32 in GGUF.
  std::optional<DType> dtype;
  std::string chat_template;  // empty: none
  std::string name;           // general.name; empty: the output file's stem
  // Hugging Face output only: MLX affine-quantize 2-D weights (bits 4 or 8,
  // 0 = off) in groups of mlx_group along each row.
  int mlx_bits = 0;
  int mlx_group = 64;
  // Threads that encode a tensor's rows (0: ThreadPool::DefaultThreads()).
  // The bytes written do not depend on it.
  int threads = 0;
};

// `config` must already be in the target file's conventions (rope_style and
// norm_offset as the target stores them).
Status WriteGgufModel(const model::ModelConfig& config, const tokenize::Tokenizer& tok,
                      const std::vector<TensorPlan>& plans, const WriteOptions& opts,
                      const std::string& path);
Status WriteHfModel(const model::ModelConfig& config, const tokenize::Tokenizer& tok,
                    const std::vector<TensorPlan>& plans, const WriteOptions& opts,
                    const std::string& dir);

}  // namespace lumen::engine
