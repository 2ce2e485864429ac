#include "lumen/engine/fit.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "lumen/core/thread_pool.h"
#include "lumen/engine/bench.h"
#include "lumen/engine/session.h"
#include "lumen/model/forward.h"
#include "lumen/model/kv_cache.h"
#include "lumen/model/weights.h"

namespace lumen::engine {
namespace {

Result<uint64_t> KvRowBytes(const model::ModelConfig& c, DType kv) {
  if (kv != DType::kF16 && kv != DType::kBF16 && kv != DType::kF32 && kv != DType::kQ8_0)
    return Errorf("--kv-type must be f16, bf16, f32 or q8_0, got {}", Name(kv));
  if (kv == DType::kQ8_0 && c.head_dim % 32 != 0)
    return Errorf("--kv-type q8_0 needs a head dimension that is a multiple of 32, got {}",
                  c.head_dim);
  auto row = RowBytes(kv, c.kv_dim());
  if (!row)
    return Errorf("--kv-type {}: rows of {} elements are not whole blocks", Name(kv), c.kv_dim());
  return uint64_t(*row);
}

bool Sliding(const model::ModelConfig& c, int l) {
  return c.sliding_window > 0 && l < int(c.layer_sliding.size()) && c.layer_sliding[l];
}

uint64_t WeightBytesPerToken(const Model& m) {
  const model::Weights& w = m.weights();
  uint64_t n = 0;
  model::ForEachMatrix(w, [&](const kernels::Matrix& x) { n += x.bytes(); });
  if (w.output.w.data != w.tok_embd.w.data) n += w.tok_embd.w.row_bytes();
  return n;
}

std::string CacheFile() {
  namespace fs = std::filesystem;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
    return (fs::path(x) / "lumen" / "membw.json").string();
  if (const char* h = std::getenv("HOME"); h && *h)
    return (fs::path(h) / ".cache" / "lumen" / "membw.json").string();
  return "";
}

}  // namespace

uint64_t KvBytesPerSeq(const model::ModelConfig& c, DType kv, int64_t ctx) {
  auto row = KvRowBytes(c, kv);
  if (!row.ok() || ctx <= 0) return 0;
  uint64_t rows = 0;
  for (int l = 0; l < c.n_layers; ++l)
    rows += uint64_t(Sliding(c, l) ? std::min(ctx, c.sliding_window + model::kMaxChunk) : ctx);
  return 2 * rows * *row;
}

uint64_t KvBytesPerToken(const model::ModelConfig& c, DType kv) {
  auto row = KvRowBytes(c, kv);
  if (!row.ok()) return 0;
  uint64_t full = 0;
  for (int l = 0; l < c.n_layers; ++l) full += !Sliding(c, l);
  return 2 * full * *row;
}

uint64_t KvReadBytes(const model::ModelConfig& c, DType kv, int64_t pos) {
  auto row = KvRowBytes(c, kv);
  if (!row.ok() || pos < 0) return 0;
  uint64_t rows = 0;
  for (int l = 0; l < c.n_layers; ++l)
    rows += uint64_t(Sliding(c, l) ? std::min(pos + 1, c.sliding_window) : pos + 1);
  return 2 * rows * *row;
}

uint64_t TransientBytesPerSeq(const model::ModelConfig& c, int threads, int64_t ctx) {
  const uint64_t f = sizeof(float);
  const uint64_t Q = uint64_t(c.q_dim()), KV = uint64_t(c.kv_dim());
  const uint64_t th = uint64_t(std::max(threads, 1));
  const uint64_t act = f * uint64_t(model::Activations::Floats(c));
  const uint64_t parts = th * Q * f;
  const uint64_t scratch = th * (uint64_t(ctx) * uint64_t(c.n_heads + 1) + 2 * KV) * f;
  const uint64_t logits = uint64_t(c.vocab_size) * f;
  return act + parts + scratch + logits;
}

Result<FitReport> Fit(const Model& model, const FitOptions& o) {
  const model::ModelConfig& c = model.config();
  if (o.parallel < 1) return Errorf("--parallel must be at least 1, got {}", o.parallel);
  LUMEN_RETURN_IF_ERROR(KvRowBytes(c, o.kv_dtype).status());
  const int64_t model_ctx = std::max<int64_t>(c.max_ctx, 1);
  FitReport r;
  r.ctx = o.ctx > 0 ? o.ctx : model_ctx;
  if (r.ctx > model_ctx && !o.beyond_model_ctx)
    return Errorf("--ctx {} exceeds the model's context of {} tokens", r.ctx, model_ctx);
  r.parallel = o.parallel;
  r.kv_dtype = o.kv_dtype;
  const int threads = o.threads > 0 ? o.threads : (model.pool() ? model.pool()->size() : 1);
  r.weight_bytes = model.weight_bytes();
  r.weight_bytes_per_token = WeightBytesPerToken(model);
  r.kv_bytes_per_token = KvBytesPerToken(c, o.kv_dtype);
  auto total = [&](int64_t ctx) {
    return r.weight_bytes + uint64_t(o.parallel) * (KvBytesPerSeq(c, o.kv_dtype, ctx) +
                                                    TransientBytesPerSeq(c, threads, ctx));
  };
  r.kv_bytes_per_seq = KvBytesPerSeq(c, o.kv_dtype, r.ctx);
  r.transient_bytes_per_seq = TransientBytesPerSeq(c, threads, r.ctx);
  r.total_bytes = total(r.ctx);
  r.budget_bytes = o.budget_bytes ? o.budget_bytes : MemAvailableBytes();
  if (r.budget_bytes == 0)
    return Error("fit: /proc/meminfo has no MemAvailable; give --memory-budget");
  r.fits = r.total_bytes <= r.budget_bytes;
  // total() never decreases with ctx: binary search the largest that fits.
  int64_t lo = 0, hi = std::max(model_ctx, r.ctx);
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (total(mid) <= r.budget_bytes)
      lo = mid;
    else
      hi = mid - 1;
  }
  r.max_ctx = lo;
  r.bandwidth = o.bandwidth;
  if (o.bandwidth > 0) {
    const double wt = double(r.weight_bytes_per_token);
    r.decode_tok_s_start = o.bandwidth / (wt + double(KvReadBytes(c, o.kv_dtype, 0)));
    const double kv_full = double(KvReadBytes(c, o.kv_dtype, r.ctx - 1));
    r.decode_tok_s_full = o.bandwidth / (wt + kv_full);
    r.decode_tok_s_batch = o.parallel * o.bandwidth / (wt + o.parallel * kv_full);
  }
  return r;
}

