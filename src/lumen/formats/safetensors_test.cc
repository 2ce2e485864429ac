#include "lumen/formats/safetensors.h"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "lumen/core/half.h"

namespace lumen::formats {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

std::string GoldenDir() { return std::string(LUMEN_SOURCE_DIR) + "/tests/goldens/safetensors"; }

std::string TempPath(const std::string& leaf) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("lumen_st_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return (dir / leaf).string();
}

// A file from a raw header text and data section (header used as given).
std::string RawFile(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = char((n >> (8 * i)) & 0xff);
  return out + header + data;
}

Result<SafetensorsFile> Parse(const std::string& bytes) {
  return SafetensorsFile::FromBytes(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                                    "t.safetensors");
}

std::string ErrorOf(const std::string& bytes) {
  auto r = Parse(bytes);
  EXPECT_FALSE(r.ok()) << "expected an error";
  return r.ok() ? "" : r.status().message();
}

template <typename T>
T At(const SafetensorsTensor& t, int64_t i) {
  T v;
  std::memcpy(&v, static_cast<const char*>(t.view.data) + i * sizeof(T), sizeof(T));
  return v;
}

// The values written by tools/reference/make_safetensors_goldens.py.
void ExpectGoldenValues(const SafetensorsFile& f) {
  ASSERT_EQ(f.tensors().size(), 14u);
  const auto* a = f.Find("a.f32");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, DType::kF32);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a->view.ShapeString(), "[2, 3]");
  for (int i = 0; i < 6; ++i) EXPECT_EQ(At<float>(*a, i), i * 0.5f - 1.0f) << i;
  EXPECT_EQ(a->view.row<float>(1)[0], 0.5f);

  const auto* b = f.Find("b.f16");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->dtype, DType::kF16);
  const float bexp[] = {1.0f, -2.5f, 65504.0f, std::ldexp(1.0f, -24)};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(F16ToF32(At<uint16_t>(*b, i)), bexp[i]) << i;

  const auto* c = f.Find("c.bf16");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->dtype, DType::kBF16);
  const float cexp[] = {1.0f, -3.140625f, std::ldexp(1.0f, 100)};
  for (int i = 0; i < 3; ++i) EXPECT_EQ(BF16ToF32(At<uint16_t>(*c, i)), cexp[i]) << i;

  const auto* d = f.Find("d.i64");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->dtype, DType::kI64);
  const int64_t dexp[] = {-1, int64_t(1) << 40, 3, -(int64_t(1) << 62)};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(At<int64_t>(*d, i), dexp[i]) << i;

  const auto* e = f.Find("e.u8");
  ASSERT_NE(e, nullptr);
  const uint8_t eexp[] = {0, 1, 127, 128, 255};
  for (int i = 0; i < 5; ++i) EXPECT_EQ(At<uint8_t>(*e, i), eexp[i]);

  const auto* fb = f.Find("f.bool");
  ASSERT_NE(fb, nullptr);
  EXPECT_EQ(fb->dtype, DType::kBool);
  EXPECT_EQ(At<uint8_t>(*fb, 0), 1);
  EXPECT_EQ(At<uint8_t>(*fb, 1), 0);
  EXPECT_EQ(At<uint8_t>(*fb, 2), 1);

  const auto* g = f.Find("g.i32");
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(g->shape.empty());
  EXPECT_EQ(g->view.ndim, 0);
  EXPECT_EQ(g->view.numel(), 1);
  EXPECT_EQ(At<int32_t>(*g, 0), -7);

  const auto* h = f.Find("h.empty");
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->shape, (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(h->view.numel(), 0);
  EXPECT_EQ(h->data_end - h->data_begin, 0u);

  const auto* i64 = f.Find("i.f64");
  ASSERT_NE(i64, nullptr);
  EXPECT_EQ(At<double>(*i64, 0), M_PI);
  EXPECT_EQ(At<double>(*i64, 1), -1e300);

  const auto* j = f.Find("j.i8");
  ASSERT_NE(j, nullptr);
  EXPECT_EQ(At<int8_t>(*j, 0), -128);
  EXPECT_EQ(At<int8_t>(*j, 3), 127);
  const auto* k = f.Find("k.i16");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(At<int16_t>(*k, 0), -32768);
  EXPECT_EQ(At<int16_t>(*k, 1), 32767);
  const auto* l = f.Find("l.u32");
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(At<uint32_t>(*l, 1), 0xdeadbeefu);
  const auto* m = f.Find("m.u16");
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->dtype, DType::kU16);
  EXPECT_EQ(At<uint16_t>(*m, 0), 65535);

  const auto* n = f.Find("n.5d");
  ASSERT_NE(n, nullptr);
  EXPECT_EQ(n->shape, (std::vector<int64_t>{1, 2, 1, 2, 2}));
  EXPECT_EQ(n->view.ndim, 4);  // leading dims folded
  EXPECT_EQ(n->view.ShapeString(), "[2, 1, 2, 2]");
  for (int i = 0; i < 8; ++i) EXPECT_EQ(At<float>(*n, i), float(i));

  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("made_by"), "make_safetensors_goldens.py");
  EXPECT_EQ(f.Find("missing"), nullptr);
  EXPECT_EQ(f.Find("__metadata__"), nullptr);
}

