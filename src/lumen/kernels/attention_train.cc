// The fast float route of the training attention (attention_train.h):
// tiled, vectorized (Highway, dispatched at run time), parallel on a
// ThreadPool. Same semantics as the scalar templates, which stay the oracle.
//
// Layout. A work unit takes one kv head and a tile of query tokens; the
// group's query heads are stacked as rows r = t * group + g (a multiple of 16
// rows). Scores are held transposed, [keys][rows], so the softmax max, sum
// and factors run along vector lanes and the products are small GEMMs with
// broadcast A operands and row-major B panels (no horizontal reductions).
// Key tiles of kBk keys cover the union of the tile's key ranges; a tile no
// token sees is skipped, a token that sees only part of a tile (range edges,
// windows, block masks) gets -inf scores there.
//
// Forward: two passes over the tile's scores, kept in a [span][rows] buffer:
// the exact row max, then sum = sum_j exp(s_j - max) and o = sum_j
// exp(s_j - max) v_j / sum, lse = max + log(sum). Every row's sums run
// sequentially over packed key indices (masked keys add exact zeros), so a
// row's output depends only on its visible keys in order, not on which other
// rows share its tile: a prefix-shared rejected row matches its two-forward
// twin bit for bit, and results do not depend on thread count or timing.
//
// Backward (flash-attention-2 scheme): per kv head, query tiles outer, key
// tiles inner; each tile pair recomputes P from the saved lse, then dP = dO
// V^T, dS = P (dP - rowsum(dO o)) (softcap: times 1 - (s / cap)^2), and
// accumulates dV += P^T dO, dK += scale dS^T Q (per-unit [M, Dh] buffers)
// and dQ += scale dS K (per query tile). One unit owns a kv head's dK, dV
// and its query heads' dQ, so units never write the same memory and the
// arithmetic order is fixed: deterministic on any thread count. Parallelism
// is over kv heads (a unit of work per kv head).
#include "lumen/kernels/attention_train.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "lumen/core/check.h"
#include "lumen/core/route.h"
#include "lumen/core/thread_pool.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "lumen/kernels/attention_train.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
// clang-format off
#include <hwy/contrib/math/math-inl.h>  // per-target; must follow highway.h
// clang-format on

#include "lumen/kernels/attention-inl.h"

#ifndef LUMEN_KERNELS_ATTENTION_TRAIN_CC_ONCE
#define LUMEN_KERNELS_ATTENTION_TRAIN_CC_ONCE
namespace lumen::kernels::attention_train_detail {

inline constexpr int kBk = 64;  // keys per tile

// Query tokens per tile: at least 64 stacked rows, always a multiple of 16.
inline int TokensPerTile(int group) { return 16 * ((4 + group - 1) / group); }

struct FastArgs {
  TrainAttentionShape s;
  const float *q = nullptr, *k = nullptr, *v = nullptr;
  const int32_t* pos = nullptr;
  const KeyRanges* vis = nullptr;
  int64_t M = 0;
  float* out = nullptr;  // forward's outputs
  float* lse = nullptr;
  const float *saved_out = nullptr, *saved_lse = nullptr, *dout = nullptr;  // backward's inputs
  float *dq = nullptr, *dk = nullptr, *dv = nullptr;
};

enum class Sees : uint8_t { kNone, kAll, kPart };

// How token i sees keys [j0, j1).
inline Sees Classify(const FastArgs& a, int64_t i, int64_t j0, int64_t j1) {
  const KeyRanges& r = a.vis[i];
  bool any = false, all = false;
  for (int n = 0; n < r.n; ++n) {
    const int64_t lo = std::max<int64_t>(r.r[n].begin, j0), hi = std::min<int64_t>(r.r[n].end, j1);
    if (lo < hi) {
      any = true;
      all = all || (lo == j0 && hi == j1);
    }
  }
  if (!any) return Sees::kNone;
  return all && a.s.window <= 0 ? Sees::kAll : Sees::kPart;
}

inline bool Visible(const FastArgs& a, int64_t i, int64_t j) {
  const KeyRanges& r = a.vis[i];
  bool in = false;
  for (int n = 0; n < r.n; ++n) in = in || (j >= r.r[n].begin && j < r.r[n].end);
  return in && (a.s.window <= 0 || int64_t(a.pos[i]) - a.pos[j] < a.s.window);
}

// The union [kb, ke) of the key ranges of tokens [t0, t1); kb >= ke if none.
inline void KeySpan(const FastArgs& a, int64_t t0, int64_t t1, int64_t& kb, int64_t& ke) {
  kb = std::numeric_limits<int64_t>::max();
  ke = 0;
  for (int64_t i = t0; i < t1; ++i)
    for (int n = 0; n < a.vis[i].n; ++n) {
      const KeyRange& r = a.vis[i].r[n];
      if (r.end <= r.begin) continue;
      kb = std::min<int64_t>(kb, r.begin);
      ke = std::max<int64_t>(ke, r.end);
    }
}

}  // namespace lumen::kernels::attention_train_detail
#endif  // LUMEN_KERNELS_ATTENTION_TRAIN_CC_ONCE

