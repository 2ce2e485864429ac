// Test helper for the kernel tests: random weight matrices in any storage
// (every dtype, MLX affine, the legacy formats' column groups) with their
// own bytes, rows at misaligned addresses (stride = row bytes + 3) so no
// kernel may assume aligned rows.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "lumen/core/quant.h"
#include "lumen/core/repack.h"
#include "lumen/kernels/matrix.h"

namespace lumen::kernels {

// A weight matrix with its own storage, rows at misaligned addresses.
struct OwnedMatrix {
  std::vector<uint8_t> bytes, sbytes, bbytes;
  Matrix m;
};

struct Spec {
  std::string name;
  DType dtype = DType::kF32;
  int mlx_bits = 0, mlx_group = 0;
  DType mlx_scale_type = DType::kF16;
  int block = 1;  // K must be a multiple
};

inline OwnedMatrix Make(const Spec& s, int64_t N, int64_t K, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> w(N * K);
  for (auto& v : w) v = nd(rng);
  OwnedMatrix o;
  if (s.mlx_bits == 0) {
    const size_t rb = *RowBytes(s.dtype, K), stride = rb + 3;
    o.bytes.assign(N * stride + 8, 0);
    uint8_t* base = o.bytes.data() + 1;
    const DType plain = PlainOf(s.dtype);  // column groups: repacked where they lie
    for (int64_t n = 0; n < N; ++n) {
      QuantizeRow(plain, &w[n * K], base + n * stride, K);
      if (plain != s.dtype) RepackColumnGroups(s.dtype, base + n * stride, K);
    }
    o.m.w = TensorView::Contiguous(base, s.dtype, {N, K});
    o.m.w.stride[0] = static_cast<int64_t>(stride);
    o.m.n = N;
    o.m.k = K;
    return o;
  }
  const int64_t words = K * s.mlx_bits / 32, groups = K / s.mlx_group;
  const size_t stride = words * 4 + 3;
  o.bytes.assign(N * stride + 8, 0);
  uint8_t* base = o.bytes.data() + 1;
  const size_t ss = *RowBytes(s.mlx_scale_type, groups);
  o.sbytes.assign(N * ss, 0);
  o.bbytes.assign(N * ss, 0);
  std::vector<uint32_t> packed(words);
  std::vector<float> sc(groups), bi(groups);
  for (int64_t n = 0; n < N; ++n) {
    QuantizeMlxRow(&w[n * K], s.mlx_bits, s.mlx_group, packed.data(), sc.data(), bi.data(), K);
    std::memcpy(base + n * stride, packed.data(), words * 4);
    QuantizeRow(s.mlx_scale_type, sc.data(), o.sbytes.data() + n * ss, groups);
    QuantizeRow(s.mlx_scale_type, bi.data(), o.bbytes.data() + n * ss, groups);
  }
  o.m.w = TensorView::Contiguous(base, DType::kU32, {N, words});
  o.m.w.stride[0] = static_cast<int64_t>(stride);
  o.m.scales = TensorView::Contiguous(o.sbytes.data(), s.mlx_scale_type, {N, groups});
  o.m.biases = TensorView::Contiguous(o.bbytes.data(), s.mlx_scale_type, {N, groups});
  o.m.mlx_bits = s.mlx_bits;
  o.m.mlx_group = s.mlx_group;
  o.m.n = N;
  o.m.k = K;
  return o;
}

// M x K activations ~ N(0, 1) with every 97th element scaled by 40 (the
// outliers real activations have).
inline std::vector<float> RandomActivations(int64_t M, int64_t K, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(M * K);
  for (auto& v : x) v = nd(rng);
  for (int64_t i = 0; i < M * K; i += 97) x[i] *= 40.0f;
  return x;
}

// Every weight storage the kernels read: each GGUF dtype with a matmul path and
// MLX affine 4/8-bit at groups 32/64/128; `block` is the K granularity.
inline std::vector<Spec> AllSpecs() {
  std::vector<Spec> v;
  for (DType t :
       {DType::kF32,      DType::kF16,      DType::kBF16,     DType::kQ4_0,      DType::kQ4_1,
        DType::kQ5_0,     DType::kQ5_1,     DType::kQ8_0,     DType::kQ2_K,      DType::kQ3_K,
        DType::kQ4_K,     DType::kQ5_K,     DType::kQ6_K,     DType::kQ4_0Cols,  DType::kQ4_1Cols,
        DType::kQ5_0Cols, DType::kQ5_1Cols, DType::kQ4_KCols, DType::kQ5_KCols,  DType::kQ8_0Cols,
        DType::kQ6_KCols, DType::kQ2_KCols, DType::kQ3_KCols, DType::kQ5_KPlanes}) {
    Spec s;
    s.name = std::string(Name(t));
    s.dtype = t;
    s.block = Info(t).block_elems;
    v.push_back(s);
  }
  for (int bits : {4, 8})
    for (int g : {32, 64, 128}) {
      Spec s;
      s.name = "mlx" + std::to_string(bits) + "_g" + std::to_string(g);
      s.mlx_bits = bits;
      s.mlx_group = g;
      s.block = g;
      s.mlx_scale_type = g == 64 ? DType::kBF16 : DType::kF16;
      v.push_back(s);
    }
  return v;
}

}  // namespace lumen::kernels
