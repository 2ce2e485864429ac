// GGUF reader/writer tests: real fixtures (facts from their READMEs and an
// independent Python parse), exact write->read round trips, and bad input.
#include "lumen/formats/gguf.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include <unistd.h>

#include "lumen/core/half.h"
#include "lumen/core/quant.h"

namespace lumen::formats {
namespace {

using ::testing::HasSubstr;

std::string FixturesDir() {
  if (const char* env = std::getenv("LUMEN_FIXTURES")) return env;
  return std::string(LUMEN_SOURCE_DIR) + "/../shared/fixtures";
}

std::string FixturePath(const std::string& rel) { return FixturesDir() + "/" + rel; }

#define SKIP_IF_MISSING(path) \
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "fixture not found: " << (path)

float F16At(const TensorView& v, int64_t i) { return F16ToF32(v.as<const uint16_t>()[i]); }
float F32At(const TensorView& v, int64_t i) { return v.as<const float>()[i]; }

TEST(GgufFixture, LlamaTinyRandomF16) {
  const std::string path = FixturePath("llama-2-tiny-random-gguf/llama-2-tiny-random.gguf");
  SKIP_IF_MISSING(path);
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->data_offset(), 724416u);
  EXPECT_EQ(f->metadata().size(), 18u);
  ASSERT_EQ(f->tensors().size(), 12u);

  EXPECT_EQ(*f->GetString("general.architecture"), "llama");
  EXPECT_EQ(*f->GetString("general.name"), "LLaMA v2");
  EXPECT_EQ(*f->GetInt("general.file_type"), 1);
  EXPECT_EQ(*f->GetInt("llama.context_length"), 4096);
  EXPECT_EQ(*f->GetInt("llama.embedding_length"), 8);
  EXPECT_EQ(*f->GetInt("llama.block_count"), 1);
  EXPECT_EQ(*f->GetInt("llama.feed_forward_length"), 32);
  EXPECT_EQ(*f->GetInt("llama.rope.dimension_count"), 4);
  EXPECT_EQ(*f->GetInt("llama.attention.head_count"), 2);
  EXPECT_EQ(*f->GetInt("llama.attention.head_count_kv"), 2);
  EXPECT_FLOAT_EQ(static_cast<float>(*f->GetFloat("llama.attention.layer_norm_rms_epsilon")),
                  1e-5f);
  EXPECT_EQ(*f->GetInt("tokenizer.ggml.bos_token_id"), 1);
  EXPECT_EQ(*f->GetInt("tokenizer.ggml.eos_token_id"), 2);
  EXPECT_EQ(*f->GetInt("tokenizer.ggml.unknown_token_id"), 0);
  EXPECT_EQ(*f->GetFloat("llama.rope.freq_base", 10000.0), 10000.0);  // absent -> default
  EXPECT_FALSE(f->GetInt("general.name").ok());                       // wrong type

  const GgufValue* tokens = f->Find("tokenizer.ggml.tokens");
  ASSERT_NE(tokens, nullptr);
  ASSERT_EQ(tokens->type, GgufType::kArray);
  EXPECT_EQ(tokens->array_type, GgufType::kString);
  ASSERT_EQ(tokens->AsArray()->size(), 32000u);
  EXPECT_EQ(*(*tokens->AsArray())[1].AsString(), "<s>");
  EXPECT_EQ(*tokens->AsArray()->back().AsString(), "\xe7\xbb\x99");  // U+7ED9
  const auto& types = *f->Find("tokenizer.ggml.token_type")->AsArray();
  int counts[7] = {};
  for (const auto& t : types) counts[*t.AsInt()]++;
  EXPECT_EQ(counts[1], 31741);
  EXPECT_EQ(counts[6], 256);
  EXPECT_EQ(counts[3], 2);
  EXPECT_EQ(counts[2], 1);
  EXPECT_EQ(*f->Find("tokenizer.ggml.scores")->AsArray()->back().AsFloat(), -31740.0);

  const GgufTensorInfo* emb = f->FindTensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->dtype, DType::kF16);
  EXPECT_EQ(emb->ne, (std::vector<int64_t>{8, 32000}));
  EXPECT_EQ(emb->view.ShapeString(), "[32000, 8]");
  EXPECT_EQ(emb->nbytes, 8u * 32000 * 2);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(F16At(emb->view, i), 0.0f);  // row 0 is all zeros
  EXPECT_EQ(F16At(emb->view, 8), 0.034088134765625f);
  EXPECT_EQ(F16At(emb->view, 9), 0.0158843994140625f);

