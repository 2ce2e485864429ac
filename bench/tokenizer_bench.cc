// Encode throughput of lumen's tokenizers on tests/goldens/tokenizers/corpus.txt
// (single thread). Run via tools/bench_tokenizers.sh, which also runs the
// transformers.js reference and prints the ratio. Fixtures: LUMEN_FIXTURES or
// <source>/../shared/fixtures.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "lumen/core/buffer.h"
#include "lumen/formats/gguf.h"
#include "lumen/tokenize/tokenizer.h"

namespace {

using lumen::tokenize::Tokenizer;

std::string SourceDir() {
  if (const char* s = std::getenv("LUMEN_SOURCE_DIR")) return s;
  return ".";
}

std::vector<std::string> Cases() {
  std::vector<std::string> out;
  auto r = lumen::ReadFile(SourceDir() + "/tests/goldens/tokenizers/corpus.txt");
  if (!r.ok()) return out;
  const std::string sep = "\n__lumen_case__\n";
  size_t start = 0;
  for (size_t i; (i = r->find(sep, start)) != std::string::npos; start = i + sep.size()) {
    out.push_back(r->substr(start, i - start));
  }
  return out;
}

void BM_Encode(benchmark::State& state, const std::string& name) {
  std::string fx = std::getenv("LUMEN_FIXTURES") ? std::getenv("LUMEN_FIXTURES")
                                                 : SourceDir() + "/../shared/fixtures";
  lumen::Result<Tokenizer> tok = lumen::Error("unset");
  if (name == "tok512") {
    tok = Tokenizer::FromLlama2c(fx + "/stories260K/tok512.bin", 512);
  } else if (name == "llama2") {
    auto g =
        lumen::formats::GgufFile::Open(fx + "/llama-2-tiny-random-gguf/llama-2-tiny-random.gguf");
    if (g.ok()) tok = Tokenizer::FromGguf(*g);
  } else {
    tok = Tokenizer::FromHf(fx + "/tokenizers/" + name);
  }
  std::vector<std::string> cases = Cases();
  if (!tok.ok() || cases.empty()) {
    state.SkipWithError("fixture or corpus missing");
    return;
  }
  size_t bytes = 0;
  for (const auto& c : cases) bytes += c.size();
  for (auto _ : state) {
    for (const auto& c : cases) benchmark::DoNotOptimize(tok->Encode(c, false));
  }
  state.SetBytesProcessed(int64_t(bytes) * state.iterations());
}

BENCHMARK_CAPTURE(BM_Encode, qwen3, std::string("qwen3"));
BENCHMARK_CAPTURE(BM_Encode, llama3_1, std::string("llama3_1"));
BENCHMARK_CAPTURE(BM_Encode, gemma3, std::string("gemma3"));
BENCHMARK_CAPTURE(BM_Encode, llama2, std::string("llama2"));
BENCHMARK_CAPTURE(BM_Encode, tok512, std::string("tok512"));

}  // namespace
