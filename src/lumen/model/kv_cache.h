// KvCache: preallocated keys and values of one sequence, per layer.
//
// Each layer is a ring of `capacity` rows [capacity, Hkv * Dh] (kernels::KvRing):
// full-attention layers hold the whole context, sliding-window layers only
// window + kMaxChunk rows, so a chunk of up to kMaxChunk new tokens can be
// written before any of them attends without evicting a key still in view.
// Element type f16 (default), bf16 or f32.
#pragma once

#include <vector>

#include "lumen/core/buffer.h"
#include "lumen/core/status.h"
#include "lumen/kernels/attention.h"
#include "lumen/model/config.h"

namespace lumen::model {

// Tokens per forward call. 256 rather than 128: a prefill product decodes each
// weight panel once per chunk, so twice the rows halve that work (+5-8%
// prefill, performance.md session 28); the FFN's pieces keep the activations
// within those of a 128-token chunk.
inline constexpr int64_t kMaxChunk = 256;

class KvCache {
 public:
  static Result<KvCache> Create(const ModelConfig& c, int64_t ctx, DType dtype);

  const kernels::KvRing& layer(int l) const { return rings_[l]; }
  int64_t ctx() const { return ctx_; }
  DType dtype() const { return dtype_; }
  size_t bytes() const { return buf_.size(); }
  // Bytes that rows [0, positions) of every layer take (ring layers at most
  // their capacity): what a sequence that reached `positions` has touched of
  // the buffer, whose pages are zeroed on first touch (AlignedBuffer::ZeroedOnTouch).
  size_t BytesFor(int64_t positions) const;

  // Copies positions [0, n) of every layer from `other` (same shape): prompt
  // cache restore. Ring layers copy the rows still held.
  void CopyPrefix(const KvCache& other, int64_t n);

 private:
  AlignedBuffer buf_;
  std::vector<kernels::KvRing> rings_;
  int64_t ctx_ = 0;
  int64_t row_elems_ = 0;
  DType dtype_ = DType::kF16;
};

}  // namespace lumen::model
