// Synthesize: random-weight models at real shapes (llama-3.2-1b, qwen3-0.6b,
// gemma-3-1b) and tiny test shapes of every family (tiny-llama, tiny-qwen3, ...),
// with a working synthetic vocabulary and a ChatML template. Deterministic from
// the seed: row r of tensor t is drawn from a generator seeded by (seed, t, r),
// so any row can be produced independently (and files are reproducible).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "lumen/engine/convert.h"
#include "lumen/model/config.h"

namespace lumen::engine {

struct SynthOptions {
  std::string name;  // llama-3.2-1b, qwen3-0.6b, gemma-3-1b, tiny-<family>
  std::string out;
  OutputFormat format = OutputFormat::kGguf;
  std::optional<DType> dtype;  // default f32 for tiny-*, f16 otherwise
  int mlx_bits = 0;            // --format hf only: MLX affine 4/8-bit weights (0: none)
  int mlx_group = 64;
  // --quant q4_k_m: Q4_K with Q6_K for the LM head and for attn_v / ffn_down
  // in the layers llama.cpp's Q4_K_M gives more bits (first and last eighth,
  // every third in between).
  bool q4_k_m = false;
  uint64_t seed = 1;
  int threads = 0;  // encoding threads (WriteOptions::threads); the file does not depend on it
  // Shape overrides (0: keep the named shape's).
  int layers = 0, dim = 0, ffn = 0, heads = 0, kv_heads = 0, vocab = 0;
  int64_t ctx = 0;
  // An embedding model (engine/embed.h): GGUF pooling_type, or HF
  // sentence-transformers modules.json + 1_Pooling/config.json.
  model::Pooling pooling = model::Pooling::kNone;
};

// Parses a --quant value: a tensor type ("f16", "q4_k", ...) into dtype,
// "q4_k_m" (the mix above), or
// "mlx4" / "mlx8" (optionally "-g32" / "-g64" / "-g128", default group 64)
// into mlx_bits / mlx_group, which also selects --format hf.
Status ParseSynthQuant(std::string_view quant, SynthOptions& opts);

// The named shapes, for help text.
std::vector<std::string> SynthNames();
Result<model::ModelConfig> SynthConfig(const SynthOptions& opts);
Status Synthesize(const SynthOptions& opts);

}  // namespace lumen::engine