TEST(SafetensorsGolden, ReadsIndependentlyWrittenFile) {
  auto f = SafetensorsFile::Open(GoldenDir() + "/mixed.safetensors");
  ASSERT_TRUE(f.ok()) << f.status().message();
  ExpectGoldenValues(*f);
  // Tensors come in data order: the script laid them out reverse-alphabetically.
  EXPECT_EQ(f->tensors().front().name, "n.5d");
  EXPECT_EQ(f->data_offset() % 8, 0u);
}

TEST(SafetensorsGolden, ReadsCanonicalFile) {
  auto f = SafetensorsFile::Open(GoldenDir() + "/canonical.safetensors");
  ASSERT_TRUE(f.ok()) << f.status().message();
  ExpectGoldenValues(*f);
}

TEST(SafetensorsGolden, AcceptsUnpaddedHeader) {
  auto f = SafetensorsFile::Open(GoldenDir() + "/unpadded.safetensors");
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_NE(f->data_offset() % 8, 0u);
  ASSERT_EQ(f->tensors().size(), 2u);
  EXPECT_EQ(At<float>(*f->Find("x"), 2), 3.0f);
  EXPECT_EQ(At<uint8_t>(*f->Find("y"), 0), 42);
  EXPECT_TRUE(f->metadata().empty());
}

// lumen's writer lays out the golden tensors byte for byte as the reference
// writer does (the script reproduces its ordering, JSON and padding).
TEST(SafetensorsGolden, WriterMatchesReferenceLayout) {
  auto src = SafetensorsFile::Open(GoldenDir() + "/mixed.safetensors");
  ASSERT_TRUE(src.ok()) << src.status().message();
  SafetensorsWriter w;
  for (const auto& t : src->tensors()) {
    ASSERT_TRUE(
        w.AddBorrowed(t.name, t.dtype, t.shape, t.view.data, t.data_end - t.data_begin).ok());
  }
  w.SetMetadata("made_by", "make_safetensors_goldens.py");
  w.SetMetadata("format", "pt");
  auto want = ReadFile(GoldenDir() + "/canonical.safetensors");
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(w.Serialize(), *want);
  const std::string path = TempPath("canonical.safetensors");
  ASSERT_TRUE(w.Write(path).ok());
  auto got = ReadFile(path);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, *want);
}

TEST(SafetensorsRoundTrip, EveryDtypeExact) {
  const DType dtypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kF64,
                          DType::kI8,  DType::kU8,  DType::kI16,  DType::kU16,
                          DType::kI32, DType::kU32, DType::kI64,  DType::kBool};
  std::mt19937 rng(1234);
  SafetensorsWriter w;
  std::map<std::string, std::pair<std::vector<int64_t>, std::string>> want;
  int k = 0;
  for (DType t : dtypes) {
    for (const std::vector<int64_t>& shape :
         {std::vector<int64_t>{3, 5}, std::vector<int64_t>{7}, std::vector<int64_t>{},
          std::vector<int64_t>{2, 0, 3}, std::vector<int64_t>{2, 1, 2, 1, 3, 2}}) {
      int64_t n = 1;
      for (auto d : shape) n *= d;
      std::string bytes(size_t(n) * Info(t).block_bytes, '\0');
      for (auto& c : bytes) c = char(rng());
      if (t == DType::kBool)
        for (auto& c : bytes) c &= 1;
      const std::string name = fmt::format("t{}.{}", k++, Name(t));
      ASSERT_TRUE(w.Add(name, t, shape, bytes).ok());
      want[name] = {shape, bytes};
    }
  }
  w.SetMetadata("answer", "42");
  w.SetMetadata("unicode", "h\xc3\xa9llo");
  const std::string path = TempPath("roundtrip.safetensors");
  ASSERT_TRUE(w.Write(path).ok());
  EXPECT_FALSE(fs::exists(path + ".tmp." + std::to_string(::getpid())));
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->data_offset() % 8, 0u);
  ASSERT_EQ(f->tensors().size(), want.size());
  for (const auto& t : f->tensors()) {
    const auto& [shape, bytes] = want.at(t.name);
    EXPECT_EQ(t.shape, shape) << t.name;
    EXPECT_EQ(t.data_end - t.data_begin, bytes.size()) << t.name;
    EXPECT_EQ(std::string(static_cast<const char*>(t.view.data), bytes.size()), bytes) << t.name;
    // Every tensor is naturally aligned thanks to the dtype-ordered layout.
    EXPECT_EQ((f->data_offset() + t.data_begin) % Info(t.dtype).block_bytes, 0u) << t.name;
  }
  EXPECT_EQ(f->metadata().at("answer"), "42");
  EXPECT_EQ(f->metadata().at("unicode"), "h\xc3\xa9llo");
  // Writing what we read reproduces the file exactly.
  SafetensorsWriter w2;
  for (const auto& t : f->tensors())
    ASSERT_TRUE(
        w2.AddBorrowed(t.name, t.dtype, t.shape, t.view.data, t.data_end - t.data_begin).ok());
  w2.SetMetadata("answer", "42");
  w2.SetMetadata("unicode", "h\xc3\xa9llo");
  auto bytes = ReadFile(path);
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(w2.Serialize(), *bytes);
}

