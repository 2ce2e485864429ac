#include "lumen/engine/bench.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "lumen/core/buffer.h"
#include "lumen/core/thread_pool.h"
#include "lumen/engine/session.h"
#include "lumen/kernels/matmul.h"
#include "lumen/kernels/matmul_bf16.h"
#include "lumen/kernels/matmul_bf16_amx.h"
#include "lumen/kernels/matmul_q8.h"
#include "lumen/kernels/matmul_q8x2_gemm.h"
#include "lumen/kernels/roofline.h"
#include "lumen/model/forward.h"
#include "lumen/model/kv_cache.h"

namespace lumen::engine {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int32_t Argmax(std::span<const float> v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

std::string CpuFlags() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("flags", 0) == 0) return line + " ";
  return "";
}

// Matrices a decoded token streams, once each (a tied head counts once).
std::vector<int32_t> RandomTokens(int n, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, vocab - 1);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = d(rng);
  return t;
}

// How `lumen bench` names an MLX matrix's order after its type.
const char* MlxOrderSuffix(kernels::MlxOrder order) {
  switch (order) {
    case kernels::MlxOrder::kRuns:
      return "_runs";
    case kernels::MlxOrder::kGroups:
      return "_groups";
    default:
      return "";
  }
}

}  // namespace

Spread Spread::Of(std::vector<double> v) {
  Spread s;
  s.n = static_cast<int>(v.size());
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.min = v.front();
  s.max = v.back();
  s.median = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  return s;
}

double PeakRssBytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) {
      std::istringstream is(line.substr(6));
      double kb = 0;
      is >> kb;
      return kb * 1024.0;
    }
  return 0;
}

Result<MemBandwidth> MeasureMemBandwidth(int threads, size_t bytes, int repeat) {
  if (threads <= 0) threads = ThreadPool::DefaultThreads();
  if (bytes < (size_t(1) << 20)) return Errorf("membw: buffer of {} bytes is too small", bytes);
  if (repeat < 1) return Errorf("membw: repeat must be >= 1, got {}", repeat);
  bytes &= ~size_t(4095);
  AlignedBuffer buf(bytes);  // zero-filled by the allocating thread
  ThreadPool pool(threads);
  const int64_t units = static_cast<int64_t>(bytes / 4096);
  // Touch every page with the thread that will read it (NUMA-friendly first touch).
  pool.ParallelFor(units, [&](int64_t b, int64_t e, int) {
    std::memset(buf.as<uint8_t>() + b * 4096, 1, (e - b) * 4096);
  });
  volatile uint64_t sink = 0;
  MemBandwidth r;
  r.buffer_bytes = bytes;
  r.threads = threads;
  std::vector<double> one, all;
  sink = sink + kernels::StreamRead(buf.data(), bytes);  // warm-up
  for (int i = 0; i < repeat; ++i) {
    auto t0 = Clock::now();
    sink = sink + kernels::StreamRead(buf.data(), bytes);
    one.push_back(bytes / Since(t0) / 1e9);
  }
  for (int i = 0; i < repeat; ++i) {
    auto t0 = Clock::now();
    pool.ParallelFor(units, [&](int64_t b, int64_t e, int) {
      sink = sink + kernels::StreamRead(buf.as<uint8_t>() + b * 4096, (e - b) * 4096);
    });
    all.push_back(bytes / Since(t0) / 1e9);
  }
  r.one_thread = Spread::Of(one);
  r.all_threads = Spread::Of(all);
  return r;
}

ComputePeak MeasureComputePeak(int cores) {
  ComputePeak p;
  p.target = kernels::KernelTargetName();
  p.f32_lanes = kernels::KernelF32Lanes();
  p.f32_fma_per_core = kernels::MeasureFmaFlops(0.2);
  p.cores = std::max(1, cores);
  p.f32_peak = p.f32_fma_per_core * p.cores;
  const std::string flags = CpuFlags();
  p.has_avx512_bf16 = flags.find(" avx512_bf16 ") != std::string::npos;
  p.has_avx512_vnni = flags.find(" avx512_vnni ") != std::string::npos;
  p.has_amx = flags.find(" amx_tile ") != std::string::npos;
  p.bf16_dot_per_core = kernels::MeasureBf16DotFlops(0.2);
  p.int8_dot_per_core = kernels::MeasureInt8DotOps(0.2);
  p.amx_bf16_per_core = kernels::MeasureAmxBf16Flops(0.2);
  if (p.amx_bf16_per_core > 0) {
    p.best_isa = "AMX-BF16 tdpbf16ps (measured)";
    p.best_peak = p.amx_bf16_per_core * p.cores;
  } else if (p.bf16_dot_per_core > 0) {
    p.best_isa = "AVX512-BF16 vdpbf16ps (measured)";
    p.best_peak = p.bf16_dot_per_core * p.cores;
  } else {
    p.best_isa = "f32 FMA";
    p.best_peak = p.f32_peak;
  }
  return p;
}

