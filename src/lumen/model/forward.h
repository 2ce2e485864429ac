// The transformer forward for every dense family (config-driven, one code path).
//
// Forward::Run takes a chunk of T <= kMaxChunk tokens of one sequence at
// positions pos0..pos0+T-1, writes their keys/values into the KvCache and
// returns logits for the last token or for every token. Each token attends to
// [max(0, p - window + 1), p] of its layer, given to the attention kernel as an
// explicit range (kernels/attention.h), so other masks need no new kernel.
// Layers are free functions over the weights and preallocated Activations.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "lumen/core/buffer.h"
#include "lumen/core/thread_pool.h"
#include "lumen/kernels/attention.h"
#include "lumen/kernels/rope.h"
#include "lumen/model/config.h"
#include "lumen/model/kv_cache.h"
#include "lumen/model/lora.h"
#include "lumen/model/weights.h"

namespace lumen::model {

// Columns of the FFN's hidden width per piece where a chunk takes it in
// pieces: the bf16 route's K block (kernels/matmul_bf16.cc), so every piece's
// down product continues the whole product's bits (kernels::MatMulAccumulate).
inline constexpr int64_t kFfnPiece = 2048;

// Scratch for one chunk; sized once for kMaxChunk tokens. The attention block
// (qkv, att) and the FFN block never live at once, so they share one work
// buffer. The FFN of a prefill chunk takes its hidden width in pieces of
// kFfnPiece columns (gate, up and the down product's slice per piece; the
// output summed in ffn_out), so the buffer holds kMaxChunk rows of one piece
// rather than of the whole width (Forward::FfnBlock). The attention block, and
// the FFN of a decode step or with adapters, write their output over xn once
// the products that read xn are done.
struct Activations {
  Activations(const ModelConfig& c, int threads);
  // Floats of x, xn and the work buffer together (what fit.cc counts).
  static int64_t Floats(const ModelConfig& c);
  // Rows whose gate and up over the FFN's whole width fit the work buffer.
  int64_t WholeFfnRows() const { return int64_t(work.size() / sizeof(float)) / (2 * ffn_dim); }

  float* qkv() { return work.as<float>(); }                          // [T, H*Dh + 2*Hkv*Dh]
  float* att() { return work.as<float>() + kMaxChunk * qkv_width; }  // [T, H*Dh] pre o_proj
  // The FFN's gate then act(gate) * up [T, w] and up [T, w] for a hidden
  // width w (a piece, or the whole width for at most WholeFfnRows rows).
  float* gate() { return work.as<float>(); }
  float* up(int64_t T, int64_t w) { return work.as<float>() + T * w; }
  // [T, D], after one piece's gate and up for kMaxChunk rows.
  float* ffn_out() { return work.as<float>() + kMaxChunk * 2 * std::min(ffn_dim, kFfnPiece); }

  AlignedBuffer x;     // [T, D] residual stream
  AlignedBuffer xn;    // [T, D] normed input of the current block, then its output
  AlignedBuffer work;  // qkv and att, then gate, up and (in pieces) the FFN's output
  int64_t qkv_width = 0, ffn_dim = 0;
  AlignedBuffer attn_scratch;  // per thread: see kernels::AttendOne (grown by RunRows)
  int64_t attn_scratch_per_thread = 0;
  AlignedBuffer attn_parts;  // [threads, H*Dh]: position-split attention's partial outputs
  AlignedBuffer attn_rows;   // per thread: kernels::AttendRows's scratch
  int64_t attn_rows_per_thread = 0;
};

enum class LogitsFor { kLast, kAll };

// One row of a batched decode step: a token of some sequence at its position,
// with that sequence's own adapters (null: none beyond the model-wide one).
struct BatchRow {
  KvCache* cache;
  int32_t token;
  int64_t pos;
  const LoraSet* lora = nullptr;
};

// The embedding multiplier the forward uses: c.embed_scale, rounded to the
// embedding's storage dtype (bf16/f16; MLX: its scales' dtype) when
// c.embed_scale_in_weight_dtype, as HF Gemma does (families.md section 6).
float EmbedScale(const ModelConfig& c, const Weights& w);

class Forward {
 public:
  Forward(const ModelConfig& c, const Weights& w, ThreadPool* pool);