TEST(SafetensorsWriter, AddViewAndErrors) {
  float x[6] = {1, 2, 3, 4, 5, 6};
  SafetensorsWriter w;
  ASSERT_TRUE(w.AddView("x", TensorView::Contiguous(x, DType::kF32, {2, 3})).ok());
  auto dup = w.Add("x", DType::kF32, {1}, std::string(4, '\0'));
  EXPECT_THAT(dup.message(), HasSubstr("added twice"));
  EXPECT_THAT(w.Add("y", DType::kF32, {2}, std::string(4, '\0')).message(),
              HasSubstr("4 bytes given"));
  EXPECT_THAT(w.Add("__metadata__", DType::kU8, {1}, "a").message(), HasSubstr("reserved"));
  EXPECT_THAT(w.Add("bad\xff", DType::kU8, {1}, "a").message(), HasSubstr("UTF-8"));
  EXPECT_THAT(w.Add("q", DType::kQ4_0, {32}, std::string(18, '\0')).message(),
              HasSubstr("cannot be stored"));
  EXPECT_THAT(w.Add("n", DType::kU8, {-1}, "").message(), HasSubstr("negative"));
  const std::string bytes = w.Serialize();  // views point into it
  auto f = Parse(bytes);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(At<float>(*f->Find("x"), 5), 6.0f);
  // A failed write leaves nothing behind.
  const std::string bad = TempPath("no/such/dir/x.safetensors");
  EXPECT_THAT(w.Write(bad).message(), HasSubstr("cannot create"));
  EXPECT_FALSE(fs::exists(bad));
}

std::string SmallFile() {
  SafetensorsWriter w;
  EXPECT_TRUE(w.Add("w", DType::kF32, {2, 2}, std::string(16, '\x01')).ok());
  EXPECT_TRUE(w.Add("b", DType::kF16, {3}, std::string(6, '\x02')).ok());
  w.SetMetadata("k", "v");
  return w.Serialize();
}

TEST(SafetensorsBadInput, EveryTruncationIsAnError) {
  const std::string full = SmallFile();
  ASSERT_TRUE(Parse(full).ok());
  for (size_t n = 0; n < full.size(); ++n) {
    const std::string cut = full.substr(0, n);
    auto r = Parse(cut);
    ASSERT_FALSE(r.ok()) << "prefix of " << n << " bytes parsed";
    EXPECT_THAT(r.status().message(), HasSubstr("t.safetensors: ")) << n;
    if (n < 8) {
      EXPECT_THAT(r.status().message(), HasSubstr("too short")) << n;
    } else if (n < full.size() - 22) {
      EXPECT_THAT(r.status().message(), HasSubstr("runs past the end of the file")) << n;
    } else {
      EXPECT_THAT(r.status().message(), HasSubstr("past the end of the data section")) << n;
    }
  }
  // One byte too many is a hole at the end.
  EXPECT_THAT(ErrorOf(full + "x"), HasSubstr("1 bytes after the last tensor"));
}

