// The memory plan of a training run: what each part of a step holds, the
// predicted peak resident memory, and (--memory-budget) the segment length
// that fits. `lumen train --plan` prints it. The arithmetic mirrors what the
// code allocates (graph.cc's LayerSaved and backward temporaries, the heads'
// buffers, the optimizer state), per token of the largest micro-batch.
#pragma once

#include <cstdint>
#include <string>

#include "lumen/core/status.h"
#include "lumen/model/config.h"
#include "lumen/train/lora.h"

namespace lumen::train {

struct PlanInputs {
  int64_t tokens = 0;       // packed tokens of the largest micro-batch (M)
  int64_t scored = 0;       // scored tokens of it (the head's rows R)
  size_t weight_bytes = 0;  // the model's mapped weights (resident once read)
  size_t baseline = 0;      // the process's anonymous memory before training
  bool fused_ce = true;
  int64_t vocab_chunk = 8192;
  int64_t row_block = 128;
  int segment = 0;        // 0: keep every layer
  int64_t mlp_chunk = 0;  // 0: the FFN over all tokens at once
  bool bf16 = false;      // --compute bf16: the products' transients (compute.h)
  int threads = 1;        // the bf16 routes hold one panel per thread
};

struct MemoryPlan {
  size_t lora = 0;       // parameters, gradients, two Adam moments
  size_t per_layer = 0;  // activations one layer keeps for its backward
  size_t layers = 0;     // all kept layers (or one segment plus boundaries)
  size_t head = 0;       // the head between forward and backward, plus its backward
  size_t transient = 0;  // the largest backward temporaries and hidden/gradient buffers
  size_t peak = 0;       // predicted peak resident bytes
  int segment = 0;
  int64_t mlp_chunk = 0;
  std::string Describe(const model::ModelConfig& c, const PlanInputs& in) const;
};

MemoryPlan PlanMemory(const model::ModelConfig& c, const LoraLayout& layout, const PlanInputs& in);

// The cheapest plan whose predicted peak fits budget_bytes: no lever, then
// segments from the longest (fewest recomputed layers) down to one layer,
// then the same with the MLP in chunks of 256 tokens; or an error with the
// smallest achievable peak.
struct PlanChoice {
  int segment = 0;
  int64_t mlp_chunk = 0;
};
Result<PlanChoice> ChooseSegment(const model::ModelConfig& c, const LoraLayout& layout,
                                 PlanInputs in, size_t budget_bytes);

// Anonymous resident bytes of this process now (VmRSS - RssFile).
size_t AnonymousRss();
// Resident bytes of the executable's and shared libraries' mappings: part of
// the process's baseline (about 12 MB for lumen), not of its weights.
size_t CodeRss();
// This process's peak resident set so far (VmHWM), in MB.
double PeakRssMb();

}  // namespace lumen::train
