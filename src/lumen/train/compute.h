// The compute precision of a training step's large products (`lumen train
// --compute auto|f32|bf16`, issue 16; auto, the CLI's default, is AutoCompute).
// f32 (TrainOptions' default) is the exact route: every
// product through kernels::MatMul / MatMulT in f32 (tier L2). bf16 (tier L3)
// rounds the operands of the large products to bf16 and multiplies them with
// AVX512-BF16 `vdpbf16ps`, or on the AMX-BF16 tiles where the CPU has them
// (kernels/matmul_bf16_amx.h, matmul_bf16_t_amx.h; LUMEN_NO_AMX=1 keeps
// AVX512-BF16), summing in f32 (kernels/matmul_bf16.h):
//
//   frozen forward   y = x W^T            kernels::MatMulBf16 (every row count)
//   frozen backward  dx += dy W           kernels::MatMulTBf16
//   head chunks      z = xn W_c^T, dxn += coeff W_c (plain and fused heads)
//   LoRA             u = A x, y += s B u, du = s dy B, dx += du A: each takes
//                    bf16 operands when its reduction length is at least
//                    kLoraBf16MinReduction (A x over K and dy B over N always
//                    in practice; B u and du A reduce over the rank, so they
//                    stay f32 below rank 64: a rank-8 reduction would fill a
//                    quarter of each 32-wide bf16 dot)
//
// Reductions stay f32: softmax, the online logsumexp, norms, the dh and LoRA
// gradient accumulations (dA, dB sum over tokens in f32), the optimizer. The
// double graph (the finite-difference oracle) ignores the option.
// Refused on a CPU without AVX512-BF16 (ValidateCompute).
//
// The bits of ProductKinds select which kinds take bf16 (the option sets all
// of them; the quality tests switch one kind at a time).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "lumen/core/status.h"

namespace lumen::train {

enum class Compute : uint8_t { kF32, kBf16 };
std::string_view ComputeName(Compute c);  // "f32", "bf16"
std::optional<Compute> ParseCompute(std::string_view s);

// Kinds of products, as bits of a mask.
enum ProductKind : uint32_t {
  kFrozenForward = 1u << 0,
  kFrozenBackward = 1u << 1,
  kHeadChunks = 1u << 2,
  kLoraProducts = 1u << 3,
};
inline constexpr uint32_t kAllProductKinds = 0xf;
inline constexpr int64_t kLoraBf16MinReduction = 64;

// The bf16 mask of a compute option.
inline uint32_t Bf16Kinds(Compute c) { return c == Compute::kBf16 ? kAllProductKinds : 0u; }

// An error when this CPU cannot run `c` (bf16 without AVX512-BF16).
Status ValidateCompute(Compute c);

// `--compute auto`: bf16 where the AMX-BF16 tiles run its products (there
// a step measured several times faster than f32 with the same efficacy,
// docs/experiments/compute-precision.md), else f32 (AVX512-BF16 alone was not
// faster), and f32 whenever the run keeps to tiers L1/L2 (--exact, --tier).
Compute AutoCompute(bool low_tier);

}  // namespace lumen::train
