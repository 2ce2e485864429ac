// Rng: the sampler's random source. xoshiro256** (Blackman & Vigna) seeded by
// expanding one 64-bit seed through splitmix64, so a seed names one stream.
//
// Contract: each Sampler owns one Rng; the same seed gives the same sequence on
// every platform (only integer ops; NextDouble uses the top 53 bits), which is
// what makes a run reproducible regardless of what else runs in the process.
#pragma once

#include <cstdint>

namespace lumen::sample {

// splitmix64 step: also useful on its own to derive per-lane seeds.
inline uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

class Rng {
 public:
  explicit Rng(uint64_t seed = 0) { Seed(seed); }

  void Seed(uint64_t seed) {
    uint64_t sm = seed;
    for (uint64_t& w : s_) w = SplitMix64(sm);
  }

  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, 1) with 53 random bits; never returns 1.
  double NextDouble() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace lumen::sample