  const GgufTensorInfo* down = f->FindTensor("blk.0.ffn_down.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->ne, (std::vector<int64_t>{32, 8}));
  EXPECT_EQ(down->view.ShapeString(), "[8, 32]");
  EXPECT_EQ(down->offset, 513536u);
  EXPECT_EQ(F16At(down->view, 0), 0.0207366943359375f);
  EXPECT_EQ(F16At(down->view, 32), -0.002490997314453125f);  // row 1

  const GgufTensorInfo* q = f->FindTensor("blk.0.attn_q.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(F16At(q->view, 0), 0.024261474609375f);
  EXPECT_EQ(F16At(q->view, 2), -0.0509033203125f);

  const GgufTensorInfo* norm = f->FindTensor("output_norm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->dtype, DType::kF32);
  EXPECT_EQ(norm->view.ndim, 1);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(F32At(norm->view, i), 1.0f);

  const GgufTensorInfo* out = f->FindTensor("output.weight");
  ASSERT_NE(out, nullptr);
  EXPECT_EQ(out->offset, 514144u);
  EXPECT_EQ(F16At(out->view, 1), 0.03363037109375f);
  EXPECT_EQ(f->tensors().back().name, "output.weight");
}

TEST(GgufFixture, Stories260KF32) {
  const std::string path = FixturePath("stories260K-gguf/stories260K.gguf");
  SKIP_IF_MISSING(path);
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->data_offset(), 14176u);
  EXPECT_EQ(f->metadata().size(), 19u);
  ASSERT_EQ(f->tensors().size(), 48u);
  EXPECT_EQ(f->metadata().front().first, "tokenizer.ggml.tokens");  // file order kept
  EXPECT_EQ(f->metadata().back().first, "llama.attention.layer_norm_rms_epsilon");
  EXPECT_EQ(*f->GetString("general.name"), "llama");
  EXPECT_EQ(*f->GetInt("llama.embedding_length"), 64);
  EXPECT_EQ(*f->GetInt("llama.feed_forward_length"), 172);
  EXPECT_EQ(*f->GetInt("llama.attention.head_count"), 8);
  EXPECT_EQ(*f->GetInt("llama.attention.head_count_kv"), 4);
  EXPECT_EQ(*f->GetInt("llama.block_count"), 5);
  EXPECT_EQ(*f->GetInt("llama.context_length"), 2048);
  EXPECT_EQ(*f->GetInt("tokenizer.ggml.padding_token_id"), 4294967295);
  EXPECT_EQ(f->Find("tokenizer.ggml.padding_token_id")->type, GgufType::kU32);
  EXPECT_EQ(f->Find("tokenizer.ggml.tokens")->AsArray()->size(), 512u);
  EXPECT_EQ(*f->Find("tokenizer.ggml.tokens")->AsArray()->back().AsString(), "\xe2\x80\x8a");
  EXPECT_EQ(*f->Find("tokenizer.ggml.scores")->AsArray()->back().AsFloat(), -252.0);

  for (const auto& t : f->tensors()) EXPECT_EQ(t.dtype, DType::kF32) << t.name;
  const GgufTensorInfo* emb = f->FindTensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->view.ShapeString(), "[512, 64]");
  EXPECT_EQ(F32At(emb->view, 0), -0.29474878311157227f);
  EXPECT_EQ(F32At(emb->view, 1), 0.5618956089019775f);
  EXPECT_EQ(F32At(emb->view, 64), -0.12708568572998047f);
  // output.weight is a bit-identical copy of the embedding (shared classifier).
  const GgufTensorInfo* out = f->FindTensor("output.weight");
  ASSERT_NE(out, nullptr);
  EXPECT_EQ(std::memcmp(out->view.data, emb->view.data, emb->nbytes), 0);

  const GgufTensorInfo* down = f->FindTensor("blk.4.ffn_down.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->ne, (std::vector<int64_t>{172, 64}));
  EXPECT_EQ(down->view.ShapeString(), "[64, 172]");
  EXPECT_EQ(down->offset, 1082880u);
  EXPECT_EQ(F32At(down->view, 0), -0.04791264981031418f);
  EXPECT_EQ(F32At(down->view, 172), 0.15593937039375305f);
  const GgufTensorInfo* k = f->FindTensor("blk.0.attn_k.weight");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->view.ShapeString(), "[32, 64]");
  EXPECT_EQ(F32At(k->view, 2), -0.21698929369449615f);
  const GgufTensorInfo* last = &f->tensors().back();
  EXPECT_EQ(last->name, "blk.4.ffn_norm.weight");
  EXPECT_EQ(f->data_offset() + last->offset + last->nbytes, 1185376u);  // ends at EOF
}

// ---------------------------------------------------------------------------
// Writer round trips.

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/lumen_gguf_test_XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string File(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

template <typename T>
GgufValue Val(GgufType t, T v) {
  GgufValue g;
  g.type = t;
  g.v = v;
  return g;
}

GgufValue Arr(GgufType et, std::vector<GgufValue> items) {
  GgufValue g;
  g.type = GgufType::kArray;
  g.array_type = et;
  g.v = std::move(items);
  return g;
}

bool SameValue(const GgufValue& a, const GgufValue& b) {
  if (a.type != b.type) return false;
  if (a.type == GgufType::kArray) {
    if (a.array_type != b.array_type) return false;
    const auto& x = *a.AsArray();
    const auto& y = *b.AsArray();
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i)
      if (!SameValue(x[i], y[i])) return false;
    return true;
  }
  if (const auto* d = std::get_if<double>(&a.v)) {  // compare bits: NaN and -0 too
    const auto* e = std::get_if<double>(&b.v);
    return e && std::memcmp(d, e, sizeof(double)) == 0;
  }
  if (a.v.index() != b.v.index()) return false;
  if (const auto* u = std::get_if<uint64_t>(&a.v)) return *u == std::get<uint64_t>(b.v);
  if (const auto* i = std::get_if<int64_t>(&a.v)) return *i == std::get<int64_t>(b.v);
  if (const auto* x = std::get_if<bool>(&a.v)) return *x == std::get<bool>(b.v);
  return *a.AsString() == *b.AsString();
}

std::vector<std::pair<std::string, GgufValue>> EveryValueType() {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<std::pair<std::string, GgufValue>> kv = {
      {"t.u8", Val(GgufType::kU8, uint64_t{255})},
      {"t.i8", Val(GgufType::kI8, int64_t{-128})},
      {"t.u16", Val(GgufType::kU16, uint64_t{65535})},
      {"t.i16", Val(GgufType::kI16, int64_t{-32768})},
      {"t.u32", Val(GgufType::kU32, uint64_t{4294967295u})},
      {"t.i32", Val(GgufType::kI32, int64_t{std::numeric_limits<int32_t>::min()})},
      {"t.f32", Val(GgufType::kF32, double{0.1f})},
      {"t.f32.nan", Val(GgufType::kF32, double{std::numeric_limits<float>::quiet_NaN()})},
      {"t.bool", Val(GgufType::kBool, true)},
      {"t.bool.false", Val(GgufType::kBool, false)},
      {"t.string", Val(GgufType::kString, std::string("h\xc3\xa9llo \xe2\x96\x81 world"))},
      {"t.string.empty", Val(GgufType::kString, std::string())},
      {"t.string.nul", Val(GgufType::kString, std::string("a\0b", 3))},
      {"t.u64", Val(GgufType::kU64, std::numeric_limits<uint64_t>::max())},
      {"t.i64", Val(GgufType::kI64, std::numeric_limits<int64_t>::min())},
      {"t.f64", Val(GgufType::kF64, 0.1)},
      {"t.f64.nan", Val(GgufType::kF64, nan)},
      {"t.f64.negzero", Val(GgufType::kF64, -0.0)},
      {"t.arr.empty", Arr(GgufType::kU8, {})},
      {"t.arr.strings", Arr(GgufType::kString, {Val(GgufType::kString, std::string("<s>")),
                                                Val(GgufType::kString, std::string(""))})},
      {"t.arr.arr",
       Arr(GgufType::kArray,
           {Arr(GgufType::kI32,
                {Val(GgufType::kI32, int64_t{1}), Val(GgufType::kI32, int64_t{-2})}),
            Arr(GgufType::kString, {Val(GgufType::kString, std::string("x"))}),
            Arr(GgufType::kArray, {Arr(GgufType::kBool, {Val(GgufType::kBool, true)})})})},
      {"\xe9\x94\xae.unicode", Val(GgufType::kU8, uint64_t{7})},
  };
  // An array of every scalar type.
  for (size_t i = 0, n = kv.size(); i < n; ++i) {
    const GgufValue& v = kv[i].second;
    if (v.type == GgufType::kArray) continue;
    kv.push_back({"arr." + kv[i].first, Arr(v.type, {v, v})});
  }
  return kv;
}

TEST(GgufWriter, RoundTripEveryValueType) {
  TempDir dir;
  GgufWriter w;
  const auto kv = EveryValueType();
  for (const auto& [k, v] : kv) w.SetValue(k, v);
  const std::string path = dir.File("values.gguf");
  ASSERT_TRUE(w.Write(path).ok());
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  ASSERT_EQ(f->metadata().size(), kv.size());
  for (size_t i = 0; i < kv.size(); ++i) {
    EXPECT_EQ(f->metadata()[i].first, kv[i].first);  // insertion order
    EXPECT_TRUE(SameValue(f->metadata()[i].second, kv[i].second)) << kv[i].first;
  }
  EXPECT_EQ(*f->GetInt("t.u32"), 4294967295);
  EXPECT_FALSE(f->GetInt("t.u64").ok());  // 2^64-1 does not fit in int64
  EXPECT_EQ(*f->Find("t.u64")->AsFloat(), 18446744073709551615.0);
  EXPECT_EQ(static_cast<float>(*f->GetFloat("t.f32")), 0.1f);
  EXPECT_EQ(*f->GetInt("t.bool"), 1);
  EXPECT_TRUE(f->tensors().empty());
}

// A file large enough to be copied into anonymous memory (the default above
// MappedFile::kCopyMinBytes): its header's pages go back to the file once
// parsed, and the metadata and the tensor bytes read the same as through the
// plain mapping (LUMEN_MMAP=1).
TEST(GgufWriter, CopiedFileGivesItsHeaderBackAndReadsTheSame) {
  TempDir dir;
  GgufWriter w;
  std::vector<std::string> vocab(100000);
  for (size_t i = 0; i < vocab.size(); ++i) vocab[i] = "piece_" + std::to_string(i * 7919);
  w.SetStringArray("tokenizer.ggml.tokens", vocab);  // a header of about 1.5 MB
  const int64_t rows = 8448, cols = 1024;            // 34.6 MB of f32
  std::string data(size_t(rows * cols) * sizeof(float), '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = char((i * 2654435761u) >> 17);
  ASSERT_TRUE(w.AddTensor("big", DType::kF32, {rows, cols}, data).ok());
  const std::string path = dir.File("big.gguf");
  ASSERT_TRUE(w.Write(path).ok());
  ASSERT_GE(std::filesystem::file_size(path), MappedFile::kCopyMinBytes);

  auto check = [&](const GgufFile& f) {
    const auto* tokens = f.Find("tokenizer.ggml.tokens")->AsArray();
    ASSERT_EQ(tokens->size(), vocab.size());
    EXPECT_EQ(*(*tokens)[77777].AsString(), vocab[77777]);
    const GgufTensorInfo* t = f.FindTensor("big");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(std::memcmp(t->view.data, data.data(), data.size()), 0);
  };
  auto copied = GgufFile::Open(path);
  ASSERT_TRUE(copied.ok()) << copied.status().message();
  const size_t size = std::filesystem::file_size(path);
  const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  ASSERT_GT(copied->data_offset(), 2 * page);
  EXPECT_EQ(copied->copied_bytes(), size - copied->data_offset() / page * page);
  check(*copied);

  ::setenv("LUMEN_MMAP", "1", 1);
  auto mapped = GgufFile::Open(path);
  ::unsetenv("LUMEN_MMAP");
  ASSERT_TRUE(mapped.ok());
  EXPECT_EQ(mapped->copied_bytes(), 0u);
  check(*mapped);
}

TEST(GgufWriter, HelpersAndReplacementKeepPosition) {
  TempDir dir;
  GgufWriter w;
  w.SetString("general.architecture", "llama");
  w.SetU32("llama.block_count", 3);
  w.SetI32("x.i32", -7);
  w.SetF32("x.f32", 1e-5f);
  w.SetBool("x.bool", true);
  w.SetStringArray("tokenizer.ggml.tokens", {"<unk>", "<s>", "\xe2\x96\x81the"});
  w.SetF32Array("tokenizer.ggml.scores", {0.0f, -1.5f, 3.25f});
  w.SetI32Array("tokenizer.ggml.token_type", {2, 3, 1});
  w.SetU32("llama.block_count", 5);  // replaces in place
  const std::string path = dir.File("h.gguf");
  ASSERT_TRUE(w.Write(path).ok());
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  ASSERT_EQ(f->metadata().size(), 8u);
  EXPECT_EQ(f->metadata()[1].first, "llama.block_count");
  EXPECT_EQ(*f->GetInt("llama.block_count"), 5);
  EXPECT_EQ(*f->GetInt("x.i32"), -7);
  EXPECT_EQ(static_cast<float>(*f->GetFloat("x.f32")), 1e-5f);
  const auto& toks = *f->Find("tokenizer.ggml.tokens")->AsArray();
  ASSERT_EQ(toks.size(), 3u);
  EXPECT_EQ(*toks[2].AsString(), "\xe2\x96\x81the");
  EXPECT_EQ(*f->Find("tokenizer.ggml.scores")->AsArray()->at(2).AsFloat(), 3.25);
  EXPECT_EQ(*f->Find("tokenizer.ggml.token_type")->AsArray()->at(0).AsInt(), 2);
}

constexpr DType kGgufDTypes[] = {
    DType::kF32,  DType::kF16,  DType::kBF16, DType::kF64,  DType::kI8,
    DType::kI16,  DType::kI32,  DType::kI64,  DType::kQ4_0, DType::kQ4_1,
    DType::kQ5_0, DType::kQ5_1, DType::kQ8_0, DType::kQ8_1, DType::kQ2_K,
    DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kQ8_K,
};

std::string RandomData(size_t n, uint32_t seed) {
  std::string s(n, '\0');
  uint32_t x = seed * 2654435761u + 1;
  for (auto& c : s) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    c = static_cast<char>(x);
  }
  return s;
}

TEST(GgufWriter, RoundTripEveryDTypeAndRank) {
  for (uint32_t alignment : {32u, 64u, 1u, 4096u}) {
    TempDir dir;
    GgufWriter w;
    w.SetString("general.architecture", "test");
    struct Want {
      std::string name;
      DType dt;
      std::vector<int64_t> shape;
      std::string data;
    };
    std::vector<Want> want;
    uint32_t seed = 1;
    for (DType dt : kGgufDTypes) {
      const int64_t be = Info(dt).block_elems;
      const std::vector<std::vector<int64_t>> shapes = {
          {be * 3}, {5, be}, {2, 3, be * 2}, {2, 1, 3, be}};
      for (const auto& shape : shapes) {
        int64_t rows = 1;
        for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
        const size_t bytes = *RowBytes(dt, shape.back()) * rows;
        Want t{fmt::format("{}.r{}", Name(dt), shape.size()), dt, shape, RandomData(bytes, seed++)};
        ASSERT_TRUE(w.AddTensor(t.name, dt, shape, t.data).ok()) << t.name;
        want.push_back(std::move(t));
      }
    }
    const std::string path = dir.File("t.gguf");
    ASSERT_TRUE(w.Write(path, alignment).ok());
    auto f = GgufFile::Open(path);
    ASSERT_TRUE(f.ok()) << f.status().message();
    EXPECT_EQ(f->version(), 3u);
    EXPECT_EQ(f->alignment(), alignment);
    EXPECT_EQ(f->data_offset() % alignment, 0u);
    EXPECT_EQ(f->Find("general.alignment") != nullptr, alignment != 32);
    ASSERT_EQ(f->tensors().size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      const GgufTensorInfo& t = f->tensors()[i];
      EXPECT_EQ(t.name, want[i].name);
      EXPECT_EQ(t.dtype, want[i].dt);
      EXPECT_EQ(t.offset % alignment, 0u);
      ASSERT_EQ(t.view.ndim, static_cast<int>(want[i].shape.size()));
      for (int d = 0; d < t.view.ndim; ++d) {
        EXPECT_EQ(t.view.shape[d], want[i].shape[d]);
        EXPECT_EQ(t.ne[t.view.ndim - 1 - d], want[i].shape[d]);
      }
      ASSERT_EQ(t.nbytes, want[i].data.size());
      EXPECT_EQ(std::memcmp(t.view.data, want[i].data.data(), t.nbytes), 0) << t.name;
    }
    // Padding is zeroed: the file ends aligned, with zeros after the last tensor.
    auto raw = ReadFile(path);
    ASSERT_TRUE(raw.ok());
    EXPECT_EQ(raw->size() % alignment, 0u);
    const auto& last = f->tensors().back();
    for (size_t k = f->data_offset() + last.offset + last.nbytes; k < raw->size(); ++k)
      ASSERT_EQ((*raw)[k], '\0') << k;
    // Nothing left behind but the file.
    EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()),
                            std::filesystem::directory_iterator()),
              1);
  }
}

