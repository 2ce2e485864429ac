// RouteKl on the embedded stories260K (trained weights, so real activation
// statistics): identical routes give KL 0 exactly; the int8-activation route
// (decoded token by token) and the bf16 prefill route (one prefill per
// sequence) on Q8_0 and Q4_0 weights each cost at most about what Q8_0 weight
// quantization costs (int8 per 32-block is the same precision on the other
// operand; bf16 rounds both operands to 8 significant bits); a wrong kernel
// gives KL of order 1. The two-level int8x2 decode route costs orders of
// magnitude less and passes the default gate.
#include "lumen/eval/route_eval.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <initializer_list>
#include <map>
#include <string>

#include "lumen/core/repack.h"
#include "lumen/engine/convert.h"
#include "lumen/engine/default_model.h"
#include "lumen/engine/synth.h"
#include "lumen/engine/writer.h"
#include "lumen/kernels/matmul_bf16.h"
#include "lumen/kernels/matmul_q8.h"
#include "lumen/kernels/matmul_q8_avx2.h"
#include "lumen/model/weights.h"

namespace lumen::eval {
namespace {

namespace fs = std::filesystem;

std::unique_ptr<engine::Model> Load(const std::string& path, kernels::ActRoute route) {
  engine::LoadOptions lo;
  lo.act_route = route;
  auto m = engine::Model::Load(path, lo);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return m.ok() ? std::move(m).value() : nullptr;
}

// The gate tests' scratch folder (removed by the test) and prompts.
fs::path GateDir(const std::string& tag) {
  fs::path dir = fs::temp_directory_path() / (tag + "_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir;
}

Result<std::vector<Seq>> GatePrompts(const engine::Model& m) {
  return EncodePrompts(
      m, std::vector<std::string>{"Once upon a time", "Lily saw a big dog", "The sun was",
                                  "Tom had a red ball", "One day, a little bird"});
}

TEST(RouteKl, Int8AndBf16RoutesCostAboutWhatQ8WeightsCost) {
  auto f32 = engine::LoadDefaultModel();
  ASSERT_TRUE(f32.ok());
  const fs::path dir = fs::temp_directory_path() / ("lumen_route_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto prompts = EncodePrompts(
      **f32, std::vector<std::string>{"Once upon a time", "Lily saw a big dog", "The sun was"});
  ASSERT_TRUE(prompts.ok());
  EvalOptions o;
  o.samples = 2;
  o.max_tokens = 24;

  // Same weights, same route: bit-identical logits.
  auto same = RouteKl(**f32, **f32, *prompts, o);
  ASSERT_TRUE(same.ok()) << same.status().message();
  EXPECT_EQ(same->kl_mean, 0.0);
  EXPECT_EQ(same->top1, 1.0);
  EXPECT_GT(same->positions, 40);

  double kl_weights = 0;
  for (DType t : {DType::kQ8_0, DType::kQ4_0}) {
    const std::string path = (dir / (std::string(Name(t)) + ".gguf")).string();
    ASSERT_TRUE(engine::ConvertModel(**f32, engine::OutputFormat::kGguf, path, t).ok());
    auto exact = Load(path, kernels::ActRoute::kExact);
    auto int8 = Load(path, kernels::ActRoute::kInt8);
    ASSERT_TRUE(exact && int8);
    if (t == DType::kQ8_0) {
      auto w = RouteKl(**f32, *exact, *prompts, o);  // f32 -> Q8_0 weights, exact route
      ASSERT_TRUE(w.ok());
      kl_weights = w->kl_mean;
      std::printf("q8_0 weights vs f32: mean KL %.3g\n", kl_weights);
    }
    auto r = RouteKl(*exact, *int8, *prompts, o);
    ASSERT_TRUE(r.ok()) << r.status().message();
    std::printf("%s int8 route vs exact: mean KL %.3g (max %.3g), top-1 %.3f over %lld\n",
                std::string(Name(t)).c_str(), r->kl_mean, r->kl_max, r->top1,
                static_cast<long long>(r->positions));
    EXPECT_GT(r->kl_mean, 0.0) << Name(t);  // the route ran
    EXPECT_LE(r->kl_mean, 2 * kl_weights) << Name(t);
    EXPECT_GE(r->top1, 0.9) << Name(t);

    // The bf16 route, measured where it applies: one prefill per sequence.
    if (!kernels::CpuHasBf16()) continue;
    auto bf16 = Load(path, kernels::ActRoute::kBf16);
    ASSERT_TRUE(bf16);
    auto exact_prefill = RouteKl(*exact, *exact, *prompts, o, RouteMode::kPrefill);
    ASSERT_TRUE(exact_prefill.ok());
    EXPECT_LT(exact_prefill->kl_mean, 1e-6) << Name(t);  // prefill vs decode: f32 order only
    auto b = RouteKl(*exact, *bf16, *prompts, o, RouteMode::kPrefill);
    ASSERT_TRUE(b.ok()) << b.status().message();
    std::printf("%s bf16 prefill route vs exact: mean KL %.3g (max %.3g), top-1 %.3f over %lld\n",
                std::string(Name(t)).c_str(), b->kl_mean, b->kl_max, b->top1,
                static_cast<long long>(b->positions));
    EXPECT_GT(b->kl_mean, 100 * exact_prefill->kl_mean) << Name(t);  // the route ran
    EXPECT_LE(b->kl_mean, 2 * kl_weights) << Name(t);
    EXPECT_GE(b->top1, 0.9) << Name(t);
  }
  fs::remove_all(dir);
}

// The default-route gate (issue 13, DESIGN.md section 4): a route may be the
// default only if its KL to the exact route is below a quarter of what Q8_0
// weights cost. The bf16 prefill route is the default (cli/common.cc); this
// holds it to that on the embedded model's f32 weights and on Q8_0 weights.
TEST(RouteKl, Bf16PrefillPassesTheDefaultGate) {
  if (!kernels::CpuHasBf16()) GTEST_SKIP() << "no AVX512-BF16 on this CPU: the route never runs";
  auto f32 = engine::LoadDefaultModel();
  ASSERT_TRUE(f32.ok());
  const fs::path dir = GateDir("lumen_gate");
  auto prompts = GatePrompts(**f32);
  ASSERT_TRUE(prompts.ok());
  EvalOptions o;
  o.samples = 2;
  o.max_tokens = 32;
  const std::string q8_path = (dir / "q8_0.gguf").string();
  ASSERT_TRUE(engine::ConvertModel(**f32, engine::OutputFormat::kGguf, q8_path, DType::kQ8_0).ok());
  auto q8 = Load(q8_path, kernels::ActRoute::kExact);
  ASSERT_TRUE(q8);
  auto w = RouteKl(**f32, *q8, *prompts, o, RouteMode::kPrefill);
  ASSERT_TRUE(w.ok());
  for (const std::string& path : {std::string(), q8_path}) {  // "": the embedded f32 model
    auto load = [&](kernels::ActRoute route) {
      engine::LoadOptions lo;
      lo.act_route = route;
      return engine::LoadModelOrDefault(path, lo);
    };
    auto exact = load(kernels::ActRoute::kExact);
    auto bf16 = load(kernels::ActRoute::kBf16);
    ASSERT_TRUE(exact.ok() && bf16.ok());
    auto b = RouteKl(**exact, **bf16, *prompts, o, RouteMode::kPrefill);
    ASSERT_TRUE(b.ok()) << b.status().message();
    std::printf("%s: bf16 prefill KL %.3g vs Q8_0 weights %.3g (ratio %.3f)\n", path.c_str(),
                b->kl_mean, w->kl_mean, b->kl_mean / w->kl_mean);
    EXPECT_GT(b->kl_mean, 0.0) << path;  // the route ran
    EXPECT_LT(b->kl_mean, 0.25 * w->kl_mean) << path;
  }
  fs::remove_all(dir);
}

// The default gate for the int8x2 route at prefill, measured where it runs
// (one prefill per sequence of at most `rows` tokens, every position's
// logits), on the embedded model's Q8_0 conversion (which also gives what
// Q8_0 weights cost) and its conversions to `more`; expect_rows: the route's
// Int8MaxRows per conversion, checked before measuring.
void ExpectInt8x2PrefillGate(const char* dir_name, int64_t rows,
                             const std::map<std::string, int64_t>& expect_rows,
                             std::initializer_list<DType> more) {
  auto f32 = engine::LoadDefaultModel();
  ASSERT_TRUE(f32.ok());
  const fs::path dir = GateDir(dir_name);
  auto prompts = GatePrompts(**f32);
  ASSERT_TRUE(prompts.ok());
  std::vector<std::string> paths;
  std::vector<DType> types = {DType::kQ8_0};
  types.insert(types.end(), more);
  for (DType t : types) {
    paths.push_back((dir / (std::string(Name(t)) + ".gguf")).string());
    ASSERT_TRUE(engine::ConvertModel(**f32, engine::OutputFormat::kGguf, paths.back(), t).ok());
  }
  auto q8 = Load(paths[0], kernels::ActRoute::kExact);
  ASSERT_TRUE(q8);
  for (const std::string& path : paths) {
    const std::string name = fs::path(path).stem().string();
    auto exact = Load(path, kernels::ActRoute::kExact);
    auto x2 = Load(path, kernels::ActRoute::kInt8x2);
    ASSERT_TRUE(exact && x2);
    const kernels::Matrix& up = x2->weights().layers[0].w_up;
    if (!expect_rows.empty()) {
      ASSERT_EQ(kernels::Int8MaxRows(up), expect_rows.at(name)) << name;
    }
    const int64_t n = rows > 0 ? rows : kernels::Int8MaxRows(up);
    ASSERT_TRUE(kernels::UsesInt8Route(up, n)) << name;
    EvalOptions o;
    o.samples = 2;
    o.max_tokens = static_cast<int>(n) - 7;  // the prompts are at most 7 tokens
    auto w = RouteKl(**f32, *q8, *prompts, o, RouteMode::kPrefill);  // what Q8_0 weights cost
    auto r = RouteKl(*exact, *x2, *prompts, o, RouteMode::kPrefill);
    ASSERT_TRUE(w.ok() && r.ok()) << r.status().message();
    std::printf(
        "%s: int8x2 prefill of at most %lld tokens: KL %.3g (max %.3g, top-1 %.3f over %lld) vs "
        "Q8_0 weights %.3g (ratio %.2g)\n",
        name.c_str(), static_cast<long long>(n), r->kl_mean, r->kl_max, r->top1,
        static_cast<long long>(r->positions), w->kl_mean, r->kl_mean / w->kl_mean);
    EXPECT_GT(r->kl_mean, 0.0) << name;  // the route ran
    EXPECT_LT(r->kl_mean, 0.25 * w->kl_mean) << name;
    EXPECT_GE(r->top1, 0.99) << name;
  }
  fs::remove_all(dir);
}

// Prompts of up to kernels::Int8MaxRows tokens take the int8x2 dot kernels
// at prefill too: with the AVX2 kernels and no bf16 route 12 for Q8_0 and 32
// for Q4_0, with the VNNI kernels (the GEMM above) 32 for both.
TEST(RouteKl, Int8x2ShortPrefillPassesTheDefaultGate) {
  if (!kernels::CpuHasVnni() && !kernels::CpuHasAvx2())
    GTEST_SKIP() << "no AVX512-VNNI and no AVX2 on this CPU: the route never runs";
  const int64_t q8_rows = kernels::CpuHasVnni() ? 32 : 12;
  ExpectInt8x2PrefillGate("lumen_gatesp", 0, {{"q8_0", q8_rows}, {"q4_0", 32}}, {DType::kQ4_0});
}

// On AVX512-VNNI CPUs every prompt takes the int8x2 route: above Int8MaxRows
// tokens (Q8_0, Q4_0: 32; F16, BF16: 8) the GEMM (kernels/matmul_q8x2_gemm.h);
// sequences of 64 tokens. F16 and BF16 weights take it requantized to 12-bit
// codes per 32.
TEST(RouteKl, Int8x2PrefillGemmPassesTheDefaultGate) {
  if (!kernels::CpuHasVnni())
    GTEST_SKIP() << "the int8x2 prefill GEMM needs AVX512-VNNI: not on this CPU";
  ExpectInt8x2PrefillGate("lumen_gategemm", 64, {}, {DType::kQ4_0, DType::kBF16, DType::kF16});
}

// The same gate for the int8x2 decode route, the default decode route
// (cli/routes.h), measured where it runs: token by token. On the embedded
// model's f32 weights it does not apply (the exact route runs: KL 0); on the
// Q8_0 and Q4_0 conversions it must stay below a quarter of what Q8_0 weights
// cost, and far below the one-level int8 route.
TEST(RouteKl, Int8x2DecodePassesTheDefaultGate) {
  if (!kernels::CpuHasVnni() && !kernels::CpuHasAvx2())
    GTEST_SKIP() << "no AVX512-VNNI and no AVX2 on this CPU: the route never runs";
  auto f32 = engine::LoadDefaultModel();
  ASSERT_TRUE(f32.ok());
  const fs::path dir = GateDir("lumen_gate8");
  auto prompts = GatePrompts(**f32);
  ASSERT_TRUE(prompts.ok());
  EvalOptions o;
  o.samples = 2;
  o.max_tokens = 32;
  std::vector<std::string> paths = {std::string()};  // "": the embedded f32 model
  for (DType t : {DType::kQ8_0, DType::kQ4_0}) {
    paths.push_back((dir / (std::string(Name(t)) + ".gguf")).string());
    ASSERT_TRUE(engine::ConvertModel(**f32, engine::OutputFormat::kGguf, paths.back(), t).ok());
  }
  auto q8 = Load(paths[1], kernels::ActRoute::kExact);
  ASSERT_TRUE(q8);
  auto w = RouteKl(**f32, *q8, *prompts, o);  // f32 -> Q8_0 weights, both exact, token by token
  ASSERT_TRUE(w.ok());
  std::printf("q8_0 weights vs f32 (decode): mean KL %.3g\n", w->kl_mean);
  for (const std::string& path : paths) {
    auto load = [&](kernels::ActRoute route) {
      engine::LoadOptions lo;
      lo.act_route = route;
      return engine::LoadModelOrDefault(path, lo);
    };
    auto exact = load(kernels::ActRoute::kExact);
    auto x2 = load(kernels::ActRoute::kInt8x2);
    auto int8 = load(kernels::ActRoute::kInt8);
    ASSERT_TRUE(exact.ok() && x2.ok() && int8.ok());
    auto r = RouteKl(**exact, **x2, *prompts, o);
    auto r1 = RouteKl(**exact, **int8, *prompts, o);
    ASSERT_TRUE(r.ok() && r1.ok());
    const std::string name = path.empty() ? "embedded f32" : fs::path(path).stem().string();
    std::printf(
        "%s: int8x2 decode KL %.3g (max %.3g, top-1 %.3f over %lld) vs Q8_0 weights %.3g "
        "(ratio %.2g); one-level int8 KL %.3g\n",
        name.c_str(), r->kl_mean, r->kl_max, r->top1, static_cast<long long>(r->positions),
        w->kl_mean, r->kl_mean / w->kl_mean, r1->kl_mean);
    if (path.empty()) {
      EXPECT_EQ(r->kl_mean, 0.0);  // f32 weights: the exact route, the same bits
      continue;
    }
    EXPECT_GT(r->kl_mean, 0.0) << name;  // the route ran
    EXPECT_LT(r->kl_mean, 0.25 * w->kl_mean) << name;
    EXPECT_LT(r->kl_mean, 0.1 * r1->kl_mean) << name;
    EXPECT_GE(r->top1, 0.99) << name;
  }
  fs::remove_all(dir);
}

// A weight storage to convert a model to: a GGUF type, or MLX bits and group.
struct Storage {
  DType type = DType::kF32;
  int mlx_bits = 0, mlx_group = 0;
  std::string name() const {
    return mlx_bits ? "mlx" + std::to_string(mlx_bits) + "_g" + std::to_string(mlx_group)
                    : std::string(Name(type));
  }
  bool Holds(const kernels::Matrix& m) const {  // repacked at load (core/repack.h) too
    return mlx_bits ? m.mlx_bits == mlx_bits && m.mlx_group == mlx_group
                    : m.mlx_bits == 0 && PlainOf(m.w.dtype) == type;
  }
};

// `src` written as `st` into dir: a GGUF file, or an MLX (Hugging Face) directory.
std::string WriteAs(const engine::Model& src, const Storage& st, const fs::path& dir) {
  std::string path = (dir / st.name()).string() + (st.mlx_bits ? "" : ".gguf");
  if (!st.mlx_bits) {
    EXPECT_TRUE(engine::ConvertModel(src, engine::OutputFormat::kGguf, path, st.type).ok());
    return path;
  }
  model::ModelConfig target;
  const auto plans = engine::PlansFor(src, engine::OutputFormat::kHf, target);
  engine::WriteOptions wo;
  wo.mlx_bits = st.mlx_bits;
  wo.mlx_group = st.mlx_group;
  wo.chat_template = src.chat_template();
  EXPECT_TRUE(engine::WriteHfModel(target, src.tokenizer(), plans, wo, path).ok());
  return path;
}

// A random-weight tiny Llama 256 wide written into dir (the K-quants need
// 256-wide rows), and its path.
std::string SynthTiny256(const fs::path& dir) {
  engine::SynthOptions so;
  so.name = "tiny-llama";
  so.dim = 256;
  so.ffn = 512;
  so.out = (dir / "tiny256.gguf").string();
  EXPECT_TRUE(engine::Synthesize(so).ok());
  return so.out;
}

// The default gate for the int8x2 decode route on each storage of `f32`'s
// weights: KL to the exact route below a quarter of what Q8_0 weights cost
// on the same model, with the storage's int8 kernel in use.
void ExpectGateOnEachStorage(const engine::Model& f32, const std::vector<Storage>& storages,
                             const std::vector<std::string>& texts, const fs::path& dir) {
  auto prompts = EncodePrompts(f32, texts);
  ASSERT_TRUE(prompts.ok());
  EvalOptions o;
  o.samples = 2;
  o.max_tokens = 32;
  // One thread: the products are small, and a pool only adds hand-offs (and
  // waits on a loaded CI machine).
  auto load = [](const std::string& path, kernels::ActRoute route) {
    engine::LoadOptions lo;
    lo.act_route = route;
    lo.threads = 1;
    auto m = engine::Model::Load(path, lo);
    EXPECT_TRUE(m.ok()) << m.status().message();
    return m.ok() ? std::move(m).value() : nullptr;
  };
  auto q8 = load(WriteAs(f32, {DType::kQ8_0}, dir), kernels::ActRoute::kExact);
  ASSERT_TRUE(q8);
  auto w = RouteKl(f32, *q8, *prompts, o);  // f32 -> Q8_0 weights, both exact, token by token
  ASSERT_TRUE(w.ok());
  std::printf("%s: q8_0 weights vs f32 (decode): mean KL %.3g\n", f32.name().c_str(), w->kl_mean);
  for (const Storage& st : storages) {
    const std::string path = WriteAs(f32, st, dir);
    auto exact = load(path, kernels::ActRoute::kExact);
    auto x2 = load(path, kernels::ActRoute::kInt8x2);
    ASSERT_TRUE(exact && x2) << st.name();
    int kernels_used = 0;  // matrices of this storage on the int8x2 route
    model::ForEachMatrix(x2->weights(), [&](const kernels::Matrix& m) {
      if (st.Holds(m) && kernels::UsesInt8Route(m, 1)) ++kernels_used;
    });
    EXPECT_GT(kernels_used, 0) << st.name();
    auto r = RouteKl(*exact, *x2, *prompts, o);
    ASSERT_TRUE(r.ok()) << r.status().message();
    std::printf(
        "%s %s (%d matrices): int8x2 decode KL %.3g (max %.3g, top-1 %.3f over %lld) vs Q8_0 "
        "weights %.3g (ratio %.2g)\n",
        f32.name().c_str(), st.name().c_str(), kernels_used, r->kl_mean, r->kl_max, r->top1,
        static_cast<long long>(r->positions), w->kl_mean, r->kl_mean / w->kl_mean);
    EXPECT_GT(r->kl_mean, 0.0) << st.name();  // the route ran
    EXPECT_LT(r->kl_mean, 0.25 * w->kl_mean) << st.name();
    EXPECT_GE(r->top1, 0.99) << st.name();
  }
}

// The same gate for the weight types whose int8 kernels came after the test
// above (issue 13): the legacy types and MLX groups of 32 and 8-bit on the
// embedded stories260K (trained weights; its 64-wide rows take them, the
// 172-wide ones fall back to f16), the K-quants and MLX 8-bit groups of 128
// on a random-weight tiny Llama 256 wide (the K-quants need 256-wide rows,
// which stories260K does not have).
TEST(RouteKl, Int8x2DecodeGateOnEveryWeightType) {
  if (!kernels::CpuHasVnni() && !kernels::CpuHasAvx2())
    GTEST_SKIP() << "no AVX512-VNNI and no AVX2 on this CPU: the route never runs";
  const fs::path dir = fs::temp_directory_path() / ("lumen_gate_all_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  engine::LoadOptions one;
  one.threads = 1;
  auto stories = engine::LoadDefaultModel(one);
  ASSERT_TRUE(stories.ok());
  ExpectGateOnEachStorage(**stories,
                          {{DType::kQ4_1},
                           {DType::kQ5_0},
                           {DType::kQ5_1},
                           {DType::kF32, 4, 32},
                           {DType::kF32, 8, 32},
                           {DType::kF32, 8, 64}},
                          {"Once upon a time", "Lily saw a big dog", "The sun was",
                           "Tom had a red ball", "One day, a little bird"},
                          dir);

  engine::LoadOptions lo;
  lo.threads = 1;
  auto tiny = engine::Model::Load(SynthTiny256(dir), lo);
  ASSERT_TRUE(tiny.ok()) << tiny.status().message();
  ExpectGateOnEachStorage(**tiny,
                          {{DType::kQ2_K},
                           {DType::kQ3_K},
                           {DType::kQ5_K},
                           {DType::kF32, 8, 128},
                           {DType::kF32, 4, 64}},  // K = 512: a 512-weight group (RowsMlx)
                          {"the cat", "a b c d", "hello world", "one two three", "x y z"}, dir);
  fs::remove_all(dir);
}

// The default gate for MLX rows on the int8x2 route at prefill, measured
// where it runs (one prefill per sequence, every position's logits), on a
// random-weight tiny Llama 256 wide, whose rows hold whole runs of the
// kernels' blocks (stories260K's 64-wide rows are all tail). gemm: prompts of
// 64 tokens on the VNNI GEMM; else the dot kernels' short prompts (VNNI: up
// to 32 tokens; AVX2 4-bit: 32, 8-bit: 10).
void ExpectMlxPrefillGate(const char* dir_name, bool gemm) {
  const fs::path dir = GateDir(dir_name);
  auto tiny = Load(SynthTiny256(dir), kernels::ActRoute::kExact);
  ASSERT_TRUE(tiny);
  auto prompts = EncodePrompts(*tiny, std::vector<std::string>{"the cat", "a b c d", "x y z"});
  ASSERT_TRUE(prompts.ok());
  size_t longest = 0;
  for (const Seq& s : *prompts) longest = std::max(longest, s.size());
  auto q8 = Load(WriteAs(*tiny, {DType::kQ8_0}, dir), kernels::ActRoute::kExact);
  ASSERT_TRUE(q8);
  for (const Storage& st : {Storage{DType::kF32, 4, 64}, Storage{DType::kF32, 8, 128}}) {
    const std::string path = WriteAs(*tiny, st, dir);
    auto exact = Load(path, kernels::ActRoute::kExact);
    auto x2 = Load(path, kernels::ActRoute::kInt8x2);
    ASSERT_TRUE(exact && x2) << st.name();
    const kernels::Matrix& up = x2->weights().layers[0].w_up;
    ASSERT_TRUE(st.Holds(up)) << st.name();
    const int64_t rows = gemm ? 64 : kernels::Int8MaxRows(up);
    if (gemm) {
      ASSERT_TRUE(kernels::Int8x2GemmTakes(up)) << st.name();
    } else {
      ASSERT_EQ(rows, st.mlx_bits == 4 || kernels::CpuHasVnni() ? 32 : 10) << st.name();
    }
    ASSERT_TRUE(kernels::UsesInt8Route(up, rows)) << st.name();
    EvalOptions o;
    o.samples = 2;
    o.max_tokens = static_cast<int>(rows - static_cast<int64_t>(longest));
    auto w = RouteKl(*tiny, *q8, *prompts, o, RouteMode::kPrefill);  // what Q8_0 weights cost
    auto r = RouteKl(*exact, *x2, *prompts, o, RouteMode::kPrefill);
    ASSERT_TRUE(w.ok() && r.ok()) << st.name();
    std::printf(
        "%s: int8x2 prefill of at most %lld tokens: KL %.3g (max %.3g, top-1 %.3f over %lld) vs "
        "Q8_0 weights %.3g (ratio %.2g)\n",
        st.name().c_str(), static_cast<long long>(rows), r->kl_mean, r->kl_max, r->top1,
        static_cast<long long>(r->positions), w->kl_mean, r->kl_mean / w->kl_mean);
    EXPECT_GT(r->kl_mean, 0.0) << st.name();  // the route ran
    EXPECT_LT(r->kl_mean, 0.25 * w->kl_mean) << st.name();
    EXPECT_GE(r->top1, 0.99) << st.name();
  }
  fs::remove_all(dir);
}

TEST(RouteKl, Int8x2ShortPrefillGateOnMlx) {
  if (!kernels::CpuHasVnni() && !kernels::CpuHasAvx2())
    GTEST_SKIP() << "no AVX512-VNNI and no AVX2 on this CPU: the route never runs";
  ExpectMlxPrefillGate("lumen_gate_mlxp", false);
}

// With AVX512-VNNI, MLX prompts above 32 tokens take the int8x2 GEMM.
TEST(RouteKl, Int8x2PrefillGemmGateOnMlx) {
  if (!kernels::CpuHasVnni())
    GTEST_SKIP() << "the int8x2 prefill GEMM needs AVX512-VNNI: not on this CPU";
  ExpectMlxPrefillGate("lumen_gate_mlxgemm", true);
}

}  // namespace
}  // namespace lumen::eval
