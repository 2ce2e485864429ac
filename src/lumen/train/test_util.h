// Test helpers for train/: tiny synth models written to a temp directory.
#pragma once

#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include "lumen/engine/model.h"
#include "lumen/engine/synth.h"

namespace lumen::train::testing {

// |a - ref| / |ref| in L2 over two vectors of the same length (any element
// types); +inf when ref is all zero and a is not, so a vanished reference
// cannot pass a bound.
template <class A, class B>
double RelativeL2(const std::vector<A>& a, const std::vector<B>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = double(a[i]) - double(ref[i]);
    num += d * d;
    den += double(ref[i]) * double(ref[i]);
  }
  if (den == 0) return num == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  return std::sqrt(num / den);
}

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
