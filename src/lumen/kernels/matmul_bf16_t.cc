#include "lumen/kernels/matmul_bf16_t.h"

#include <algorithm>
#include <vector>

#include "lumen/core/buffer.h"
#include "lumen/core/check.h"
#include "lumen/kernels/matmul_bf16.h"
#include "lumen/kernels/matmul_bf16_amx.h"
#include "lumen/kernels/matmul_bf16_t_amx.h"

namespace lumen::kernels {

namespace {

constexpr int64_t kPanelElems = 256 * 1024;  // 512 KiB of bf16: half of a 1-2 MiB L2

int64_t RoundUp(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

// The blocking of one call: KB columns per block, NB rows of W per chunk,
// dY's rows as stored (the tiles read M rounded up to 16).
struct Blocking {
  bool amx;
  int64_t kb, kb_rows, nb;  // kb_rows: the panel's rows or groups' columns (kb rounded up)
  int64_t m_rows;
};

bool UseAmx(int64_t M) { return M >= kAmxTMinRows && AmxBf16Usable(); }

// AVX512-BF16: 64 columns per block (the panel is W transposed, kb rows of
// nb). AMX: 256 columns (16 B-tile groups), so dY's chunk is read a quarter
// as often; the panel holds the same 512 KiB either way.
Blocking Block(int64_t M, int64_t N, int64_t align, bool amx) {
  Blocking b;
  b.amx = amx;
  b.kb = RoundUp(amx ? 256 : 64, align);
  b.kb_rows = RoundUp(b.kb, amx ? kAmxTGroup : 4);
  b.nb = std::max<int64_t>(kBf16RowAlign, kPanelElems / b.kb_rows / kBf16RowAlign * kBf16RowAlign);
  b.nb = std::min(b.nb, RoundUp(std::max<int64_t>(N, 1), kBf16RowAlign));
  b.m_rows = amx ? RoundUp(M, kAmxRows) : M;
  return b;
}

// Per-thread scratch: one panel and the decoded columns of one row (AVX) or
// of a row pair (AMX).
struct Scratch {
  // Zero-filled: panel rows past a short block are read (never stored) and
  // must be finite; later they hold earlier weights, also finite.
  AlignedBuffer panel;
  std::vector<float> rowf;
  AlignedBuffer rowb;  // one row's columns in bf16 (AVX)
  explicit Scratch(const Blocking& b)
      : panel(size_t(b.kb_rows * b.nb) * sizeof(uint16_t)),
        rowf(size_t(b.amx ? 2 : 1) * b.kb),
        rowb(size_t(RoundUp(b.kb, kBf16RowAlign)) * sizeof(uint16_t)) {}
};

// One panel's share: rows [n0, n0 + len) x columns [k0, k0 + kn) of W; the
// panel has w rows (len rounded up to 32, rows past len zero).
struct Piece {
  int64_t n0, len, w, k0, kn;
  bool accumulate;
};

// Builds the piece's panel in the kernel's layout and adds dY's chunk dyc
// ([M, w] bf16) times it into dX's columns [k0, k0 + kn).
void AddPiece(const Matrix& W, const Blocking& b, const Piece& p, const uint16_t* dyc, int64_t M,
              Scratch& s, float* dX) {
  uint16_t* panel = s.panel.as<uint16_t>();
  const int64_t k1 = p.k0 + p.kn;
  if (b.amx) {
    const int64_t groups = (p.kn + kAmxTGroup - 1) / kAmxTGroup;
    float* r0 = s.rowf.data();
    float* r1 = r0 + b.kb;
    const bool f16 = W.mlx_bits == 0 && W.w.dtype == DType::kF16;
    auto f16_row = [&](int64_t i) {  // row i of the piece in storage, or null past len
      return i < p.len ? W.w.row<const uint16_t>(p.n0 + i) + p.k0 : nullptr;
    };
    for (int64_t pair = 0; 2 * pair < p.w; ++pair) {
      const int64_t n = 2 * pair;
      if (f16) {  // straight from storage: vcvtph2ps is exact, as the decoder is
        AmxPackTPairF16(f16_row(n), f16_row(n + 1), p.kn, groups, p.w, pair, panel);
        continue;
      }
      if (n < p.len) DequantizeMatrixColumns(W, p.n0 + n, p.k0, k1, r0);
      if (n + 1 < p.len) DequantizeMatrixColumns(W, p.n0 + n + 1, p.k0, k1, r1);
      AmxPackTPair(n < p.len ? r0 : nullptr, n + 1 < p.len ? r1 : nullptr, p.kn, groups, p.w, pair,
                   panel);
    }
    return AmxBf16TPanelProduct(dyc, M, p.w, panel, p.kn, dX, W.k, p.k0, p.accumulate);
  }
  uint16_t* rowb = s.rowb.as<uint16_t>();
  for (int64_t j = 0; j < p.len; ++j) {
    DequantizeMatrixColumns(W, p.n0 + j, p.k0, k1, s.rowf.data());
    ToBf16Padded(s.rowf.data(), p.kn, p.kn, rowb);
    for (int64_t i = 0; i < p.kn; ++i) panel[i * p.w + j] = rowb[i];
  }
  for (int64_t i = 0; i < p.kn; ++i)  // columns past N: dY's are zero, these must be finite
    std::fill(panel + i * p.w + p.len, panel + (i + 1) * p.w, uint16_t(0));
  Bf16PanelProduct(panel, p.kn, dyc, M, p.w, dX, W.k, p.k0, p.accumulate);
}

}  // namespace

size_t MatMulTBf16TransientBytes(int64_t M, int64_t N, int threads, int64_t align) {
  const Blocking b = Block(M, N, align, UseAmx(M));
  const size_t dy = size_t(b.m_rows) * size_t(RoundUp(N, kBf16RowAlign)) * sizeof(uint16_t);
  const size_t per_thread = size_t(b.kb_rows * b.nb) * sizeof(uint16_t) +
                            size_t(b.amx ? 2 : 1) * size_t(b.kb) * sizeof(float) +
                            size_t(RoundUp(b.kb, kBf16RowAlign)) * sizeof(uint16_t);
  return dy + size_t(std::max(threads, 1)) * per_thread;
}

void MatMulTBf16(const Matrix& W, const float* dY, int64_t M, float* dX, bool accumulate,
                 ThreadPool* pool) {
  LUMEN_CHECK(CpuHasBf16());
  const int64_t N = W.n, K = W.k;
  if (M <= 0 || K <= 0) return;
  if (N == 0) {
    if (!accumulate) std::fill(dX, dX + M * K, 0.0f);
    return;
  }
  const Blocking b = Block(M, N, MatrixColumnAlign(W), UseAmx(M));
  const int64_t chunks = (N + b.nb - 1) / b.nb;
  // Chunk c of dY in bf16: [m_rows, width(c)] at offset m_rows * c * nb;
  // every chunk but the last is nb wide, the last is its length rounded up
  // to 32. Rows past M (AMX's padding to 16) are zero.
  auto width = [&](int64_t c) {
    return c + 1 < chunks ? b.nb : RoundUp(N - c * b.nb, kBf16RowAlign);
  };
  const int64_t Mr = b.m_rows;
  const size_t dy_elems = size_t(Mr) * size_t((chunks - 1) * b.nb + width(chunks - 1));
  AlignedBuffer dyb_buf(dy_elems * sizeof(uint16_t));
  uint16_t* dyb = dyb_buf.as<uint16_t>();
  auto round_rows = [&](int64_t m0, int64_t m1, int) {
    for (int64_t m = m0; m < m1; ++m)
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t n0 = c * b.nb, len = std::min(b.nb, N - n0), w = width(c);
        uint16_t* row = dyb + Mr * n0 + m * w;
        if (m < M)
          ToBf16Padded(dY + m * N + n0, len, w, row);
        else
          std::fill(row, row + w, uint16_t(0));
      }
  };
  if (pool && Mr >= 8) {
    pool->ParallelFor(Mr, round_rows, 4);
  } else {
    round_rows(0, Mr, 0);
  }

  const int64_t blocks = (K + b.kb - 1) / b.kb;
  auto run_blocks = [&](int64_t blk0, int64_t blk1, int) {
    Scratch scratch(b);
    for (int64_t blk = blk0; blk < blk1; ++blk) {
      const int64_t k0 = blk * b.kb, kn = std::min(K, k0 + b.kb) - k0;
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t n0 = c * b.nb;
        const Piece p{n0, std::min(b.nb, N - n0), width(c), k0, kn, accumulate || c > 0};
        AddPiece(W, b, p, dyb + Mr * n0, M, scratch, dX);
      }
    }
  };
  if (pool && blocks > 1) {
    pool->ParallelFor(blocks, run_blocks, 1);
  } else {
    run_blocks(0, blocks, 0);
  }
}

}  // namespace lumen::kernels
