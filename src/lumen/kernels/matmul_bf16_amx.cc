#include "lumen/kernels/matmul_bf16_amx.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "lumen/core/check.h"
#include "lumen/core/log.h"
#include "lumen/core/route.h"
#include "lumen/kernels/matmul_bf16.h"

#include "lumen/kernels/amx_target.h"
#include "lumen/kernels/intrinsics_warnings.h"
#include "lumen/kernels/transpose16_avx512.h"

#if defined(LUMEN_AMX_X86)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

// Blocking: four C tiles (2 blocks of 16 weight rows x 2 blocks of 16
// activation rows), two A tiles (weight rows, loaded straight from the bf16
// panel) and two B tiles (packed activations): per 32 columns of K, 4 tile
// loads feed 4 `tdpbf16ps`, and all 8 tile registers are in use. Each output
// sums K in order, 32 columns per instruction, whatever block it falls in
// (a K block continues the C tiles of the previous one exactly), so neither
// the thread split, M's remainder nor the cache blocking below changes a
// result (MatMulBf16AmxBlocking.*).

namespace lumen::kernels {

LUMEN_ROUTE(matmul_bf16_amx_prefill,
            {.node = "matmul.prefill",
             .name = "bf16-amx",
             .tier = Tier::kL3,
             .oracle = "MatMulBf16Ref (both operands rounded to bf16, double accumulation); "
                       "as a replacement of the exact product: no oracle",
             .bound = "the bf16 route's bound against MatMulBf16Ref (matmul_bf16_test.cc); "
                      "KL(exact || route) below a quarter of what Q8_0 weights cost",
             .tests = "MatMulBf16Amx.*;MatMulBf16.RouteSelectionAndThreads;RouteKl."
                      "Bf16PrefillPassesTheDefaultGate",
             .measure = "docs/reference/performance.md#amx-prefill",
             .when = "act=bf16|int8+bf16|int8x2+bf16 cpu=amx",
             .priority = 30});

#if defined(LUMEN_AMX_X86)

LUMEN_INTRINSICS_BEGIN

namespace {

constexpr int kArchReqXcompPerm = 0x1023;  // arch_prctl: request an XSAVE feature
constexpr int kXfeatureXtiledata = 18;

// CPUID leaf 7: EDX bit 22 AMX-BF16, bit 24 AMX-TILE; XCR0 bits 17 and 18
// (XTILECFG, XTILEDATA) say the OS manages the tile state.
bool CpuidHasAmxBf16() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(1, 0, &a, &b, &c, &d) || !(c & (1u << 27))) return false;  // OSXSAVE
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  if (!(d & (1u << 22)) || !(d & (1u << 24))) return false;
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & (3u << 17)) == (3u << 17);
}

// Decided once per process: "" when usable, else the reason.
const char* Decide() {
  if (const char* e = std::getenv("LUMEN_NO_AMX"); e && *e && std::strcmp(e, "0") != 0)
    return "LUMEN_NO_AMX is set";
  if (!CpuidHasAmxBf16()) return "this CPU has no AMX-BF16 tiles (or the OS does not enable them)";
  if (!CpuHasBf16()) return "this CPU has no AVX512-BF16 (needed to round the operands)";
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) {
    LUMEN_LOG_WARN(
        "AMX: the kernel refused the tile state (arch_prctl ARCH_REQ_XCOMP_PERM): the bf16 "
        "prefill uses AVX512-BF16");
    return "the kernel refused the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM)";
  }
  return "";
}

const char* Reason() {
  static const char* const reason = Decide();  // fixed for the process; thread-safe init
  return reason;
}

// The tile configuration (palette 1): every tile 16 rows of 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

TileConfig FullTiles() {
  TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.colsb[t] = 64;
    c.rows[t] = 16;
  }
  return c;
}

// A C tile stored at c ([16 weight rows][16 activation rows], f32) into Y,
// transposed: Y[(m0 + j) * ldy + n + i] = c[i][j] (+= with accumulate) for
// j < mv, i < nv.
LUMEN_AVX512 inline void StoreTransposed(const float* c, float* Y, int64_t ldy, int64_t m0,
                                         int64_t n, int mv, int nv, bool accumulate) {
  __m512i r[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_load_si512(c + 16 * i);
  Transpose16x16(r);
  const __mmask16 keep = static_cast<__mmask16>((1u << nv) - 1);
  for (int j = 0; j < mv; ++j) {
    float* y = Y + (m0 + j) * ldy + n;
    __m512 v = _mm512_castsi512_ps(r[j]);
    if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(keep, y));
    _mm512_mask_storeu_ps(y, keep, v);
  }
}

