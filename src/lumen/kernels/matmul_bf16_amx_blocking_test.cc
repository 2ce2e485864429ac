// The cache blocking of the AMX kernels (matmul_bf16_amx.cc,
// matmul_bf16_t_amx.cc) changes no bit of a result: every output is the
// unblocked tile order, one C tile accumulating all of K in the tile unit
// (AmxTileBlock<1, 1> over K's steps, amx_target.h), bit for bit, on shapes
// that cross several K blocks (8 steps of 32), their remainder, and the row
// chunks of both operands. The operands span wide magnitudes so that another
// summation order gives other bits, and each test checks that it would:
// the same tiles summed as two halves of K differ somewhere.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "lumen/core/buffer.h"
#include "lumen/core/half.h"
#include "lumen/kernels/amx_target.h"
#include "lumen/kernels/matmul_bf16.h"
#include "lumen/kernels/matmul_bf16_amx.h"
#include "lumen/kernels/matmul_bf16_t_amx.h"

namespace lumen::kernels {
namespace {

#if defined(LUMEN_AMX_X86)

#define SKIP_WITHOUT_AMX()                                          \
  if (!AmxBf16Usable())                                             \
  GTEST_SKIP() << "AMX-BF16 not usable here (" << AmxBf16Unusable() \
               << "): the kernels under test never run"

// Values of about 2^-8 .. 2^8 times a normal deviate, rounded to bf16: sums
// of them lose different low bits in different orders.
float WideValue(std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  return nd(rng) * std::exp2(std::round(nd(rng) * 3.0f));
}

// One 16 x 16 C tile, unblocked: C = sum over `steps` steps of A (16 rows of
// stride lda, stepping 32) times B (packed tiles stepping 512), one tile
// register accumulating in k order. c_in: the starting tile, or null for 0.
LUMEN_AMX void OneTile(const uint16_t* a, int64_t lda, const uint16_t* b, int64_t steps,
                       const float (*c_in)[16 * 16], float (*c)[16 * 16]) {
  AmxConfigureTiles();
  AmxTileBlock<1, 1>(a, a, lda, b, b, steps, c_in, c);
  AmxReleaseTiles();
}

bool SameBits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

// The unblocked tile of a and b over `steps` steps (c), and the same two
// halves of k summed apart (lo + hi): the order the tests must match, and an
// order they must be able to tell from it.
struct TileOrders {
  alignas(64) float c[1][256], lo[1][256], hi[1][256];
  TileOrders(const uint16_t* a, int64_t lda, const uint16_t* b, int64_t steps) {
    const int64_t half = steps / 2;
    OneTile(a, lda, b, steps, nullptr, c);
    OneTile(a, lda, b, half, nullptr, lo);
    OneTile(a + half * 32, lda, b + half * 512, steps - half, nullptr, hi);
  }
  float Want(int64_t i, int64_t j) const { return c[0][i * 16 + j]; }
  bool SplitDiffers(int64_t i, int64_t j) const {
    return !SameBits(lo[0][i * 16 + j] + hi[0][i * 16 + j], c[0][i * 16 + j]);
  }
};

// The prefill kernel: Y = W X^T tile by tile, Y[m][n0 + i] = C[i][m].
TEST(MatMulBf16AmxBlocking, PanelProductIsTheUnblockedTileOrderBitForBit) {
  SKIP_WITHOUT_AMX();
  std::mt19937 rng(29);
  int split_differs = 0;
  // ld / 32 steps: 9 (one K block and 1), 64 (8 blocks), 67 (8 and 3). rows
  // past 128 cross the weight-row chunk, M past 128 the activation chunk.
  for (int64_t ld : {288, 2048, 2144})
    for (int64_t rows : {16, 40, 128, 161})
      for (int64_t M : {5, 48, 140}) {
        const int64_t prows = (rows + 15) / 16 * 16, n0 = 3, ldy = n0 + rows + 2;
        AlignedBuffer w(prows * ld * sizeof(uint16_t)), x(M * ld * sizeof(uint16_t));
        for (int64_t i = 0; i < prows * ld; ++i) w.as<uint16_t>()[i] = F32ToBF16(WideValue(rng));
        for (int64_t i = 0; i < M * ld; ++i) x.as<uint16_t>()[i] = F32ToBF16(WideValue(rng));
        AlignedBuffer xp(AmxPackedXBytes(M, ld));
        AmxPackX(x.as<uint16_t>(), M, ld, xp.as<uint16_t>());
        std::vector<float> Y(M * ldy, -7.0f);
        AmxBf16PanelProduct(w.as<uint16_t>(), rows, xp.as<uint16_t>(), M, ld, Y.data(), ldy, n0);
        const int64_t kc = ld / 32;
        int bad = 0;
        for (int64_t ib = 0; ib < prows / 16; ++ib)
          for (int64_t mb = 0; mb * 16 < M; ++mb) {
            const uint16_t* a = w.as<uint16_t>() + ib * 16 * ld;
            const uint16_t* b = xp.as<uint16_t>() + mb * kc * 512;
            const TileOrders t(a, ld, b, kc);
            for (int64_t i = 0; i < 16 && ib * 16 + i < rows; ++i)
              for (int64_t j = 0; j < 16 && mb * 16 + j < M; ++j) {
                const float want = t.Want(i, j);
                const float got = Y[(mb * 16 + j) * ldy + n0 + ib * 16 + i];
                split_differs += t.SplitDiffers(i, j);
                if (!SameBits(got, want) && bad++ < 3)
                  ADD_FAILURE() << "ld=" << ld << " rows=" << rows << " M=" << M
                                << " row=" << ib * 16 + i << " m=" << mb * 16 + j << " got " << got
                                << " want " << want;
              }
          }
        for (int64_t m = 0; m < M; ++m)  // outside the panel's rows: untouched
          for (int64_t j : {int64_t(0), n0 - 1, n0 + rows, ldy - 1})
            if (Y[m * ldy + j] != -7.0f && bad++ < 3) ADD_FAILURE() << "wrote outside: m=" << m;
      }
  EXPECT_GT(split_differs, 0) << "the operands do not tell summation orders apart";
}

// The transposed kernel: dX (+)= dY W tile by tile, the C tile of dY rows
// block mb and columns group g stored as it is (added when accumulating).
TEST(MatMulBf16AmxBlocking, TransposedProductIsTheUnblockedTileOrderBitForBit) {
  SKIP_WITHOUT_AMX();
  std::mt19937 rng(31);
  int split_differs = 0;
  // ld / 32 steps: 9, 32 (4 blocks), 35; M past 128 crosses the dY chunk,
  // kn past 256 the group chunk.
  for (int64_t ld : {288, 1024, 1120})
    for (int64_t kn : {16, 70, 300})
      for (int64_t M : {5, 48, 150}) {
        const int64_t groups = (kn + 15) / 16, mr = (M + 15) / 16 * 16, k0 = 1, ldx = k0 + kn + 2;
        std::vector<float> wrows(ld * kn);
        for (float& v : wrows) v = WideValue(rng);
        AlignedBuffer panel(AmxTPanelElems(groups, ld) * sizeof(uint16_t));
        for (int64_t p = 0; p < ld / 2; ++p)
          AmxPackTPair(wrows.data() + 2 * p * kn, wrows.data() + (2 * p + 1) * kn, kn, groups, ld,
                       p, panel.as<uint16_t>());
        AlignedBuffer dyb(mr * ld * sizeof(uint16_t));  // zero-filled: rows past M
        for (int64_t i = 0; i < M * ld; ++i) dyb.as<uint16_t>()[i] = F32ToBF16(WideValue(rng));
        std::vector<float> dX(M * ldx, -7.0f), acc(M * ldx);
        for (float& v : acc) v = WideValue(rng);
        const std::vector<float> prior = acc;
        AmxBf16TPanelProduct(dyb.as<uint16_t>(), M, ld, panel.as<uint16_t>(), kn, dX.data(), ldx,
                             k0, false);
        AmxBf16TPanelProduct(dyb.as<uint16_t>(), M, ld, panel.as<uint16_t>(), kn, acc.data(), ldx,
                             k0, true);
        const int64_t steps = ld / 32;
        int bad = 0;
        for (int64_t mb = 0; mb * 16 < M; ++mb)
          for (int64_t g = 0; g < groups; ++g) {
            const uint16_t* a = dyb.as<uint16_t>() + mb * 16 * ld;
            const uint16_t* b = panel.as<uint16_t>() + g * 16 * ld;
            const TileOrders t(a, ld, b, steps);
            for (int64_t i = 0; i < 16 && mb * 16 + i < M; ++i)
              for (int64_t j = 0; j < 16 && g * 16 + j < kn; ++j) {
                const float want = t.Want(i, j);
                const int64_t at = (mb * 16 + i) * ldx + k0 + g * 16 + j;
                split_differs += t.SplitDiffers(i, j);
                if ((!SameBits(dX[at], want) || !SameBits(acc[at], prior[at] + want)) && bad++ < 3)
                  ADD_FAILURE() << "ld=" << ld << " kn=" << kn << " M=" << M << " m=" << mb * 16 + i
                                << " col=" << g * 16 + j << " got " << dX[at] << " accumulated "
                                << acc[at] << " want " << want;
              }
          }
        for (int64_t m = 0; m < M; ++m)  // outside [k0, k0 + kn): untouched
          for (int64_t col : {int64_t(0), k0 + kn, ldx - 1})
            if ((dX[m * ldx + col] != -7.0f ||
                 !SameBits(acc[m * ldx + col], prior[m * ldx + col])) &&
                bad++ < 3)
              ADD_FAILURE() << "wrote outside: m=" << m << " col=" << col;
      }
  EXPECT_GT(split_differs, 0) << "the operands do not tell summation orders apart";
}

#endif  // LUMEN_AMX_X86

}  // namespace
}  // namespace lumen::kernels
