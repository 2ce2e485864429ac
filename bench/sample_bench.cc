// Time of one Sampler::Sample() at real vocabulary sizes, for the plain chain
// (top-k 40, top-p 0.95, T 0.8), HLG with each pivot, and the control-point
// curve. Target (issue 6): under 0.3 ms per token at V = 128k on one core.
// Logits are a fixed random draw, restored before each call (the sampler edits
// them in place); the restore is excluded from the timing.
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>
#include <vector>

#include "lumen/sample/sampler.h"

namespace lumen::sample {
namespace {

std::vector<float> BenchLogits(size_t v) {
  std::mt19937_64 gen(1);
  std::normal_distribution<float> nd(0.0f, 2.5f);
  std::vector<float> x(v);
  for (float& f : x) f = nd(gen);
  return x;
}

void Run(benchmark::State& state, const SamplerConfig& c) {
  const auto v = static_cast<size_t>(state.range(0));
  const auto base = BenchLogits(v);
  std::vector<float> x = base;
  std::vector<int32_t> history(256);
  for (size_t i = 0; i < history.size(); ++i) history[i] = static_cast<int32_t>((i * 7919) % v);
  Sampler s(c);
  for (auto _ : state) {
    state.PauseTiming();
    std::memcpy(x.data(), base.data(), v * sizeof(float));
    state.ResumeTiming();
    benchmark::DoNotOptimize(s.Sample(x, history));
  }
  state.SetItemsProcessed(state.iterations());
}

SamplerConfig Seeded() {
  SamplerConfig c;
  c.seed = 1;
  return c;
}

void BM_Plain(benchmark::State& state) {
  SamplerConfig c = Seeded();
  c.top_k = 40;
  c.top_p = 0.95;
  c.temperature = 0.8;
  c.repetition_penalty = 1.1;
  Run(state, c);
}

void BM_PlainFullVocabT1(benchmark::State& state) { Run(state, Seeded()); }

void Hlg(benchmark::State& state, HlgPivot pivot) {
  SamplerConfig c = Seeded();
  c.temperature = 0.8;
  c.hlg.enabled = true;
  c.hlg.pivot = pivot;
  Run(state, c);
}
void BM_HlgTop(benchmark::State& state) { Hlg(state, HlgPivot::kTop); }
void BM_HlgEntropy(benchmark::State& state) { Hlg(state, HlgPivot::kEntropy); }
void BM_HlgMedian(benchmark::State& state) { Hlg(state, HlgPivot::kMedian); }

void BM_Curve(benchmark::State& state) {
  SamplerConfig c = Seeded();
  c.curve = {true, {{0.01, 0.005}, {1, 1.5}, {10, 12}, {50, 48}, {100, 100}}, false};
  Run(state, c);
}

#define LUMEN_VOCABS ->Arg(32000)->Arg(128256)->Arg(262144)->Unit(benchmark::kMicrosecond)
BENCHMARK(BM_Plain) LUMEN_VOCABS;
BENCHMARK(BM_PlainFullVocabT1) LUMEN_VOCABS;
BENCHMARK(BM_HlgTop) LUMEN_VOCABS;
BENCHMARK(BM_HlgEntropy) LUMEN_VOCABS;
BENCHMARK(BM_HlgMedian) LUMEN_VOCABS;
BENCHMARK(BM_Curve) LUMEN_VOCABS;

}  // namespace
}  // namespace lumen::sample
