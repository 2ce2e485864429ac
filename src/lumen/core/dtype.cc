#include "lumen/core/dtype.h"

#include <array>
#include <cctype>
#include <limits>

namespace lumen {
namespace {

constexpr std::array<DTypeInfo, 35> kInfo = {{
    {"f32", 1, 4, false},
    {"f16", 1, 2, false},
    {"bf16", 1, 2, false},
    {"f64", 1, 8, false},
    {"i8", 1, 1, false},
    {"u8", 1, 1, false},
    {"i16", 1, 2, false},
    {"u16", 1, 2, false},
    {"i32", 1, 4, false},
    {"u32", 1, 4, false},
    {"i64", 1, 8, false},
    {"bool", 1, 1, false},
    {"q4_0", 32, 18, true},
    {"q4_1", 32, 20, true},
    {"q5_0", 32, 22, true},
    {"q5_1", 32, 24, true},
    {"q8_0", 32, 34, true},
    {"q8_1", 32, 36, true},
    {"q2_k", 256, 84, true},
    {"q3_k", 256, 110, true},
    {"q4_k", 256, 144, true},
    {"q5_k", 256, 176, true},
    {"q6_k", 256, 210, true},
    {"q8_k", 256, 292, true},
    {"q4_0_cols", 32, 18, true},
    {"q4_1_cols", 32, 20, true},
    {"q5_0_cols", 32, 22, true},
    {"q5_1_cols", 32, 24, true},
    {"q4_k_cols", 256, 144, true},
    {"q5_k_cols", 256, 176, true},
    {"q8_0_cols", 32, 34, true},
    {"q6_k_cols", 256, 210, true},
    {"q2_k_cols", 256, 84, true},
    {"q3_k_cols", 256, 110, true},
    {"q5_k_planes", 256, 176, true},
}};

}  // namespace

const DTypeInfo& Info(DType t) { return kInfo[static_cast<size_t>(t)]; }

std::optional<DType> ParseDType(std::string_view name) {
  for (size_t i = 0; i < kInfo.size(); ++i) {
    const auto& n = kInfo[i].name;
    if (n.size() != name.size()) continue;
    bool eq = true;
    for (size_t j = 0; j < n.size() && eq; ++j)
      eq = std::tolower(static_cast<unsigned char>(name[j])) == n[j];
    if (eq) return static_cast<DType>(i);
  }
  return std::nullopt;
}

std::optional<size_t> RowBytes(DType t, int64_t n) {
  const DTypeInfo& info = Info(t);
  if (n < 0 || n % info.block_elems != 0) return std::nullopt;
  const uint64_t blocks = uint64_t(n) / info.block_elems;
  if (blocks > std::numeric_limits<size_t>::max() / info.block_bytes) return std::nullopt;
  return blocks * info.block_bytes;
}

}  // namespace lumen
