// Test helpers for train/: tiny synth models written to a temp directory.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include <unistd.h>

#include "lumen/engine/model.h"
#include "lumen/engine/synth.h"

namespace lumen::train::testing {

// A per-process temp directory removed at destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& tag)
      : path_(std::filesystem::temp_directory_path() /
              ("lumen_train_" + tag + "_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// `lumen synth <name>` (GGUF, f32 unless dtype given) loaded with `threads`.
// quant: a `lumen synth --quant` value ("q4_0", "mlx4", ...) or empty for f32.
inline std::unique_ptr<engine::Model> SynthModel(const TempDir& dir, const std::string& name,
                                                 int threads = 1, uint64_t seed = 1,
                                                 const std::string& quant = "") {
  engine::SynthOptions o;
  o.name = name;
  o.seed = seed;
  if (!quant.empty() && !engine::ParseSynthQuant(quant, o).ok()) return nullptr;
  const std::string stem = quant.empty() ? name : name + "-" + quant;
  o.out = (dir.path() / (stem + (o.mlx_bits ? "" : ".gguf"))).string();
  if (!engine::Synthesize(o).ok()) return nullptr;
  engine::LoadOptions lo;
  lo.threads = threads;
  auto m = engine::Model::Load(o.out, lo);
  return m.ok() ? std::move(m).value() : nullptr;
}

}  // namespace lumen::train::testing