nlohmann::ordered_json FitReportJson(const FitReport& r) {
  return {{"ctx", r.ctx},
          {"parallel", r.parallel},
          {"kv_type", std::string(Name(r.kv_dtype))},
          {"weight_bytes", r.weight_bytes},
          {"weight_bytes_per_token", r.weight_bytes_per_token},
          {"kv_bytes_per_token", r.kv_bytes_per_token},
          {"kv_bytes_per_seq", r.kv_bytes_per_seq},
          {"transient_bytes_per_seq", r.transient_bytes_per_seq},
          {"total_bytes", r.total_bytes},
          {"budget_bytes", r.budget_bytes},
          {"fits", r.fits},
          {"max_ctx", r.max_ctx},
          {"bandwidth", r.bandwidth},
          {"decode_tok_s_start", r.decode_tok_s_start},
          {"decode_tok_s_full", r.decode_tok_s_full},
          {"decode_tok_s_batch", r.decode_tok_s_batch}};
}

std::string CpuModelName() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon == std::string::npos) break;
      std::string v = line.substr(colon + 1);
      v.erase(0, v.find_first_not_of(" \t"));
      return v;
    }
  return "unknown cpu";
}

Result<double> MachineBandwidth(int threads, bool remeasure, std::string* source) {
  namespace fs = std::filesystem;
  if (threads <= 0) threads = ThreadPool::DefaultThreads();
  const std::string key = CpuModelName() + " / " + std::to_string(threads) + " threads";
  const std::string file = CacheFile();
  nlohmann::json cache = nlohmann::json::object();
  if (!file.empty()) {
    std::ifstream in(file);
    if (in) {
      cache = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
      if (!cache.is_object()) cache = nlohmann::json::object();  // unreadable: measure again
    }
  }
  if (!remeasure && cache.contains(key) && cache[key].is_object() &&
      cache[key].value("bytes_per_s", 0.0) > 0) {
    if (source) *source = "cached in " + file;
    return cache[key]["bytes_per_s"].get<double>();
  }
  LUMEN_ASSIGN_OR_RETURN(MemBandwidth m, MeasureMemBandwidth(threads, size_t(256) << 20, 3));
  const double bw = m.all_threads.median * 1e9;
  if (source) *source = "measured";
  if (!file.empty()) {
    std::error_code ec;
    fs::create_directories(fs::path(file).parent_path(), ec);
    cache[key] = {{"bytes_per_s", bw},
                  {"buffer_bytes", m.buffer_bytes},
                  {"measured_unix", int64_t(std::time(nullptr))}};
    const std::string tmp = file + ".tmp" + std::to_string(::getpid());
    std::ofstream(tmp) << cache.dump(1) << "\n";
    fs::rename(tmp, file, ec);
    if (!ec && source) *source = "measured, cached in " + file;
  }
  return bw;
}

}  // namespace lumen::engine