TEST(GgufWriter, RewritesFixtureExactly) {
  // Read a real file, write it back with the same metadata order and tensors:
  // the result must be byte-identical (llama.cpp writes padding as we do).
  const std::string path = FixturePath("stories260K-gguf/stories260K.gguf");
  SKIP_IF_MISSING(path);
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  GgufWriter w;
  for (const auto& [k, v] : f->metadata()) w.SetValue(k, v);
  for (const auto& t : f->tensors()) {
    std::vector<int64_t> shape(t.view.shape.begin(), t.view.shape.begin() + t.view.ndim);
    ASSERT_TRUE(w.AddTensor(t.name, t.dtype, shape,
                            std::string(static_cast<const char*>(t.view.data), t.nbytes))
                    .ok());
  }
  TempDir dir;
  const std::string out = dir.File("copy.gguf");
  ASSERT_TRUE(w.Write(out).ok());
  auto a = ReadFile(path);
  auto b = ReadFile(out);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->size(), b->size());
  EXPECT_TRUE(*a == *b);
}

TEST(GgufWriter, RejectsBadTensorsAndValues) {
  GgufWriter w;
  EXPECT_TRUE(w.AddTensor("a", DType::kF32, {2, 2}, std::string(16, '\0')).ok());
  EXPECT_THAT(w.AddTensor("a", DType::kF32, {2}, std::string(8, '\0')).message(),
              HasSubstr("duplicate tensor name"));
  EXPECT_THAT(w.AddTensor("b", DType::kF32, {2, 2}, std::string(15, '\0')).message(),
              HasSubstr("got 15 bytes"));
  EXPECT_THAT(w.AddTensor("c", DType::kQ4_0, {2, 16}, std::string(36, '\0')).message(),
              HasSubstr("block size 32"));
  EXPECT_THAT(w.AddTensor("d", DType::kF32, {0, 2}, "").message(), HasSubstr("dimension 0"));
  EXPECT_THAT(w.AddTensor("e", DType::kF32, {1, 1, 1, 1, 1}, std::string(4, '\0')).message(),
              HasSubstr("rank 5"));
  EXPECT_THAT(w.AddTensor("f", DType::kU8, {4}, std::string(4, '\0')).message(),
              HasSubstr("no GGUF type"));
  EXPECT_THAT(w.AddTensor("\xff", DType::kF32, {1}, std::string(4, '\0')).message(),
              HasSubstr("UTF-8"));
  TempDir dir;
  EXPECT_THAT(w.Write(dir.File("x.gguf"), 48).message(), HasSubstr("power of two"));
  GgufWriter bad;
  bad.SetValue("k", Val(GgufType::kU8, uint64_t{256}));
  EXPECT_THAT(bad.Write(dir.File("y.gguf")).message(), HasSubstr("out of range"));
  GgufWriter mixed;
  mixed.SetValue("k", Arr(GgufType::kU8, {Val(GgufType::kI8, int64_t{1})}));
  EXPECT_THAT(mixed.Write(dir.File("z.gguf")).message(), HasSubstr("different type"));
  // Failed writes leave nothing behind; a missing directory is an error.
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
  EXPECT_THAT(w.Write(dir.File("no/such/dir.gguf")).message(), HasSubstr("cannot create"));
}

