// MLX-style affine quantized weights, as mlx-lm writes them into safetensors.
//
// config.json holds "quantization": {"group_size": 32|64|128, "bits": 4|8}
// (mlx-lm writes the same object again as "quantization_config"; "mode", when
// present, must be "affine"). Mixed-precision models add per-module entries
// under the same object: "model.layers.0.mlp.down_proj": {"group_size": 64,
// "bits": 8}, or false for a module left in floating point.
//
// A quantized module "x" (a Linear, or an Embedding, whose rows are tokens)
// stores three tensors:
//   x.weight  U32          [out, in * bits / 32]  values packed LSB first
//   x.scales  F16/BF16/F32 [out, in / group_size]
//   x.biases  same dtype   [out, in / group_size]
// and w[o][i] = scales[o][i / group_size] * q[o][i] + biases[o][i / group_size].
// MlxLinear checks these shapes against each other (errors name the tensor)
// and dequantizes a row with the scalar reference in quant.h.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "lumen/core/status.h"
#include "lumen/core/tensor.h"
#include "lumen/formats/hf_dir.h"

namespace lumen::formats {

struct MlxQuantParams {
  int group_size = 64;
  int bits = 4;
  bool operator==(const MlxQuantParams&) const = default;
};

struct MlxQuantization {
  MlxQuantParams defaults;
  // Module path -> its own params, or nullopt for a module left unquantized.
  std::map<std::string, std::optional<MlxQuantParams>, std::less<>> overrides;

  // The params for a module path ("model.layers.0.self_attn.q_proj"), or
  // nullopt when that module is not quantized.
  std::optional<MlxQuantParams> For(std::string_view module) const;
};

// Reads config["quantization"] (else config["quantization_config"]).
// nullopt when neither is present. `where` names the config in errors.
Result<std::optional<MlxQuantization>> ParseMlxQuantization(const nlohmann::json& config,
                                                            std::string_view where);

// Validates one group-size / bits pair (`where` names it in errors).
Status CheckMlxQuantParams(const MlxQuantParams& p, std::string_view where);

struct MlxLinear {
  std::string name;   // module path, e.g. "model.layers.0.mlp.up_proj"
  TensorView weight;  // U32 [out, in * bits / 32]
  TensorView scales;  // [out, in / group_size]
  TensorView biases;  // [out, in / group_size]
  int bits = 4;
  int group_size = 64;
  int64_t out_features = 0;
  int64_t in_features = 0;

  // Binds "<module>.weight/.scales/.biases" from a model directory.
  static Result<MlxLinear> Bind(const HfModelDir& dir, const std::string& module,
                                const MlxQuantParams& params);
  // Binds from views already at hand, checking them the same way.
  static Result<MlxLinear> FromViews(std::string module, const TensorView& weight,
                                     const TensorView& scales, const TensorView& biases,
                                     const MlxQuantParams& params);

  // out[0, in_features) = dequantized row `row` (0 <= row < out_features).
  void DequantizeRow(int64_t row, float* out) const;
};

}  // namespace lumen::formats
