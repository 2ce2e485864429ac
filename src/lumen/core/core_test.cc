#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "lumen/core/buffer.h"
#include "lumen/core/cache_size.h"
#include "lumen/core/half.h"
#include "lumen/core/status.h"
#include "lumen/core/tensor.h"
#include "lumen/core/thread_pool.h"
#include "lumen/core/utf8.h"

namespace lumen {
namespace {

TEST(Half, F16RoundTripsEveryBitPattern) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = F16ToF32(uint16_t(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(F16ToF32(F32ToF16(f)))) << h;
      continue;
    }
    ASSERT_EQ(F32ToF16(f), h) << "half bits " << h << " -> " << f;
  }
}

TEST(Half, F16KnownValuesAndRounding) {
  EXPECT_EQ(F16ToF32(0x3c00), 1.0f);
  EXPECT_EQ(F16ToF32(0xc000), -2.0f);
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(F16ToF32(0x7bff), 65504.0f);
  EXPECT_EQ(F32ToF16(65520.0f), 0x7c00);                      // rounds up to inf
  EXPECT_EQ(F32ToF16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie -> even
  EXPECT_EQ(F32ToF16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -25)), 0x0000);  // tie -> even (0)
  EXPECT_EQ(F32ToF16(std::ldexp(3.0f, -26)), 0x0001);
}

TEST(Half, BF16RoundTripAndRounding) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const float f = BF16ToF32(uint16_t(b));
    if (std::isnan(f)) continue;
    ASSERT_EQ(F32ToBF16(f), b);
  }
  EXPECT_EQ(F32ToBF16(BitsToF32(0x3f808000)), 0x3f80);  // tie -> even
  EXPECT_EQ(F32ToBF16(BitsToF32(0x3f818000)), 0x3f82);
}

TEST(Status, ContextAndMacros) {
  auto fail = []() -> Result<int> { return Errorf("bad {}", 7); };
  auto wrap = [&]() -> Result<int> {
    LUMEN_ASSIGN_OR_RETURN(int v, fail());
    return v + 1;
  };
  Result<int> r = wrap();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().WithContext("file.gguf").message(), "file.gguf: bad 7");
  Result<int> good = 3;
  EXPECT_EQ(*good, 3);
}

TEST(Tensor, ContiguousStridesAndQuantRows) {
  std::vector<float> buf(24);
  auto v = TensorView::Contiguous(buf.data(), DType::kF32, {2, 3, 4});
  EXPECT_EQ(v.numel(), 24);
  EXPECT_EQ(v.rows(), 6);
  EXPECT_EQ(v.stride[0], 48);
  EXPECT_EQ(v.stride[1], 16);
  EXPECT_TRUE(v.is_contiguous());
  auto q = TensorView::Contiguous(nullptr, DType::kQ4_K, {10, 512});
  EXPECT_EQ(q.row_bytes(), 288u);
  EXPECT_EQ(q.byte_size(), 2880u);
  EXPECT_FALSE(RowBytes(DType::kQ4_0, 33).has_value());
  EXPECT_EQ(ParseDType("Q6_K"), DType::kQ6_K);
  EXPECT_EQ(v.Slice0(1, 2).as<float>(), buf.data() + 12);
}

TEST(ThreadPool, CoversRangeExactlyOnce) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 5, 64, 1001}) {
      std::vector<std::atomic<int>> hits(n);
      pool.ParallelFor(
          n,
          [&](int64_t b, int64_t e, int) {
            for (int64_t i = b; i < e; ++i) hits[i]++;
          },
          4);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << threads << " " << n;
    }
  }
}

// run(pool, n, fn, grain) over pools of 1-8 threads and ranges with and
// without a remainder: every index once, every call non-empty and starting
// at a multiple of the grain, ending on one or at n (whole_units: exactly one
// grain long but for the last), with a valid thread index. A grain below 1
// is taken as 1.
template <class Run>
void ExpectEachIndexOnceInGrainCalls(const Run& run, bool whole_units) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 5, 64, 1001}) {
      for (int64_t asked : {-3, 0, 1, 4, 128}) {
        const int64_t grain = std::max<int64_t>(asked, 1);
        std::vector<std::atomic<int>> hits(n);
        std::atomic<int> bad{0};
        run(
            pool, n,
            [&](int64_t b, int64_t e, int thread) {
              const bool ends = whole_units ? e - b == grain || e == n : e % grain == 0 || e == n;
              if (b % grain != 0 || !(b < e) || !ends || thread < 0 || thread >= threads) ++bad;
              for (int64_t i = b; i < e; ++i) hits[i]++;
            },
            asked);
        ASSERT_EQ(bad.load(), 0) << threads << " " << n << " " << asked;
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(hits[i].load(), 1) << threads << " " << n << " " << asked;
      }
    }
  }
}