HWY_BEFORE_NAMESPACE();
namespace lumen::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace {
using namespace attention_train_detail;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// C[m][n] (+)= sum_k A(m, k) B[k][n] for R rows and CV vectors of columns:
// A(m, k) = a[m * am + k * ak]; B and C row-major. Every element of C is one
// FMA chain over k in order, starting from C (acc) or zero.
template <int R, int CV>
HWY_INLINE void Micro(const float* HWY_RESTRICT a, int64_t am, int64_t ak,
                      const float* HWY_RESTRICT b, int64_t ldb, float* HWY_RESTRICT c, int64_t ldc,
                      int64_t K, bool acc) {
  const DF d;
  const size_t N = hn::Lanes(d);
  VF x[R][CV];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < CV; ++j) x[r][j] = acc ? hn::LoadU(d, c + r * ldc + j * N) : hn::Zero(d);
  for (int64_t k = 0; k < K; ++k) {
    VF bv[CV];
    for (int j = 0; j < CV; ++j) bv[j] = hn::LoadU(d, b + k * ldb + j * N);
    for (int r = 0; r < R; ++r) {
      const VF av = hn::Set(d, a[r * am + k * ak]);
      for (int j = 0; j < CV; ++j) x[r][j] = hn::MulAdd(av, bv[j], x[r][j]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < CV; ++j) hn::StoreU(x[r][j], d, c + r * ldc + j * N);
}

template <int R>
HWY_INLINE void MicroCv(int cv, const float* a, int64_t am, int64_t ak, const float* b, int64_t ldb,
                        float* c, int64_t ldc, int64_t K, bool acc) {
  switch (cv) {
    case 4:
      return Micro<R, 4>(a, am, ak, b, ldb, c, ldc, K, acc);
    case 3:
      return Micro<R, 3>(a, am, ak, b, ldb, c, ldc, K, acc);
    case 2:
      return Micro<R, 2>(a, am, ak, b, ldb, c, ldc, K, acc);
    default:
      return Micro<R, 1>(a, am, ak, b, ldb, c, ldc, K, acc);
  }
}

// C [rows, cols] (+)= A [rows, K] B [K, cols]; cols a multiple of Lanes.
void Gemm(int64_t rows, int64_t cols, int64_t K, const float* a, int64_t am, int64_t ak,
          const float* b, int64_t ldb, float* c, int64_t ldc, bool acc) {
  const DF d;
  const int64_t N = int64_t(hn::Lanes(d)), nv = cols / N;
  for (int64_t m = 0; m < rows; m += 4) {
    const int64_t r = std::min<int64_t>(4, rows - m);
    for (int64_t v0 = 0; v0 < nv; v0 += 4) {
      const int cv = int(std::min<int64_t>(4, nv - v0));
      const float* am0 = a + m * am;
      const float* b0 = b + v0 * N;
      float* c0 = c + m * ldc + v0 * N;
      switch (r) {
        case 4:
          MicroCv<4>(cv, am0, am, ak, b0, ldb, c0, ldc, K, acc);
          break;
        case 3:
          MicroCv<3>(cv, am0, am, ak, b0, ldb, c0, ldc, K, acc);
          break;
        case 2:
          MicroCv<2>(cv, am0, am, ak, b0, ldb, c0, ldc, K, acc);
          break;
        default:
          MicroCv<1>(cv, am0, am, ak, b0, ldb, c0, ldc, K, acc);
          break;
      }
    }
  }
}

// Scores in place: s * scale, then the soft cap.
void ScaleCap(const TrainAttentionShape& s, float* x, int64_t n) {
  const DF d;
  const int64_t N = int64_t(hn::Lanes(d));
  const VF scale = hn::Set(d, s.scale);
  for (int64_t i = 0; i < n; i += N) {  // n is a multiple of N
    VF v = hn::Mul(hn::LoadU(d, x + i), scale);
    if (s.softcap > 0) {
      const VF cap = hn::Set(d, s.softcap), inv = hn::Set(d, 1.0f / s.softcap);
      v = hn::Mul(cap, hn::Tanh(d, hn::Mul(v, inv)));
    }
    hn::StoreU(v, d, x + i);
  }
}

// -inf where the tile's tokens do not see keys [j0, j0 + kn): st is
// [kn][rows]; tokens at or past nt are padding and see nothing.
void Mask(const FastArgs& a, const std::vector<Sees>& sees, int64_t t0, int64_t nt, int group,
          int64_t rows, int64_t j0, int64_t kn, float* st) {
  const int64_t T = rows / group;
  for (int64_t t = 0; t < T; ++t) {
    const Sees k = t < nt ? sees[t] : Sees::kNone;
    if (k == Sees::kAll) continue;
    for (int64_t j = 0; j < kn; ++j) {
      if (k == Sees::kPart && Visible(a, t0 + t, j0 + j)) continue;
      float* row = st + j * rows + t * group;
      for (int g = 0; g < group; ++g) row[g] = kNegInf;
    }
  }
}

// Classifies tokens [t0, t0 + nt) against keys [j0, j0 + kn); false when
// none sees any.
bool ClassifyTile(const FastArgs& a, int64_t t0, int64_t nt, int64_t j0, int64_t kn,
                  std::vector<Sees>& sees) {
  bool any = false;
  for (int64_t t = 0; t < nt; ++t) {
    sees[t] = Classify(a, t0 + t, j0, j0 + kn);
    any = any || sees[t] != Sees::kNone;
  }
  return any;
}

// Stacked query rows of a tile: transposed [Dh][rows] and/or padded
// [rows][Dhp], zero beyond the tile's nt tokens and Dh.
void PackRows(const float* src, int64_t stride, int64_t t0, int64_t nt, int group, int64_t col0,
              int64_t Dh, int64_t rows, int64_t Dhp, float* tr, float* pad) {
  if (tr) std::fill(tr, tr + Dh * rows, 0.0f);
  if (pad) std::fill(pad, pad + rows * Dhp, 0.0f);
  for (int64_t t = 0; t < nt; ++t)
    for (int g = 0; g < group; ++g) {
      const int64_t r = t * group + g;
      const float* x = src + (t0 + t) * stride + col0 + g * Dh;
      if (tr)
        for (int64_t e = 0; e < Dh; ++e) tr[e * rows + r] = x[e];
      if (pad) std::copy_n(x, Dh, pad + r * Dhp);
    }
}

// Key rows [j0, j0 + kn) of one kv head, padded to [kBk][Dhp].
void PackKeys(const float* src, int64_t stride, int64_t col0, int64_t j0, int64_t kn, int64_t Dh,
              int64_t Dhp, float* pad) {
  std::fill(pad, pad + kBk * Dhp, 0.0f);
  for (int64_t j = 0; j < kn; ++j) std::copy_n(src + (j0 + j) * stride + col0, Dh, pad + j * Dhp);
}

struct Geometry {
  int64_t Dh, Dhp, Q, KV, rows, bq, n_qtiles;
  int group;
};

Geometry Geo(const FastArgs& a) {
  const DF d;
  const int64_t N = int64_t(hn::Lanes(d));
  Geometry g;
  g.group = a.s.n_heads / a.s.n_kv_heads;
  g.Dh = a.s.head_dim;
  g.Dhp = (g.Dh + N - 1) / N * N;
  g.Q = int64_t(a.s.n_heads) * g.Dh;
  g.KV = int64_t(a.s.n_kv_heads) * g.Dh;
  g.bq = TokensPerTile(g.group);
  g.rows = g.bq * g.group;
  g.n_qtiles = (a.M + g.bq - 1) / g.bq;
  return g;
}

struct ForwardScratch {
  std::vector<float> qt, st, o, vp, mx, sum;
  std::vector<int64_t> tile_kn;  // keys in each key tile, 0: skipped
  std::vector<Sees> sees;
};

void ForwardUnit(const FastArgs& a, const Geometry& G, int kh, int64_t qt, ForwardScratch& w) {
  const DF d;
  const int64_t N = int64_t(hn::Lanes(d));
  const int64_t rows = G.rows, Dh = G.Dh, Dhp = G.Dhp;
  const int64_t t0 = qt * G.bq, nt = std::min(G.bq, a.M - t0);
  const int64_t col_q = int64_t(kh) * G.group * Dh, col_kv = int64_t(kh) * Dh;
  int64_t kb, ke;
  KeySpan(a, t0, t0 + nt, kb, ke);
  const int64_t ntiles = kb < ke ? (ke - kb + kBk - 1) / kBk : 0;
  w.qt.resize(Dh * rows);
  PackRows(a.q, G.Q, t0, nt, G.group, col_q, Dh, rows, Dhp, w.qt.data(), nullptr);
  w.st.resize(ntiles * kBk * rows);
  w.tile_kn.assign(ntiles, 0);
  w.sees.resize(G.bq);
  // Scores, transposed, per key tile.
  for (int64_t tl = 0; tl < ntiles; ++tl) {
    const int64_t j0 = kb + tl * kBk, kn = std::min<int64_t>(kBk, ke - j0);
    if (!ClassifyTile(a, t0, nt, j0, kn, w.sees)) continue;
    w.tile_kn[tl] = kn;
    float* st = w.st.data() + tl * kBk * rows;
    Gemm(kn, rows, Dh, a.k + j0 * G.KV + col_kv, G.KV, 1, w.qt.data(), rows, st, rows, false);
    ScaleCap(a.s, st, kn * rows);
    Mask(a, w.sees, t0, nt, G.group, rows, j0, kn, st);
  }
  // Row max (exact, any order), then sequential sums of exp(s - max).
  w.mx.resize(rows);
  w.sum.resize(rows);
  for (int64_t r0 = 0; r0 < rows; r0 += N) {
    VF vmax = hn::Set(d, kNegInf);
    for (int64_t tl = 0; tl < ntiles; ++tl)
      for (int64_t j = 0; j < w.tile_kn[tl]; ++j)
        vmax = hn::Max(vmax, hn::LoadU(d, w.st.data() + (tl * kBk + j) * rows + r0));
    // A row that sees nothing: shift 0, so every exp is exp(-inf) = 0.
    vmax = hn::IfThenZeroElse(hn::Eq(vmax, hn::Set(d, kNegInf)), vmax);
    VF vsum = hn::Zero(d);
    for (int64_t tl = 0; tl < ntiles; ++tl)
      for (int64_t j = 0; j < w.tile_kn[tl]; ++j) {
        float* p = w.st.data() + (tl * kBk + j) * rows + r0;
        const VF e = ExpZ(d, hn::Sub(hn::LoadU(d, p), vmax));
        hn::StoreU(e, d, p);
        vsum = hn::Add(vsum, e);
      }
    hn::StoreU(vmax, d, w.mx.data() + r0);
    hn::StoreU(vsum, d, w.sum.data() + r0);
  }
  // o = sum_j p_j v_j over key tiles in order.
  w.o.assign(rows * Dhp, 0.0f);
  w.vp.resize(kBk * Dhp);
  for (int64_t tl = 0; tl < ntiles; ++tl) {
    const int64_t kn = w.tile_kn[tl];
    if (kn == 0) continue;
    PackKeys(a.v, G.KV, col_kv, kb + tl * kBk, kn, Dh, Dhp, w.vp.data());
    Gemm(rows, Dhp, kn, w.st.data() + tl * kBk * rows, 1, rows, w.vp.data(), Dhp, w.o.data(), Dhp,
         true);
  }
  for (int64_t t = 0; t < nt; ++t)
    for (int g = 0; g < G.group; ++g) {
      const int64_t r = t * G.group + g, h = int64_t(kh) * G.group + g;
      float* o = a.out + (t0 + t) * G.Q + h * Dh;
      const float s = w.sum[r];
      if (s > 0) {
        for (int64_t e = 0; e < Dh; ++e) o[e] = w.o[r * Dhp + e] / s;
        a.lse[(t0 + t) * a.s.n_heads + h] = w.mx[r] + std::log(s);
      } else {
        std::fill(o, o + Dh, 0.0f);
        a.lse[(t0 + t) * a.s.n_heads + h] = kNegInf;
      }
    }
}

void ForwardUnitsT(const FastArgs& a, int64_t u0, int64_t u1) {
  const Geometry G = Geo(a);
  ForwardScratch w;
  for (int64_t u = u0; u < u1; ++u) ForwardUnit(a, G, int(u / G.n_qtiles), u % G.n_qtiles, w);
}

// The whole backward of kv head kh and its query heads.
void BackwardHead(const FastArgs& a, const Geometry& G, int kh) {
  const DF d;
  const int64_t N = int64_t(hn::Lanes(d));
  const int64_t rows = G.rows, Dh = G.Dh, Dhp = G.Dhp, M = a.M;
  const int64_t col_q = int64_t(kh) * G.group * Dh, col_kv = int64_t(kh) * Dh;
  const float scale = a.s.scale, cap = a.s.softcap;
  std::vector<float> dk(M * Dhp, 0.0f), dv(M * Dhp, 0.0f);
  std::vector<float> qt(Dh * rows), qp(rows * Dhp), dot(Dh * rows), dop(rows * Dhp),
      dqp(rows * Dhp);
  std::vector<float> lse(rows), D(rows), kp(kBk * Dhp), st(kBk * rows), pt(kBk * rows),
      ds(kBk * rows);
  std::vector<Sees> sees(G.bq);
  for (int64_t qt_i = 0; qt_i < G.n_qtiles; ++qt_i) {
    const int64_t t0 = qt_i * G.bq, nt = std::min(G.bq, M - t0);
    int64_t kb, ke;
    KeySpan(a, t0, t0 + nt, kb, ke);
    if (kb >= ke) continue;
    PackRows(a.q, G.Q, t0, nt, G.group, col_q, Dh, rows, Dhp, qt.data(), qp.data());
    PackRows(a.dout, G.Q, t0, nt, G.group, col_q, Dh, rows, Dhp, dot.data(), dop.data());
    // Per row: the saved lse (+inf where a row sees nothing, so every p is 0)
    // and D = dO . o.
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = r / G.group, h = int64_t(kh) * G.group + r % G.group;
      lse[r] = std::numeric_limits<float>::infinity();
      D[r] = 0.0f;
      if (t >= nt) continue;
      const float l = a.saved_lse[(t0 + t) * a.s.n_heads + h];
      if (std::isfinite(l)) lse[r] = l;
      const float* o = a.saved_out + (t0 + t) * G.Q + h * Dh;
      float acc = 0;
      for (int64_t e = 0; e < Dh; ++e) acc += dop[r * Dhp + e] * o[e];
      D[r] = acc;
    }
    std::fill(dqp.begin(), dqp.end(), 0.0f);
    const int64_t ntiles = (ke - kb + kBk - 1) / kBk;
    for (int64_t tl = 0; tl < ntiles; ++tl) {
      const int64_t j0 = kb + tl * kBk, kn = std::min<int64_t>(kBk, ke - j0);
      if (!ClassifyTile(a, t0, nt, j0, kn, sees)) continue;
      const float* kj = a.k + j0 * G.KV + col_kv;
      const float* vj = a.v + j0 * G.KV + col_kv;
      Gemm(kn, rows, Dh, kj, G.KV, 1, qt.data(), rows, st.data(), rows, false);
      ScaleCap(a.s, st.data(), kn * rows);
      Mask(a, sees, t0, nt, G.group, rows, j0, kn, st.data());
      Gemm(kn, rows, Dh, vj, G.KV, 1, dot.data(), rows, ds.data(), rows, false);  // dP^T
      for (int64_t j = 0; j < kn; ++j)
        for (int64_t r0 = 0; r0 < rows; r0 += N) {
          const int64_t at = j * rows + r0;
          const VF s = hn::LoadU(d, st.data() + at);
          const VF p = ExpZ(d, hn::Sub(s, hn::LoadU(d, lse.data() + r0)));
          hn::StoreU(p, d, pt.data() + at);
          VF g = hn::Mul(p, hn::Sub(hn::LoadU(d, ds.data() + at), hn::LoadU(d, D.data() + r0)));
          if (cap > 0) {
            const VF t = hn::Mul(s, hn::Set(d, 1.0f / cap));
            g = hn::Mul(g, hn::NegMulAdd(t, t, hn::Set(d, 1.0f)));
            g = hn::IfThenElseZero(hn::Gt(s, hn::Set(d, kNegInf)), g);  // 0 * inf
          }
          hn::StoreU(hn::Mul(g, hn::Set(d, scale)), d, ds.data() + at);
        }
      // dV += P^T dO; dK += dS^T Q; dQ += dS K.
      Gemm(kn, Dhp, rows, pt.data(), rows, 1, dop.data(), Dhp, dv.data() + j0 * Dhp, Dhp, true);
      Gemm(kn, Dhp, rows, ds.data(), rows, 1, qp.data(), Dhp, dk.data() + j0 * Dhp, Dhp, true);
      PackKeys(a.k, G.KV, col_kv, j0, kn, Dh, Dhp, kp.data());
      Gemm(rows, Dhp, kn, ds.data(), 1, rows, kp.data(), Dhp, dqp.data(), Dhp, true);
    }
    for (int64_t t = 0; t < nt; ++t)
      for (int g = 0; g < G.group; ++g) {
        const int64_t r = t * G.group + g;
        float* dq = a.dq + (t0 + t) * G.Q + col_q + g * Dh;
        for (int64_t e = 0; e < Dh; ++e) dq[e] += dqp[r * Dhp + e];
      }
  }
  for (int64_t j = 0; j < M; ++j)
    for (int64_t e = 0; e < Dh; ++e) {
      a.dk[j * G.KV + col_kv + e] += dk[j * Dhp + e];
      a.dv[j * G.KV + col_kv + e] += dv[j * Dhp + e];
    }
}

void BackwardHeadsT(const FastArgs& a, int64_t kh0, int64_t kh1) {
  const Geometry G = Geo(a);
  for (int64_t kh = kh0; kh < kh1; ++kh) BackwardHead(a, G, int(kh));
}

}  // namespace
// Exported (HWY_EXPORT needs external names per target).
void AttnTrainForwardUnits(const attention_train_detail::FastArgs& a, int64_t u0, int64_t u1) {
  ForwardUnitsT(a, u0, u1);
}
void AttnTrainBackwardHeads(const attention_train_detail::FastArgs& a, int64_t kh0, int64_t kh1) {
  BackwardHeadsT(a, kh0, kh1);
}
}  // namespace lumen::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace lumen::kernels {

