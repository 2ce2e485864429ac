// The 4- and 5-bit formats' matrices repacked at load into column groups
// (core/repack.h, Model::Finish): only for an int8 route in a copied file,
// every matrix the forward reads (the tied embedding table too), and the
// logits those of the same file mapped, where nothing is repacked, up to the
// kernels' summation order.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lumen/core/repack.h"
#include "lumen/engine/convert.h"
#include "lumen/engine/model.h"
#include "lumen/engine/session.h"
#include "lumen/engine/synth.h"
#include "lumen/kernels/matmul_q8.h"
#include "lumen/kernels/matmul_q8_avx2.h"

namespace lumen::engine {
namespace {

namespace fs = std::filesystem;

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// A 64-position session with an f32 KV cache (its rounding is the same in
// every load, so logits compare bit for bit); null (and a failure) if refused.
std::unique_ptr<Session> NewSession(const Model& m) {
  SessionOptions o;
  o.ctx = 64;
  o.kv_dtype = DType::kF32;
  auto s = Session::Create(m, o);
  EXPECT_TRUE(s.ok());
  return s.ok() ? std::move(*s) : nullptr;
}

std::vector<float> Logits(Model& m, std::span<const int32_t> ids) {
  const std::unique_ptr<Session> s = NewSession(m);
  std::vector<float> out;
  if (!s) return out;
  // The first five together (a few rows: the int8 kernels), then one by one.
  EXPECT_TRUE(s->Append(ids.first(5)).ok());
  for (size_t i = 5; i < ids.size(); ++i) {
    EXPECT_TRUE(s->Append(ids.subspan(i, 1)).ok());
    out.insert(out.end(), s->logits().begin(), s->logits().end());
  }
  return out;
}

// The last position's logits after one prefill of every id.
std::vector<float> PrefillLogits(Model& m, std::span<const int32_t> ids) {
  const std::unique_ptr<Session> s = NewSession(m);
  if (!s) return {};
  EXPECT_TRUE(s->Append(ids).ok());
  return {s->logits().begin(), s->logits().end()};
}

// The logits of `repacked` and `file` (the same weights, the int8x2 route,
// summed in another order) against the exact route's: the same activation
// rounding, float rounding only, through two layers of tiny-model weights
// (measured: 1.1e-3 to 2.2e-3 on logits up to 19, where the int8x2 route
// itself moves them 2.4e-3 to 1.2e-2 from the exact route). A wrong code or
// scale moves them by whole units.
void ExpectSumsInAnotherOrder(const std::vector<float>& a, const std::vector<float>& b,
                              const std::vector<float>& e) {
  ASSERT_EQ(a.size(), b.size());
  ASSERT_EQ(a.size(), e.size());
  double scale = 1, diff = 0, route = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, double(std::fabs(b[i])));
    diff = std::max(diff, double(std::fabs(a[i] - b[i])));
    route = std::max(route, double(std::fabs(b[i] - e[i])));
  }
  EXPECT_LE(diff, 2e-4 * scale) << "route " << route;
  EXPECT_GT(route, 0.0);
}

// A tiny Llama of dim x ffn at `out` (the rest of so as given).
SynthOptions Tiny(SynthOptions so, const std::string& out, int dim, int ffn) {
  so.name = "tiny-llama";
  so.out = out;
  so.dim = dim;
  so.ffn = ffn;
  so.heads = 4;
  so.kv_heads = 2;
  return so;
}

std::unique_ptr<Model> LoadAs(const std::string& path, kernels::ActRoute route, Residency res) {
  LoadOptions lo;
  lo.threads = 2;
  lo.act_route = route;
  lo.residency = res;
  auto m = Model::Load(path, lo);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return std::move(m).value();
}

// Both models converted to GGUF in dir write the same bytes; returns the
// size of the file written.
uintmax_t ExpectSameConversion(const Model& copied, const Model& mapped, const fs::path& dir) {
  const std::string from_copy = (dir / "copy.gguf").string(),
                    from_map = (dir / "map.gguf").string();
  EXPECT_TRUE(ConvertModel(copied, OutputFormat::kGguf, from_copy, std::nullopt).ok());
  EXPECT_TRUE(ConvertModel(mapped, OutputFormat::kGguf, from_map, std::nullopt).ok());
  EXPECT_EQ(ReadAll(from_map), ReadAll(from_copy));
  return fs::file_size(from_copy);
}

TEST(RepackLoad, ColumnGroupsOnlyForInt8RoutesInCopiedFilesWithTheMappedLogits) {
  if (!kernels::CpuHasVnni() && !kernels::CpuHasAvx2())
    GTEST_SKIP() << "no AVX512-VNNI and no AVX2: the int8 routes do not run";
  const fs::path dir = fs::temp_directory_path() / ("lumen_repack_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  for (DType t : {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kQ4_K,
                  DType::kQ5_K, DType::kQ8_0, DType::kQ6_K, DType::kQ2_K, DType::kQ3_K}) {
    SCOPED_TRACE(std::string(Name(t)));
    const std::string path = (dir / (std::string(Name(t)) + ".gguf")).string();
    SynthOptions so;
    so.dtype = t;
    // Legacy, K = 640: a group and a quad; 1120: two groups, a pair and a
    // half block. K-quants, 768: a group and a super-block; 1280: two and one.
    const bool super = Info(t).block_elems == 256;
    ASSERT_TRUE(Synthesize(Tiny(so, path, super ? 768 : 640, super ? 1280 : 1120)).ok());
    auto copied = LoadAs(path, kernels::ActRoute::kInt8x2, Residency::kCopy);
    auto mapped = LoadAs(path, kernels::ActRoute::kInt8x2, Residency::kMap);
    auto exact = LoadAs(path, kernels::ActRoute::kExact, Residency::kCopy);
    const auto& w = copied->weights();
    for (const kernels::Matrix* m :
         {&w.tok_embd, &w.output, &w.layers[0].wq, &w.layers[1].w_down, &w.layers[1].w_up})
      EXPECT_EQ(kernels::Int8ColumnGroupsOf(t), m->w.dtype) << Name(t);
    EXPECT_EQ(t, mapped->weights().layers[0].wq.w.dtype);
    EXPECT_EQ(t, exact->weights().layers[0].wq.w.dtype);

    const std::vector<int32_t> ids = {1, 17, 230, 5, 99, 311, 42, 7, 480};
    ExpectSumsInAnotherOrder(Logits(*copied, ids), Logits(*mapped, ids), Logits(*exact, ids));

    // Converted, the repacked model writes the plain type, byte for byte the
    // file the mapped model writes.
    EXPECT_EQ(fs::file_size(path), ExpectSameConversion(*copied, *mapped, dir));
  }
  fs::remove_all(dir);
}