// The dynamic split: every index once, in units that start at multiples of
// the grain and are whole but for the last, with valid thread indexes; and a
// slow thread takes fewer units (the point of it): while thread 1 sleeps on
// its first unit, the others take the rest.
TEST(ThreadPool, DynamicCoversRangeInGrainUnitsAndRebalances) {
  ExpectEachIndexOnceInGrainCalls([](ThreadPool& pool, int64_t n, const ThreadPool::Fn& fn,
                                     int64_t grain) { pool.ParallelForDynamic(n, fn, grain); },
                                  /*whole_units=*/true);
  ThreadPool pool(2);
  std::atomic<int> by_sleeper{0}, units{0};
  pool.ParallelForDynamic(
      64,
      [&](int64_t, int64_t, int thread) {
        ++units;
        if (thread == 1) ++by_sleeper;
        // 1 ms a unit on thread 0, so the worker starts before the units
        // run out (with instant units thread 0 took all 64 alone).
        std::this_thread::sleep_for(std::chrono::milliseconds(thread == 1 ? 50 : 1));
      },
      1);
  EXPECT_EQ(units.load(), 64);
  EXPECT_LE(by_sleeper.load(), 3);  // a static split would give it 32
}

// The stealing split: every index once, in calls that start at multiples of
// the grain and end on one or at n, with valid thread indexes; each chunk's
// owner runs it from its front (its first call is the first half of its
// chunk, the rest in order); and while thread 1 sleeps in its first half,
// thread 0 takes the rest of thread 1's chunk from the back.
TEST(ThreadPool, StealingCoversRangeKeepsChunksAndRebalances) {
  ExpectEachIndexOnceInGrainCalls([](ThreadPool& pool, int64_t n, const ThreadPool::Fn& fn,
                                     int64_t grain) { pool.ParallelForStealing(n, fn, grain); },
                                  /*whole_units=*/false);
  ThreadPool pool(2);
  std::mutex mu;
  std::vector<std::pair<int64_t, int64_t>> calls[2];
  pool.ParallelForStealing(
      64,
      [&](int64_t b, int64_t e, int thread) {
        {
          std::lock_guard<std::mutex> lock(mu);
          calls[thread].emplace_back(b, e);
        }
        // Thread 0's own chunk takes 32 ms, long enough for the worker to
        // start; thread 1 then sleeps through its first call, long enough
        // that it cannot be done before thread 0 (which would let it steal
        // from thread 0's chunk) unless thread 0 stalls for 160 ms.
        std::this_thread::sleep_for(std::chrono::milliseconds(thread == 1 ? 200 : e - b));
      },
      1);
  int64_t own0 = 0, stolen = 0, by1 = 0;
  for (auto [b, e] : calls[0]) (b < 32 ? own0 : stolen) += e - b;
  for (auto [b, e] : calls[1]) by1 += e - b;
  EXPECT_EQ(own0, 32);
  ASSERT_FALSE(calls[0].empty());
  EXPECT_EQ(calls[0].front(), std::make_pair(int64_t{0}, int64_t{16}));  // half its chunk
  for (size_t i = 1; i < calls[0].size() && calls[0][i].first < 32; ++i)
    EXPECT_EQ(calls[0][i].first, calls[0][i - 1].second);  // then the rest, in order
  EXPECT_LE(by1, 16);                                      // a static split would give it 32
  EXPECT_EQ(stolen + by1, 32);
  if (!calls[1].empty()) {
    EXPECT_EQ(calls[1].front(), std::make_pair(int64_t{32}, int64_t{48}));
  }
}

// Back-to-back calls (workers still spinning) and calls after a pause long
// enough that every worker has gone to sleep on the condition variable: each
// call must see its own fn and range, and every chunk must run exactly once.
TEST(ThreadPool, SpinAndSleepHandOffs) {
  ThreadPool pool(3);
  int64_t total = 0;
  for (int call = 0; call < 3000; ++call) {
    if (call % 1000 == 999) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const int64_t n = 1 + call % 97;
    std::atomic<int64_t> sum{0};
    pool.ParallelFor(n, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) sum += i + call;
    });
    ASSERT_EQ(sum.load(), n * (n - 1) / 2 + n * call) << "call " << call;
    total += sum.load();
  }
  EXPECT_GT(total, 0);
}