// ---------------------------------------------------------------------------
// Bad input. Files are built byte by byte here (independently of the writer)
// so each test can corrupt one field at a known offset.

class Bytes {
 public:
  template <typename T>
  size_t Put(T v) {
    const size_t at = s_.size();
    s_.append(reinterpret_cast<const char*>(&v), sizeof(T));
    return at;
  }
  size_t Str(const std::string& v) {
    const size_t at = Put<uint64_t>(v.size());
    s_ += v;
    return at;
  }
  void PadTo(size_t a) {
    while (s_.size() % a) s_ += '\0';
  }
  template <typename T>
  void Set(size_t at, T v) {
    std::memcpy(&s_[at], &v, sizeof(T));
  }
  std::string& str() { return s_; }

 private:
  std::string s_;
};

// A small valid v3 file: 2 keys (string, u32 array), 2 F32 tensors.
struct Layout {
  std::string bytes;
  size_t version_at, n_tensors_at, n_kv_at, key0_len_at, arr_len_at, t0_at, t0_ne0_at, t0_type_at,
      t0_offset_at, t1_name_at, t1_offset_at;
};

Layout ValidFile(bool bad_utf8_key = false) {
  Bytes b;
  Layout l{};
  b.Put<uint32_t>(0x46554747);
  l.version_at = b.Put<uint32_t>(3);
  l.n_tensors_at = b.Put<uint64_t>(2);
  l.n_kv_at = b.Put<uint64_t>(2);
  l.key0_len_at = b.Str(bad_utf8_key ? "general.\xc0\xaf" : "general.architecture");
  b.Put<uint32_t>(8);
  b.Str("llama");
  b.Str("x.ids");
  b.Put<uint32_t>(9);
  b.Put<uint32_t>(4);
  l.arr_len_at = b.Put<uint64_t>(3);
  for (uint32_t v : {7u, 8u, 9u}) b.Put<uint32_t>(v);
  l.t0_at = b.Str("a");
  b.Put<uint32_t>(2);
  l.t0_ne0_at = b.Put<uint64_t>(4);
  b.Put<uint64_t>(2);
  l.t0_type_at = b.Put<uint32_t>(0);
  l.t0_offset_at = b.Put<uint64_t>(0);
  l.t1_name_at = b.Str("b");
  b.Put<uint32_t>(1);
  b.Put<uint64_t>(3);
  b.Put<uint32_t>(0);
  l.t1_offset_at = b.Put<uint64_t>(32);
  b.PadTo(32);
  for (int i = 0; i < 8; ++i) b.Put<float>(static_cast<float>(i));
  for (int i = 0; i < 3; ++i) b.Put<float>(-1.0f - i);
  l.bytes = b.str();
  return l;
}

