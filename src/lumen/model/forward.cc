#include "lumen/model/forward.h"

#include <algorithm>
#include <cstring>

#include "lumen/core/half.h"
#include "lumen/core/route.h"
#include "lumen/kernels/activation.h"
#include "lumen/kernels/attention.h"
#include "lumen/kernels/matmul.h"
#include "lumen/kernels/matmul_q8.h"
#include "lumen/kernels/norm.h"

namespace lumen::model {

LUMEN_ROUTE(
    forward_dense,
    {.node = "forward",
     .name = "config-driven",
     .tier = Tier::kL2,
     .oracle = "HF transformers (float64 goldens of every family) and llama2.c's run.c",
     .bound = "the logit bounds of families_test.cc and llama2c_test.cc",
     .tests = "Families/FamilyGolden.*;Stories260K.LogitsMatchRunC;Stories260K.GreedyIdsMatchRunC",
     .priority = 10});
LUMEN_ROUTE(norm_rms, {.node = "norm.rms",
                       .name = "scalar-double-sum",
                       .tier = Tier::kL2,
                       .oracle = "the textbook RMSNorm in float64 (family goldens)",
                       .bound = "the family goldens' logit bound",
                       .tests = "Families/FamilyGolden.*",
                       .priority = 10});
LUMEN_ROUTE(embed_lookup,
            {.node = "embed",
             .name = "dequantize-row",
             .tier = Tier::kL1,
             .oracle = "core/quant.h's scalar dequantizers",
             .bound = "bit-identical (one row decoded, scaled in the embedding's dtype as HF does)",
             .tests = "QuantRoundTrip.PlainTypes;Families/FamilyGolden.*",
             .priority = 10});
LUMEN_ROUTE(
    decode_batched,
    {.node = "decode.batched",
     .name = "rows-in-one-pass",
     .tier = Tier::kL1,
     .oracle = "the same sequence decoded alone",
     .bound = "bit-identical logits and tokens per row",
     .tests = "SchedulerTest.OutputDoesNotDependOnNeighbours;SchedulerTest.MatchesGenerateAlone;"
              "ServerBatching.SameSeedAloneAndBesideOthers;MatMulTest.ManyEqualsOneByOneBitForBit",
     .priority = 10});

using kernels::MatMul;

// Below this many elements the FFN activation runs on the calling thread: a
// decode step's 8k elements take a few microseconds, about what a hand-off costs.
constexpr int64_t kParallelActivation = 16384;

// From this many rows the per-row work between products (norms, RoPE and the
// KV store, residual adds) is split across threads: on two threads a 128-row
// prefill chunk spent 7% of its time there on the calling thread alone.
constexpr int64_t kParallelRows = 16;

// From this many visible positions a decode row's attention is split across
// threads by position (each streams whole KV rows) instead of by kv head.
constexpr int64_t kSplitAttention = 1024;

namespace {

// Up to this many rows (a decode step's, a short prompt's) the FFN takes its
// whole width at once: their products are dot-shaped (M <= 4, the int8
// routes' M <= kernels::Int8MaxRows), where a piece's sum would be added to
// the output once rather than continue it, so pieces would change their bits.
int64_t WholeFfnMinRows(const LayerWeights& L) {
  int64_t rows = std::max(kernels::Int8MaxRows(L.w_up), kernels::Int8MaxRows(L.w_down));
  if (L.w_gate.valid()) rows = std::max(rows, kernels::Int8MaxRows(L.w_gate));
  return rows;
}

// The work buffer: a chunk's qkv and att; or its FFN gate and up for one
// piece and the FFN's output; or gate and up over the whole width for a
// decode step's or a short prompt's rows (the most any CPU's int8 routes take).
int64_t WorkFloats(const ModelConfig& c) {
  const int64_t qkv_att = c.q_dim() + 2 * c.kv_dim() + c.q_dim();
  return std::max(
      {kMaxChunk * qkv_att, kMaxChunk * (2 * std::min<int64_t>(c.ffn_dim, kFfnPiece) + c.dim),
       std::max(kernels::kInt8MaxRowsVnni, kernels::kInt8MaxRowsAvx2) * 2 * int64_t(c.ffn_dim)});
}

}  // namespace

int64_t Activations::Floats(const ModelConfig& c) { return 2 * kMaxChunk * c.dim + WorkFloats(c); }

Activations::Activations(const ModelConfig& c, int threads)
    : x(kMaxChunk * c.dim * sizeof(float)),
      xn(kMaxChunk * c.dim * sizeof(float)),
      work(WorkFloats(c) * sizeof(float)),
      qkv_width(c.q_dim() + 2 * c.kv_dim()),
      ffn_dim(c.ffn_dim) {
  // attn_scratch is sized by RunRows for the longest cache it is given: the
  // model's context (128k for Llama-3.2) would cost 35 MB for a 4k session.
  attn_parts = AlignedBuffer(size_t(threads) * c.q_dim() * sizeof(float));
  const kernels::AttentionShape shape{c.n_heads, c.n_kv_heads, c.head_dim, c.attn_scale,
                                      c.attn_softcap};
  attn_rows_per_thread = kernels::AttendRowsScratchFloats(shape);
  attn_rows = AlignedBuffer(size_t(threads) * attn_rows_per_thread * sizeof(float));
}

float EmbedScale(const ModelConfig& c, const Weights& w) {
  if (!c.embed_scale_in_weight_dtype) return c.embed_scale;
  DType t = w.tok_embd.w.dtype;
  if (w.tok_embd.mlx_bits) t = w.tok_embd.scales.dtype;  // MLX: the scales' float type
  if (t == DType::kBF16) return BF16ToF32(F32ToBF16(c.embed_scale));
  if (t == DType::kF16) return F16ToF32(F32ToF16(c.embed_scale));
  return c.embed_scale;
}

Forward::Forward(const ModelConfig& c, const Weights& w, ThreadPool* pool)
    : c_(c), w_(w), pool_(pool), a_(c, pool ? pool->size() : 1), embed_scale_(EmbedScale(c, w)) {}

template <class Fn>
void Forward::ForRows(int64_t T, const Fn& fn) {
  if (pool_ && T >= kParallelRows) {
    pool_->ParallelFor(T, [&](int64_t b, int64_t e, int) {
      for (int64_t t = b; t < e; ++t) fn(t);
    });
  } else {
    for (int64_t t = 0; t < T; ++t) fn(t);
  }
}

const kernels::RopeTable& Forward::Rope(bool sliding, int64_t seq_len) {
  // Only dynamic NTK depends on the call's length (HF: max position + 1, and
  // only beyond max_position_embeddings); rebuild when that value changes.
  const bool dynamic = c_.rope_scaling.type == kernels::RopeScaling::Type::kDynamic;
  const int64_t key = dynamic ? std::max(seq_len, c_.max_ctx) : 0;
  if (rope_seq_len_ < 0 || key != rope_seq_len_) {
    rope_seq_len_ = key;
    rope_global_ =
        kernels::MakeRopeTable(c_.rope_dim, c_.rope_theta, c_.rope_scaling, c_.max_ctx, seq_len);
    rope_local_ = kernels::MakeRopeTable(c_.rope_dim, c_.rope_theta_local, {}, c_.max_ctx, seq_len);
    if (w_.rope_freqs)  // llama.cpp's rope_freqs tensor: per-pair divisors (global layers)
      for (size_t i = 0; i < rope_global_.inv_freq.size(); ++i)
        rope_global_.inv_freq[i] /= w_.rope_freqs[i];
  }
  // Gemma3 rotates sliding layers with the local base; other families use one base.
  return sliding && c_.family == Family::kGemma3 ? rope_local_ : rope_global_;
}

void Forward::Embed(std::span<const BatchRow> rows, float* x) const {
  for (size_t t = 0; t < rows.size(); ++t) {
    float* row = x + t * c_.dim;
    kernels::DequantizeMatrixRow(w_.tok_embd, rows[t].token, row);
    if (embed_scale_ != 1.0f)
      for (int i = 0; i < c_.dim; ++i) row[i] *= embed_scale_;
  }
}

void Forward::AttentionBlock(int l, std::span<const BatchRow> rows) {
  const int64_t T = static_cast<int64_t>(rows.size());
  const LayerWeights& L = w_.layers[l];
  const int64_t D = c_.dim, Q = c_.q_dim(), KV = c_.kv_dim(), QKV = Q + 2 * KV;
  float* x = a_.x.as<float>();
  float* xn = a_.xn.as<float>();
  float* qkv = a_.qkv();
  float* att = a_.att();
  float* out = xn;  // read by the QKV products and their adapters only

  ForRows(T, [&](int64_t t) {
    kernels::RmsNormForward(x + t * D, L.attn_norm, c_.norm_offset, c_.norm_eps, D, xn + t * D);
  });
  if (L.wqkv.valid()) {
    MatMul(L.wqkv, xn, T, D, qkv, QKV, pool_);
  } else {
    // One thread-pool pass for all three (bit-identical to three MatMuls).
    const kernels::MatMulOut outs[] = {
        {&L.wq, qkv, QKV}, {&L.wk, qkv + Q, QKV}, {&L.wv, qkv + Q + KV, QKV}};
    kernels::MatMulMany(outs, xn, T, D, pool_);
  }
  RowLora(l, kLoraQ, rows, xn, D, qkv, QKV);
  RowLora(l, kLoraK, rows, xn, D, qkv + Q, QKV);
  RowLora(l, kLoraV, rows, xn, D, qkv + Q + KV, QKV);
  const bool sliding = c_.layer_sliding[l];
  int64_t max_pos = 0;
  for (const auto& r : rows) max_pos = std::max(max_pos, r.pos);
  const kernels::RopeTable& rope = Rope(sliding, max_pos + 1);
  ForRows(T, [&](int64_t t) {
    const int64_t pos = rows[t].pos;
    float* q = qkv + t * QKV;
    float* k = q + Q;
    float* v = k + KV;
    if (L.bq)
      for (int64_t i = 0; i < Q; ++i) q[i] += L.bq[i];
    if (L.bk)
      for (int64_t i = 0; i < KV; ++i) k[i] += L.bk[i];
    if (L.bv)
      for (int64_t i = 0; i < KV; ++i) v[i] += L.bv[i];
    if (L.q_norm) {
      for (int h = 0; h < c_.n_heads; ++h) {
        float* qh = q + int64_t(h) * c_.head_dim;
        kernels::RmsNormForward(qh, L.q_norm, c_.norm_offset, c_.norm_eps, c_.head_dim, qh);
      }
      for (int h = 0; h < c_.n_kv_heads; ++h) {
        float* kh = k + int64_t(h) * c_.head_dim;
        kernels::RmsNormForward(kh, L.k_norm, c_.norm_offset, c_.norm_eps, c_.head_dim, kh);
      }
    }
    kernels::ApplyRope(q, c_.n_heads, c_.head_dim, c_.rope_dim, rope, pos, c_.rope_style);
    kernels::ApplyRope(k, c_.n_kv_heads, c_.head_dim, c_.rope_dim, rope, pos, c_.rope_style);
    kernels::StoreKv(rows[t].cache->layer(l), KV, pos, k, v);
  });

  const kernels::AttentionShape shape{c_.n_heads, c_.n_kv_heads, c_.head_dim, c_.attn_scale,
                                      c_.attn_softcap};
  const int64_t window = sliding ? c_.sliding_window : 0;
  const int threads = pool_ ? pool_->size() : 1;
  if (T >= threads || step_invariant_ || HasRun(rows)) {
    AttendRuns(l, rows, shape, window);
  } else if (max_pos + 1 >= kSplitAttention &&
             std::all_of(rows.begin(), rows.end(), [&](const BatchRow& r) {
               return kernels::AttendSplitSupported(shape, r.cache->layer(l).dtype);
             })) {
    for (int64_t t = 0; t < T; ++t) AttendByPosition(l, rows[t], t, shape, window);
  } else {
    // Decode has fewer rows than threads: split each row's kv heads instead.
    const int64_t Hkv = c_.n_kv_heads;
    // A thread's heads of one row go in one call: its blocked passes then read
    // all of them per cache row (adjacent in the row) instead of one head's
    // 2 * Dh bytes of every row per pass.
    pool_->ParallelFor(T * Hkv, [&](int64_t b, int64_t e, int thread) {
      float* scratch = a_.attn_scratch.as<float>() + thread * a_.attn_scratch_per_thread;
      for (int64_t u = b; u < e;) {
        const int64_t t = u / Hkv;
        const int64_t u_end = std::min(e, (t + 1) * Hkv);
        const int64_t p = rows[t].pos;
        const int64_t begin = window > 0 ? std::max<int64_t>(0, p - window + 1) : 0;
        kernels::AttendHeads(qkv + t * QKV, shape, rows[t].cache->layer(l), begin, p + 1,
                             att + t * Q, scratch, static_cast<int>(u % Hkv),
                             static_cast<int>(u_end - t * Hkv));
        u = u_end;
      }
    });
  }

  MatMul(L.wo, att, T, Q, out, D, pool_);
  RowLora(l, kLoraO, rows, att, Q, out, D);
  ForRows(T, [&](int64_t t) {
    float* o = out + t * D;
    if (L.bo)
      for (int64_t i = 0; i < D; ++i) o[i] += L.bo[i];
    if (L.post_attn_norm)
      kernels::RmsNormForward(o, L.post_attn_norm, c_.norm_offset, c_.norm_eps, D, o);
    float* xr = x + t * D;
    for (int64_t i = 0; i < D; ++i) xr[i] += o[i] * c_.residual_scale;
  });
}

// Whether some two rows are consecutive tokens of one sequence (a prefill
// chunk, or a forced run), which AttendRuns takes as GEMM tiles.
bool Forward::HasRun(std::span<const BatchRow> rows) const {
  for (size_t t = 1; t < rows.size(); ++t)
    if (rows[t].cache == rows[t - 1].cache && rows[t].pos == rows[t - 1].pos + 1) return true;
  return false;
}

// Attention of a chunk's rows in units spread over the threads, first come:
// a run of consecutive tokens of one sequence goes to kernels::AttendRows in
// (kv head, token block) units, a head's blocks together (its K and V stay
// in L2 between them), the last blocks (the most positions) first; a lone row
// (a batched decode step's) to AttendOne whole, whose bits are the
// single-stream decode step's (AttendHeads splits by head bit for bit),
// unless step_invariant_ (RunHidden) asks for AttendRows for every row.
void Forward::AttendRuns(int l, std::span<const BatchRow> rows,
                         const kernels::AttentionShape& shape, int64_t window) {
  const int64_t T = static_cast<int64_t>(rows.size()), Q = c_.q_dim(), QKV = Q + 2 * c_.kv_dim();
  float* qkv = a_.qkv();
  float* att = a_.att();
  const int64_t block = kernels::AttendRowsTokens(shape);
  attn_units_.clear();
  for (int64_t t = 0; t < T;) {
    int64_t e = t + 1;
    while (e < T && rows[e].cache == rows[t].cache && rows[e].pos == rows[e - 1].pos + 1) ++e;
    if ((e - t >= 2 || step_invariant_) &&
        kernels::AttendRowsSupported(shape, rows[t].cache->layer(l).dtype)) {
      for (int h = 0; h < c_.n_kv_heads; ++h)
        for (int64_t b = t + (e - t - 1) / block * block; b >= t; b -= block)
          attn_units_.push_back({t, b, std::min(e, b + block), h});
    } else {
      for (int64_t u = t; u < e; ++u) attn_units_.push_back({u, u, u + 1, -1});
    }
    t = e;
  }
  auto run = [&](int64_t b, int64_t e, int thread) {
    for (int64_t i = b; i < e; ++i) {
      const AttentionUnit& u = attn_units_[i];
      const BatchRow& first = rows[u.run];
      const kernels::KvRing& kv = first.cache->layer(l);
      if (u.kv_head < 0) {
        const int64_t p = first.pos;
        const int64_t begin = window > 0 ? std::max<int64_t>(0, p - window + 1) : 0;
        float* scratch = a_.attn_scratch.as<float>() + thread * a_.attn_scratch_per_thread;
        kernels::AttendOne(qkv + u.run * QKV, shape, kv, begin, p + 1, att + u.run * Q, scratch);
        continue;
      }
      const kernels::AttentionRows r{qkv + u.run * QKV, QKV, att + u.run * Q, Q, first.pos, window};
      kernels::AttendRows(shape, kv, r, u.kv_head, u.t0 - u.run, u.t1 - u.run,
                          a_.attn_rows.as<float>() + thread * a_.attn_rows_per_thread);
    }
  };
  const int64_t n = static_cast<int64_t>(attn_units_.size());
  if (pool_)
    pool_->ParallelForDynamic(n, run, 1);
  else
    run(0, n, 0);
}

// One decode row's attention split across threads by position (three passes;
// kernels/attention.h): scores [H, S] live in thread 0's scratch, each thread
// sums its positions' values into its own part, and the parts add up to the
// row's output.
void Forward::AttendByPosition(int l, const BatchRow& row, int64_t t,
                               const kernels::AttentionShape& shape, int64_t window) {
  const int64_t Q = c_.q_dim(), QKV = Q + 2 * c_.kv_dim();
  const int threads = pool_->size();
  float* scores = a_.attn_scratch.as<float>();
  float* parts = a_.attn_parts.as<float>();
  const kernels::KvRing& kv = row.cache->layer(l);
  const int64_t p = row.pos;
  const int64_t begin = window > 0 ? std::max<int64_t>(0, p - window + 1) : 0, S = p + 1 - begin;
  const float* q = a_.qkv() + t * QKV;
  std::fill(parts, parts + int64_t(threads) * Q, 0.0f);
  pool_->ParallelFor(
      S,
      [&](int64_t b, int64_t e, int) {
        kernels::AttendScores(q, shape, kv, begin, p + 1, b, e, scores);
      },
      64);
  pool_->ParallelFor(c_.n_heads, [&](int64_t b, int64_t e, int) {
    kernels::AttendSoftmax(S, scores, static_cast<int>(b), static_cast<int>(e));
  });
  pool_->ParallelFor(
      S,
      [&](int64_t b, int64_t e, int thread) {
        kernels::AttendValues(shape, kv, begin, p + 1, b, e, scores, parts + thread * Q);
      },
      64);
  float* o = a_.att() + t * Q;
  std::copy(parts, parts + Q, o);
  for (int i = 1; i < threads; ++i)
    for (int64_t k = 0; k < Q; ++k) o[k] += parts[i * Q + k];
}

// The FFN of a chunk's rows. A prefill chunk takes the hidden width in
// pieces of kFfnPiece columns: gate and up for the piece's rows of W_gate and
// W_up, the activation, then the piece's columns of W_down, each piece's
// product continuing the output of the ones before (MatMulAccumulate: the
// exact and AVX512-BF16 routes give the whole product's bits), so the work
// buffer holds one piece of gate and up for kMaxChunk rows, not the whole
// width. Decode rows, and rows with adapters (whose low-rank terms need the
// whole width), take the whole width in parts of at most WholeFfnRows rows
// (a row's bits do not depend on the rows beside it on those routes).
void Forward::FfnBlock(int l, std::span<const BatchRow> rows) {
  const int64_t T = static_cast<int64_t>(rows.size());
  const LayerWeights& L = w_.layers[l];
  const int64_t D = c_.dim, F = c_.ffn_dim;
  float* x = a_.x.as<float>();
  float* xn = a_.xn.as<float>();

  ForRows(T, [&](int64_t t) {
    kernels::RmsNormForward(x + t * D, L.ffn_norm, c_.norm_offset, c_.norm_eps, D, xn + t * D);
  });
  const bool adapters = lora_terms_ > 0 || L.lora[kLoraGate].valid() || L.lora[kLoraUp].valid() ||
                        L.lora[kLoraDown].valid();
  const bool pieces = T > WholeFfnMinRows(L) && !adapters && F > kFfnPiece &&
                      kFfnPiece % kernels::MatrixSliceAlign(L.w_down) == 0;
  float* out = xn;
  if (pieces) {
    out = a_.ffn_out();
    for (int64_t f0 = 0; f0 < F; f0 += kFfnPiece) FfnPiece(l, T, f0, std::min(F, f0 + kFfnPiece));
  } else {
    const int64_t parts = (T + a_.WholeFfnRows() - 1) / a_.WholeFfnRows();
    for (int64_t p = 0; p < parts; ++p) {
      const int64_t t0 = T * p / parts, t1 = T * (p + 1) / parts;
      FfnWhole(l, rows.subspan(t0, t1 - t0), xn + t0 * D);
    }
  }
  ForRows(T, [&](int64_t t) {
    float* o = out + t * D;
    if (L.post_ffn_norm)
      kernels::RmsNormForward(o, L.post_ffn_norm, c_.norm_offset, c_.norm_eps, D, o);
    float* xr = x + t * D;
    for (int64_t i = 0; i < D; ++i) xr[i] += o[i] * c_.residual_scale;
  });
}

// Hidden columns [f0, f1) of the FFN for T rows of xn, into (f0 = 0) or
// onto a_.ffn_out().
void Forward::FfnPiece(int l, int64_t T, int64_t f0, int64_t f1) {
  const LayerWeights& L = w_.layers[l];
  const int64_t D = c_.dim, F = c_.ffn_dim, w = f1 - f0;
  const bool fused = !L.w_gate.valid();  // one [2F, D] matrix: gate rows, then up rows
  const kernels::Matrix gate_w = fused ? L.w_up.RowSlice(f0, f1) : L.w_gate.RowSlice(f0, f1);
  const kernels::Matrix up_w = fused ? L.w_up.RowSlice(F + f0, F + f1) : L.w_up.RowSlice(f0, f1);
  float* gate = a_.gate();
  float* up = a_.up(T, w);
  const kernels::MatMulOut outs[] = {{&gate_w, gate, w}, {&up_w, up, w}};
  kernels::MatMulMany(outs, a_.xn.as<float>(), T, D, pool_);
  Activate(gate, up, T * w);
  const kernels::Matrix down = L.w_down.ColSlice(f0, f1);
  if (f0 == 0)
    MatMul(down, gate, T, w, a_.ffn_out(), D, pool_);
  else
    kernels::MatMulAccumulate(down, gate, T, w, a_.ffn_out(), D, pool_);
}

// The FFN over its whole width for rows (xn: their normed inputs), the output
// written over xn.
void Forward::FfnWhole(int l, std::span<const BatchRow> rows, float* xn) {
  const int64_t T = static_cast<int64_t>(rows.size());
  const LayerWeights& L = w_.layers[l];
  const int64_t D = c_.dim, F = c_.ffn_dim;
  float* gate = a_.gate();
  if (L.w_gate.valid()) {
    float* up = a_.up(T, F);
    const kernels::MatMulOut outs[] = {{&L.w_gate, gate, F}, {&L.w_up, up, F}};
    kernels::MatMulMany(outs, xn, T, D, pool_);
    RowLora(l, kLoraGate, rows, xn, D, gate, F);
    RowLora(l, kLoraUp, rows, xn, D, up, F);
    Activate(gate, up, T * F);
  } else {  // fused [gate; up] rows: one row of output is [gate F | up F]
    MatMul(L.w_up, xn, T, D, gate, 2 * F, pool_);
    RowLora(l, kLoraGate, rows, xn, D, gate, 2 * F);
    RowLora(l, kLoraUp, rows, xn, D, gate + F, 2 * F);
    auto act = [&](int64_t b, int64_t e, int) {
      for (int64_t t = b; t < e; ++t) {
        float* g = gate + t * 2 * F;
        kernels::GatedActivation(c_.act, g, g + F, F);
      }
    };
    if (pool_ && T > 1) {
      pool_->ParallelFor(T, act);
    } else {
      act(0, T, 0);
    }
    for (int64_t t = 1; t < T; ++t)  // compact to [T, F], in order (rows overlap)
      std::memmove(gate + t * F, gate + t * 2 * F, F * sizeof(float));
  }
  MatMul(L.w_down, gate, T, F, xn, D, pool_);  // xn's rows are read by now
  RowLora(l, kLoraDown, rows, gate, F, xn, D);
}

// gate = act(gate) * up over n dense elements, split across threads.
void Forward::Activate(float* gate, const float* up, int64_t n) {
  auto act = [&](int64_t b, int64_t e, int) {
    kernels::GatedActivation(c_.act, gate + b, up + b, e - b);
  };
  if (pool_ && n >= kParallelActivation) {
    pool_->ParallelFor(n, act, 1024);
  } else {
    act(0, n, 0);
  }
}

void Forward::RowLora(int l, int target, std::span<const BatchRow> rows, const float* x,
                      int64_t ldx, float* y, int64_t ldy) {
  const int64_t T = static_cast<int64_t>(rows.size());
  ApplyLora(w_.layers[l].lora[target], x, T, ldx, y, ldy, pool_);
  for (size_t k = 0; k < lora_terms_; ++k) {
    lora_seen_.clear();
    for (int64_t t = 0; t < T; ++t) {
      const LoraSet* set = rows[t].lora;
      if (!set || set->terms.size() <= k) continue;
      const LoraWeights* w = set->terms[k].weights;
      if (std::find(lora_seen_.begin(), lora_seen_.end(), w) != lora_seen_.end()) continue;
      lora_seen_.push_back(w);
      lora_rows_.clear();
      lora_weights_.clear();
      for (int64_t u = t; u < T; ++u) {
        const LoraSet* su = rows[u].lora;
        if (su && su->terms.size() > k && su->terms[k].weights == w) {
          lora_rows_.push_back(u);
          lora_weights_.push_back(su->terms[k].weight);
        }
      }
      const LoraMatrix& m = w->layers[l][target];
      if (!m.valid()) continue;
      const size_t need = lora_rows_.size() * size_t(m.rank);
      if (lora_u_.size() < need) lora_u_.resize(need);
      ApplyLoraRows(m, lora_rows_, lora_weights_, x, ldx, y, ldy, lora_u_.data(), pool_);
    }
  }
}

Status Forward::Run(std::span<const int32_t> tokens, int64_t pos0, KvCache& cache, LogitsFor which,
                    float* logits, const LoraSet* lora) {
  const int64_t T = static_cast<int64_t>(tokens.size());
  if (T == 0) return Error("forward: no tokens");
  if (T > kMaxChunk) return Errorf("forward: chunk of {} tokens exceeds {}", T, kMaxChunk);
  if (pos0 < 0 || pos0 + T > cache.ctx())
    return Errorf("context full: positions {}..{} do not fit the context of {} tokens", pos0,
                  pos0 + T - 1, cache.ctx());
  BatchRow rows[kMaxChunk];
  for (int64_t t = 0; t < T; ++t) rows[t] = {&cache, tokens[t], pos0 + t, lora};
  return RunRows(std::span<const BatchRow>(rows, T), which == LogitsFor::kAll ? 0 : T - 1, logits);
}

Status Forward::RunBatch(std::span<const BatchRow> rows, float* logits) {
  const int64_t B = static_cast<int64_t>(rows.size());
  if (B == 0) return Error("forward: empty batch");
  if (B > kMaxChunk) return Errorf("forward: batch of {} rows exceeds {}", B, kMaxChunk);
  for (int64_t b = 0; b < B; ++b)
    if (rows[b].pos < 0 || rows[b].pos >= rows[b].cache->ctx())
      return Errorf("context full: position {} does not fit the context of {} tokens (row {})",
                    rows[b].pos, rows[b].cache->ctx(), b);
  return RunRows(rows, 0, logits);
}

Status Forward::RunLayers(std::span<const BatchRow> rows) {
  const int64_t T = static_cast<int64_t>(rows.size());
  for (int64_t t = 0; t < T; ++t)
    if (rows[t].token < 0 || rows[t].token >= c_.vocab_size)
      return Errorf("token id {} at index {} is outside the vocabulary (size {})", rows[t].token, t,
                    c_.vocab_size);
  int64_t max_ctx = 0;
  lora_terms_ = 0;
  for (const auto& r : rows) {
    max_ctx = std::max(max_ctx, r.cache->ctx());
    if (r.lora) {
      lora_terms_ = std::max(lora_terms_, r.lora->terms.size());
      for (const LoraTerm& term : r.lora->terms)
        if (!term.weights || term.weights->layers.size() != size_t(c_.n_layers))
          return Errorf("forward: an adapter set's term has {} layers; the model has {}",
                        term.weights ? term.weights->layers.size() : 0, c_.n_layers);
    }
  }
  const int64_t need = max_ctx * (c_.n_heads + 1) + 2 * c_.kv_dim();
  if (need > a_.attn_scratch_per_thread) {  // the first call, or a longer cache than before
    a_.attn_scratch_per_thread = need;
    a_.attn_scratch = AlignedBuffer(size_t(pool_ ? pool_->size() : 1) * need * sizeof(float));
  }
  float* x = a_.x.as<float>();
  Embed(rows, x);
  for (int l = 0; l < c_.n_layers; ++l) {
    AttentionBlock(l, rows);
    FfnBlock(l, rows);
  }
  return Status::Ok();
}

Status Forward::RunRows(std::span<const BatchRow> rows, int64_t first, float* logits) {
  LUMEN_RETURN_IF_ERROR(RunLayers(rows));
  const int64_t T = static_cast<int64_t>(rows.size());
  const int64_t D = c_.dim, V = c_.vocab_size;
  const int64_t nrows = T - first;
  const float* x = a_.x.as<float>();
  float* xn = a_.xn.as<float>();
  for (int64_t t = 0; t < nrows; ++t) {
    float* o = xn + t * D;
    kernels::RmsNormForward(x + (first + t) * D, w_.output_norm, c_.norm_offset, c_.norm_eps, D, o);
    if (c_.logit_scale != 1.0f)
      for (int64_t i = 0; i < D; ++i) o[i] *= c_.logit_scale;
  }
  MatMul(w_.output, xn, nrows, D, logits, V, pool_);
  if (c_.final_softcap > 0) kernels::SoftCap(logits, nrows * V, c_.final_softcap);
  return Status::Ok();
}

Status Forward::RunHidden(std::span<const BatchRow> rows, float* hidden) {
  const int64_t T = static_cast<int64_t>(rows.size());
  if (T == 0) return Error("forward: no rows");
  if (T > kMaxChunk) return Errorf("forward: chunk of {} rows exceeds {}", T, kMaxChunk);
  for (int64_t t = 0; t < T; ++t)
    if (rows[t].pos < 0 || rows[t].pos >= rows[t].cache->ctx())
      return Errorf("context full: position {} does not fit the context of {} tokens (row {})",
                    rows[t].pos, rows[t].cache->ctx(), t);
  // Every row's attention through AttendRuns, lone rows tiled too, so a
  // row's result does not depend on how many rows share its step or how its
  // input was cut into steps (the batched embedding route is L1 against one
  // input at a time).
  step_invariant_ = true;
  const Status st = RunLayers(rows);
  step_invariant_ = false;
  LUMEN_RETURN_IF_ERROR(st);
  const int64_t D = c_.dim;
  const float* x = a_.x.as<float>();
  for (int64_t t = 0; t < T; ++t)
    kernels::RmsNormForward(x + t * D, w_.output_norm, c_.norm_offset, c_.norm_eps, D,
                            hidden + t * D);
  return Status::Ok();
}

}  // namespace lumen::model