// The stats split the caller's time by where it was spent: a worker's chunk
// that sleeps 30 ms is waited for (the caller's own chunk returns at once),
// a 20 ms pause between two calls is serial time, and a call that runs inline
// (one unit) is not counted. Lower bounds only: sleeps last at least as asked.
TEST(ThreadPool, StatsSplitOwnWaitAndBetween) {
  ThreadPool pool(2);
  auto sleepy = [](int64_t, int64_t, int thread) {
    if (thread == 1) std::this_thread::sleep_for(std::chrono::milliseconds(30));
  };
  pool.ParallelFor(2, sleepy);
  EXPECT_EQ(pool.stats().calls, 1);
  EXPECT_GE(pool.stats().wait_s, 0.030);
  EXPECT_EQ(pool.stats().between_s, 0.0);  // nothing before the first call
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  pool.ParallelFor(1, sleepy);  // one unit: inline, not counted
  pool.ParallelFor(2, [](int64_t, int64_t, int thread) {
    if (thread == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  });
  EXPECT_EQ(pool.stats().calls, 2);
  EXPECT_GE(pool.stats().between_s, 0.020);
  EXPECT_GE(pool.stats().own_s, 0.010);
  pool.ResetStats();
  EXPECT_EQ(pool.stats().calls, 0);
  pool.ParallelFor(2, [](int64_t, int64_t, int) {});
  EXPECT_EQ(pool.stats().between_s, 0.0);  // the reset forgets the last call's end
  ThreadPool one(1);
  one.ParallelFor(100, [](int64_t, int64_t, int) {});
  EXPECT_EQ(one.stats().calls, 0);
}

// Resident bytes of this process (/proc/self/statm), 0 where unreadable.
size_t ResidentBytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  unsigned long size = 0, resident = 0;
  const int n = std::fscanf(f, "%lu %lu", &size, &resident);
  std::fclose(f);
  return n == 2 ? size_t(resident) * size_t(sysconf(_SC_PAGESIZE)) : 0;
}

// Both kinds are zeroed, 64-byte aligned, move-only owners; ZeroedOnTouch
// (a KV cache of a long context) costs no resident memory until written.
TEST(Buffer, AlignedBufferZeroedAndZeroedOnTouchUntouched) {
  for (const bool lazy : {false, true})
    for (size_t bytes : {size_t{100}, size_t{1} << 20, size_t{40} << 20}) {
      const size_t before = ResidentBytes();
      AlignedBuffer b = lazy ? AlignedBuffer::ZeroedOnTouch(bytes) : AlignedBuffer(bytes);
      const size_t after = ResidentBytes();
      ASSERT_NE(b.data(), nullptr);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % AlignedBuffer::kAlign, 0u);
      if (lazy && before > 0) {
        EXPECT_LT(after - std::min(after, before), size_t{1} << 20) << bytes;
      }
      const auto* p = b.as<const unsigned char>();
      EXPECT_EQ(p[0], 0);
      EXPECT_EQ(p[bytes - 1], 0);
      EXPECT_EQ(p[bytes / 2], 0);
      b.as<unsigned char>()[bytes - 1] = 7;
      AlignedBuffer moved(std::move(b));
      EXPECT_EQ(b.data(), nullptr);
      EXPECT_EQ(moved.as<unsigned char>()[bytes - 1], 7);
      AlignedBuffer other(64);
      other = std::move(moved);  // frees other's 64 bytes, takes the large one
      EXPECT_EQ(other.size(), bytes);
      EXPECT_EQ(other.as<unsigned char>()[bytes - 1], 7);
    }
}

TEST(Buffer, MappedFileErrorsNameThePath) {
  auto r = MappedFile::Open("/nonexistent/x.gguf");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("/nonexistent/x.gguf"), std::string::npos);
}

// A file that yields fewer bytes than its size says (a sysfs attribute: 4096
// by stat, a few bytes read) is an error naming it, where the copy stopped
// and why, and leaves nothing mapped.
TEST(Buffer, MappedFileCopyOfAFileThatShrinksIsAnError) {
  const char* path = nullptr;
  for (const char* p : {"/sys/kernel/uevent_seqnum", "/sys/kernel/profiling", "/sys/power/state"}) {
    struct stat st {};
    if (::stat(p, &st) == 0 && S_ISREG(st.st_mode) && st.st_size == 4096) {
      path = p;
      break;
    }
  }
  if (!path) GTEST_SKIP() << "no sysfs attribute to read here (no /sys in this container)";
  auto r = MappedFile::Open(path, Residency::kCopy);
  ASSERT_FALSE(r.ok());
  const std::string msg(r.status().message());
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("of 4096: file shrank while reading"), std::string::npos) << msg;
}

