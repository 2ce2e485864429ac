// The compiler targets of the AMX kernels (matmul_bf16_amx.cc,
// matmul_bf16_t_amx.cc), in one place: LUMEN_AMX_X86 is defined where tile
// code can be built (x86-64 Linux, which grants the tile state through
// arch_prctl); LUMEN_AMX marks the functions that touch tiles and
// LUMEN_AVX512 the AVX-512 helpers around them, so the rest of the binary
// stays free of these instructions. Include only from .cc files.
#pragma once

#if defined(__x86_64__) && defined(__linux__)
#include <immintrin.h>
#define LUMEN_AMX_X86 1
#define LUMEN_AMX \
  __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#define LUMEN_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

#include <cstdint>
#include <cstdlib>

#include "lumen/core/check.h"

namespace lumen::kernels {

// Scratch C tiles (16 x 16 f32 each, 64-byte aligned) that hold a chunk's
// sums between K blocks. Left uninitialized: every tile is stored before it
// is loaded, and the smallest products (M = 16) would otherwise pay for
// zeroing it on every panel.
class TileScratch {
 public:
  explicit TileScratch(int64_t tiles)
      : p_(tiles > 0 ? static_cast<float (*)[16 * 16]>(
                           std::aligned_alloc(64, size_t(tiles) * 16 * 16 * sizeof(float)))
                     : nullptr) {
    LUMEN_CHECK(tiles <= 0 || p_ != nullptr);
  }
  ~TileScratch() { std::free(p_); }
  TileScratch(const TileScratch&) = delete;
  TileScratch& operator=(const TileScratch&) = delete;
  float (*tiles() const)[16 * 16] { return p_; }

 private:
  float (*p_)[16 * 16];
};

// The tile loop both kernels share: C tiles 0..3 = (A block 0, 1) x (B block
// 0, 1), NA and NB of each, over `steps` k steps of 32. A blocks are 16 rows
// of bf16 with a row stride of lda elements (tiles 4, 5), stepping 32
// elements; B blocks are packed 1 KiB tiles stepping 512 elements (tiles 6,
// 7). The C tiles start from zero, or from c_in[0..3] when c_in is not null
// (a K block continuing the sums of the previous ones: a tile load and store
// of f32 are exact, so splitting K changes no bit of a result). The used C
// tiles are stored to c[0..3] (16 rows of 16 f32 each; c may be c_in).
template <int NA, int NB>
LUMEN_AMX inline void AmxTileBlock(const uint16_t* a0, const uint16_t* a1, int64_t lda,
                                   const uint16_t* b0, const uint16_t* b1, int64_t steps,
                                   const float (*c_in)[16 * 16], float (*c)[16 * 16]) {
  if (c_in) {
    _tile_loadd(0, c_in[0], 64);
    if constexpr (NB == 2) _tile_loadd(1, c_in[1], 64);
    if constexpr (NA == 2) _tile_loadd(2, c_in[2], 64);
    if constexpr (NA == 2 && NB == 2) _tile_loadd(3, c_in[3], 64);
  } else {
    _tile_zero(0);
    if constexpr (NB == 2) _tile_zero(1);
    if constexpr (NA == 2) _tile_zero(2);
    if constexpr (NA == 2 && NB == 2) _tile_zero(3);
  }
  const int64_t stride = lda * 2;
  for (int64_t k = 0; k < steps; ++k) {
    _tile_loadd(4, a0 + k * 32, stride);
    _tile_loadd(6, b0 + k * 512, 64);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NB == 2) {
      _tile_loadd(7, b1 + k * 512, 64);
      _tile_dpbf16ps(1, 4, 7);
    }
    if constexpr (NA == 2) {
      _tile_loadd(5, a1 + k * 32, stride);
      _tile_dpbf16ps(2, 5, 6);
      if constexpr (NB == 2) _tile_dpbf16ps(3, 5, 7);
    }
  }
  // The tile number of _tile_stored is pasted into the instruction's text,
  // so each store names its tile literally.
  _tile_stored(0, c[0], 64);
  if constexpr (NB == 2) _tile_stored(1, c[1], 64);
  if constexpr (NA == 2) _tile_stored(2, c[2], 64);
  if constexpr (NA == 2 && NB == 2) _tile_stored(3, c[3], 64);
}

}  // namespace lumen::kernels
#endif
