// The AMX-BF16 variant of the bf16 prefill route (tier L3, same numerics
// class as matmul_bf16.h: both operands rounded to bf16, f32 accumulation):
// the panel product runs on the AMX tile unit (`tdpbf16ps`, 16 x 16 x 32
// products per instruction, 8x the products of an AVX-512 `vdpbf16ps`).
//
// Shape of the product: a tile instruction computes C[16, 16] += A[16, 32] *
// B[32, 16] where B must be in the "VNNI pair" layout (row r of the B tile
// holds elements 2r and 2r + 1 of K for each of 16 columns). The weight panel
// rows are already [rows, K] bf16, which is exactly the A layout, so the
// weights are loaded as they are decoded and the activations (M rows, the
// smaller operand of a prefill chunk) are the ones repacked, once per call:
// C = W X^T, and each 16 x 16 C tile is transposed into Y on the way out.
//
// Used by MatMul's bf16 route (kernels/matmul.cc) when AmxBf16Usable() and
// M >= kAmxMinRows; otherwise the AVX512-BF16 kernel runs. The training's
// transposed bf16 product has its own tile kernel (matmul_bf16_t_amx.h) on
// the same permission and configuration. MatMulBf16Ref (matmul_bf16_ref.h) is
// the oracle of both prefill kernels.
//
// Linux hands out the tile state only on request (arch_prctl
// ARCH_REQ_XCOMP_PERM for XTILEDATA); AmxBf16Usable() asks once per process.
// LUMEN_NO_AMX=1 in the environment (read once) turns the variant off, for
// comparisons.
#pragma once

#include <cstdint>

namespace lumen::kernels {

// Products with at least this many activation rows take the AMX kernel:
// every product of the bf16 route (M > 4). Even at M = 5 the tiles win (a
// 2048 x 2048 Q4_0 product: 0.51 ms against 0.78 ms for AVX512-BF16, one
// thread), because decoding the weight panel costs the same on both and the
// tiles' share is small; docs/reference/performance.md#amx-prefill.
inline constexpr int64_t kAmxMinRows = 5;

// Tile edge: 16 rows of weights or activations per tile.
inline constexpr int64_t kAmxRows = 16;

// True when the CPU has AMX-TILE and AMX-BF16 (CPUID), AVX512-BF16, the
// kernel granted this process the tile state, and LUMEN_NO_AMX is unset or
// "0". Decided once per process; a refusal is logged once (warn).
bool AmxBf16Usable();

// The reason AmxBf16Usable() is false ("" when true): for test skips and logs.
const char* AmxBf16Unusable();

// Loads this thread's tile configuration: palette 1, the 8 tiles each 16
// rows of 64 bytes (every AMX kernel of lumen uses full tiles and pads its
// operands instead). AmxReleaseTiles() hands the tile state back; call it
// when the tile work of a call is done. Both require AmxBf16Usable().
void AmxConfigureTiles();
void AmxReleaseTiles();

// Bytes of the packed activations for M rows of ld bf16 (M rounded up to 16).
int64_t AmxPackedXBytes(int64_t M, int64_t ld);

// Packs xb [M, ld] (bf16, stride ld, a multiple of kBf16RowAlign) into the
// B-tile layout: for each block of 16 rows and each 32 columns of K, a 1 KiB
// tile whose row r holds (x[m][2r], x[m][2r + 1]) for m = 0..15. Rows past M
// are zero. packed: AmxPackedXBytes(M, ld) bytes, 64-byte aligned. Requires
// AmxBf16Usable().
void AmxPackX(const uint16_t* xb, int64_t M, int64_t ld, uint16_t* packed);

// Y[m * ldy + n0 + i] = sum_k xb[m][k] * panel[i * ld + k] for m < M, i < rows,
// accumulated in f32 by the tile unit (Y overwritten; accumulate: one f32 add
// of the tile's sum to Y per output, as Bf16PanelProduct's). panel: rows rounded up
// to a multiple of 16 (rows past `rows` are read, never stored), stride ld,
// 64-byte aligned; xpacked from AmxPackX. Blocked for the cache (K in
// 256-column blocks, with up to 64 KiB of f32 scratch per call holding the C
// tiles between them); the bits are those of one C tile summing all of K in
// order. Configures this thread's tiles and releases them before returning.
// Requires AmxBf16Usable().
void AmxBf16PanelProduct(const uint16_t* panel, int64_t rows, const uint16_t* xpacked, int64_t M,
                         int64_t ld, float* Y, int64_t ldy, int64_t n0, bool accumulate = false);

}  // namespace lumen::kernels