// The cache blocking, chosen by measurement (docs/experiments/
// compute-precision.md, "AMX kernels blocked for the cache"): K in blocks of
// 8 steps (256 columns), the activations 8 blocks (128 rows) and the weight
// rows 8 blocks at a time. Within a K block, one pair of activation blocks
// (2 B tiles x 8 steps, 16 KiB) stays in L1 while the chunk's weight-row
// pairs stream past it from L2, where their K slice (64 KiB) is reused by
// every activation pair of the chunk; the chunk's C tiles (at most 4 x 4
// pairs of pairs, 64 KiB) wait in scratch between K blocks. Unblocked, each
// block streamed both operands' full K: at K = 2048, M = 512 the packed
// activations (2 MiB) were read from beyond L2 once per weight-row pair.
constexpr int64_t kKSteps = 8;
constexpr int64_t kRowBlocks = 8;
constexpr int64_t kMBlocks = 8;

// NA weight-row blocks (at panel row i) x NB activation blocks (from block
// mb), over the K steps [k, k + steps) of kc: the C tiles continue from acc
// unless k = 0, and go back to acc unless the steps end K, where they are
// transposed into Y.
template <int NA, int NB>
LUMEN_AMX void Block(const uint16_t* panel, int64_t ld, const uint16_t* xpacked, int64_t kc,
                     int64_t k, int64_t steps, float (*acc)[16 * 16], int64_t i, int64_t mb,
                     int64_t rows, int64_t M, float* Y, int64_t ldy, int64_t n0, bool accumulate) {
  const uint16_t* a0 = panel + i * ld + k * 32;
  const uint16_t* b0 = xpacked + (mb * kc + k) * 512;
  const bool last = k + steps == kc;
  alignas(64) float c[4][16 * 16];
  AmxTileBlock<NA, NB>(a0, a0 + kAmxRows * ld, ld, b0, b0 + kc * 512, steps, k == 0 ? nullptr : acc,
                       last ? c : acc);
  if (!last) return;
  auto count = [](int64_t left) { return static_cast<int>(left < 16 ? left : 16); };
  const int64_t m0 = mb * kAmxRows, m1 = m0 + kAmxRows;
  const int nv0 = count(rows - i), mv0 = count(M - m0);
  StoreTransposed(c[0], Y, ldy, m0, n0 + i, mv0, nv0, accumulate);
  if constexpr (NB == 2) StoreTransposed(c[1], Y, ldy, m1, n0 + i, count(M - m1), nv0, accumulate);
  if constexpr (NA == 2) {
    const int nv1 = count(rows - i - kAmxRows);
    StoreTransposed(c[2], Y, ldy, m0, n0 + i + kAmxRows, mv0, nv1, accumulate);
    if constexpr (NB == 2)
      StoreTransposed(c[3], Y, ldy, m1, n0 + i + kAmxRows, count(M - m1), nv1, accumulate);
  }
}

// Block for the weight-row blocks a (and a + 1 when two_a) and the
// activation blocks b (and b + 1 when two_b).
LUMEN_AMX inline void BlockAt(bool two_a, bool two_b, const uint16_t* panel, int64_t ld,
                              const uint16_t* xpacked, int64_t kc, int64_t k, int64_t steps,
                              float (*acc)[16 * 16], int64_t a, int64_t b, int64_t rows, int64_t M,
                              float* Y, int64_t ldy, int64_t n0, bool accumulate) {
  const int64_t i = a * kAmxRows;
  if (two_a && two_b)
    Block<2, 2>(panel, ld, xpacked, kc, k, steps, acc, i, b, rows, M, Y, ldy, n0, accumulate);
  else if (two_a)
    Block<2, 1>(panel, ld, xpacked, kc, k, steps, acc, i, b, rows, M, Y, ldy, n0, accumulate);
  else if (two_b)
    Block<1, 2>(panel, ld, xpacked, kc, k, steps, acc, i, b, rows, M, Y, ldy, n0, accumulate);
  else
    Block<1, 1>(panel, ld, xpacked, kc, k, steps, acc, i, b, rows, M, Y, ldy, n0, accumulate);
}

}  // namespace

bool AmxBf16Usable() { return *Reason() == '\0'; }
const char* AmxBf16Unusable() { return Reason(); }

