// Element types: plain scalars and the GGUF quantized block types.
//
// A quantized type packs `BlockElems()` consecutive elements of a row into
// `BlockBytes()` bytes; rows of quantized tensors are whole blocks. Plain types
// have BlockElems() == 1. MLX affine quantization is not a block dtype: it is a
// U32 packed tensor plus separate scales/biases (formats/mlx.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace lumen {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kF64,
  kI8,
  kU8,
  kI16,
  kU16,
  kI32,
  kU32,
  kI64,
  kBool,
  kQ4_0,
  kQ4_1,
  kQ5_0,
  kQ5_1,
  kQ8_0,
  kQ8_1,
  kQ2_K,
  kQ3_K,
  kQ4_K,
  kQ5_K,
  kQ6_K,
  kQ8_K,
  // Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q8_0, Q6_K, Q2_K, Q3_K repacked in place at
  // load for the int8 decode kernels (core/repack.h); never read from or written to a file.
  kQ4_0Cols,
  kQ4_1Cols,
  kQ5_0Cols,
  kQ5_1Cols,
  kQ4_KCols,
  kQ5_KCols,
  kQ8_0Cols,
  kQ6_KCols,
  kQ2_KCols,
  kQ3_KCols,
  // Q5_K column groups with the 5th bits in planes (core/repack.h), where
  // the AVX2 kernels run.
  kQ5_KPlanes,
};

struct DTypeInfo {
  std::string_view name;  // lower-case, as printed by `lumen inspect` ("f16", "q4_k")
  int block_elems;        // elements per block (1 for plain types)
  int block_bytes;        // bytes per block
  bool quantized;
};

const DTypeInfo& Info(DType t);
inline std::string_view Name(DType t) { return Info(t).name; }
inline bool IsQuantized(DType t) { return Info(t).quantized; }

// Parses a name as printed by Name(), case-insensitively ("Q4_K" ok).
std::optional<DType> ParseDType(std::string_view name);

// Bytes for `n` elements of a row; nullopt if n is not a whole number of blocks
// or the size overflows.
std::optional<size_t> RowBytes(DType t, int64_t n);

}  // namespace lumen