LUMEN_ROUTE(attn_train_tiled,
            {.node = "attn.train",
             .name = "simd-tiled-lse",
             .tier = Tier::kL2,
             .oracle = "the scalar templates of attention_train.h (in double and in float)",
             .bound = "out, lse, dQ, dK, dV within relative L2 1e-5 of the double oracle",
             .tests = "AttentionTrainFast.EveryTargetWithinBoundOfTheOracle;"
                      "AttentionTrainFast.IndependentOfThreadCount;"
                      "AttentionTrainFast.RowsDependOnlyOnTheKeysTheySee;"
                      "Families/PrefixShare.MatchesTwoForwards/*",
             .when = "train.compute=f32",
             .priority = 10});

HWY_EXPORT(AttnTrainForwardUnits);
HWY_EXPORT(AttnTrainBackwardHeads);

namespace {
using attention_train_detail::FastArgs;

void CheckShape(const TrainAttentionShape& s) {
  LUMEN_CHECK(s.n_heads > 0 && s.n_kv_heads > 0 && s.n_heads % s.n_kv_heads == 0 && s.head_dim > 0);
}

// The inputs both passes read.
FastArgs Inputs(const TrainAttentionShape& s, const float* q, const float* k, const float* v,
                const int32_t* pos, const KeyRanges* vis, int64_t M) {
  FastArgs a;
  a.s = s;
  a.q = q;
  a.k = k;
  a.v = v;
  a.pos = pos;
  a.vis = vis;
  a.M = M;
  return a;
}

// Runs f(begin, end) over [0, units) on the pool, or inline without one.
template <typename F>
void ForUnits(ThreadPool* pool, int64_t units, F f) {
  auto run = [&](int64_t b, int64_t e, int) { f(b, e); };
  if (pool)
    pool->ParallelFor(units, run);
  else
    run(0, units, 0);
}
}  // namespace

