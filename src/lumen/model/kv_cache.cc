#include "lumen/model/kv_cache.h"
#include "lumen/core/route.h"

#include <algorithm>
#include <cstring>

namespace lumen::model {

LUMEN_ROUTE(kv_f32, {.node = "kv.store",
                     .name = "f32",
                     .tier = Tier::kL1,
                     .oracle = "the keys and values as computed",
                     .bound = "bit-identical",
                     .tests = "Stories260K.LogitsMatchRunC",
                     .when = "kv=f32",
                     .priority = 10});
LUMEN_ROUTE(
    kv_half,
    {.node = "kv.store",
     .name = "f16/bf16",
     .tier = Tier::kL2,
     .oracle = "the f32 cache",
     .bound = "each value rounded once (2^-11 / 2^-8 relative); logits within 10% of max|logit|",
     .tests = "QuantTypes.Q8KvCacheTracksF16;Families/FamilyGolden.*",
     .when = "kv=f16|bf16",
     .priority = 10});
LUMEN_ROUTE(
    kv_q8,
    {.node = "kv.store",
     .name = "q8_0",
     .tier = Tier::kL2,
     .oracle = "the f16 cache",
     .bound =
         "each value within half a step of its 32-block's scale; logits within 10% of max|logit|",
     .tests = "QuantTypes.Q8KvCacheTracksF16",
     .when = "kv=q8_0",
     .priority = 10});

size_t KvCache::BytesFor(int64_t positions) const {
  const size_t row_bytes = *RowBytes(dtype_, row_elems_);
  size_t n = 0;
  for (const kernels::KvRing& r : rings_)
    n += 2 * size_t(std::clamp<int64_t>(positions, 0, r.capacity)) * row_bytes;
  return n;
}

Result<KvCache> KvCache::Create(const ModelConfig& c, int64_t ctx, DType dtype) {
  if (dtype != DType::kF16 && dtype != DType::kBF16 && dtype != DType::kF32 &&
      dtype != DType::kQ8_0)
    return Errorf("KV cache type must be f16, bf16, f32 or q8_0, got {}", Name(dtype));
  // Q8_0 blocks run along the row; each head's slice must be whole blocks.
  if (dtype == DType::kQ8_0 && c.head_dim % 32 != 0)
    return Errorf("KV cache type q8_0 needs a head dimension that is a multiple of 32, got {}",
                  c.head_dim);
  if (ctx <= 0) return Errorf("context size must be positive, got {}", ctx);
  KvCache kv;
  kv.ctx_ = ctx;
  kv.dtype_ = dtype;
  kv.row_elems_ = c.kv_dim();
  const size_t row_bytes = *RowBytes(dtype, kv.row_elems_);
  std::vector<int64_t> caps(c.n_layers);
  size_t total = 0;
  for (int l = 0; l < c.n_layers; ++l) {
    caps[l] = c.layer_sliding[l] ? std::min(ctx, c.sliding_window + kMaxChunk) : ctx;
    total += 2 * size_t(caps[l]) * row_bytes;
  }
  // Allocated for the whole context, touched only as far as the sequence goes.
  kv.buf_ = AlignedBuffer::ZeroedOnTouch(total);
  char* p = kv.buf_.as<char>();
  for (int l = 0; l < c.n_layers; ++l) {
    kernels::KvRing r;
    r.dtype = dtype;
    r.capacity = caps[l];
    const size_t bytes = size_t(caps[l]) * row_bytes;
    r.k = p;
    r.v = p + bytes;
    p += 2 * bytes;
    kv.rings_.push_back(r);
  }
  return kv;
}

void KvCache::CopyPrefix(const KvCache& other, int64_t n) {
  LUMEN_CHECK(other.rings_.size() == rings_.size() && other.row_elems_ == row_elems_ &&
              other.dtype_ == dtype_);
  const size_t row_bytes = *RowBytes(dtype_, row_elems_);
  for (size_t l = 0; l < rings_.size(); ++l) {
    const auto& src = other.rings_[l];
    const auto& dst = rings_[l];
    LUMEN_CHECK(src.capacity == dst.capacity);
    const int64_t rows = std::min(n, dst.capacity);
    for (int64_t pos = n - rows; pos < n; ++pos) {
      const int64_t slot = pos % dst.capacity;
      std::memcpy(static_cast<char*>(const_cast<void*>(dst.k)) + slot * row_bytes,
                  static_cast<const char*>(src.k) + slot * row_bytes, row_bytes);
      std::memcpy(static_cast<char*>(const_cast<void*>(dst.v)) + slot * row_bytes,
                  static_cast<const char*>(src.v) + slot * row_bytes, row_bytes);
    }
  }
}

}  // namespace lumen::model