Result<GgufFile> Parse(const std::string& bytes) {
  return GgufFile::FromBytes(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                             "bad.gguf");
}

template <typename T>
std::string With(std::string s, size_t at, T v) {
  std::memcpy(&s[at], &v, sizeof(T));
  return s;
}

TEST(GgufBadInput, ValidBaseFileParses) {
  const Layout l = ValidFile();
  auto f = Parse(l.bytes);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->tensors().size(), 2u);
  EXPECT_EQ(f->FindTensor("b")->view.as<const float>()[2], -3.0f);
  EXPECT_EQ(*f->Find("x.ids")->AsArray()->at(2).AsInt(), 9);
  // v2 has the same layout.
  EXPECT_TRUE(Parse(With<uint32_t>(l.bytes, l.version_at, 2)).ok());
}

TEST(GgufBadInput, EveryTruncationIsAnError) {
  const Layout l = ValidFile();
  for (size_t n = 0; n < l.bytes.size(); ++n) {
    // A copy of exactly n bytes, so reading past it is caught by ASan.
    std::vector<uint8_t> prefix(l.bytes.begin(), l.bytes.begin() + n);
    auto f = GgufFile::FromBytes(prefix.data(), prefix.size(), "cut.gguf");
    ASSERT_FALSE(f.ok()) << "prefix of " << n << " bytes parsed";
    const std::string& m = f.status().message();
    EXPECT_THAT(m, HasSubstr("cut.gguf: ")) << m;
    EXPECT_TRUE(m.find("truncated") != std::string::npos ||
                m.find("runs past the end") != std::string::npos ||
                m.find("cannot fit") != std::string::npos ||
                m.find("exceeds the") != std::string::npos)
        << n << ": " << m;
  }
}

