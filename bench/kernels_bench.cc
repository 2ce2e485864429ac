// Kernel micro-benchmarks (issue 5): quantized matvec (decode) and matmul
// (prefill; exact, int8 and bf16 routes) per weight type with bytes/s and
// FLOP/s counters, attention over an f16 KV ring at context 512/4k/16k (one
// thread, and two threads split by kv head or by position), the gated FFN
// activations, RMSNorm and RoPE. Shapes are
// Llama-3.2-1B's (D 2048, F 8192, 32 heads, 8 kv heads, head dim 64).
//
// Matvec weights total >= 256 MiB of f16 (several copies of a quantized
// 64-row slab), larger than the 32 MiB L3, so bytes/s is DRAM read bandwidth.
// Run: build/<dir>/bench/lumen_bench_kernels --benchmark_filter=MatVec
#include <benchmark/benchmark.h>
#include <immintrin.h>
#include <sys/mman.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "lumen/core/buffer.h"
#include "lumen/core/quant.h"
#include "lumen/core/repack.h"
#include "lumen/core/thread_pool.h"
#include "lumen/kernels/activation.h"
#include "lumen/kernels/attention.h"
#include "lumen/kernels/intrinsics_warnings.h"
#include "lumen/kernels/matmul.h"
#include "lumen/kernels/matmul_bf16.h"
#include "lumen/kernels/matmul_q8.h"
#include "lumen/kernels/matmul_q8x2_gemm.h"
#include "lumen/kernels/norm.h"
#include "lumen/kernels/prefetch.h"
#include "lumen/kernels/roofline.h"
#include "lumen/kernels/rope.h"

