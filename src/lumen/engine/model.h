// Model: everything loaded from one model file or directory, immutable after
// Load and shared by every Session (CLI, server slots, trainer).
//
// Sources: a .gguf file, a Hugging Face directory (safetensors, sharded or MLX
// quantized), a llama2.c .bin with its tokenizer, or GGUF bytes in memory (the
// embedded default model). Weights stay in the file mapping; nothing
// dequantizes the model into memory.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lumen/core/buffer.h"
#include "lumen/core/status.h"
#include "lumen/core/thread_pool.h"
#include "lumen/model/config.h"
#include "lumen/model/weights.h"
#include "lumen/tokenize/tokenizer.h"

namespace lumen::engine {

struct LoadOptions {
  std::string tokenizer_path;  // llama2.c .bin models: their tokenizer file
  int threads = 0;             // 0: LUMEN_THREADS or all cores
  // kInt8: products with Q8_0/Q4_0/Q4_K/Q6_K/MLX-4-bit weights at decode and small batches
  // quantize their activations to int8 (tier L3, kernels/matmul_q8.h).
  kernels::ActRoute act_route = kernels::ActRoute::kExact;
  // A LoRA adapter directory (PEFT layout, engine/adapter.h) applied unmerged.
  std::string adapter_dir;
  // How a GGUF file's or a Hugging Face directory's safetensors shards' bytes
  // are made resident (core/buffer.h; tests force kCopy, under which the int8
  // routes' load-time layouts are made: GGUF column groups, MLX runs).
  Residency residency = Residency::kAuto;
};

struct Adapter;

// One stored tensor, for `lumen inspect` and `lumen convert`.
struct StoredTensor {
  std::string name;            // canonical (GGUF-style) name
  std::string source_name;     // name in the file
  kernels::Matrix matrix;      // view into the file
  std::vector<int64_t> shape;  // row-major, as stored
};

class Model {
 public:
  static Result<std::unique_ptr<Model>> Load(const std::string& path, const LoadOptions& opts = {});
  static Result<std::unique_ptr<Model>> LoadGgufBytes(const uint8_t* data, size_t size,
                                                      const std::string& name,
                                                      const LoadOptions& opts = {});
  ~Model();

  const model::ModelConfig& config() const { return config_; }
  const model::Weights& weights() const { return weights_; }
  const tokenize::Tokenizer& tokenizer() const { return *tokenizer_; }
  const std::string& chat_template() const { return chat_template_; }
  const nlohmann::json& generation_config() const { return generation_config_; }
  ThreadPool* pool() const { return pool_.get(); }
  const std::string& name() const { return name_; }
  const std::string& format() const { return format_; }  // "gguf", "hf", "mlx", "llama2c"
  const std::vector<StoredTensor>& tensors() const { return tensors_; }
  const Adapter* adapter() const { return adapter_.get(); }
  // The activation route of every matrix (LoadOptions::act_route). Setting
  // another after the load is exact for every route: matrices repacked into
  // column groups for an int8 route decode to the plain values elsewhere
  // (core/repack.h); an int8 route set later runs on the file's layout.
  kernels::ActRoute act_route() const { return act_route_; }
  void SetActRoute(kernels::ActRoute route);
  int64_t parameter_count() const;
  size_t weight_bytes() const;  // bytes streamed per decoded token
  // Bytes of the model's files held as anonymous copies (core/buffer.h
  // Residency::kCopy): resident like heap, so RSS accounting subtracts them.
  size_t copied_bytes() const;

  struct Sources;  // the open files, kept alive for the mappings

 private:
  Model();
  Status InitGguf(const LoadOptions& opts);
  Status InitHf(const LoadOptions& opts);
  Status InitLlama2c(const LoadOptions& opts);
  Status Finish(const LoadOptions& opts);
  void AddTensor(StoredTensor st);
  void AddTensor(const std::string& name, const std::string& source_name, const TensorView& view);

  std::unique_ptr<Sources> sources_;
  model::ModelConfig config_;
  model::Weights weights_;
  std::optional<tokenize::Tokenizer> tokenizer_;
  std::string chat_template_;
  nlohmann::json generation_config_ = nlohmann::json::object();
  std::unique_ptr<ThreadPool> pool_;
  std::string name_, format_;
  std::vector<StoredTensor> tensors_;
  std::unique_ptr<Adapter> adapter_;  // the weights' LoraMatrix entries point into it
  kernels::ActRoute act_route_ = kernels::ActRoute::kExact;
};

}  // namespace lumen::engine