TEST(SafetensorsBadInput, HeaderLength) {
  std::string huge(8, '\xff');
  EXPECT_THAT(ErrorOf(huge + "{}"), HasSubstr("exceeds the limit"));
  std::string big = RawFile("{}", "");
  big[0] = 100;  // 100 > 2 bytes available
  EXPECT_THAT(ErrorOf(big), HasSubstr("header length 100 runs past the end of the file"));
  EXPECT_THAT(ErrorOf(RawFile("", "")), HasSubstr("does not start with '{'"));
  EXPECT_THAT(ErrorOf(RawFile("  {}", "")), HasSubstr("does not start with '{'"));
  EXPECT_THAT(ErrorOf(RawFile("[1, 2]", "")), HasSubstr("does not start with '{'"));
  EXPECT_TRUE(Parse(RawFile("{}      ", "")).ok());  // space padding is fine
  EXPECT_TRUE(Parse(RawFile("{}", "")).ok());
}

TEST(SafetensorsBadInput, HeaderNotJson) {
  EXPECT_THAT(ErrorOf(RawFile("{\"a\": ", "")), HasSubstr("header is not valid JSON"));
  EXPECT_THAT(ErrorOf(RawFile("{garbage}", "")), HasSubstr("header is not valid JSON"));
  EXPECT_THAT(ErrorOf(RawFile("{}x", "")), HasSubstr("header is not valid JSON"));
  EXPECT_THAT(ErrorOf(RawFile(std::string("{}\0\0", 4), "")),
              HasSubstr("header is not valid JSON"));
}

TEST(SafetensorsBadInput, NonUtf8Name) {
  const std::string msg =
      ErrorOf(RawFile("{\"a\xff\": {\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", "x"));
  EXPECT_THAT(msg, HasSubstr("UTF-8"));
  EXPECT_THAT(msg, HasSubstr("\\xff"));  // raw bytes are escaped in the message
  // Overlong encoding of '/'.
  EXPECT_THAT(ErrorOf(RawFile(
                  "{\"a\xc0\xaf\": {\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", "x")),
              HasSubstr("UTF-8"));
}

TEST(SafetensorsBadInput, DuplicateNames) {
  const std::string e = "{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}";
  const std::string e2 = "{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}";
  EXPECT_THAT(ErrorOf(RawFile("{\"a\":" + e + ",\"a\":" + e2 + "}", "xy")),
              HasSubstr("duplicate key 'a'"));
  EXPECT_THAT(ErrorOf(RawFile("{\"a\":{\"dtype\":\"U8\",\"dtype\":\"U8\",\"shape\":[1],"
                              "\"data_offsets\":[0,1]}}",
                              "x")),
              HasSubstr("duplicate key 'dtype'"));
}

std::string One(const std::string& name, const std::string& body, const std::string& data) {
  return RawFile("{\"" + name + "\":" + body + "}", data);
}

TEST(SafetensorsBadInput, EntryFields) {
  EXPECT_THAT(ErrorOf(One("w", "{\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,1]}", "x")),
              HasSubstr("t.safetensors: tensor 'w': unknown dtype 'Q4'"));
  EXPECT_THAT(
      ErrorOf(One("w", "{\"dtype\":\"F8_E4M3\",\"shape\":[1],\"data_offsets\":[0,1]}", "x")),
      HasSubstr("tensor 'w': dtype 'F8_E4M3' is not supported"));
  EXPECT_THAT(ErrorOf(One("w", "{\"shape\":[1],\"data_offsets\":[0,1]}", "x")),
              HasSubstr("tensor 'w': missing \"dtype\""));
  EXPECT_THAT(ErrorOf(One("w", "{\"dtype\":\"U8\",\"data_offsets\":[0,1]}", "x")),
              HasSubstr("tensor 'w': missing \"shape\""));
  EXPECT_THAT(ErrorOf(One("w", "{\"dtype\":\"U8\",\"shape\":[1]}", "x")),
              HasSubstr("tensor 'w': missing \"data_offsets\""));
  EXPECT_THAT(ErrorOf(One("w", "{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}", "x")),
              HasSubstr("shape dimension must be a non-negative integer"));
  EXPECT_THAT(ErrorOf(One("w", "{\"dtype\":\"U8\",\"shape\":[1.0],\"data_offsets\":[0,1]}", "x")),
              HasSubstr("shape dimension must be a non-negative integer"));
  EXPECT_THAT(ErrorOf(One("w", "{\"dtype\":\"U8\",\"shape\":1,\"data_offsets\":[0,1]}", "x")),
              HasSubstr("\"shape\" must be an array"));
  EXPECT_THAT(ErrorOf(One("w", "{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}", "x")),
              HasSubstr("\"data_offsets\" must be an array [begin, end]"));
  EXPECT_THAT(ErrorOf(One("w", "7", "x")), HasSubstr("tensor 'w': entry must be a JSON object"));
  EXPECT_THAT(ErrorOf(RawFile("{\"__metadata__\":{\"a\":1}}", "")),
              HasSubstr("\"__metadata__\" key 'a' must have a string value"));
  EXPECT_THAT(ErrorOf(RawFile("{\"__metadata__\":[]}", "")),
              HasSubstr("\"__metadata__\" must be an object"));
}

