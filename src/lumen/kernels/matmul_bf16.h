// The bf16 route of MatMul's prefill (tier L3): for products with more than
// 4 activation rows, the activation rows and each decoded weight row are
// rounded to bf16 (nearest even) and dotted by AVX512-BF16 `vdpbf16ps`
// (32 products per instruction, summed in f32 lanes).
//
// Why: the exact route spends one f32 FMA per weight per activation row and
// reaches about half of the f32 FMA peak; `vdpbf16ps` does twice the products
// per instruction. The cost is two roundings per product (relative error at
// most 2^-8 per term), below what Q8_0 weights cost; `lumen eval route`
// reports the KL against the exact route.
//
// Used by MatMul when RouteHasBf16(W.route), the CPU has AVX512-BF16 and
// M > 4 (and, with kInt8Bf16, the int8 route does not take the product first),
// unless the CPU has AMX-BF16 tiles: then matmul_bf16_amx.h takes the product
// with the same rounding.
// Every weight storage works: the weight rows come from the same decoders as
// the exact route. MatMulBf16Ref (matmul_bf16_ref.h) is the scalar oracle.
#pragma once

#include <cstdint>

#include "lumen/kernels/matrix.h"

namespace lumen::kernels {

// Rows of the bf16 operands are padded with zeros to a multiple of this.
inline constexpr int64_t kBf16RowAlign = 32;

// True when this CPU has AVX512-BF16 (and AVX512F/BW).
bool CpuHasBf16();

// True when the bf16 route is the faster prefill on this CPU, so the default
// route preset takes it (cli/routes.cc): AMX-BF16 tiles usable
// (matmul_bf16_amx.h), or AVX512-BF16 on an AMD CPU, whose `vdpbf16ps` runs
// at 1.8-1.9x the f32 FMA rate (Zen 5). On an Intel Xeon without AMX it runs
// at 0.5x, and the exact GEMM is the faster prefill
// (docs/reference/performance.md, session 39).
bool Bf16PrefillPays();

// True when MatMul takes a product of M rows of W by this route (when the
// int8 route does not take it first: UsesInt8Route in matmul_q8.h).
inline bool UsesBf16Route(const Matrix& W, int64_t M) {
  return M > 4 && RouteHasBf16(W.route) && CpuHasBf16();
}

// dst[0, n) = bf16(src[0, n)) rounded to nearest even; dst[n, padded) = 0.
// Requires CpuHasBf16().
void ToBf16Padded(const float* src, int64_t n, int64_t padded, uint16_t* dst);

// Y[m * ldy + n0 + i] = sum_k xb[m * ld + k] * panel[i * ld + k] for m < M, i < rows,
// accumulated in f32. ld is a multiple of kBf16RowAlign; panel holds rows rounded
// up to a multiple of 4 (rows past `rows` are read, never stored: any finite
// values). Both operands 64-byte aligned. Requires CpuHasBf16().
// accumulate: Y[...] += the sum (one f32 add per output) instead of Y = it.
void Bf16PanelProduct(const uint16_t* panel, int64_t rows, const uint16_t* xb, int64_t M,
                      int64_t ld, float* Y, int64_t ldy, int64_t n0, bool accumulate = false);

}  // namespace lumen::kernels
