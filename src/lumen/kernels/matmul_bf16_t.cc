#include "lumen/kernels/matmul_bf16_t.h"

#include <algorithm>
#include <vector>

#include "lumen/core/buffer.h"
#include "lumen/core/check.h"
#include "lumen/kernels/matmul_bf16.h"

namespace lumen::kernels {

namespace {

constexpr int64_t kPanelElems = 256 * 1024;  // 512 KiB of bf16: half of a 1-2 MiB L2

int64_t RoundUp(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

// The blocking of one call: KB columns per block, NB rows of W per chunk.
struct Blocking {
  int64_t kb, kb_rows, nb;  // kb_rows: kb rounded up to the tile height (4)
};

Blocking Block(int64_t N, int64_t align) {
  Blocking b;
  b.kb = RoundUp(64, align);
  b.kb_rows = RoundUp(b.kb, 4);
  b.nb = std::max<int64_t>(kBf16RowAlign, kPanelElems / b.kb_rows / kBf16RowAlign * kBf16RowAlign);
  b.nb = std::min(b.nb, RoundUp(std::max<int64_t>(N, 1), kBf16RowAlign));
  return b;
}

}  // namespace

size_t MatMulTBf16TransientBytes(int64_t M, int64_t N, int threads, int64_t align) {
  const Blocking b = Block(N, align);
  const size_t dy = size_t(M) * size_t(RoundUp(N, kBf16RowAlign)) * sizeof(uint16_t);
  const size_t per_thread = size_t(b.kb_rows * b.nb) * sizeof(uint16_t) +
                            size_t(b.kb) * sizeof(float) +
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
  const Blocking b = Block(N, MatrixColumnAlign(W));
  const int64_t chunks = (N + b.nb - 1) / b.nb;
  // Chunk c of dY in bf16: [M, width(c)] at offset M * c * nb; every chunk
  // but the last is nb wide, the last is its length rounded up to 32.
  auto width = [&](int64_t c) {
    return c + 1 < chunks ? b.nb : RoundUp(N - c * b.nb, kBf16RowAlign);
  };
  const size_t dy_elems = size_t(M) * size_t((chunks - 1) * b.nb + width(chunks - 1));
  AlignedBuffer dyb_buf(dy_elems * sizeof(uint16_t));
  uint16_t* dyb = dyb_buf.as<uint16_t>();
  auto round_rows = [&](int64_t m0, int64_t m1, int) {
    for (int64_t m = m0; m < m1; ++m)
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t n0 = c * b.nb, len = std::min(b.nb, N - n0), w = width(c);
        ToBf16Padded(dY + m * N + n0, len, w, dyb + M * n0 + m * w);
      }
  };
  if (pool && M >= 8) {
    pool->ParallelFor(M, round_rows, 4);
  } else {
    round_rows(0, M, 0);
  }

  const int64_t blocks = (K + b.kb - 1) / b.kb;
  auto run_blocks = [&](int64_t blk0, int64_t blk1, int) {
    // Zero-filled: panel rows past a short block are read (never stored) and
    // must be finite; later they hold earlier weights, also finite.
    AlignedBuffer panel_buf(size_t(b.kb_rows * b.nb) * sizeof(uint16_t));
    uint16_t* panel = panel_buf.as<uint16_t>();
    std::vector<float> rowf(b.kb);
    AlignedBuffer rowb_buf(size_t(RoundUp(b.kb, kBf16RowAlign)) * sizeof(uint16_t));
    uint16_t* rowb = rowb_buf.as<uint16_t>();
    for (int64_t blk = blk0; blk < blk1; ++blk) {
      const int64_t k0 = blk * b.kb, k1 = std::min(K, k0 + b.kb), kn = k1 - k0;
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t n0 = c * b.nb, len = std::min(b.nb, N - n0), w = width(c);
        for (int64_t j = 0; j < len; ++j) {
          DequantizeMatrixColumns(W, n0 + j, k0, k1, rowf.data());
          ToBf16Padded(rowf.data(), kn, kn, rowb);
          for (int64_t i = 0; i < kn; ++i) panel[i * w + j] = rowb[i];
        }
        for (int64_t i = 0; i < kn; ++i)  // columns past N: dY's are zero, these must be finite
          std::fill(panel + i * w + len, panel + (i + 1) * w, uint16_t(0));
        Bf16PanelProduct(panel, kn, dyb + M * n0, M, w, dX, K, k0, accumulate || c > 0);
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
