// A prefill chunk takes the FFN's hidden width in pieces of kFfnPiece columns
// (model::Forward::FfnBlock); rows with an adapter set take the whole width at
// once. An adapter set that adapts no product runs exactly the base products,
// so the two must give the same logits: bit for bit where the down product
// continues across pieces (the exact route and the AVX512-BF16 panels,
// kernels::MatMulAccumulate), within float rounding on the AMX tiles. Hidden
// width 4608: two whole pieces and a 512-column remainder; the int8 routes'
// copied files hold the column groups repacked at load.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "lumen/engine/model.h"
#include "lumen/engine/synth.h"
#include "lumen/kernels/matmul_bf16.h"
#include "lumen/kernels/matmul_bf16_amx.h"
#include "lumen/model/forward.h"
#include "lumen/model/kv_cache.h"

namespace lumen::engine {
namespace {

namespace fs = std::filesystem;

// Logits of every row of one chunk of T tokens at position 0 (set: every
// row's adapter set, or none).
std::vector<float> ChunkLogits(const Model& m, int64_t T, const model::LoraSet* set) {
  const model::ModelConfig& c = m.config();
  auto cache = model::KvCache::Create(c, T, DType::kF32);
  EXPECT_TRUE(cache.ok());
  model::Forward fwd(c, m.weights(), m.pool());
  std::vector<int32_t> ids(T);
  for (int64_t t = 0; t < T; ++t) ids[t] = int32_t((t * 37 + 11) % c.vocab_size);
  std::vector<float> logits(T * c.vocab_size);
  EXPECT_TRUE(fwd.Run(ids, 0, *cache, model::LogitsFor::kAll, logits.data(), set).ok());
  return logits;
}

TEST(FfnPieces, GiveTheWholeWidthsLogits) {
  static_assert(model::kFfnPiece == 2048);
  const fs::path dir = fs::temp_directory_path() / ("lumen_ffn_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::vector<kernels::ActRoute> routes = {kernels::ActRoute::kExact, kernels::ActRoute::kInt8x2};
  if (kernels::CpuHasBf16()) routes.push_back(kernels::ActRoute::kInt8x2Bf16);
  for (DType t : {DType::kF16, DType::kQ4_0, DType::kQ4_K}) {
    const std::string path = (dir / (std::string(Name(t)) + ".gguf")).string();
    SynthOptions so;
    so.name = "tiny-llama";
    so.out = path;
    so.dtype = t;
    so.dim = 256;
    so.ffn = 4608;
    ASSERT_TRUE(Synthesize(so).ok());
    for (kernels::ActRoute r : routes) {
      SCOPED_TRACE(std::string(Name(t)) + " route " + std::string(kernels::kActRouteNames[int(r)]));
      LoadOptions lo;
      lo.threads = 2;
      lo.act_route = r;
      lo.residency = Residency::kCopy;  // where the int8 routes repack
      auto m = Model::Load(path, lo);
      ASSERT_TRUE(m.ok()) << m.status().message();
      model::LoraWeights none;  // adapts no product: the base arithmetic only
      none.layers.resize((*m)->config().n_layers);
      const model::LoraSet set{{{&none, 1.0f}}};
      for (int64_t T : {int64_t{40}, model::kMaxChunk}) {
        const std::vector<float> pieces = ChunkLogits(**m, T, nullptr);
        const std::vector<float> whole = ChunkLogits(**m, T, &set);
        const bool amx = r == kernels::ActRoute::kInt8x2Bf16 && kernels::AmxBf16Usable();
        if (!amx) {
          EXPECT_EQ(0, std::memcmp(pieces.data(), whole.data(), pieces.size() * sizeof(float)))
              << "T=" << T;
          continue;
        }
        double diff = 0, scale = 1;
        for (size_t i = 0; i < pieces.size(); ++i) {
          diff = std::max(diff, double(std::fabs(pieces[i] - whole[i])));
          scale = std::max(scale, double(std::fabs(whole[i])));
        }
        EXPECT_LE(diff, 1e-4 * scale) << "T=" << T;
      }
    }
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace lumen::engine
