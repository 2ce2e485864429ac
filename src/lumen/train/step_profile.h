// Where a training step's time goes, for `lumen bench train`: wall seconds
// per phase, summed over steps, and the useful FLOPs of the step's products,
// attention and head (what one forward and backward needs; segment and MLP
// chunk recomputation, and the backward's recomputed scores and logits, are
// not counted, so FLOP/s compare configurations doing the same work).
//
// Phases are timed at their outermost calls, so they do not overlap: head
// (forward, objective, backward), attention (the kernels), products (frozen
// and LoRA), norms (RMS norms and their backward), optimizer (gradient norm
// and AdamW). The rest of the step (embedding, rope, residual adds, copies)
// is total minus their sum.
#pragma once

#include <chrono>
#include <cstdint>

namespace lumen::train {

struct StepProfile {
  double total_s = 0, head_s = 0, attention_s = 0, products_s = 0, norms_s = 0, optimizer_s = 0;
  double head_flops = 0, attention_flops = 0, product_flops = 0;
  int64_t steps = 0;
};

// Adds the seconds of its lifetime to *acc; a null acc times nothing.
class PhaseTimer {
 public:
  explicit PhaseTimer(double* acc) : acc_(acc) {
    if (acc_) t0_ = std::chrono::steady_clock::now();
  }
  ~PhaseTimer() {
    if (acc_)
      *acc_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

 private:
  double* acc_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace lumen::train