Result<BenchReport> RunBench(const Model& model, const BenchOptions& o) {
  if (o.prompt < 1 || o.gen < 1 || o.repeat < 1 || o.batch < 1)
    return Errorf("bench: --prompt, --gen, --repeat and --batch must be >= 1 (got {}, {}, {}, {})",
                  o.prompt, o.gen, o.repeat, o.batch);
  if (o.batch > model::kMaxChunk)
    return Errorf("bench: --batch {} exceeds the forward's {} rows", o.batch, model::kMaxChunk);
  const model::ModelConfig& c = model.config();
  const model::Weights& w = model.weights();
  ThreadPool* pool = model.pool();
  BenchReport r;
  r.model_name = model.name();
  r.threads = pool ? pool->size() : 1;

  // Roofline inputs.
  double mat_flops = 0;  // 2 * N * K summed over the layer matrices
  std::set<std::string> routes;
  const char* isa = kernels::CpuHasVnni() ? "VNNI" : "AVX2";  // the int8 kernels' instructions
  model::ForEachMatrix(w, [&](const kernels::Matrix& m) {
    r.weight_bytes_per_token += m.bytes();
    if (&m != &w.output) mat_flops += 2.0 * double(m.n) * double(m.k);
    const std::string name = m.mlx_bits
                                 ? "mlx" + std::to_string(m.mlx_bits) + "_g" +
                                       std::to_string(m.mlx_group) + MlxOrderSuffix(m.mlx_order)
                                 : std::string(Name(m.w.dtype));
    std::string route = !kernels::UsesInt8Route(m, 1)
                            ? (kernels::MatMulIsFused(m) ? ": fused decode" : ": scalar dequant")
                        : kernels::Int8Levels(m.route) == 2
                            ? fmt::format(": decode int8x2 activations (two levels), {} (L2)", isa)
                            : fmt::format(": decode int8 activations, {} (L3)", isa);
    if (kernels::RouteHasBf16(m.route) && kernels::CpuHasBf16())
      route += kernels::AmxBf16Usable() ? ", prefill bf16, AMX tiles (L3)"
                                        : ", prefill bf16, AVX512-BF16 (L3)";
    else if (kernels::Int8x2GemmTakes(m))
      route += kernels::Int8x2GemmRequantizes(m)
                   ? ", prefill int8x2 GEMM on 12-bit codes per 32, VNNI (L2)"
                   : ", prefill int8x2 GEMM, VNNI (L2)";
    routes.insert(name + route);
  });
  if (w.output.w.data != w.tok_embd.w.data) r.weight_bytes_per_token += w.tok_embd.w.row_bytes();
  r.kernel_routes.assign(routes.begin(), routes.end());
  r.weight_bytes_total = model.weight_bytes();
  // Attention: q.k and p.v, 2 FLOP each per head dim, at the prompt's mean position.
  const double attn = 4.0 * c.n_layers * c.n_heads * c.head_dim * (o.prompt + 1) / 2.0;
  r.prefill_flop_per_token =
      mat_flops + attn + 2.0 * double(w.output.n) * double(w.output.k) / o.prompt;

  const int64_t ctx = o.prompt + o.gen;
  const std::vector<int32_t> prompt = RandomTokens(o.prompt, c.vocab_size, o.seed);
  // Adds the pool's hand-offs since the last reset to *to (when counting) and resets.
  auto take = [&](ThreadPool::Stats* to) {
    if (!pool) return;
    if (to) {
      const ThreadPool::Stats& p = pool->stats();
      to->calls += p.calls;
      to->own_s += p.own_s;
      to->wait_s += p.wait_s;
      to->between_s += p.between_s;
    }
    pool->ResetStats();
  };
  auto one = [&](int prompt_len, int gen, double* pre_s, double* dec_s, bool count) -> Status {
    LUMEN_ASSIGN_OR_RETURN(
        auto s, Session::Create(model, SessionOptions{.ctx = ctx, .kv_dtype = o.kv_dtype}));
    take(nullptr);
    auto t0 = Clock::now();
    LUMEN_RETURN_IF_ERROR(s->Append(std::span(prompt.data(), prompt_len)));
    *pre_s = Since(t0);
    take(count ? &r.prefill_pool : nullptr);
    int32_t tok = Argmax(s->logits());
    t0 = Clock::now();
    for (int i = 0; i < gen; ++i) {
      LUMEN_RETURN_IF_ERROR(s->Append(std::span(&tok, 1)));
      tok = Argmax(s->logits());
    }
    *dec_s = Since(t0);
    take(count ? &r.decode_pool : nullptr);
    r.kv_bytes = s->cache().bytes();
    return Status::Ok();
  };
  {
    double a, b;  // warm-up: pages in every weight, grows allocator arenas
    const int warm_prompt = std::min(o.prompt, 16);  // and up to 2 tokens: within ctx
    LUMEN_RETURN_IF_ERROR(
        one(warm_prompt, static_cast<int>(std::min<int64_t>(2, ctx - warm_prompt)), &a, &b, false));
  }
  std::vector<double> pre, ttft, dec;
  for (int i = 0; i < o.repeat; ++i) {
    double ps, ds;
    LUMEN_RETURN_IF_ERROR(one(o.prompt, o.gen, &ps, &ds, true));
    pre.push_back(o.prompt / ps);
    ttft.push_back(ps * 1e3);
    dec.push_back(o.gen / ds);
  }
  r.prefill_tok_s = Spread::Of(pre);
  r.ttft_ms = Spread::Of(ttft);
  r.decode_tok_s = Spread::Of(dec);
  r.peak_rss_bytes = PeakRssBytes();

  // Decode rows straight through Forward::RunBatch at a given depth: the KV
  // before `depth` is zeros (attention costs the same whatever the values).
  auto run_rows = [&](int B, int64_t depth, std::vector<double>* tok_s) -> Status {
    std::vector<model::KvCache> caches;
    for (int b = 0; b < B; ++b) {
      LUMEN_ASSIGN_OR_RETURN(auto kc, model::KvCache::Create(c, depth + o.gen, o.kv_dtype));
      caches.push_back(std::move(kc));
    }
    model::Forward fwd(c, w, pool);
    std::vector<float> logits(size_t(B) * c.vocab_size);
    std::vector<model::BatchRow> rows(B);
    for (int rep = 0; rep <= o.repeat; ++rep) {  // rep 0: warm-up
      const int steps = rep == 0 ? 2 : o.gen;
      for (int b = 0; b < B; ++b) rows[b] = {&caches[b], prompt[b % prompt.size()], depth};
      auto t0 = Clock::now();
      for (int i = 0; i < steps; ++i) {
        LUMEN_RETURN_IF_ERROR(fwd.RunBatch(rows, logits.data()));
        for (int b = 0; b < B; ++b) {
          rows[b].token = Argmax(
              std::span<const float>(logits.data() + size_t(b) * c.vocab_size, c.vocab_size));
          ++rows[b].pos;
        }
      }
      if (rep > 0) tok_s->push_back(double(B) * steps / Since(t0));
    }
    return Status::Ok();
  };
  if (o.depth > 0) {
    std::vector<double> v;
    LUMEN_RETURN_IF_ERROR(run_rows(1, o.depth, &v));
    r.depth_decode_tok_s = Spread::Of(v);
  }
  if (o.batch > 1) {
    std::vector<double> v1, vb;
    LUMEN_RETURN_IF_ERROR(run_rows(1, o.prompt, &v1));
    LUMEN_RETURN_IF_ERROR(run_rows(o.batch, o.prompt, &vb));
    r.batch1_tok_s = Spread::Of(v1);
    r.batch_tok_s = Spread::Of(vb);
  }
  if (o.membw) {
    LUMEN_ASSIGN_OR_RETURN(r.membw, MeasureMemBandwidth(r.threads));
  }
  r.peak = MeasureComputePeak(r.threads);
  return r;
}

}  // namespace lumen::engine