  // logits: [1, V] (kLast) or [T, V] (kAll). Errors when pos0 + T > cache ctx.
  // lora: the sequence's adapter set (null: none), which must outlive the call.
  Status Run(std::span<const int32_t> tokens, int64_t pos0, KvCache& cache, LogitsFor which,
             float* logits, const LoraSet* lora = nullptr);

  // Continuous batching: B <= kMaxChunk rows, each from its own sequence (or
  // consecutive positions of one), in one pass, so every weight is read once
  // for all rows. logits: [B, V]. Row r gives the same logits as running it
  // alone (L1: the per-row arithmetic is identical), with or without its
  // own adapter set: every base product runs once for all rows, then each
  // set's low-rank updates on the rows that carry it (RowLora).
  Status RunBatch(std::span<const BatchRow> rows, float* logits);

  // Embeddings: the final norm's output for every row, no LM head (no
  // logit_scale, no softcap). hidden: [B, D]. Rows as RunBatch takes them,
  // plus runs of consecutive positions of one sequence (a prefill chunk of
  // each of several sequences); each row's hidden state is computed with the
  // same per-row arithmetic as in Run.
  Status RunHidden(std::span<const BatchRow> rows, float* hidden);

  const ModelConfig& config() const { return c_; }

 private:
  // Everything before the head: embedding and every layer, into a_.x.
  Status RunLayers(std::span<const BatchRow> rows);
  Status RunRows(std::span<const BatchRow> rows, int64_t first_logit_row, float* logits);
  void Embed(std::span<const BatchRow> rows, float* x) const;
  void AttentionBlock(int l, std::span<const BatchRow> rows);
  void AttendByPosition(int l, const BatchRow& row, int64_t t, const kernels::AttentionShape& shape,
                        int64_t window);
  bool HasRun(std::span<const BatchRow> rows) const;
  void AttendRuns(int l, std::span<const BatchRow> rows, const kernels::AttentionShape& shape,
                  int64_t window);
  void FfnBlock(int l, std::span<const BatchRow> rows);
  void FfnPiece(int l, int64_t T, int64_t f0, int64_t f1);
  void FfnWhole(int l, std::span<const BatchRow> rows, float* xn);
  void Activate(float* gate, const float* up, int64_t n);
  // y += the LoRA updates of product `target` of layer l: the model-wide
  // adapter on every row, then each row's set. Pass k applies every row's
  // k-th term, rows sharing that adapter together (ApplyLoraRows), so a
  // row's updates are added in its set's order whatever the batch holds.
  void RowLora(int l, int target, std::span<const BatchRow> rows, const float* x, int64_t ldx,
               float* y, int64_t ldy);
  const kernels::RopeTable& Rope(bool sliding, int64_t seq_len);
  // fn(t) for every row t in [0, T): split across the pool for a prefill
  // chunk's rows, inline for a decode step's few (a hand-off costs more).
  template <class Fn>
  void ForRows(int64_t T, const Fn& fn);

  const ModelConfig& c_;
  const Weights& w_;
  ThreadPool* pool_;
  Activations a_;
  float embed_scale_;  // c_.embed_scale, rounded to the embedding dtype when HF does
  kernels::RopeTable rope_global_, rope_local_;
  int64_t rope_seq_len_ = -1;
  // RunHidden: a row's result must not depend on the step's other rows (no
  // position split; lone rows through AttendRows too).
  bool step_invariant_ = false;
  size_t lora_terms_ = 0;  // the most terms of any row's set in this call (0: no row has one)
  std::vector<const LoraWeights*> lora_seen_;
  std::vector<int64_t> lora_rows_;
  std::vector<float> lora_weights_, lora_u_;
  // AttendRuns's work: rows [t0, t1) of the run starting at row `run`, kv
  // head kv_head (-1: row t0 alone, every head).
  struct AttentionUnit {
    int64_t run, t0, t1;
    int kv_head;
  };
  std::vector<AttentionUnit> attn_units_;
};

}  // namespace lumen::model