TEST(GgufBadInput, WrongMagicAndVersions) {
  const Layout l = ValidFile();
  EXPECT_THAT(Parse("GGML" + l.bytes.substr(4)).status().message(), HasSubstr("bad magic 'GGML'"));
  EXPECT_THAT(Parse(With<uint32_t>(l.bytes, l.version_at, 1)).status().message(),
              HasSubstr("version 1 is not supported"));
  EXPECT_THAT(Parse(With<uint32_t>(l.bytes, l.version_at, 4)).status().message(),
              HasSubstr("unsupported GGUF version 4"));
  EXPECT_THAT(Parse(With<uint32_t>(l.bytes, l.version_at, 0x03000000)).status().message(),
              HasSubstr("big-endian"));
  EXPECT_THAT(Parse("").status().message(), HasSubstr("too short"));
}

TEST(GgufBadInput, AbsurdCountsAndLengths) {
  const Layout l = ValidFile();
  const uint64_t huge = uint64_t{1} << 62;
  EXPECT_THAT(Parse(With(l.bytes, l.n_tensors_at, huge)).status().message(),
              HasSubstr("tensor count 4611686018427387904 cannot fit"));
  EXPECT_THAT(Parse(With(l.bytes, l.n_kv_at, huge)).status().message(),
              HasSubstr("metadata count 4611686018427387904 cannot fit"));
  EXPECT_THAT(Parse(With(l.bytes, l.n_kv_at, ~uint64_t{0})).status().message(),
              HasSubstr("cannot fit"));
  EXPECT_THAT(Parse(With(l.bytes, l.key0_len_at, huge)).status().message(),
              HasSubstr("key length 4611686018427387904 exceeds the"));
  auto m = Parse(With(l.bytes, l.arr_len_at, huge)).status().message();
  EXPECT_THAT(m, HasSubstr("key 'x.ids'"));
  EXPECT_THAT(m, HasSubstr("array length 4611686018427387904 of u32 cannot fit"));
}

