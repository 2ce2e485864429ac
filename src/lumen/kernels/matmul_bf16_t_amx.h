// The AMX-BF16 kernel of the bf16 transposed product (tier L3, the numerics
// class of matmul_bf16_t.h: both operands rounded to bf16 nearest even, the
// exact products summed in f32): dX[M, kn] (+)= dY[M, N] W[N, kn] for one
// column block of W, on the tile unit (`tdpbf16ps`, C[16, 16] += A[16, 32]
// B[32, 16]).
//
// Shape: dY's rows, rounded to bf16, are the A tiles as they are (16 rows of
// 32 consecutive n), so the reduction runs over W's rows n and the B tiles
// need W in the VNNI pair layout: row p of a B tile holds (W[2p][k],
// W[2p + 1][k]) for 16 consecutive columns k. AmxPackTPair writes that
// layout straight from two decoded f32 rows (rounding them on the way), so
// the panel is built without a scalar transpose. The C tiles come out as
// [16 rows of dX, 16 columns], the layout of dX itself: no transpose on the
// way out either (unlike the prefill kernel, matmul_bf16_amx.h).
//
// Used by MatMulTBf16 (matmul_bf16_t.cc) when AmxBf16Usable() and M >=
// kAmxTMinRows; the tile permission, configuration and LUMEN_NO_AMX are the
// prefill kernel's (matmul_bf16_amx.h). MatMulTBf16Ref (matmul_bf16_ref.h)
// is the oracle; matmul_bf16_t_test.cc states and tests the bound.
#pragma once

#include <cstdint>

namespace lumen::kernels {

// Transposed products with at least this many rows of dY take the tiles.
// Measured (docs/experiments/compute-precision.md, "With AMX tiles in the
// backward and the head"): even at M = 5 (dY padded to 16 rows) the tiles
// win by 13x or more, because building the VNNI panel is vectorized where the
// AVX512-BF16 path transposes W element by element, a cost that does not
// shrink with M.
inline constexpr int64_t kAmxTMinRows = 5;

// Columns of W per group: one B tile is 16 columns wide.
inline constexpr int64_t kAmxTGroup = 16;

// Elements of a VNNI panel of `groups` 16-column groups and `rows` rows of W
// (rows a multiple of 32, the reduction step of one tile instruction).
inline int64_t AmxTPanelElems(int64_t groups, int64_t rows) { return groups * kAmxTGroup * rows; }

// Writes the pair p of a panel: rows 2p (r0) and 2p + 1 (r1) of the chunk,
// columns [0, kn) of the decoded f32 rows, rounded to bf16 (nearest even),
// into every group; columns [kn, 16 groups) are zero, and so is a null row.
// Group g of the panel starts at element g * 16 * rows; pair p of it is the
// 32 elements at + 32 p. Requires AmxBf16Usable().
void AmxPackTPair(const float* r0, const float* r1, int64_t kn, int64_t groups, int64_t rows,
                  int64_t p, uint16_t* panel);

// The same from two rows stored as f16 (any alignment): converted exactly
// to f32 by `vcvtph2ps`, then rounded as above. The driver's path for f16
// weights, whose scalar decode would otherwise cost as much as the tiles.
void AmxPackTPairF16(const uint16_t* h0, const uint16_t* h1, int64_t kn, int64_t groups,
                     int64_t rows, int64_t p, uint16_t* panel);

// dX[m * ldx + k0 + j] = sum_{n < ld} dyb[m * ld + n] * W(n, j) for m < M,
// j < kn (W(n, j) as packed in `panel`, rows = ld), summed in f32 by the tile
// unit, 32 n per instruction in increasing n; accumulate: dX += that sum (one
// f32 add per output). dyb: bf16 rows of stride ld (a multiple of 32), with M
// rounded up to 16 rows readable (rows past M: zero). Blocked for the cache
// (n in 256-row blocks, with up to 128 KiB of f32 scratch per call holding
// the C tiles between them) without changing a bit. Configures this
// thread's tiles and releases them before returning. Requires AmxBf16Usable().
void AmxBf16TPanelProduct(const uint16_t* dyb, int64_t M, int64_t ld, const uint16_t* panel,
                          int64_t kn, float* dX, int64_t ldx, int64_t k0, bool accumulate);

}  // namespace lumen::kernels
