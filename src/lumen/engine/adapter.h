// LoRA adapters on disk in PEFT's layout (adapter_model.safetensors +
// adapter_config.json), so lumen's adapters load in PEFT and PEFT's load here.
//
// Phi3 (fused qkv / gate_up) adapters use the split names below too (lumen
// trains one LoRA per slice); PEFT names Phi-3 modules qkv_proj / gate_up_proj,
// which this reader does not map.
// Tensor names: base_model.model.model.layers.{l}.self_attn.{q,k,v,o}_proj.lora_{A,B}.weight
// and ...mlp.{gate,up,down}_proj...; A [r, K], B [N, r]; F32/F16/BF16 read,
// F32 written. In memory B's rows follow the base file's order: for models
// whose q/k rows are stored for interleaved RoPE (GGUF llama, llama2.c) the
// q/k B rows are permuted on the way in and out, as the converter does for
// the weights themselves.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lumen/core/status.h"
#include "lumen/model/config.h"
#include "lumen/model/weights.h"

namespace lumen::engine {

struct AdapterPair {
  int layer = 0;
  int target = 0;        // model::LoraTarget
  int64_t n = 0, k = 0;  // the base product's [N, K]
  std::vector<float> a;  // [r, K]
  std::vector<float> b;  // [N, r], base row order
};

struct Adapter {
  int rank = 0;
  float alpha = 0.0f;
  bool rs_lora = false;
  std::string base_model;  // base_model_name_or_path
  std::vector<AdapterPair> pairs;
  float Scale() const;
};

// PEFT module name of a target ("q_proj", ...).
std::string_view AdapterModuleName(int target);
// The PEFT tensor name of (layer, target, "A"|"B").
std::string AdapterTensorName(int layer, int target, char ab);

// Reads dir/adapter_config.json and dir/adapter_model.safetensors and checks
// every tensor against the base config (a layer or target the model lacks, a
// rank or shape mismatch, a missing A or B are errors naming the tensor).
Result<Adapter> LoadAdapter(const std::string& dir, const model::ModelConfig& c);

// Writes both files into dir (created if needed), each atomically.
Status SaveAdapter(const std::string& dir, const Adapter& a, const model::ModelConfig& c);

// Points the weights' LoraMatrix entries at the adapter's buffers (which must
// outlive the weights' use).
void AttachAdapter(const Adapter& a, model::Weights& w);

}  // namespace lumen::engine
