// Test helper (engine/ and tests/integration/): random PEFT adapters for a
// base config, written with SaveAdapter, so adapter tests need no training.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "lumen/engine/adapter.h"

namespace lumen::testing_util {

struct RandomAdapterSpec {
  std::vector<int> targets;  // model::LoraTarget values
  int rank = 4;
  float alpha = 8.0f;
  float amplitude = 0.2f;  // A and B uniform in [-amplitude, amplitude]
  uint64_t seed = 1;
  std::string base_model = "stories260K";
};

// An in-memory adapter on every layer for the spec's targets.
inline engine::Adapter RandomAdapter(const model::ModelConfig& c, const RandomAdapterSpec& s) {
  std::mt19937_64 rng(s.seed);
  std::uniform_real_distribution<float> u(-s.amplitude, s.amplitude);
  engine::Adapter a;
  a.rank = s.rank;
  a.alpha = s.alpha;
  a.base_model = s.base_model;
  for (int l = 0; l < c.n_layers; ++l)
    for (int t : s.targets) {
      engine::AdapterPair p;
      p.layer = l;
      p.target = t;
      const auto [N, K] = model::LoraTargetShape(c, t);
      p.n = N;
      p.k = K;
      p.a.resize(size_t(s.rank * K));
      p.b.resize(size_t(N * s.rank));
      for (float& x : p.a) x = u(rng);
      for (float& x : p.b) x = u(rng);
      a.pairs.push_back(std::move(p));
    }
  return a;
}

// Writes RandomAdapter(c, s) into dir; false on failure.
inline bool WriteRandomAdapter(const std::string& dir, const model::ModelConfig& c,
                               const RandomAdapterSpec& s) {
  return engine::SaveAdapter(dir, RandomAdapter(c, s), c).ok();
}

}  // namespace lumen::testing_util
