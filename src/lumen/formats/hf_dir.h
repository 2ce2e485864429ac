// A Hugging Face model directory: config.json, generation_config.json,
// tokenizer files, and safetensors weights, single-file or sharded.
//
// HfModelDir::Open(dir) reads config.json (required, a JSON object) and
// generation_config.json (optional), notes which tokenizer files exist, and
// opens the weights, in this order of preference:
//   1. model.safetensors.index.json: its "weight_map" (tensor -> shard file);
//      every listed shard is opened once, every mapped tensor must exist in
//      the shard the map names;
//   2. model.safetensors;
//   3. otherwise every *.safetensors file in the directory (MLX and older
//      exporters use names like weights.safetensors or weights.00.safetensors).
// The tensors of all shards form one namespace: a name in two shards is an
// error naming both. Shard names in an index must be plain file names in the
// directory (no '/', no '..'). Errors name the file, the tensor and the reason.
//
// Views are zero-copy into the mmap'd shards and live as long as the HfModelDir.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "lumen/core/status.h"
#include "lumen/core/tensor.h"
#include "lumen/formats/safetensors.h"

namespace lumen::formats {

struct HfTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // as stored, outermost first
  TensorView view;             // zero-copy into the shard
  size_t shard = 0;            // index into HfModelDir::shard_paths()
};

class HfModelDir {
 public:
  // residency: how each shard is held (MappedFile::Open).
  static Result<HfModelDir> Open(const std::string& dir, Residency residency = Residency::kAuto);

  const std::string& dir() const { return dir_; }
  const nlohmann::json& config() const { return config_; }
  // generation_config.json, or null when the directory has none.
  const nlohmann::json* generation_config() const {
    return generation_config_ ? &*generation_config_ : nullptr;
  }
  // Paths of tokenizer files that exist in the directory.
  const std::optional<std::string>& tokenizer_json_path() const { return tokenizer_json_; }
  const std::optional<std::string>& tokenizer_config_path() const { return tokenizer_config_; }
  const std::optional<std::string>& tokenizer_model_path() const { return tokenizer_model_; }

  // The safetensors files, in the order they were opened.
  const std::vector<std::string>& shard_paths() const { return shard_paths_; }
  const SafetensorsFile& shard(size_t i) const { return *shards_[i]; }
  // All tensors of all shards, shard by shard, each in data order.
  const std::vector<HfTensor>& tensors() const { return tensors_; }
  const HfTensor* Find(std::string_view name) const;
  // The bytes [at, at + len) of a tensor of a shard, writable for fn
  // (SafetensorsFile::RewriteInPlace); false where no copied shard holds them.
  bool RewriteInPlace(const void* at, size_t len, const std::function<void(uint8_t*)>& fn) {
    for (auto& s : shards_)
      if (s->RewriteInPlace(at, len, fn)) return true;
    return false;
  }
  // Bytes of the shards copied into anonymous memory (Residency::kCopy).
  size_t copied_bytes() const {
    size_t n = 0;
    for (const auto& s : shards_) n += s->copied_bytes();
    return n;
  }

 private:
  Status AddShard(const std::string& file_name);

  std::string dir_;
  Residency residency_ = Residency::kAuto;
  nlohmann::json config_;
  std::optional<nlohmann::json> generation_config_;
  std::optional<std::string> tokenizer_json_, tokenizer_config_, tokenizer_model_;
  std::vector<std::string> shard_paths_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::vector<HfTensor> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
};

// Reads a JSON file; errors name the path and the parse error.
Result<nlohmann::json> ReadJsonFile(const std::string& path);

}  // namespace lumen::formats