namespace lumen::kernels {
namespace {

struct Weight {
  AlignedBuffer bytes, sb, bb;
  Matrix m;
};

// Weight "type" index -> storage; 7 and 16 = MLX 4-bit and 8-bit g64 (bf16
// scales), 9, 10, 12, 13, 14 and 15 = Q4_0, Q4_K, Q8_0, Q6_K, Q2_K and Q3_K
// repacked at load (core/repack.h),
// 17 and 18 = MLX 4-bit and 8-bit in runs (as the loader makes them where
// the int8 kernels are the AVX2 ones; elsewhere no int8 kernel reads them),
// 19 and 20 = MLX 4-bit and 8-bit in groups (as the loader makes them for
// the AVX-512 VNNI kernels; the AVX2 ones do not read them), 21-24 = Q4_1,
// Q5_0, Q5_1 and Q5_K in column groups (as the loader makes them for both).
constexpr DType kTypes[] = {
    DType::kF32,      DType::kF16,      DType::kBF16,     DType::kQ8_0,     DType::kQ4_0,
    DType::kQ4_K,     DType::kQ6_K,     DType::kU32,      DType::kQ2_K,     DType::kQ4_0Cols,
    DType::kQ4_KCols, DType::kQ3_K,     DType::kQ8_0Cols, DType::kQ6_KCols, DType::kQ2_KCols,
    DType::kQ3_KCols, DType::kU32,      DType::kU32,      DType::kU32,      DType::kU32,
    DType::kU32,      DType::kQ4_1Cols, DType::kQ5_0Cols, DType::kQ5_1Cols, DType::kQ5_KCols};
constexpr int kMlx8 = 16, kMlxRuns = 17, kMlx8Runs = 18, kMlxGroups = 19, kMlx8Groups = 20;
const char* TypeName(int t) {
  static const char* names[] = {"f32",
                                "f16",
                                "bf16",
                                "q8_0",
                                "q4_0",
                                "q4_k",
                                "q6_k",
                                "mlx4_g64",
                                "q2_k",
                                "q4_0_cols",
                                "q4_k_cols",
                                "q3_k",
                                "q8_0_cols",
                                "q6_k_cols",
                                "q2_k_cols",
                                "q3_k_cols",
                                "mlx8_g64",
                                "mlx4_g64_runs",
                                "mlx8_g64_runs",
                                "mlx4_g64_groups",
                                "mlx8_g64_groups",
                                "q4_1_cols",
                                "q5_0_cols",
                                "q5_1_cols",
                                "q5_k_cols"};
  return names[t];
}

// Rows [0, N) of a [N, K] matrix of t at p: kSlab distinct rows quantized
// from src (kSlab x K), the rest repeating them; column groups are laid out
// by address, so they are repacked where they lie.
constexpr int64_t kSlab = 64;
void FillRows(DType t, const std::vector<float>& src, uint8_t* p, int64_t N, int64_t K) {
  const DType plain = PlainOf(t);
  const size_t rb = *RowBytes(t, K);
  for (int64_t n = 0; n < N; ++n) {
    if (n < kSlab)
      QuantizeRow(plain, &src[n * K], p + n * rb, K);
    else
      std::memcpy(p + n * rb, p + (n % kSlab) * rb, rb);
  }
  for (int64_t n = 0; n < N && plain != t; ++n) RepackColumnGroups(plain, p + n * rb, K);
}

std::vector<float> SlabSource(int64_t K) {
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0, 0.02f);
  std::vector<float> src(kSlab * K);
  for (auto& v : src) v = nd(rng);
  return src;
}

std::unique_ptr<Weight> MakeWeight(int type, int64_t N, int64_t K) {
  auto w = std::make_unique<Weight>();
  const std::vector<float> src = SlabSource(K);
  if (kTypes[type] == DType::kU32) {  // MLX
    const int G = 64, bits = type == kMlx8 || type == kMlx8Runs || type == kMlx8Groups ? 8 : 4;
    const int64_t words = K * bits / 32, groups = K / G;
    w->bytes = AlignedBuffer(N * words * 4);
    w->sb = AlignedBuffer(N * groups * 2);
    w->bb = AlignedBuffer(N * groups * 2);
    std::vector<uint32_t> packed(words);
    std::vector<float> sc(groups), bi(groups);
    for (int64_t n = 0; n < N; ++n) {
      if (n < kSlab) {
        QuantizeMlxRow(&src[n * K], bits, G, packed.data(), sc.data(), bi.data(), K);
        std::memcpy(w->bytes.as<uint8_t>() + n * words * 4, packed.data(), words * 4);
        QuantizeRow(DType::kBF16, sc.data(), w->sb.as<uint8_t>() + n * groups * 2, groups);
        QuantizeRow(DType::kBF16, bi.data(), w->bb.as<uint8_t>() + n * groups * 2, groups);
      } else {
        std::memcpy(w->bytes.as<uint8_t>() + n * words * 4,
                    w->bytes.as<uint8_t>() + (n % kSlab) * words * 4, words * 4);
        std::memcpy(w->sb.as<uint8_t>() + n * groups * 2,
                    w->sb.as<uint8_t>() + (n % kSlab) * groups * 2, groups * 2);
        std::memcpy(w->bb.as<uint8_t>() + n * groups * 2,
                    w->bb.as<uint8_t>() + (n % kSlab) * groups * 2, groups * 2);
      }
    }
    w->m.w = TensorView::Contiguous(w->bytes.data(), DType::kU32, {N, words});
    w->m.scales = TensorView::Contiguous(w->sb.data(), DType::kBF16, {N, groups});
    w->m.biases = TensorView::Contiguous(w->bb.data(), DType::kBF16, {N, groups});
    w->m.mlx_bits = bits;
    w->m.mlx_group = G;
    w->m.mlx_order = type == kMlxRuns || type == kMlx8Runs       ? MlxOrder::kRuns
                     : type == kMlxGroups || type == kMlx8Groups ? MlxOrder::kGroups
                                                                 : MlxOrder::kFile;
    for (int64_t n = 0; n < N; ++n) {
      uint8_t* row = w->bytes.as<uint8_t>() + n * words * 4;
      if (w->m.mlx_order == MlxOrder::kRuns) TransposeMlxRuns(row, words * 4);
      if (w->m.mlx_order == MlxOrder::kGroups) TransposeMlxGroups(row, words * 4, bits);
    }
  } else {
    const DType t = kTypes[type];
    w->bytes = AlignedBuffer(N * *RowBytes(t, K));
    FillRows(t, src, w->bytes.as<uint8_t>(), N, K);
    w->m.w = TensorView::Contiguous(w->bytes.data(), t, {N, K});
  }
  w->m.n = N;
  w->m.k = K;
  return w;
}

// Times Y[M, N] = X[M, K] W^T for a W [N, K] of `type` on `route` (X
// uniform in [-1, 1) from `seed`), with FLOP/s and weight bytes/s counters
// and the type and route as the label.
void TimeProduct(benchmark::State& state, int type, ActRoute route, int64_t M, int64_t N, int64_t K,
                 int threads, uint32_t seed) {
  auto w = MakeWeight(type, N, K);
  w->m.route = route;
  std::vector<float> x(M * K), y(M * N);
  std::mt19937 rng(seed);
  for (auto& v : x) v = std::uniform_real_distribution<float>(-1, 1)(rng);
  ThreadPool pool(threads);
  for (auto _ : state) {
    MatMul(w->m, x.data(), M, K, y.data(), N, &pool);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetLabel(std::string(TypeName(type)) + (route == ActRoute::kInt8     ? " int8"
                                                : route == ActRoute::kBf16   ? " bf16"
                                                : route == ActRoute::kInt8x2 ? " int8x2"
                                                                             : ""));
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * M * N * K * state.iterations(), benchmark::Counter::kIsRate);
  state.counters["bytes/s"] =
      benchmark::Counter(double(w->m.bytes()) * state.iterations(), benchmark::Counter::kIsRate);
}

// Decode: Y[1, N] = x W^T over a weight larger than the last-level cache.
// range(2) == 1: the int8-activation route (matmul_q8.h), 2: int8x2 (the default decode route).
// range(3): activation rows M (1: decode; 4: a batch-4 decode step), so the
// weights stream from DRAM as in a real step.
void BM_MatVec(benchmark::State& state) {
  constexpr ActRoute kRoutes[] = {ActRoute::kExact, ActRoute::kInt8, ActRoute::kInt8x2};
  // K 2048, N 65536: 134M weights, 256 MiB as f16.
  TimeProduct(state, static_cast<int>(state.range(0)), kRoutes[state.range(2)], state.range(3),
              65536, 2048, static_cast<int>(state.range(1)), 1);
}
BENCHMARK(BM_MatVec)->ArgsProduct({{0, 1, 2, 3, 4, 5, 6, 7}, {1, 2}, {0}, {1, 4}})->UseRealTime();
BENCHMARK(BM_MatVec)
    ->ArgsProduct({{3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {1, 2}, {1, 2}, {1, 4}})
    ->UseRealTime();

// The default decode route (int8x2) of one row from DRAM at the two widths
// of a Llama layer: K = 2048 (q, k, v, o, gate, up) and K = 8192 (down),
// the same 134M weights either way.
void BM_DecodeK(benchmark::State& state) {
  const int64_t K = state.range(2);
  TimeProduct(state, static_cast<int>(state.range(0)), ActRoute::kInt8x2, 1, (int64_t{1} << 27) / K,
              K, static_cast<int>(state.range(1)), 3);
}
BENCHMARK(BM_DecodeK)
    ->ArgsProduct({{3, 4, 5, 6, 8, 9, 10, 13}, {1, 2}, {2048, 8192}})
    ->UseRealTime();

constexpr size_t kHuge = size_t{2} << 20;

// The first 2 MiB boundary in region (untouched anonymous memory of at
// least bytes + kHuge), with bytes from there on transparent huge pages when
// huge (as the engine's copied weights), else left on 4 KiB pages.
uint8_t* HugeAligned(const AlignedBuffer& region, size_t bytes, bool huge) {
  auto* base = region.as<uint8_t>();
  uint8_t* p = base + ((kHuge - reinterpret_cast<uintptr_t>(base) % kHuge) % kHuge);
  if (huge) ::madvise(p, bytes, MADV_HUGEPAGE);
  return p;
}

// Decode against the memory's own rate: one activation row (int8x2; F16
// and BF16 the exact fused dot, their default decode) over a 1 GiB matrix
// (K = 2048), larger than any cache here (the Xeon's L3 is 480 MiB), beside
// a plain read of the same bytes (StreamRead, as `lumen bench --membw`), the
// two timed in turn in every iteration. range(2): 1 puts the matrix on huge
// pages, as the engine's copied weights; 0 on 4 KiB pages, as a mapped file.
// range(3): 1 cuts the rows into a decode step's products (below), 0 reads
// them in one. range(4): activation rows (1 a decode step, 4 a batch-4
// step's products over the same bytes). stream = the kernel's bytes/s over
// the read's: what the kernel's access pattern and work leave of the
// bandwidth.
void BM_DecodeStream(benchmark::State& state) {
  const DType t = kTypes[state.range(0)];
  const int threads = static_cast<int>(state.range(1));
  constexpr int64_t K = 2048;
  const size_t rb = *RowBytes(t, K);
  const int64_t N = static_cast<int64_t>((size_t{1} << 30) / rb) / kSlab * kSlab;
  const size_t bytes = static_cast<size_t>(N) * rb;
  AlignedBuffer region = AlignedBuffer::ZeroedOnTouch(bytes + kHuge);
  uint8_t* p = HugeAligned(region, bytes, state.range(2) == 1);
  FillRows(t, SlabSource(K), p, N, K);
  // range(3) == 1: the rows as a Llama-3.2-1B layer's matrices in turn (q,
  // k, v, o, gate, up, down: 2048, 512, 512, 2048, 8192, 8192 and 8192 rows of
  // K = 2048, the last the down projection's bytes), one product each.
  constexpr int64_t kLayer[] = {2048, 512, 512, 2048, 8192, 8192, 8192};
  std::vector<Matrix> parts;
  for (int64_t n0 = 0, i = 0; n0 < N; ++i) {
    const int64_t rows = state.range(3) == 1 ? std::min(kLayer[i % 7], N - n0) : N;
    Matrix m;
    m.w = TensorView::Contiguous(p + static_cast<size_t>(n0) * rb, t, {rows, K});
    m.n = rows;
    m.k = K;
    m.route = ActRoute::kInt8x2;
    parts.push_back(m);
    n0 += rows;
  }
  const int64_t M = state.range(4);
  std::vector<float> x(M * K), y(M * N);
  std::mt19937 rng(4);
  for (auto& v : x) v = std::uniform_real_distribution<float>(-1, 1)(rng);
  ThreadPool pool(threads);
  const int64_t pages = static_cast<int64_t>(bytes / 4096);
  double t_kernel = 0, t_read = 0;
  std::vector<uint64_t> sink(threads);  // one per thread, so the reads stay
  for (auto _ : state) {
    const auto s0 = std::chrono::steady_clock::now();
    for (const Matrix& m : parts) MatMul(m, x.data(), M, K, y.data(), m.n, &pool);
    const auto s1 = std::chrono::steady_clock::now();
    pool.ParallelFor(pages, [&](int64_t b, int64_t e, int thread) {
      sink[thread] += StreamRead(p + b * 4096, static_cast<size_t>(e - b) * 4096);
    });
    const auto s2 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(y.data());
    t_kernel += std::chrono::duration<double>(s1 - s0).count();
    t_read += std::chrono::duration<double>(s2 - s1).count();
  }
  benchmark::DoNotOptimize(sink.data());
  const double iters = static_cast<double>(state.iterations());
  state.counters["kernel_GBps"] = static_cast<double>(bytes) * iters / t_kernel / 1e9;
  state.counters["read_GBps"] = static_cast<double>(bytes) * iters / t_read / 1e9;
  state.counters["stream"] = t_read / t_kernel;
  state.SetLabel(std::string(TypeName(static_cast<int>(state.range(0)))) +
                 (state.range(2) ? " huge pages" : " 4 KiB pages") +
                 (state.range(3) ? ", layer-sized products" : "") +
                 (M > 1 ? ", " + std::to_string(M) + " rows" : ""));
}
BENCHMARK(BM_DecodeStream)
    ->ArgsProduct({{1, 2, 3, 4, 8, 9, 10, 12}, {1, 2}, {0, 1}, {0, 1}, {1}})
    ->UseRealTime()
    ->Iterations(6);
// A batch-4 step's products against the memory (the 4-row kernels on huge
// pages, layer-sized), beside BM_MatMul/T/4/1/2048/3's rate from L3.
BENCHMARK(BM_DecodeStream)
    ->ArgsProduct({{9, 10, 12}, {1, 2}, {1}, {1}, {4}})
    ->ArgsProduct({{13, 14}, {1, 2}, {1}, {1}, {1, 4}})
    ->UseRealTime()
    ->Iterations(6);

// What work per byte costs a stream on this machine, apart from any kernel:
// a loop that reads 256 bytes per step (prefetching 4 KiB ahead, as the
// decode kernels do) and runs `work` rounds of four vpdpbusd on them, in
// four dependent chains. Timed over 1 GiB (from DRAM) beside a plain read of
// the same bytes, and over 1 MiB (in L2) for the rate of its work alone.
// stream = plain read time / loop time. Where the work alone runs well
// above the memory's rate, a machine that overlapped them fully would keep
// stream near 1.
__attribute__((target("avx512f,avx512bw,avx512vnni"), noinline)) uint64_t ReadWithWork(
    const uint8_t* p, size_t bytes, int work) {
  __m512i a[4];
  for (auto& v : a) v = _mm512_setzero_si512();
  const __m512i k = _mm512_set1_epi8(3);
  for (size_t i = 0; i < bytes; i += 256) {
    for (int o = 0; o < 256; o += 64) __builtin_prefetch(p + i + 4096 + o, 0, 2);
    for (int j = 0; j < 4; ++j) {
      const __m512i v = _mm512_load_si512(p + i + 64 * j);
      a[j] = _mm512_xor_si512(a[j], v);
      for (int w = 0; w < work; ++w) a[j] = _mm512_dpbusd_epi32(a[j], v, k);
    }
  }
  alignas(64) uint64_t v[8];  // (GCC 12's _mm512_reduce_add_epi64 warns)
  _mm512_store_si512(v,
                     _mm512_add_epi64(_mm512_add_epi64(a[0], a[1]), _mm512_add_epi64(a[2], a[3])));
  uint64_t sum = 0;
  for (uint64_t x : v) sum += x;
  return sum;
}
void BM_StreamWithWork(benchmark::State& state) {
  const int work = static_cast<int>(state.range(0));
  constexpr size_t kBytes = size_t{1} << 30, kL2 = size_t{1} << 20;
  AlignedBuffer region = AlignedBuffer::ZeroedOnTouch(kBytes + kHuge);
  uint8_t* p = HugeAligned(region, kBytes, true);
  std::memset(p, 1, kBytes);
  double t_dram = 0, t_read = 0, t_l2 = 0;
  uint64_t sink = 0;
  for (auto _ : state) {
    const auto s0 = std::chrono::steady_clock::now();
    sink += ReadWithWork(p, kBytes, work);
    const auto s1 = std::chrono::steady_clock::now();
    sink += StreamRead(p, kBytes);
    const auto s2 = std::chrono::steady_clock::now();
    for (int j = 0; j < 256; ++j) sink += ReadWithWork(p + (j % 2) * 64, kL2, work);
    const auto s3 = std::chrono::steady_clock::now();
    t_dram += std::chrono::duration<double>(s1 - s0).count();
    t_read += std::chrono::duration<double>(s2 - s1).count();
    t_l2 += std::chrono::duration<double>(s3 - s2).count();
  }
  benchmark::DoNotOptimize(sink);
  const double it = static_cast<double>(state.iterations());
  state.counters["work_GBps"] = 256.0 * kL2 * it / t_l2 / 1e9;
  state.counters["dram_GBps"] = kBytes * it / t_dram / 1e9;
  state.counters["read_GBps"] = kBytes * it / t_read / 1e9;
  state.counters["stream"] = t_read / t_dram;
}
BENCHMARK(BM_StreamWithWork)->Arg(0)->Arg(2)->Arg(4)->Arg(8)->Arg(16)->UseRealTime()->Iterations(4);

// Prefill / batched decode: Y[M, N] = X[M, K] W^T; K 2048 (q/o/gate/up) or 8192 (down).
// range(4): 0 exact, 1 int8, 2 bf16, 3 int8x2.
void BM_MatMul(benchmark::State& state) {
  constexpr ActRoute kRoutes[] = {ActRoute::kExact, ActRoute::kInt8, ActRoute::kBf16,
                                  ActRoute::kInt8x2};
  TimeProduct(state, static_cast<int>(state.range(0)), kRoutes[state.range(4)], state.range(1),
              2048, state.range(3), static_cast<int>(state.range(2)), 2);
}
BENCHMARK(BM_MatMul)
    ->ArgsProduct({{0, 1, 2, 3, 4, 5, 6, 7}, {4, 256}, {1, 2}, {2048, 8192}, {0}})
    ->UseRealTime();
BENCHMARK(BM_MatMul)->ArgsProduct({{3, 4}, {4, 8}, {1, 2}, {2048, 8192}, {1}})->UseRealTime();
// The default decode route (int8x2) at batch-decode rows: the weights stay in
// the last-level cache here (not DRAM), so this times the kernel: its compute
// and its activation traffic (K = 8192 records outgrow L1 at 4 rows).
BENCHMARK(BM_MatMul)
    ->ArgsProduct({{3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 19, 20},
                   {1, 4},
                   {1, 2},
                   {2048, 8192},
                   {3}})
    ->UseRealTime();
// The int8x2 route's prefill products (the VNNI GEMM, matmul_q8x2_gemm.h)
// beside the exact route's above: the same shapes.
BENCHMARK(BM_MatMul)
    ->ArgsProduct({{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}, {256}, {1, 2}, {2048, 8192}, {3}})
    ->UseRealTime();
// F16 and BF16 at a short prompt's rows: above Int8MaxRows (8) the GEMM
// requantizes every weight per call, a cost 16 rows share.
BENCHMARK(BM_MatMul)->ArgsProduct({{1, 2}, {16}, {1, 2}, {2048, 8192}, {3}})->UseRealTime();
// Short prompts where the bf16 panels take the products above the dot
// kernels' row count (AMD CPUs with AVX512-BF16): the panels (route 2)
// against the dot kernels (int8x2, route 3, which keeps these row counts
// on them) for Q4_0, Q4_K, Q3_K, Q2_K records and MLX 4 / 8-bit groups
// (Q4_0 and Q4_K's panels at 16 rows are registered below).
BENCHMARK(BM_MatMul)
    ->ArgsProduct({{9, 10, 11, 14, 15, 19, 20}, {8, 12, 24}, {1}, {2048}, {2, 3}})
    ->UseRealTime();
BENCHMARK(BM_MatMul)->ArgsProduct({{11, 14, 15, 19, 20}, {16}, {1}, {2048}, {2, 3}})->UseRealTime();
BENCHMARK(BM_MatMul)->ArgsProduct({{9, 10}, {16}, {1}, {2048}, {3}})->UseRealTime();
// Short prompts with the VNNI kernels: a product of M rows on the int8x2 dot
// kernels (MatMulManyInt8Dots, which MatMul takes up to Int8MaxRows(W)) and
// on the int8x2 GEMM (which it takes above), timed in turn in every
// iteration; gemm_over_dots > 1 where the dot kernels are faster. The
// 2048 x 2048 weights stay in the last-level cache, so both are timed
// compute-bound, as a prompt of this length is. range: type, M, threads.
void BM_ShortPrompt(benchmark::State& state) {
  const int type = static_cast<int>(state.range(0));
  const int64_t M = state.range(1), N = 2048, K = 2048;
  auto w = MakeWeight(type, N, K);
  w->m.route = ActRoute::kInt8x2;
  if (!CpuHasVnni() || !Int8x2GemmTakes(w->m) || !Int8RouteSupports(w->m)) {
    state.SkipWithError("needs the VNNI dot kernels and the int8x2 GEMM for this type");
    return;
  }
  std::vector<float> x(M * K), y(M * N);
  std::mt19937 rng(5);
  for (auto& v : x) v = std::uniform_real_distribution<float>(-1, 1)(rng);
  ThreadPool pool(static_cast<int>(state.range(2)));
  const MatMulOut out{&w->m, y.data(), N};
  double t_dots = 0, t_gemm = 0;
  for (auto _ : state) {
    const auto s0 = std::chrono::steady_clock::now();
    MatMulManyInt8Dots({&out, 1}, x.data(), M, K, &pool);
    const auto s1 = std::chrono::steady_clock::now();
    MatMulManyInt8x2Gemm({&out, 1}, x.data(), M, K, &pool, false);
    const auto s2 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(y.data());
    t_dots += std::chrono::duration<double>(s1 - s0).count();
    t_gemm += std::chrono::duration<double>(s2 - s1).count();
  }
  const double it = static_cast<double>(state.iterations());
  state.counters["dots_us"] = t_dots / it * 1e6;
  state.counters["gemm_us"] = t_gemm / it * 1e6;
  state.counters["gemm_over_dots"] = t_gemm / t_dots;
  state.SetLabel(std::string(TypeName(type)) + ", MatMul takes the " +
                 (M <= Int8MaxRows(w->m) ? "dots" : "GEMM"));
}
BENCHMARK(BM_ShortPrompt)
    ->ArgsProduct({{8, 9, 10, 11, 12, 13, 14, 19, 20, 21, 22, 23, 24},
                   {8, 16, 24, 32, 48, 64},
                   {1, 2}})
    ->UseRealTime();

// Training's backward through a frozen weight: dX[M, K] = dY[M, N] W (the
// transposed product, MatMulT), beside BM_MatMul's forward of the same
// shape. range: type, M, threads, N (8192: the fused head's vocabulary
// chunk; 2048 a layer's q / o / gate / up width), K = 2048.
void BM_MatMulT(benchmark::State& state) {
  const int64_t M = state.range(1), N = state.range(3), K = 2048;
  auto w = MakeWeight(static_cast<int>(state.range(0)), N, K);
  std::vector<float> dy(M * N), dx(M * K);
  std::mt19937 rng(4);
  for (auto& v : dy) v = std::uniform_real_distribution<float>(-1, 1)(rng);
  ThreadPool pool(static_cast<int>(state.range(2)));
  for (auto _ : state) {
    MatMulT(w->m, dy.data(), M, dx.data(), &pool);
    benchmark::DoNotOptimize(dx.data());
  }
  state.SetLabel(TypeName(static_cast<int>(state.range(0))));
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * M * N * K * state.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_MatMulT)->ArgsProduct({{0, 1, 4}, {128, 256}, {1, 2}, {2048, 8192}})->UseRealTime();

// The same kernels with the weights in L2 (256 rows, at most 0.55 MB at
// K = 2048): their compute ceiling at one row and at a batch step's four.
void BM_MatMulL2(benchmark::State& state) {
  TimeProduct(state, static_cast<int>(state.range(0)), ActRoute::kInt8x2, state.range(1), 256, 2048,
              1, 2);
}
BENCHMARK(BM_MatMulL2)->ArgsProduct({{3, 4, 5, 6, 7, 8, 9, 10, 13}, {1, 2, 4}})->UseRealTime();

// What one weight row costs the int8x2 kernel at M activation rows, apart
// from the work per call (quantizing and laying out the activations): the
// same product at N = 256 and N = 1024 (both in L2, K = 2048) timed in turn,
// row_ns = the difference over 768 rows, call_ns = what is left of the N =
// 256 call. row_ns at M = 4 over row_ns at M = 1 bounds a batch-4 step's cost
// where one row decodes at the kernel's rate, not the memory's.
void BM_MatMulRowCost(benchmark::State& state) {
  const int type = static_cast<int>(state.range(0));
  const int64_t M = state.range(1), K = 2048, N1 = 256, N2 = 1024;
  auto a = MakeWeight(type, N1, K), b = MakeWeight(type, N2, K);
  a->m.route = b->m.route = ActRoute::kInt8x2;
  std::vector<float> x(M * K), y(M * N2);
  std::mt19937 rng(2);
  for (auto& v : x) v = std::uniform_real_distribution<float>(-1, 1)(rng);
  ThreadPool pool(1);
  double t1 = 0, t2 = 0;
  for (auto _ : state) {
    const auto s0 = std::chrono::steady_clock::now();
    MatMul(a->m, x.data(), M, K, y.data(), N1, &pool);
    const auto s1 = std::chrono::steady_clock::now();
    MatMul(b->m, x.data(), M, K, y.data(), N2, &pool);
    const auto s2 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(y.data());
    t1 += std::chrono::duration<double, std::nano>(s1 - s0).count();
    t2 += std::chrono::duration<double, std::nano>(s2 - s1).count();
  }
  const double iters = static_cast<double>(state.iterations());
  const double row_ns = (t2 - t1) / iters / static_cast<double>(N2 - N1);
  state.counters["row_ns"] = row_ns;
  state.counters["call_ns"] = t1 / iters - static_cast<double>(N1) * row_ns;
  state.SetLabel(TypeName(type));
}
BENCHMARK(BM_MatMulRowCost)
    ->ArgsProduct({{3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20}, {1, 4}})
    ->UseRealTime();
// The bf16 prefill route (matmul_bf16.h) beside the exact M=256 rows above.
BENCHMARK(BM_MatMul)
    ->ArgsProduct({{0, 1, 2, 3, 4, 5, 6, 7}, {256}, {1, 2}, {2048}, {2}})
    ->UseRealTime();
// The bf16 route at a prefill chunk's rows (128) and near the smallest it
// takes: on an AMX machine these run the tiles (matmul_bf16_amx.h); the same
// run with LUMEN_NO_AMX=1 gives the AVX512-BF16 kernel beside them.
BENCHMARK(BM_MatMul)
    ->ArgsProduct({{3, 4, 5, 9, 10}, {5, 16, 128}, {1}, {2048, 8192}, {2}})
    ->UseRealTime();

// Every row of the ring and the query ~ U(-1, 1).
void FillRandom(const KvRing& ring, int64_t row, std::vector<float>& q) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> ud(-1, 1);
  std::vector<float> kr(row), vr(row);
  for (int64_t p = 0; p < ring.capacity; ++p) {
    for (auto& f : kr) f = ud(rng);
    for (auto& f : vr) f = ud(rng);
    StoreKv(ring, row, p, kr.data(), vr.data());
  }
  for (auto& f : q) f = ud(rng);
}

// One decode token's attention for one layer at context S (f16 KV).
void BM_Attention(benchmark::State& state) {
  const int64_t S = state.range(0);
  const int H = 32, Hkv = 8, Dh = 64;
  const int64_t row = int64_t(Hkv) * Dh;
  AlignedBuffer k(S * row * 2), v(S * row * 2);
  const KvRing ring{DType::kF16, k.data(), v.data(), S};
  std::vector<float> q(H * Dh), out(H * Dh);
  FillRandom(ring, row, q);
  std::vector<float> scratch(S * (H + 1) + 2 * row);
  const AttentionShape shape{H, Hkv, Dh, 0.125f, 0.0f};
  for (auto _ : state) {
    AttendOne(q.data(), shape, ring, 0, S, out.data(), scratch.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["bytes/s"] =
      benchmark::Counter(2.0 * S * row * 2 * state.iterations(), benchmark::Counter::kIsRate);
  state.counters["FLOP/s"] =
      benchmark::Counter(4.0 * S * H * Dh * state.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Attention)->Arg(512)->Arg(4096)->Arg(16384)->UseRealTime();

// The same token's attention for all 32 heads on a 2-thread pool, as the
// forward runs it at decode: range(1) == 0 splits the 8 kv heads (AttendHeads),
// 1 splits the positions (AttendScores / AttendSoftmax / AttendValues).
void BM_AttentionThreads(benchmark::State& state) {
  const int64_t S = state.range(0);
  const bool by_position = state.range(1) == 1;
  const int H = 32, Hkv = 8, Dh = 64;
  const int64_t row = int64_t(Hkv) * Dh;
  AlignedBuffer k(S * row * 2), v(S * row * 2);
  const KvRing ring{DType::kF16, k.data(), v.data(), S};
  std::vector<float> q(H * Dh), out(H * Dh), parts(2 * H * Dh);
  FillRandom(ring, row, q);
  std::vector<float> scratch(2 * (S * (H + 1) + 2 * row));
  const AttentionShape shape{H, Hkv, Dh, 0.125f, 0.0f};
  ThreadPool pool(2);
  for (auto _ : state) {
    if (by_position) {
      pool.ParallelFor(
          S,
          [&](int64_t b, int64_t e, int) {
            AttendScores(q.data(), shape, ring, 0, S, b, e, scratch.data());
          },
          64);
      pool.ParallelFor(H, [&](int64_t b, int64_t e, int) {
        AttendSoftmax(S, scratch.data(), static_cast<int>(b), static_cast<int>(e));
      });
      pool.ParallelFor(
          S,
          [&](int64_t b, int64_t e, int t) {
            AttendValues(shape, ring, 0, S, b, e, scratch.data(), parts.data() + t * H * Dh);
          },
          64);
      for (int i = 0; i < H * Dh; ++i) out[i] = parts[i] + parts[H * Dh + i];
    } else {
      pool.ParallelFor(Hkv, [&](int64_t b, int64_t e, int t) {
        AttendHeads(q.data(), shape, ring, 0, S, out.data(),
                    scratch.data() + t * (S * (H + 1) + 2 * row), static_cast<int>(b),
                    static_cast<int>(e));
      });
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetLabel(by_position ? "split by position" : "split by kv head");
  state.counters["bytes/s"] =
      benchmark::Counter(2.0 * S * row * 2 * state.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_AttentionThreads)->ArgsProduct({{4096, 8192, 16384}, {0, 1}})->UseRealTime();

// The gated FFN activation over one 128-token chunk of Llama-3.2-1B (F 8192).
void BM_GatedActivation(benchmark::State& state) {
  const Activation act = state.range(0) == 0 ? Activation::kSilu : Activation::kGeluTanh;
  const int64_t n = 128 * 8192;
  std::vector<float> g(n), u(n, 1.0f);
  std::mt19937 rng(4);
  for (auto& f : g) f = std::normal_distribution<float>(0, 2)(rng);
  std::vector<float> work(n);
  for (auto _ : state) {
    std::memcpy(work.data(), g.data(), n * sizeof(float));
    GatedActivation(act, work.data(), u.data(), n);
    benchmark::DoNotOptimize(work.data());
  }
  state.SetLabel(state.range(0) == 0 ? "silu" : "gelu_tanh");
  state.counters["elements/s"] =
      benchmark::Counter(double(n) * state.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_GatedActivation)->Arg(0)->Arg(1);

void BM_RmsNorm(benchmark::State& state) {
  const int64_t D = state.range(0);
  std::vector<float> x(D, 0.3f), w(D, 1.0f), y(D);
  for (auto _ : state) {
    RmsNormForward(x.data(), w.data(), 0.0f, 1e-5f, D, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["bytes/s"] =
      benchmark::Counter(3.0 * D * 4 * state.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_RmsNorm)->Arg(2048)->Arg(8192);

void BM_Rope(benchmark::State& state) {
  const int H = 32, Dh = 64;
  const RopeTable t = MakeRopeTable(Dh, 500000.0, {}, 131072, 0);
  std::vector<float> x(H * Dh, 0.1f);
  int64_t pos = 0;
  for (auto _ : state) {
    ApplyRope(x.data(), H, Dh, Dh, t, (pos++) & 4095, RopeStyle::kHalf);
    benchmark::DoNotOptimize(x.data());
  }
  state.counters["heads/s"] =
      benchmark::Counter(double(H) * state.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Rope);

// Issue rates of the instructions the AVX2 int8 kernels and the f32 panels
// are made of: each iteration is 8 independent instructions (no chain), so
// instr/s over the clock gives how many issue per cycle, and a mix shows
// whether two kinds share a port (performance.md, "Zen 2 again": on Zen 2
// vpmaddubsw and vpmaddwd issue 1 per cycle each and 1 per cycle together,
// the FMA 2, vpsrlvd 1 per 2 cycles). range(0) picks the mix.
#if defined(__x86_64__)
#define LUMEN_X8(op) op op op op op op op op
void BM_IssueRate(benchmark::State& state) {
  const int mix = static_cast<int>(state.range(0));
  const char* names[] = {"vpmaddubsw",  "vpmaddwd",        "vpmaddubsw+vpmaddwd",
                         "vfmadd231ps", "vpmaddubsw+vfma", "vpsrlvd",
                         "vpshufb",     "vpsrlw",          "vcvtdq2ps"};
  constexpr int64_t kIters = 1 << 20;
  for (auto _ : state) {
    int64_t n = kIters;
    switch (mix) {
#define LUMEN_ISSUE(body)                                                                         \
  asm volatile("1:\n" body "dec %0\n jnz 1b\n"                                                    \
               : "+r"(n)::"ymm0", "ymm1", "ymm2", "ymm3", "ymm4", "ymm5", "ymm6", "ymm7", "ymm8", \
                 "ymm9", "ymm14", "ymm15");                                                       \
  break;
      case 0:
        LUMEN_ISSUE(LUMEN_X8("vpmaddubsw %%ymm15,%%ymm14,%%ymm0\n"))
      case 1:
        LUMEN_ISSUE(LUMEN_X8("vpmaddwd %%ymm15,%%ymm14,%%ymm0\n"))
      case 2:
        LUMEN_ISSUE(
            LUMEN_X8("vpmaddubsw %%ymm15,%%ymm14,%%ymm0\n vpmaddwd %%ymm15,%%ymm14,%%ymm1\n"))
      case 3:  // 10 accumulators: latency 5 at 2 per cycle
        LUMEN_ISSUE(
            "vfmadd231ps %%ymm15,%%ymm14,%%ymm0\n vfmadd231ps %%ymm15,%%ymm14,%%ymm1\n"
            "vfmadd231ps %%ymm15,%%ymm14,%%ymm2\n vfmadd231ps %%ymm15,%%ymm14,%%ymm3\n"
            "vfmadd231ps %%ymm15,%%ymm14,%%ymm4\n vfmadd231ps %%ymm15,%%ymm14,%%ymm5\n"
            "vfmadd231ps %%ymm15,%%ymm14,%%ymm6\n vfmadd231ps %%ymm15,%%ymm14,%%ymm7\n"
            "vfmadd231ps %%ymm15,%%ymm14,%%ymm8\n vfmadd231ps %%ymm15,%%ymm14,%%ymm9\n")
      case 4:  // 8 FMA accumulators (latency 5): the FMAs alone could issue 1.6 per cycle
        LUMEN_ISSUE(
            "vpmaddubsw %%ymm15,%%ymm14,%%ymm0\n vfmadd231ps %%ymm15,%%ymm14,%%ymm1\n"
            "vpmaddubsw %%ymm15,%%ymm14,%%ymm0\n vfmadd231ps %%ymm15,%%ymm14,%%ymm2\n"
            "vpmaddubsw %%ymm15,%%ymm14,%%ymm0\n vfmadd231ps %%ymm15,%%ymm14,%%ymm3\n"
            "vpmaddubsw %%ymm15,%%ymm14,%%ymm0\n vfmadd231ps %%ymm15,%%ymm14,%%ymm4\n"
            "vpmaddubsw %%ymm15,%%ymm14,%%ymm0\n vfmadd231ps %%ymm15,%%ymm14,%%ymm5\n"
            "vpmaddubsw %%ymm15,%%ymm14,%%ymm0\n vfmadd231ps %%ymm15,%%ymm14,%%ymm6\n"
            "vpmaddubsw %%ymm15,%%ymm14,%%ymm0\n vfmadd231ps %%ymm15,%%ymm14,%%ymm7\n"
            "vpmaddubsw %%ymm15,%%ymm14,%%ymm0\n vfmadd231ps %%ymm15,%%ymm14,%%ymm8\n")
      case 5:
        LUMEN_ISSUE(LUMEN_X8("vpsrlvd %%ymm15,%%ymm14,%%ymm0\n"))
      case 6:
        LUMEN_ISSUE(LUMEN_X8("vpshufb %%ymm15,%%ymm14,%%ymm0\n"))
      case 7:
        LUMEN_ISSUE(LUMEN_X8("vpsrlw $2,%%ymm15,%%ymm0\n"))
      default:
        LUMEN_ISSUE(LUMEN_X8("vcvtdq2ps %%ymm15,%%ymm0\n"))
#undef LUMEN_ISSUE
    }
  }
  const double per_iter = mix == 2 || mix == 4 ? 16
                          : mix == 3           ? 10
                                               : 8;  // instructions per iteration
  state.counters["instr"] = benchmark::Counter(per_iter * kIters * double(state.iterations()),
                                               benchmark::Counter::kIsRate);
  state.SetLabel(names[mix]);
}
BENCHMARK(BM_IssueRate)->DenseRange(0, 8)->UseRealTime();
#undef LUMEN_X8

// The 512-bit products the prefill routes are made of, each accumulating into
// 12 independent registers (latencies of 4-5 at up to two per cycle): f32
// FMA (exact route), vpdpbusd (int8 decode kernels), vpdpwssd (the int8x2
// GEMM), vdpbf16ps (the bf16 route). Per core on session 40's Intel Xeon
// without AMX: 6.8-7.0, 6.6-6.8, 6.6-6.8 and 1.7 G instructions/s
// (performance.md, "The int8x2 prefill GEMM"). Skipped where the CPU lacks one.
__attribute__((target("avx512f,avx512vnni,avx512bf16"))) void BM_IssueRate512(
    benchmark::State& state) {
  const int kind = static_cast<int>(state.range(0));
  const char* names[] = {"vfmadd231ps zmm", "vpdpbusd zmm", "vpdpwssd zmm", "vdpbf16ps zmm"};
  if ((kind == 1 || kind == 2) && !CpuHasVnni()) return state.SkipWithError("no AVX512-VNNI");
  if (kind == 3 && !CpuHasBf16()) return state.SkipWithError("no AVX512-BF16");
  if (!__builtin_cpu_supports("avx512f")) return state.SkipWithError("no AVX-512");
  constexpr int64_t kIters = 1 << 20;
  for (auto _ : state) {
    int64_t n = kIters;
    switch (kind) {
#define LUMEN_R12(I)                                                                       \
  I "%%zmm30,%%zmm31,%%zmm0\n" I "%%zmm30,%%zmm31,%%zmm1\n" I "%%zmm30,%%zmm31,%%zmm2\n" I \
    "%%zmm30,%%zmm31,%%zmm3\n" I "%%zmm30,%%zmm31,%%zmm4\n" I "%%zmm30,%%zmm31,%%zmm5\n" I \
    "%%zmm30,%%zmm31,%%zmm6\n" I "%%zmm30,%%zmm31,%%zmm7\n" I "%%zmm30,%%zmm31,%%zmm8\n" I \
    "%%zmm30,%%zmm31,%%zmm9\n" I "%%zmm30,%%zmm31,%%zmm10\n" I "%%zmm30,%%zmm31,%%zmm11\n"
#define LUMEN_ISSUE512(I)                                                                          \
  asm volatile("vpxord %%zmm30,%%zmm30,%%zmm30\n vpxord %%zmm31,%%zmm31,%%zmm31\n 1:\n" LUMEN_R12( \
                   I) "dec %0\n jnz 1b\n"                                                          \
               : "+r"(n)::"xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8",  \
                 "xmm9", "xmm10", "xmm11", "xmm30", "xmm31");                                      \
  break;
      case 0:
        LUMEN_ISSUE512("vfmadd231ps ")
      case 1:
        LUMEN_ISSUE512("vpdpbusd ")
      case 2:
        LUMEN_ISSUE512("vpdpwssd ")
      default:
        LUMEN_ISSUE512("vdpbf16ps ")
#undef LUMEN_ISSUE512
#undef LUMEN_R12
    }
  }
  state.counters["instr"] =
      benchmark::Counter(12.0 * kIters * double(state.iterations()), benchmark::Counter::kIsRate);
  state.SetLabel(names[kind]);
}
BENCHMARK(BM_IssueRate512)->DenseRange(0, 3)->UseRealTime();

// A batch-4 decode step's inner work on one Q4_0 column group (512 weights),
// without the kernel around it: 4 activation rows x 2 levels x 8 records =
// 64 vpdpbusd, each row's lane sums then converted, scaled and added (the
// int8x2 kernels' AddScaledLanes). range(0), the weights: 0 fixed in
// registers, 1 unpacked from a 2.4 MiB stream of 288-byte groups (the
// kernels bench's 2048 x 2048 product: the last-level cache), 2 from a 1 GiB
// stream on huge pages (DRAM; prefetched as the kernels prefetch), 3 that
// DRAM stream loaded but not used (the dot products take fixed codes): what
// the core streams beside this work when nothing waits on the bytes.
// range(1): 0 the rows' chains interleaved record by record, 1 row by row in
// two chains per level (GroupDot's order), 2 two weight rows' groups per
// step, each activation vector loaded once (pinned in a register: GCC folds
// a loaded vector into each use, a load each) and met by both rows' codes,
// the two groups adjacent (rows interleaved group by group: one stream), 3
// the same with the second group from the other half of the buffer (two
// rows as stored: two streams).
// ns per group = 1e9 / groups/s (weights_GBps: 288 bytes a group); the
// bound next to the kernel's own (BM_MatMul/9/4/1/2048/3: 8192 groups per
// call; BM_DecodeStream/9/1/1/1/4 from DRAM).
#define LUMEN_BENCH_VNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))
LUMEN_BENCH_VNNI void BM_FourRowGroupDots(benchmark::State& state) {
  if (!CpuHasVnni()) return state.SkipWithError("no AVX512-VNNI");
  const int64_t source = state.range(0);
  const bool stream = source >= 1, dram = source >= 2, unused = source == 3;
  const bool by_row = state.range(1) == 1, pairs = state.range(1) >= 2, far = state.range(1) == 3;
  constexpr int64_t kGroupBytes = 288, kRowBytes = 1024;
  const int64_t groups = dram ? (int64_t{1} << 30) / kGroupBytes : 8192;
  const size_t bytes = static_cast<size_t>(groups * kGroupBytes + 4096);
  AlignedBuffer region = dram ? AlignedBuffer::ZeroedOnTouch(bytes + kHuge) : AlignedBuffer(bytes);
  uint8_t* weights = dram ? HugeAligned(region, bytes, true) : region.as<uint8_t>();
  AlignedBuffer x(8 * 4 * kRowBytes);
  std::memset(weights, 0x35, bytes);
  std::memset(x.data(), 0x11, x.size());
  const bool l1 = L1PrefetchPays();
  LUMEN_INTRINSICS_BEGIN
  const __m512 d = _mm512_set1_ps(1.5f);
  const __m512i m = _mm512_set1_epi8(15);
  __m512 acc[4][2];
  for (auto& a : acc) a[0] = a[1] = _mm512_setzero_ps();
  __m512i sink = _mm512_setzero_si512();  // the unused stream's bytes
  int64_t g = 0, window = 0;              // window: the step's activations, 8 in turn
  auto group = [&]<int A>(std::integral_constant<int, A>) LUMEN_BENCH_VNNI {
    // Two streams: the buffer's halves, each read in order.
    const int64_t at = g, step = pairs && !far ? 2 : 1, end = far ? groups / 2 : groups;
    g = g + step >= end ? 0 : g + step;
    const uint8_t* grp = weights + at * kGroupBytes;
    const uint8_t* p = x.as<uint8_t>() + window * 4 * kRowBytes;
    window = (window + 1) % 8;
    auto codes = [&](const uint8_t* src, int salt, __m512i(&c)[8]) LUMEN_BENCH_VNNI {
      for (int i = 0; i < 4; ++i) {
        __m512i y = stream ? _mm512_loadu_si512(src + 64 * i)
                           : _mm512_set1_epi8(static_cast<char>(i + salt));
        if (unused) {
          sink = _mm512_xor_si512(sink, y);
          y = _mm512_set1_epi8(static_cast<char>(i + salt));
        }
        c[i] = _mm512_and_si512(y, m);
        c[4 + i] = _mm512_and_si512(_mm512_srli_epi16(y, 4), m);
      }
      if (dram)
        PrefetchAheadInto(l1, src, kGroupBytes);
      else if (stream)
        _mm_prefetch(reinterpret_cast<const char*>(src) + 4096, _MM_HINT_T1);
    };
    __m512i c[8];
    codes(grp, 1, c);
    __m512i a[4][2];
    auto rec = [&](int r, int k, int l) LUMEN_BENCH_VNNI {
      return _mm512_load_si512(p + r * kRowBytes + 128 * k + 64 * l);
    };
    // Row r's lane scales (its window's last 64 bytes) times d.
    auto row_scale = [&](int r) LUMEN_BENCH_VNNI {
      return _mm512_mul_ps(
          d, _mm512_load_ps(reinterpret_cast<const float*>(p + r * kRowBytes + kRowBytes - 64)));
    };
    // acc + the two levels' lane sums (hi worth 256 of lo), converted, times sd.
    auto add_scaled = [&](__m512 acc, __m512i hi, __m512i lo, __m512 sd) LUMEN_BENCH_VNNI {
      return _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(hi, 8), lo)), sd,
                             acc);
    };
    if (pairs) {  // two groups as two weight rows; acc[r][A]: the first's
      __m512i c1[8];
      codes(weights + (far ? groups / 2 + at : at + 1) * kGroupBytes, 5, c1);
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r) {
        __m512i s0[2], s1[2];
#pragma GCC unroll 2
        for (int l = 0; l < 2; ++l) {
          s0[l] = s1[l] = _mm512_setzero_si512();
#pragma GCC unroll 8
          for (int k = 0; k < 8; ++k) {
            __m512i v = rec(r, k, l);
            asm("" : "+v"(v));
            s0[l] = _mm512_dpbusd_epi32(s0[l], c[k], v);
            s1[l] = _mm512_dpbusd_epi32(s1[l], c1[k], v);
          }
        }
        const __m512 sd = row_scale(r);
        acc[r][A] = add_scaled(acc[r][A], s0[0], s0[1], sd);
        acc[r][1 - A] = add_scaled(acc[r][1 - A], s1[0], s1[1], sd);
      }
      return;
    }
    if (!by_row) {
      for (int r = 0; r < 4; ++r) a[r][0] = a[r][1] = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k)
#pragma GCC unroll 4
        for (int r = 0; r < 4; ++r)
#pragma GCC unroll 2
          for (int l = 0; l < 2; ++l) a[r][l] = _mm512_dpbusd_epi32(a[r][l], c[k], rec(r, k, l));
    } else {
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r)
#pragma GCC unroll 2
        for (int l = 0; l < 2; ++l) {
          __m512i lo = _mm512_setzero_si512(), hi = _mm512_setzero_si512();
#pragma GCC unroll 4
          for (int k = 0; k < 4; ++k) {
            lo = _mm512_dpbusd_epi32(lo, c[k], rec(r, k, l));
            hi = _mm512_dpbusd_epi32(hi, c[4 + k], rec(r, 4 + k, l));
          }
          a[r][l] = _mm512_add_epi32(lo, hi);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) acc[r][A] = add_scaled(acc[r][A], a[r][0], a[r][1], row_scale(r));
  };
  constexpr int64_t kPerIter = 1 << 14;
  for (auto _ : state) {
    for (int64_t i = 0; i < kPerIter; i += 2) {
      group(std::integral_constant<int, 0>{});
      group(std::integral_constant<int, 1>{});
    }
    for (auto& a : acc) benchmark::DoNotOptimize(a);
    benchmark::DoNotOptimize(sink);
  }
  LUMEN_INTRINSICS_END
  const double done = double(kPerIter) * (pairs ? 2 : 1) * double(state.iterations());
  state.counters["groups"] = benchmark::Counter(done, benchmark::Counter::kIsRate);
  state.counters["weights_GBps"] =
      benchmark::Counter(done * kGroupBytes / 1e9, benchmark::Counter::kIsRate);
  static constexpr const char* kSources[] = {"weights in registers", "weights from L3",
                                             "weights from DRAM", "DRAM stream unused"};
  const char* order = far      ? ", two weight rows, two streams"
                      : pairs  ? ", two weight rows, one stream"
                      : by_row ? ", row by row"
                               : ", interleaved";
  state.SetLabel(std::string(kSources[source]) + order);
}
// (In registers the two-stream order reads nothing: it is the one-stream one.)
BENCHMARK(BM_FourRowGroupDots)
    ->ArgsProduct({{0}, {0, 1, 2}})
    ->ArgsProduct({{1, 2, 3}, {0, 1, 2, 3}})
    ->UseRealTime();

// Which vector instructions share this core's vpdpbusd pipes: an iteration
// of 12 vpdpbusd (12 chains, activation-like loads from L1 folded in)
// beside 8 instructions of one kind (8 chains), timed with and without the
// dot products. An instruction that issues elsewhere adds nothing to the
// dots' time; one that shares their pipes adds about its share of them.
// range(0): the kind (0 none, 1 vpaddd, 2 vpsrlw, 3 vpermd, 4 vcvtdq2ps,
// 5 vmulps, 6 vfmadd, 7 vpermps, 8 a 64-byte load and vpxor); range(1): 1
// beside the dot products, 0 alone. ns per iteration = 1e9 / iters/s.
// kPerIter iterations of BM_VnniBeside's loop, the vectors in registers (a
// call inside the loop, as the benchmark's own iteration has, would put
// them in memory: every vector register is caller-saved).
template <int kKind, bool kDots>
LUMEN_BENCH_VNNI __attribute__((noinline)) int VnniBesideLoop(const uint8_t* p, int64_t n) {
  LUMEN_INTRINSICS_BEGIN
  // Named vectors, not arrays: GCC kept arrays of them in memory here.
  __m512i a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11;
  a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = a8 = a9 = a10 = a11 = _mm512_setzero_si512();
  __m512i v0 = _mm512_set1_epi32(1), v1 = _mm512_set1_epi32(2), v2 = _mm512_set1_epi32(3),
          v3 = _mm512_set1_epi32(4), v4 = _mm512_set1_epi32(5), v5 = _mm512_set1_epi32(6),
          v6 = _mm512_set1_epi32(7), v7 = _mm512_set1_epi32(8);
  const __m512i w = _mm512_set1_epi8(3), k = _mm512_set1_epi32(1);
  const __m512i idx = _mm512_set_epi32(0, 15, 1, 14, 2, 13, 3, 12, 4, 11, 5, 10, 6, 9, 7, 8);
  const __m512 g = _mm512_set1_ps(0.999f), h = _mm512_set1_ps(1e-3f);
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* rec = p + (i * 768) % (16 << 10);
    auto dot = [&](__m512i& acc, int j) LUMEN_BENCH_VNNI {
      acc = _mm512_dpbusd_epi32(acc, w, _mm512_load_si512(rec + 64 * j));
    };
    if constexpr (kDots) {
      dot(a0, 0), dot(a1, 1), dot(a2, 2), dot(a3, 3), dot(a4, 4), dot(a5, 5);
      dot(a6, 6), dot(a7, 7), dot(a8, 8), dot(a9, 9), dot(a10, 10), dot(a11, 11);
    }
    auto op = [&](__m512i& x, int j) LUMEN_BENCH_VNNI {
      if constexpr (kKind == 1) x = _mm512_add_epi32(x, k);
      if constexpr (kKind == 2) x = _mm512_srli_epi16(x, 1);
      if constexpr (kKind == 3) x = _mm512_permutexvar_epi32(idx, x);
      if constexpr (kKind == 4) x = _mm512_castps_si512(_mm512_cvtepi32_ps(x));
      if constexpr (kKind == 5) x = _mm512_castps_si512(_mm512_mul_ps(_mm512_castsi512_ps(x), g));
      if constexpr (kKind == 6)
        x = _mm512_castps_si512(_mm512_fmadd_ps(_mm512_castsi512_ps(x), g, h));
      if constexpr (kKind == 7)
        x = _mm512_castps_si512(_mm512_permutexvar_ps(idx, _mm512_castsi512_ps(x)));
      if constexpr (kKind == 8) x = _mm512_xor_si512(x, _mm512_load_si512(rec + 8192 + 64 * j));
      asm volatile("" : "+v"(x));  // no folding of a chain, no call hoisted as const
    };
    op(v0, 0), op(v1, 1), op(v2, 2), op(v3, 3), op(v4, 4), op(v5, 5), op(v6, 6), op(v7, 7);
  }
  const __m512i sa =
      _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)),
                       _mm512_add_epi32(_mm512_add_epi32(a4, a5), _mm512_add_epi32(a6, a7)));
  const __m512i sb = _mm512_add_epi32(_mm512_add_epi32(a8, a9), _mm512_add_epi32(a10, a11));
  const __m512i sv =
      _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(v0, v1), _mm512_add_epi32(v2, v3)),
                       _mm512_add_epi32(_mm512_add_epi32(v4, v5), _mm512_add_epi32(v6, v7)));
  return _mm512_reduce_add_epi32(_mm512_add_epi32(_mm512_add_epi32(sa, sb), sv));
  LUMEN_INTRINSICS_END
}
template <int kKind, bool kDots>
void VnniBeside(benchmark::State& state) {
  AlignedBuffer x(32 << 10);
  std::memset(x.data(), 0x11, x.size());
  constexpr int64_t kPerIter = 1 << 12;
  for (auto _ : state)
    benchmark::DoNotOptimize(VnniBesideLoop<kKind, kDots>(x.as<uint8_t>(), kPerIter));
  state.counters["iters"] = benchmark::Counter(double(kPerIter) * double(state.iterations()),
                                               benchmark::Counter::kIsRate);
}
void BM_VnniBeside(benchmark::State& state) {
  if (!CpuHasVnni()) return state.SkipWithError("no AVX512-VNNI");
  const bool dots = state.range(1) == 1;
  using Fn = void (*)(benchmark::State&);
  static constexpr Fn kRun[2][9] = {
      {VnniBeside<0, false>, VnniBeside<1, false>, VnniBeside<2, false>, VnniBeside<3, false>,
       VnniBeside<4, false>, VnniBeside<5, false>, VnniBeside<6, false>, VnniBeside<7, false>,
       VnniBeside<8, false>},
      {VnniBeside<0, true>, VnniBeside<1, true>, VnniBeside<2, true>, VnniBeside<3, true>,
       VnniBeside<4, true>, VnniBeside<5, true>, VnniBeside<6, true>, VnniBeside<7, true>,
       VnniBeside<8, true>}};
  static constexpr const char* kKinds[] = {"none",   "vpaddd", "vpsrlw",  "vpermd",    "vcvtdq2ps",
                                           "vmulps", "vfmadd", "vpermps", "load+vpxor"};
  const auto kind = static_cast<size_t>(state.range(0));
  kRun[dots ? 1 : 0][kind](state);
  state.SetLabel(std::string(kKinds[kind]) + (dots ? " beside 12 vpdpbusd" : " alone"));
}
BENCHMARK(BM_VnniBeside)->ArgsProduct({{0, 1, 2, 3, 4, 5, 6, 7, 8}, {0, 1}})->UseRealTime();
#undef LUMEN_BENCH_VNNI
#endif

}  // namespace
}  // namespace lumen::kernels