// Both residencies hold the file's exact bytes; kAuto copies a large file
// (onto a 2 MiB boundary, read-only; read by a thread per piece of whole
// huge pages where the machine has several cores, the last piece short)
// and maps a small one; LUMEN_MMAP=1 forces the mapping.
TEST(Buffer, MappedFileCopyAndMapHoldTheSameBytes) {
  const std::string path = ::testing::TempDir() + "/lumen_residency.bin";
  std::string bytes(MappedFile::kCopyMinBytes + 12345, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = char((i * 2654435761u) >> 13);
  ASSERT_TRUE(WriteFileAtomic(path, bytes).ok());
  auto map = MappedFile::Open(path, Residency::kMap);
  auto copy = MappedFile::Open(path, Residency::kCopy);
  ASSERT_TRUE(map.ok() && copy.ok());
  EXPECT_FALSE(map->copied());
  EXPECT_TRUE(copy->copied());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(copy->data()) % (size_t{2} << 20), 0u);
  ASSERT_EQ(copy->size(), bytes.size());
  EXPECT_EQ(std::memcmp(copy->data(), bytes.data(), bytes.size()), 0);
  EXPECT_EQ(std::memcmp(map->data(), bytes.data(), bytes.size()), 0);
  MappedFile moved = std::move(*copy);  // the move keeps what munmap needs
  EXPECT_TRUE(moved.copied());
  EXPECT_EQ(std::memcmp(moved.data(), bytes.data(), bytes.size()), 0);

  ::setenv("LUMEN_MMAP", "1", 1);
  auto forced = MappedFile::Open(path);
  ::unsetenv("LUMEN_MMAP");
  ASSERT_TRUE(forced.ok());
  EXPECT_FALSE(forced->copied());
  std::remove(path.c_str());

  const std::string small = ::testing::TempDir() + "/lumen_residency_small.bin";
  ASSERT_TRUE(WriteFileAtomic(small, "tiny").ok());
  auto s = MappedFile::Open(small);
  ASSERT_TRUE(s.ok());
  EXPECT_FALSE(s->copied());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(s->data()), s->size()), "tiny");
  auto e = MappedFile::Open(::testing::TempDir(), Residency::kCopy);
  EXPECT_FALSE(e.ok());  // a directory: an error naming it, whatever the residency
  std::remove(small.c_str());
}

// AnonHugePages (kB) of the mapping that holds p, from /proc/self/smaps; -1 if not found.
long HugeKbAt(const void* p) {
  std::FILE* f = std::fopen("/proc/self/smaps", "r");
  if (!f) return -1;
  char line[512];
  bool in = false;
  long kb = -1;
  const auto a = reinterpret_cast<uintptr_t>(p);
  while (std::fgets(line, sizeof(line), f)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line, "%lx-%lx ", &lo, &hi) == 2 &&
        std::strchr(line, '-') < std::strchr(line, ' ')) {
      in = lo <= a && a < hi;
    } else if (in && std::sscanf(line, "AnonHugePages: %ld kB", &kb) == 1) {
      break;
    }
  }
  std::fclose(f);
  return kb;
}