int64_t AmxPackedXBytes(int64_t M, int64_t ld) {
  return (M + kAmxRows - 1) / kAmxRows * kAmxRows * ld * 2;
}

LUMEN_AVX512 void AmxPackX(const uint16_t* xb, int64_t M, int64_t ld, uint16_t* packed) {
  LUMEN_CHECK(ld % kBf16RowAlign == 0);
  const int64_t kc = ld / 32, blocks = (M + kAmxRows - 1) / kAmxRows;
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t c = 0; c < kc; ++c) {
      // Rows m of 16 pairs (32-bit) each; their transpose is the B tile.
      __m512i r[16];
      for (int64_t m = 0; m < 16; ++m) {
        const int64_t row = b * kAmxRows + m;
        r[m] = row < M ? _mm512_load_si512(xb + row * ld + c * 32) : _mm512_setzero_si512();
      }
      Transpose16x16(r);
      uint16_t* tile = packed + (b * kc + c) * 512;
      for (int p = 0; p < 16; ++p) _mm512_store_si512(tile + p * 32, r[p]);
    }
}

LUMEN_AMX void AmxBf16PanelProduct(const uint16_t* panel, int64_t rows, const uint16_t* xpacked,
                                   int64_t M, int64_t ld, float* Y, int64_t ldy, int64_t n0,
                                   bool accumulate) {
  LUMEN_CHECK(ld % kBf16RowAlign == 0);
  if (rows <= 0 || M <= 0) return;
  const int64_t kc = ld / 32;
  const int64_t nblocks = (rows + kAmxRows - 1) / kAmxRows;
  const int64_t mblocks = (M + kAmxRows - 1) / kAmxRows;
  // K is split only where a chunk has more than one weight-row pair to reuse
  // the activations' K slice: otherwise splitting buys nothing and costs the
  // C tiles' trips through scratch.
  const int64_t rpairs = (std::min(nblocks, kRowBlocks) + 1) / 2;
  const int64_t mpairs = (std::min(mblocks, kMBlocks) + 1) / 2;
  TileScratch acc(kc > kKSteps && nblocks > 2 ? rpairs * mpairs * 4 : 0);
  AmxConfigureTiles();
  for (int64_t r0 = 0; r0 < nblocks; r0 += kRowBlocks) {
    const int64_t r1 = std::min(nblocks, r0 + kRowBlocks);
    const int64_t kb = r1 - r0 > 2 ? kKSteps : kc;
    for (int64_t m0 = 0; m0 < mblocks; m0 += kMBlocks) {
      const int64_t m1 = std::min(mblocks, m0 + kMBlocks);
      for (int64_t k = 0; k < kc; k += kb) {
        const int64_t steps = std::min(kb, kc - k);
        for (int64_t b = m0; b < m1; b += 2)
          for (int64_t a = r0; a < r1; a += 2) {
            float(*tiles)[16 * 16] =
                acc.tiles() ? acc.tiles() + ((a - r0) / 2 * mpairs + (b - m0) / 2) * 4 : nullptr;
            BlockAt(a + 1 < r1, b + 1 < m1, panel, ld, xpacked, kc, k, steps, tiles, a, b, rows, M,
                    Y, ldy, n0, accumulate);
          }
      }
    }
  }
  AmxReleaseTiles();
}

LUMEN_AMX void AmxConfigureTiles() {
  static const TileConfig kConfig = FullTiles();
  _tile_loadconfig(&kConfig);
}

// Smaller context switches while no tile work runs.
LUMEN_AMX void AmxReleaseTiles() { _tile_release(); }

LUMEN_INTRINSICS_END

#else  // no x86 Linux: the variant is never taken, so these are never called

bool AmxBf16Usable() { return false; }
const char* AmxBf16Unusable() { return "AMX needs x86-64 Linux"; }
int64_t AmxPackedXBytes(int64_t M, int64_t ld) { return (M + 15) / 16 * 16 * ld * 2; }
void AmxPackX(const uint16_t*, int64_t, int64_t, uint16_t*) { LUMEN_CHECK(false); }
void AmxBf16PanelProduct(const uint16_t*, int64_t, const uint16_t*, int64_t, int64_t, float*,
                         int64_t, int64_t, bool) {
  LUMEN_CHECK(false);
}
void AmxConfigureTiles() { LUMEN_CHECK(false); }
void AmxReleaseTiles() { LUMEN_CHECK(false); }

#endif

}  // namespace lumen::kernels