TEST(SafetensorsBadInput, SizesAndOffsets) {
  // Shape and byte range disagree.
  EXPECT_THAT(
      ErrorOf(One("w", "{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}", "abcd")),
      HasSubstr("tensor 'w': data_offsets [0, 4] hold 4 bytes but shape [2] of F32 needs 8"));
  // Past the data section.
  EXPECT_THAT(ErrorOf(One("w", "{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}", "ab")),
              HasSubstr("tensor 'w': data_offsets [0, 4] run past the end of the data section "
                        "(2 bytes)"));
  EXPECT_THAT(ErrorOf(One("w",
                          "{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[18446744073709551615,"
                          "0]}",
                          "ab")),
              HasSubstr("too large"));
  EXPECT_THAT(ErrorOf(One("w", "{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[2,1]}", "ab")),
              HasSubstr("end before they begin"));
  // Shape product overflows 64 bits.
  EXPECT_THAT(ErrorOf(One("w",
                          "{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],"
                          "\"data_offsets\":[0,0]}",
                          "")),
              HasSubstr("tensor 'w': shape [4294967296,4294967296] is too large"));
  EXPECT_THAT(ErrorOf(One("w",
                          "{\"dtype\":\"F32\",\"shape\":[0,4611686018427387904,4],"
                          "\"data_offsets\":[0,0]}",
                          "")),
              HasSubstr("is too large"));
  // A zero-size tensor with ordinary dims is fine.
  EXPECT_TRUE(
      Parse(One("w", "{\"dtype\":\"F32\",\"shape\":[0,4096],\"data_offsets\":[0,0]}", "")).ok());
  // Overlap, hole, trailing bytes.
  const std::string a = "\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}";
  EXPECT_THAT(
      ErrorOf(RawFile("{" + a + ",\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}",
                      "abcdef")),
      HasSubstr("tensor 'b': data_offsets [2, 6] overlap tensor 'a' [0, 4]"));
  EXPECT_THAT(
      ErrorOf(RawFile("{" + a + ",\"b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[5,6]}}",
                      "abcdef")),
      HasSubstr("tensor 'b': data starts at 5 but the previous tensor ends at 4: a hole"));
  EXPECT_THAT(ErrorOf(RawFile("{" + a + "}", "abcdef")),
              HasSubstr("the data section has 2 bytes after the last tensor"));
  EXPECT_THAT(ErrorOf(RawFile("{}", "z")), HasSubstr("1 bytes after the last tensor"));
}

TEST(SafetensorsBadInput, OpenMissingFile) {
  auto r = SafetensorsFile::Open("/nonexistent/x.safetensors");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("/nonexistent/x.safetensors: cannot open"));
}

// Replays the fuzz corpus (seeds and crashers found so far): every input must
// parse or fail cleanly, and every view of a parsed file must be readable.
TEST(SafetensorsFuzzCorpus, ReplaysWithoutCrashing) {
  const fs::path dir = fs::path(LUMEN_SOURCE_DIR) / "tests/fuzz/corpus/safetensors";
  if (!fs::exists(dir)) GTEST_SKIP() << dir << " is missing";
  int files = 0, parsed = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    auto bytes = ReadFile(entry.path().string());
    ASSERT_TRUE(bytes.ok()) << bytes.status().message();
    auto f = Parse(*bytes);
    ++files;
    if (!f.ok()) {
      EXPECT_FALSE(f.status().message().empty());
      continue;
    }
    ++parsed;
    for (const auto& t : f->tensors()) {
      uint8_t sum = 0;
      const auto* p = static_cast<const uint8_t*>(t.view.data);
      for (size_t i = 0; i < t.view.byte_size(); ++i) sum ^= p[i];
      (void)sum;
      EXPECT_EQ(t.view.byte_size(), t.data_end - t.data_begin) << entry.path();
    }
  }
  EXPECT_GT(files, 0);
  EXPECT_GT(parsed, 0);
}

}  // namespace
}  // namespace lumen::formats
