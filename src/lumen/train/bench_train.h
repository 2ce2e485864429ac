// `lumen bench train`: step time and peak resident memory of a preference
// training step under each memory lever (issue 15) on a synth model at real
// widths, each configuration in its own child process so its peak RSS is its
// own. Prints one table row per (sequence length, configuration) with the
// ratios to the plain path measured in the same run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lumen/core/status.h"

namespace lumen::train {

struct TrainBenchOptions {
  std::string model;  // empty: synth llama-3.2-1b widths with `layers` layers
  int layers = 2;
  std::string method = "orpo";
  std::vector<int64_t> seqs = {512};  // tokens per sequence (prompt half, response half)
  std::vector<std::string> configs = {"plain",   "fused-ce",  "prefix-share",
                                      "segment", "mlp-chunk", "all"};
  int steps = 1;  // measured steps per configuration (after none warm)
  int threads = 0;
  bool plan_only = false;  // predicted peaks from the memory plan, no training
  // --compute: the products' precision (compute.h): f32, bf16, or auto
  // (AutoCompute: what `lumen train` runs by default on this CPU).
  std::string compute = "f32";
};

// Runs the benchmark and returns the printed table (markdown).
Result<std::string> RunTrainBench(const TrainBenchOptions& o);

}  // namespace lumen::train
