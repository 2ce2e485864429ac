// Bench: the measurements behind `lumen bench` (the CLI only prints them).
//
// MeasureMemBandwidth streams a large buffer with vector loads on 1 and on all
// threads (the roofline's denominator). RunBench times prefill, decode (batch
// 1, through Session as generation does), decode at a deep context, and
// batched decode (Forward::RunBatch over B sequences), each repeated R times
// after a warm-up, and reports median/min/max together with the roofline:
// bytes of weights read per decoded token / measured bandwidth, and prefill
// FLOP/s against the measured f32 FMA peak of the kernels' SIMD target.
// Timings depend on the machine's load; callers print the load average.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "lumen/core/status.h"
#include "lumen/core/thread_pool.h"
#include "lumen/engine/model.h"

namespace lumen::engine {

struct Spread {
  double median = 0, min = 0, max = 0;
  int n = 0;
  static Spread Of(std::vector<double> v);
};

struct MemBandwidth {
  size_t buffer_bytes = 0;
  int threads = 0;     // for `all`
  Spread one_thread;   // GB/s (1e9 bytes/s)
  Spread all_threads;  // GB/s
};

// Streams a `bytes` buffer (first touched by the thread that reads it) `repeat`
// times on 1 thread and on `threads` threads (0: ThreadPool::DefaultThreads()).
Result<MemBandwidth> MeasureMemBandwidth(int threads, size_t bytes = size_t(1) << 30,
                                         int repeat = 5);

struct ComputePeak {
  std::string target;  // Highway target name, e.g. "AVX3"
  int f32_lanes = 0;
  double f32_fma_per_core = 0;  // measured FLOP/s, one thread
  int cores = 0;                // threads used for the peak
  double f32_peak = 0;          // f32_fma_per_core * cores
  bool has_avx512_bf16 = false, has_avx512_vnni = false, has_amx = false;
  double bf16_dot_per_core = 0;  // measured vdpbf16ps FLOP/s, one thread (0: absent)
  double int8_dot_per_core = 0;  // measured vpdpbusd OP/s, one thread (0: absent)
  double amx_bf16_per_core = 0;  // measured tdpbf16ps FLOP/s, one thread (0: tiles unusable)
  // Peak of the best floating-point matrix instruction set usable: AMX tiles
  // > AVX512-BF16 > f32 FMA, each measured.
  // Names which in best_isa. The int8 peak is reported beside it.
  std::string best_isa;
  double best_peak = 0;
};
ComputePeak MeasureComputePeak(int cores);

struct BenchOptions {
  int prompt = 512;  // prefill tokens
  int gen = 128;     // decoded tokens per repetition
  int threads = 0;   // informational: the model's pool decides
  int batch = 1;     // > 1: also batched decode with B sequences
  int repeat = 3;
  int64_t depth = 0;  // > 0: also decode starting at this context position
  bool membw = true;  // measure bandwidth in the same run
  DType kv_dtype = DType::kF16;
  uint64_t seed = 1;
};

struct BenchReport {
  std::string model_name;
  int threads = 0;
  size_t weight_bytes_per_token = 0;  // matrices read per decoded token (+1 embedding row)
  size_t weight_bytes_total = 0;      // Model::weight_bytes()
  size_t kv_bytes = 0;                // KV cache of one decode session
  double prefill_flop_per_token = 0;  // matmuls + attention at the prompt's mean position
  Spread prefill_tok_s, ttft_ms, decode_tok_s;
  Spread depth_decode_tok_s;         // decode at opts.depth (when > 0)
  Spread batch1_tok_s, batch_tok_s;  // via RunBatch at the prompt's depth (when batch > 1)
  double peak_rss_bytes = 0;         // VmHWM after all phases
  MemBandwidth membw;                // when opts.membw
  ComputePeak peak;
  std::vector<std::string> kernel_routes;  // "q4_k: fused" per weight dtype present
  // The pool's hand-offs over the measured prefills and decodes (threads > 1).
  ThreadPool::Stats prefill_pool, decode_pool;
};

Result<BenchReport> RunBench(const Model& model, const BenchOptions& opts);

// Peak resident set (VmHWM) of this process in bytes; 0 if unknown.
double PeakRssBytes();

}  // namespace lumen::engine