// MLX matrices' codes rewritten at load in the order of this CPU's int8
// kernels (core/repack.h; kernels::Int8MlxOrder): runs where they are the AVX2
// ones, groups where they are the AVX-512 VNNI ones; only for an int8 route
// in a copied file, every MLX matrix those kernels read (the tied embedding
// table too, whose rows the lookup reads back in the file's order); the
// logits bit for bit those of the same file mapped (the kernels' sums are
// the same, only where the transpose happens moves; VNNI 8-bit: within float
// rounding, its groups summed by block, the file's twins otherwise), through
// the int8x2 rows and the products of a longer prompt (the exact panels, or
// the int8x2 GEMM, which reads the file's order back);
// converted, the same file. Rows with and without codes after their last
// whole run or group.
TEST(RepackLoad, MlxCodesInTheInt8KernelsOrderOnlyInCopiedFilesWithTheMappedLogits) {
  if (!kernels::CpuHasVnni() && !kernels::CpuHasAvx2())
    GTEST_SKIP() << "no int8 kernels here (neither VNNI nor AVX2)";
  const bool vnni = kernels::CpuHasVnni();
  const fs::path dir = fs::temp_directory_path() / ("lumen_mlxruns_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  struct Case {
    int bits, group, dim, ffn;
  };
  // 4-bit runs hold 256 elements, 8-bit 128, groups 512: K = 640 leaves
  // 4-bit a run tail of 128 (a group tail of 128), 1120 leaves 96 (8-bit: 96;
  // groups: 96), 1152 leaves 4-bit 128 (groups 128); 768 and 1280 no run tail
  // (groups: 256).
  for (const Case c : {Case{4, 32, 640, 1120}, Case{8, 32, 640, 1120}, Case{4, 64, 640, 1152},
                       Case{8, 64, 640, 1152}, Case{4, 128, 768, 1280}}) {
    const std::string name = "mlx" + std::to_string(c.bits) + "_g" + std::to_string(c.group);
    SCOPED_TRACE(name);
    const kernels::MlxOrder want = vnni ? kernels::MlxOrder::kGroups : kernels::MlxOrder::kRuns;
    const std::string path = (dir / name).string();
    SynthOptions so;
    so.format = OutputFormat::kHf;
    so.mlx_bits = c.bits;
    so.mlx_group = c.group;
    ASSERT_TRUE(Synthesize(Tiny(so, path, c.dim, c.ffn)).ok());
    auto copied = LoadAs(path, kernels::ActRoute::kInt8x2, Residency::kCopy);
    auto mapped = LoadAs(path, kernels::ActRoute::kInt8x2, Residency::kMap);
    auto exact = LoadAs(path, kernels::ActRoute::kExact, Residency::kCopy);
    const auto& w = copied->weights();
    for (const kernels::Matrix* m :
         {&w.tok_embd, &w.output, &w.layers[0].wq, &w.layers[1].w_down, &w.layers[1].w_up}) {
      EXPECT_EQ(c.bits, m->mlx_bits);
      // The VNNI kernels take rows of whole 64-element vectors (w_down of
      // the 1120-wide FFN is not one: the exact route's, in the file's order).
      const bool covered = !vnni || m->k % 64 == 0;
      EXPECT_EQ(covered ? want : kernels::MlxOrder::kFile, m->mlx_order) << m->k;
    }
    EXPECT_EQ(kernels::MlxOrder::kFile, mapped->weights().layers[0].wq.mlx_order);
    EXPECT_EQ(kernels::MlxOrder::kFile, exact->weights().layers[0].wq.mlx_order);

    const std::vector<int32_t> ids = {1, 17, 230, 5, 99, 311, 42, 7, 480};
    std::vector<int32_t> longer(40);  // one prefill of 40 rows: the exact panels or the GEMM
    for (size_t i = 0; i < longer.size(); ++i) longer[i] = static_cast<int32_t>(i * 37 % 500 + 1);
    if (vnni && c.bits == 8) {  // the VNNI kernels sum 8-bit groups by block, the file by twin
      ExpectSumsInAnotherOrder(Logits(*copied, ids), Logits(*mapped, ids), Logits(*exact, ids));
      ExpectSumsInAnotherOrder(PrefillLogits(*copied, longer), PrefillLogits(*mapped, longer),
                               PrefillLogits(*exact, longer));
    } else {
      EXPECT_EQ(Logits(*mapped, ids), Logits(*copied, ids));
      EXPECT_EQ(PrefillLogits(*mapped, longer), PrefillLogits(*copied, longer));
    }

    ExpectSameConversion(*copied, *mapped, dir);
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace lumen::engine
