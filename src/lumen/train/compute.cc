#include "lumen/train/compute.h"

#include "lumen/core/route.h"
#include "lumen/kernels/matmul_bf16.h"
#include "lumen/kernels/matmul_bf16_amx.h"

namespace lumen::train {

// The products of a training step under --compute (compute.h). f32 is the
// exact route (L2, the kernels' own bounds); bf16 is L3, gated by the
// teacher-forced quality measurement and the efficacy tests.
LUMEN_ROUTE(train_product_f32,
            {.node = "train.product",
             .name = "f32",
             .tier = Tier::kL2,
             .oracle = "MatMulRef (matmul_ref.h) through kernels::MatMul",
             .bound = "relative error per output within the bound of matmul_test.cc",
             .tests = "MatMulTest.EveryTargetDtypeAndShapeWithinBound;Families/"
                      "GradientCheck.FloatRouteWithinBoundOfDouble/*",
             .priority = 10});
LUMEN_ROUTE(
    train_product_bf16,
    {.node = "train.product",
     .name = "bf16",
     .tier = Tier::kL3,
     .oracle = "MatMulBf16Ref (bf16 operands, double sums); against the f32 route: none",
     .bound = "LoRA-gradient and dh cosine and relative error per product kind against f32, "
              "teacher-forced (compute_test.cc)",
     .tests = "MatMulBf16Every.AnyRowCountMatchesOracleAndTheRoute;ComputeQuality.*;"
              "Methods/Bf16Efficacy.*;Bf16SftEfficacy.*",
     .measure = "docs/experiments/compute-precision.md",
     .when = "train.compute=bf16 cpu=avx512bf16",
     .priority = 20});
LUMEN_ROUTE(train_product_t_f32,
            {.node = "train.product_t",
             .name = "f32",
             .tier = Tier::kL2,
             .oracle = "MatMulRef of the transposed product through kernels::MatMulT",
             .bound = "relative error within the bound of matmul_test.cc",
             .tests = "MatMulTest.TransposedWithinBound;Families/"
                      "GradientCheck.FloatRouteWithinBoundOfDouble/*",
             .priority = 10});
LUMEN_ROUTE(
    train_product_t_bf16,
    {.node = "train.product_t",
     .name = "bf16",
     .tier = Tier::kL3,
     .oracle = "MatMulTBf16Ref (bf16 operands, double sums); against the f32 route: none",
     .bound = "(N + 2) 2^-24 sum |dy w| of the oracle (matmul_bf16_t_test.cc); against f32: "
              "the teacher-forced gradient cosine and relative error (compute_test.cc)",
     .tests = "MatMulTBf16.*;MatrixColumns.EqualTheRowsSlices;ComputeQuality.*;Methods/"
              "Bf16Efficacy.*;Bf16SftEfficacy.*",
     .measure = "docs/experiments/compute-precision.md",
     .when = "train.compute=bf16 cpu=avx512bf16",
     .priority = 20});
// The same product on the AMX tiles (kernels/matmul_bf16_t_amx.h) where the
// CPU has them: the same rounding, f32 sums in the same n order per chunk.
LUMEN_ROUTE(
    train_product_t_bf16_amx,
    {.node = "train.product_t",
     .name = "bf16-amx",
     .tier = Tier::kL3,
     .oracle = "MatMulTBf16Ref (bf16 operands, double sums); against the f32 route: none",
     .bound = "(N + 2) 2^-24 sum |dy w| of the oracle, as the AVX512-BF16 kernel "
              "(matmul_bf16_t_test.cc); against f32: the teacher-forced gradient cosine and "
              "relative error (compute_test.cc)",
     .tests = "MatMulTBf16Amx.*;MatMulTBf16.*;MatMulTBf16.WithoutAmx;ComputeQuality.*;Methods/"
              "Bf16Efficacy.*;Bf16SftEfficacy.*",
     .measure = "docs/experiments/compute-precision.md",
     .when = "train.compute=bf16 cpu=amx",
     .priority = 30});
LUMEN_ROUTE(head_chunk_f32,
            {.node = "head.chunk",
             .name = "f32",
             .tier = Tier::kL2,
             .oracle = "the plain head (f32) and finite differences (double)",
             .bound = "log-probs and dh within the relative L2 bound of fused_head_test.cc",
             .tests = "Models/FusedHeadTest.MatchesPlainHeadInF32/*",
             .priority = 10});
LUMEN_ROUTE(head_chunk_bf16,
            {.node = "head.chunk",
             .name = "bf16",
             .tier = Tier::kL3,
             .oracle = "none: the head's logits and dh products with bf16 operands "
                       "(kernels::MatMulBf16 / MatMulTBf16, on the AMX tiles where the CPU has "
                       "them); measured against the f32 head",
             .bound = "dh and LoRA-gradient cosine and relative error, teacher-forced "
                      "(compute_test.cc)",
             .tests = "ComputeQuality.*;Methods/Bf16Efficacy.*;Bf16SftEfficacy.*",
             .measure = "docs/experiments/compute-precision.md",
             .when = "train.compute=bf16 cpu=avx512bf16",
             .priority = 20});
// f32: the rank-r term in the frozen product's epilogue (Graph's default), or
// in a second pass (Phi3's fused q/k/v and gate/up weights, set_lora_epilogue
// off). A x, s dy B, dA and dB are kernel products either way (lora_products.h).
LUMEN_ROUTE(train_lora_f32_epilogue,
            {.node = "train.lora",
             .name = "f32-epilogue",
             .tier = Tier::kL2,
             .oracle = "the unfused f32 order (second pass) and the same graph in double",
             .bound = "LoRA gradients within 1e-5 relative L2 of the unfused order and 1e-4 of "
                      "the double route; per product the bounds of matmul.h",
             .tests = "Families/GradientCheck.LoraEpilogueMatchesUnfusedWithinBound/*;"
                      "MatMulLowRank.*;MatMulTLowRank.*;LoraProducts.*",
             .when = "train.compute=f32",
             .priority = 15});
LUMEN_ROUTE(train_lora_f32,
            {.node = "train.lora",
             .name = "f32",
             .tier = Tier::kL2,
             .oracle = "the same graph in double, finite differences",
             .bound = "relative L2 of LoRA gradients below 1e-4 of the double route",
             .tests = "Families/GradientCheck.FloatRouteWithinBoundOfDouble/*;Families/"
                      "GradientCheck.LoraEpilogueMatchesUnfusedWithinBound/*",
             .priority = 10});
LUMEN_ROUTE(train_lora_bf16,
            {.node = "train.lora",
             .name = "bf16",
             .tier = Tier::kL3,
             .oracle = "none: A x and dy B (reductions of 64 or more) with bf16 operands; "
                       "measured against f32",
             .bound = "LoRA-gradient cosine and relative error, teacher-forced (compute_test.cc)",
             .tests = "ComputeQuality.*;Methods/Bf16Efficacy.*;Bf16SftEfficacy.*",
             .measure = "docs/experiments/compute-precision.md",
             .when = "train.compute=bf16 cpu=avx512bf16",
             .priority = 20});

std::string_view ComputeName(Compute c) { return c == Compute::kBf16 ? "bf16" : "f32"; }

std::optional<Compute> ParseCompute(std::string_view s) {
  if (s == "f32") return Compute::kF32;
  if (s == "bf16") return Compute::kBf16;
  return std::nullopt;
}

Compute AutoCompute(bool low_tier) {
  return !low_tier && kernels::AmxBf16Usable() ? Compute::kBf16 : Compute::kF32;
}

Status ValidateCompute(Compute c) {
  if (c == Compute::kBf16 && !kernels::CpuHasBf16())
    return Error(
        "--compute bf16: this CPU has no AVX512-BF16 (the vdpbf16ps dot products the bf16 "
        "route runs on); use --compute f32");
  return Status::Ok();
}

}  // namespace lumen::train