void AttentionTrainForwardFast(const TrainAttentionShape& s, const float* q, const float* k,
                               const float* v, const int32_t* pos, const KeyRanges* vis, int64_t M,
                               float* out, float* lse, ThreadPool* pool) {
  CheckShape(s);
  if (M <= 0) return;
  FastArgs a = Inputs(s, q, k, v, pos, vis, M);
  a.out = out;
  a.lse = lse;
  const int64_t bq = attention_train_detail::TokensPerTile(s.n_heads / s.n_kv_heads);
  const int64_t units = int64_t(s.n_kv_heads) * ((M + bq - 1) / bq);
  ForUnits(pool, units, [&](int64_t b, int64_t e) {
    HWY_DYNAMIC_DISPATCH(AttnTrainForwardUnits)(a, b, e);
  });
}

void AttentionTrainBackwardFast(const TrainAttentionShape& s, const float* q, const float* k,
                                const float* v, const int32_t* pos, const KeyRanges* vis, int64_t M,
                                const float* out, const float* lse, const float* dout, float* dq,
                                float* dk, float* dv, ThreadPool* pool) {
  CheckShape(s);
  if (M <= 0) return;
  FastArgs a = Inputs(s, q, k, v, pos, vis, M);
  a.saved_out = out;
  a.saved_lse = lse;
  a.dout = dout;
  a.dq = dq;
  a.dk = dk;
  a.dv = dv;
  ForUnits(pool, s.n_kv_heads, [&](int64_t b, int64_t e) {
    HWY_DYNAMIC_DISPATCH(AttnTrainBackwardHeads)(a, b, e);
  });
}

}  // namespace lumen::kernels
#endif  // HWY_ONCE