TEST(GgufBadInput, TensorErrorsNameTheTensorAndOffset) {
  const Layout l = ValidFile();
  EXPECT_EQ(Parse(With<uint64_t>(l.bytes, l.t1_offset_at, 64)).status().message(),
            fmt::format("bad.gguf: tensor 'b' at offset {}: data (12 bytes at data offset {} + 64) "
                        "runs past the end of the file ({} bytes)",
                        l.t1_name_at, l.bytes.size() - 44, l.bytes.size()));
  EXPECT_THAT(Parse(With<uint64_t>(l.bytes, l.t1_offset_at, 33)).status().message(),
              HasSubstr("tensor 'b' at offset"));
  EXPECT_THAT(Parse(With<uint64_t>(l.bytes, l.t1_offset_at, 33)).status().message(),
              HasSubstr("data offset 33 is not a multiple of the alignment 32"));
  EXPECT_THAT(Parse(With<uint64_t>(l.bytes, l.t1_offset_at, ~uint64_t{0} - 31)).status().message(),
              HasSubstr("runs past the end"));
  EXPECT_THAT(
      Parse(With<uint32_t>(l.bytes, l.t0_type_at, 99)).status().message(),
      HasSubstr("tensor 'a' at offset " + std::to_string(l.t0_at) + ": unknown ggml type id 99"));
  EXPECT_THAT(Parse(With<uint32_t>(l.bytes, l.t0_type_at, 4)).status().message(),
              HasSubstr("unknown ggml type id 4"));  // removed Q4_2
  EXPECT_THAT(Parse(With<uint32_t>(l.bytes, l.t0_type_at, 2)).status().message(),
              HasSubstr("innermost dimension 4 is not a multiple of the q4_0 block size 32"));
  EXPECT_THAT(Parse(With<uint64_t>(l.bytes, l.t0_ne0_at, 0)).status().message(),
              HasSubstr("ne[0] = 0 is not positive"));
  EXPECT_THAT(Parse(With<uint64_t>(l.bytes, l.t0_ne0_at, uint64_t{1} << 62)).status().message(),
              HasSubstr("element count overflows"));
  EXPECT_THAT(Parse(With<uint32_t>(l.bytes, l.t0_ne0_at - 4, 5)).status().message(),
              HasSubstr("n_dims 5 is not in 1..4"));
  EXPECT_THAT(Parse(With<uint32_t>(l.bytes, l.t0_ne0_at - 4, 0)).status().message(),
              HasSubstr("n_dims 0"));
  std::string dup = l.bytes;
  dup[l.t1_name_at + 8] = 'a';
  EXPECT_THAT(Parse(dup).status().message(),
              HasSubstr("tensor 'a' at offset " + std::to_string(l.t1_name_at) +
                        ": duplicate tensor name"));
  std::string badname = l.bytes;
  badname[l.t1_name_at + 8] = '\xff';
  EXPECT_THAT(Parse(badname).status().message(), HasSubstr("tensor '\\xff'"));
  EXPECT_THAT(Parse(badname).status().message(), HasSubstr("not valid UTF-8"));
}

