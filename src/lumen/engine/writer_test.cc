// The writer encodes a tensor's rows on several threads: the files must be the
// bytes one thread writes, for every output kind.
#include "lumen/engine/writer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "lumen/engine/synth.h"

namespace lumen::engine {
namespace {

namespace fs = std::filesystem;

std::string Slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

class WriterThreads : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("lumen_writer_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // tiny-llama with rows of 256 (every K-quant applies) and 61 rows in the
  // FFN products, so three threads get chunks of unequal length; written
  // under dir_/sub.
  SynthOptions Tiny(const std::string& quant, int threads, const std::string& sub) {
    SynthOptions o;
    o.name = "tiny-llama";
    o.dim = 256;
    o.ffn = 512;
    o.heads = 4;
    o.kv_heads = 2;
    o.vocab = 61 * 8;
    o.threads = threads;
    fs::create_directories(dir_ / sub);
    o.out = (dir_ / sub / "m.gguf").string();  // the stem is general.name: the same in both
    EXPECT_TRUE(ParseSynthQuant(quant, o).ok()) << quant;
    return o;
  }

  fs::path dir_;
};

TEST_F(WriterThreads, GgufBytesDoNotDependOnTheThreadCount) {
  for (const char* quant : {"q4_k_m", "q3_k", "q6_k", "q8_0", "f16"}) {
    ASSERT_TRUE(Synthesize(Tiny(quant, 1, "one")).ok()) << quant;
    ASSERT_TRUE(Synthesize(Tiny(quant, 3, "three")).ok()) << quant;
    const std::string one = Slurp(dir_ / "one" / "m.gguf");
    ASSERT_GT(one.size(), 100000u) << quant;
    EXPECT_TRUE(one == Slurp(dir_ / "three" / "m.gguf")) << quant;
  }
}

TEST_F(WriterThreads, HfBytesDoNotDependOnTheThreadCount) {
  for (const char* quant : {"bf16", "mlx4"}) {
    SynthOptions a = Tiny(quant, 1, "one"), b = Tiny(quant, 3, "three");
    a.format = b.format = OutputFormat::kHf;
    a.out = (dir_ / "one" / "hf").string();
    b.out = (dir_ / "three" / "hf").string();
    ASSERT_TRUE(Synthesize(a).ok()) << quant;
    ASSERT_TRUE(Synthesize(b).ok()) << quant;
    const std::string one = Slurp(dir_ / "one" / "hf" / "model.safetensors");
    ASSERT_GT(one.size(), 100000u) << quant;
    EXPECT_TRUE(one == Slurp(dir_ / "three" / "hf" / "model.safetensors")) << quant;
  }
}

}  // namespace
}  // namespace lumen::engine