// Rewriting a tensor inside a copy on huge pages keeps them whole: changing
// the protection of part of a 2 MiB page splits it (session 23: the decode
// then streamed 4 KiB pages, a third slower), so the rewrite makes whole
// huge pages writable. Skipped where the copy got no huge pages.
TEST(Buffer, RewriteInPlaceKeepsTheCopysHugePages) {
  const std::string path = ::testing::TempDir() + "/lumen_rewrite.bin";
  std::string bytes(MappedFile::kCopyMinBytes + 4096, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = char(i * 7);
  ASSERT_TRUE(WriteFileAtomic(path, bytes).ok());
  auto copy = MappedFile::Open(path, Residency::kCopy);
  ASSERT_TRUE(copy.ok());
  std::remove(path.c_str());
  const long before = HugeKbAt(copy->data() + (8 << 20));
  if (before <= 0) GTEST_SKIP() << "the copy is not on huge pages here (THP off?)";
  // A tensor of 5000 bytes starting 12345 bytes into the sixth 2 MiB page.
  const size_t at = (size_t{5} << 20) + 12345;
  ASSERT_TRUE(copy->RewriteInPlace(at, 5000, [](uint8_t* p) { p[0] ^= 1; }));
  EXPECT_EQ(copy->data()[at], static_cast<uint8_t>((at * 7) ^ 1));
  EXPECT_EQ(HugeKbAt(copy->data() + (8 << 20)), before);
}

// A copied file's parsed header goes back to the file: the bytes stay the
// same, only the whole pages below the limit leave the copy, and a file that
// changed on disk since it was read keeps its copy.
TEST(Buffer, MappedFilePrefixGivenBackToTheFileKeepsTheBytes) {
  const std::string path = ::testing::TempDir() + "/lumen_prefix.bin";
  std::string bytes((size_t{3} << 20) + 777, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = char((i * 2654435761u) >> 11);
  ASSERT_TRUE(WriteFileAtomic(path, bytes).ok());
  const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t header = (size_t{5} << 19) + 123;  // 2.5 MiB + 123: crosses a huge page

  auto copy = MappedFile::Open(path, Residency::kCopy);
  ASSERT_TRUE(copy.ok());
  EXPECT_EQ(copy->copied_bytes(), bytes.size());
  ASSERT_TRUE(copy->MapPrefixFromFile(header));
  EXPECT_EQ(copy->copied_bytes(), bytes.size() - header / page * page);
  EXPECT_EQ(std::memcmp(copy->data(), bytes.data(), bytes.size()), 0);
  EXPECT_TRUE(copy->MapPrefixFromFile(header));  // already done
  MappedFile moved = std::move(*copy);
  EXPECT_EQ(moved.copied_bytes(), bytes.size() - header / page * page);
  EXPECT_EQ(std::memcmp(moved.data(), bytes.data(), bytes.size()), 0);

  auto stale = MappedFile::Open(path, Residency::kCopy);
  ASSERT_TRUE(stale.ok());
  std::string changed = bytes;
  changed[page + 5] ^= 1;
  ASSERT_TRUE(WriteFileAtomic(path, changed).ok());
  EXPECT_FALSE(stale->MapPrefixFromFile(header));
  EXPECT_EQ(stale->copied_bytes(), bytes.size());
  EXPECT_EQ(std::memcmp(stale->data(), bytes.data(), bytes.size()), 0);

  auto map = MappedFile::Open(path, Residency::kMap);
  ASSERT_TRUE(map.ok());
  EXPECT_TRUE(map->MapPrefixFromFile(header));  // nothing to give back
  EXPECT_EQ(map->copied_bytes(), 0u);
  std::remove(path.c_str());
}

TEST(Buffer, WriteFileAtomicRoundTrip) {
  const std::string path = ::testing::TempDir() + "/lumen_atomic.bin";
  ASSERT_TRUE(WriteFileAtomic(path, "hello").ok());
  auto r = ReadFile(path);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, "hello");
  EXPECT_FALSE(WriteFileAtomic("/nonexistent/dir/f", "x").ok());
}

}  // namespace
}  // namespace lumen

namespace lumen {
namespace {

TEST(Utf8, StrictValidation) {
  size_t bad = 99;
  EXPECT_TRUE(ValidUtf8("h\xc3\xa9llo \xf0\x9f\x98\x80", &bad));
  EXPECT_TRUE(ValidUtf8(""));
  EXPECT_FALSE(ValidUtf8("ab\xc0\xaf", &bad));  // overlong '/'
  EXPECT_EQ(bad, 2u);
  EXPECT_FALSE(ValidUtf8("\xed\xa0\x80", &bad));  // surrogate
  EXPECT_EQ(bad, 0u);
  EXPECT_FALSE(ValidUtf8("\xf4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_FALSE(ValidUtf8("x\xe2\x82", &bad));   // truncated
  EXPECT_EQ(bad, 1u);
  EXPECT_FALSE(ValidUtf8("\x80"));             // lone continuation byte
  EXPECT_TRUE(ValidUtf8("\xf4\x8f\xbf\xbf"));  // U+10FFFF itself
}

// The OS's per-core L2 figure where it is plausible (64 KiB and up, capped at
// 4 MiB), else 512 KiB; read once, so every call agrees.
TEST(CacheSize, L2IsTheOsFigureWithinItsBounds) {
  const long os = sysconf(_SC_LEVEL2_CACHE_SIZE);
  const int64_t want = os >= (64 << 10) ? std::min<int64_t>(os, 4 << 20) : 512 << 10;
  EXPECT_EQ(L2CacheBytes(), want) << "sysconf: " << os;
  EXPECT_EQ(L2CacheBytes(), L2CacheBytes());
}

}  // namespace
}  // namespace lumen