TEST(GgufBadInput, KeyErrors) {
  const Layout bad = ValidFile(/*bad_utf8_key=*/true);  // overlong '/'
  EXPECT_THAT(Parse(bad.bytes).status().message(),
              HasSubstr("key 'general.\\xc0\\xaf' at offset 24: key is not valid UTF-8"));
  // Duplicate key.
  Bytes b;
  b.Put<uint32_t>(0x46554747);
  b.Put<uint32_t>(3);
  b.Put<uint64_t>(0);
  b.Put<uint64_t>(2);
  for (int i = 0; i < 2; ++i) {
    b.Str("k");
    b.Put<uint32_t>(0);
    b.Put<uint8_t>(1);
  }
  EXPECT_THAT(Parse(b.str()).status().message(), HasSubstr("key 'k' at offset 38: duplicate key"));
  // Unknown value type, unknown array element type, bad alignment.
  auto one_key = [](const std::string& key, uint32_t type, const std::string& payload) {
    Bytes k;
    k.Put<uint32_t>(0x46554747);
    k.Put<uint32_t>(3);
    k.Put<uint64_t>(0);
    k.Put<uint64_t>(1);
    k.Str(key);
    k.Put<uint32_t>(type);
    k.str() += payload;
    return k.str();
  };
  EXPECT_THAT(Parse(one_key("k", 13, std::string(8, '\0'))).status().message(),
              HasSubstr("unknown value type 13"));
  EXPECT_THAT(Parse(one_key("k", 9, std::string("\x0e\0\0\0", 4) + std::string(8, '\0')))
                  .status()
                  .message(),
              HasSubstr("unknown array element type 14"));
  EXPECT_THAT(
      Parse(one_key("general.alignment", 4, std::string("\x30\0\0\0", 4))).status().message(),
      HasSubstr("alignment 48 is not a nonzero power of two"));
  EXPECT_THAT(Parse(one_key("general.alignment", 4, std::string(4, '\0'))).status().message(),
              HasSubstr("alignment 0 is not"));
  EXPECT_THAT(Parse(one_key("general.alignment", 8, std::string(8, '\0'))).status().message(),
              HasSubstr("alignment must be an integer"));
  EXPECT_TRUE(Parse(one_key("general.alignment", 4, std::string("\x40\0\0\0", 4))).ok());
  // Arrays nested absurdly deep are refused, not recursed into.
  std::string nest;
  for (int i = 0; i < 100; ++i) nest += std::string("\x09\0\0\0\x01\0\0\0\0\0\0\0", 12);
  EXPECT_THAT(Parse(one_key("k", 9, nest)).status().message(), HasSubstr("nested deeper"));
}

// Every input in the fuzz corpus (seeds and kept crashers) goes through the
// same steps as tests/fuzz/gguf_fuzz.cc; under the asan-ubsan preset this is
// the regression check for past crashes.
TEST(GgufFuzzCorpus, ReplayEveryInput) {
  const std::string dir = std::string(LUMEN_SOURCE_DIR) + "/tests/fuzz/corpus/gguf";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << "no corpus at " << dir;
  int files = 0, parsed = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    auto bytes = ReadFile(entry.path().string());
    ASSERT_TRUE(bytes.ok()) << bytes.status().message();
    std::vector<uint8_t> copy(bytes->begin(), bytes->end());  // exact-size buffer
    auto f = GgufFile::FromBytes(copy.data(), copy.size(), entry.path().filename().string());
    ++files;
    if (!f.ok()) {
      EXPECT_THAT(f.status().message(), HasSubstr(entry.path().filename().string() + ": "));
      continue;
    }
    ++parsed;
    std::vector<float> row;
    for (const auto& t : f->tensors()) {
      const int64_t n = std::min<int64_t>(t.view.cols(), 4096);
      row.resize(static_cast<size_t>(n));
      DequantizeRow(t.dtype, t.view.data, row.data(), n);
    }
  }
  EXPECT_GE(files, 10);
  EXPECT_GE(parsed, 4);  // the valid seeds
}

}  // namespace
}  // namespace lumen::formats
