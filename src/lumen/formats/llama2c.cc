#include "lumen/formats/llama2c.h"

#include <cstring>
#include <optional>

namespace lumen::formats {
namespace {

int32_t LoadI32(const uint8_t* p) {
  uint32_t v = uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
  int32_t s;
  std::memcpy(&s, &v, 4);
  return s;
}

uint32_t LoadU32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

float LoadF32(const uint8_t* p) {
  const uint32_t u = LoadU32(p);
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Checked product of non-negative factors; nullopt on 64-bit overflow.
std::optional<uint64_t> Mul(std::initializer_list<uint64_t> xs) {
  uint64_t r = 1;
  for (uint64_t x : xs)
    if (__builtin_mul_overflow(r, x, &r)) return std::nullopt;
  return r;
}

// The arrays of a checkpoint, in no particular file order.
enum Array {
  kEmb,
  kRmsAtt,
  kWq,
  kWk,
  kWv,
  kWo,
  kRmsFfn,
  kW1,
  kW2,
  kW3,
  kRmsFinal,
  kFreqReal,
  kFreqImag,
  kWcls,
  kNumArrays
};

constexpr Array kOrderV0[] = {kEmb, kRmsAtt, kWq, kWk,       kWv,       kWo,       kRmsFfn,
                              kW1,  kW2,     kW3, kRmsFinal, kFreqReal, kFreqImag, kWcls};
constexpr Array kOrderV1[] = {kRmsAtt, kRmsFfn, kRmsFinal, kEmb, kWq, kWk,
                              kWv,     kWo,     kW1,       kW2,  kW3, kWcls};

constexpr int64_t kMaxParam = int64_t(1) << 24;

std::string Describe(const Llama2cConfig& c) {
  return fmt::format(
      "version {} header (dim={}, hidden_dim={}, n_layers={}, n_heads={}, n_kv_heads={}, "
      "vocab_size={}, seq_len={}, {} classifier)",
      c.version, c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size, c.seq_len,
      c.shared_classifier ? "shared" : "unshared");
}

Status CheckConfig(const Llama2cConfig& c) {
  const std::pair<const char*, int64_t> params[] = {
      {"dim", c.dim},         {"hidden_dim", c.hidden_dim}, {"n_layers", c.n_layers},
      {"n_heads", c.n_heads}, {"n_kv_heads", c.n_kv_heads}, {"vocab_size", c.vocab_size},
      {"seq_len", c.seq_len}};
  for (const auto& [name, v] : params) {
    if (v <= 0) return Errorf("{} = {} must be positive", name, v);
    if (v > kMaxParam) return Errorf("{} = {} is implausibly large (limit {})", name, v, kMaxParam);
  }
  if (c.dim % c.n_heads != 0)
    return Errorf("dim {} is not a multiple of n_heads {}", c.dim, c.n_heads);
  if (c.n_kv_heads > c.n_heads || c.n_heads % c.n_kv_heads != 0)
    return Errorf("n_heads {} is not a multiple of n_kv_heads {}", c.n_heads, c.n_kv_heads);
  return Status::Ok();
}

}  // namespace

Result<Llama2cModel> Llama2cModel::Open(const std::string& path) {
  LUMEN_ASSIGN_OR_RETURN(MappedFile m, MappedFile::Open(path));
  LUMEN_ASSIGN_OR_RETURN(Llama2cModel model, Parse(m.data(), m.size(), path));
  model.file_ = std::move(m);  // the mapping's address is unchanged by the move
  return model;
}

Result<Llama2cModel> Llama2cModel::FromBytes(const uint8_t* bytes, size_t size, std::string name) {
  return Parse(bytes, size, std::move(name));
}

Result<Llama2cModel> Llama2cModel::Parse(const uint8_t* bytes, size_t size, std::string name) {
  Llama2cModel m;
  m.path_ = name;
  Llama2cConfig& c = m.config_;
  size_t header = 0;
  const uint8_t* params = nullptr;
  if (size >= 4 && LoadU32(bytes) == kLlama2cMagic) {
    if (size < 256)
      return Errorf("{}: file is {} bytes, too short for the 256-byte \"ak42\" header", name, size);
    const int32_t version = LoadI32(bytes + 4);
    if (version != 1) {
      return Errorf("{}: llama2.c export version {} is not supported (only 0 and 1{})", name,
                    version, version == 2 ? "; version 2 is int8-quantized" : "");
    }
    c.version = 1;
    header = 256;
    params = bytes + 8;
    const uint8_t shared = bytes[36];
    if (shared > 1) return Errorf("{}: shared_classifier byte is {}, not 0 or 1", name, shared);
    c.shared_classifier = shared == 1;
  } else {
    if (size < 28)
      return Errorf("{}: file is {} bytes, too short for the 28-byte llama2.c header", name, size);
    c.version = 0;
    header = 28;
    params = bytes;
  }
  c.dim = LoadI32(params);
  c.hidden_dim = LoadI32(params + 4);
  c.n_layers = LoadI32(params + 8);
  c.n_heads = LoadI32(params + 12);
  c.n_kv_heads = LoadI32(params + 16);
  c.vocab_size = LoadI32(params + 20);
  c.seq_len = LoadI32(params + 24);
  if (c.version == 0) {
    // A negative vocab size is how the legacy format says wcls follows.
    c.shared_classifier = c.vocab_size > 0;
    if (c.vocab_size < 0) c.vocab_size = -c.vocab_size;
  }
  if (Status s = CheckConfig(c); !s.ok())
    return s.WithContext(fmt::format("{}: version {} header", name, c.version));

  const uint64_t D = c.dim, F = c.hidden_dim, L = c.n_layers, V = c.vocab_size;
  const uint64_t kv = c.kv_dim();
  std::optional<uint64_t> floats[kNumArrays];
  floats[kEmb] = Mul({V, D});
  floats[kRmsAtt] = Mul({L, D});
  floats[kWq] = Mul({L, D, D});
  floats[kWk] = Mul({L, kv, D});
  floats[kWv] = floats[kWk];
  floats[kWo] = Mul({L, D, D});
  floats[kRmsFfn] = Mul({L, D});
  floats[kW1] = Mul({L, F, D});
  floats[kW2] = floats[kW1];
  floats[kW3] = floats[kW1];
  floats[kRmsFinal] = D;
  // As run.c: seq_len * head_size / 2 floats each (v0 only).
  const uint64_t freq = c.version == 0 ? uint64_t(c.seq_len) * uint64_t(c.head_size()) / 2 : 0;
  floats[kFreqReal] = freq;
  floats[kFreqImag] = freq;
  floats[kWcls] = c.shared_classifier ? std::optional<uint64_t>(0) : floats[kEmb];

  uint64_t offset[kNumArrays] = {};
  uint64_t total = header;
  bool overflow = false;
  auto place = [&](Array a) {
    const auto bytes_needed = floats[a] ? Mul({*floats[a], 4}) : std::nullopt;
    if (!bytes_needed || __builtin_add_overflow(total, *bytes_needed, &total)) overflow = true;
    offset[a] = total - (bytes_needed ? *bytes_needed : 0);
  };
  if (c.version == 0) {
    for (Array a : kOrderV0) place(a);
  } else {
    for (Array a : kOrderV1) place(a);
  }
  if (overflow) return Errorf("{}: the {} implies more than 2^64 bytes", name, Describe(c));
  if (total != size)
    return Errorf("{}: file is {} bytes but the {} implies {} bytes", name, size, Describe(c),
                  total);

  auto ptr = [&](Array a, uint64_t floats_in) {
    return const_cast<uint8_t*>(bytes + offset[a] + 4 * floats_in);  // views are read-only
  };
  auto add = [&](std::string tname, void* p, std::initializer_list<int64_t> shape) {
    m.index_.emplace(tname, m.tensors_.size());
    m.tensors_.push_back({std::move(tname), TensorView::Contiguous(p, DType::kF32, shape)});
  };
  const int64_t Di = c.dim, Fi = c.hidden_dim, KVi = c.kv_dim(), Vi = c.vocab_size;
  add("token_embd.weight", ptr(kEmb, 0), {Vi, Di});
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const uint64_t ul = uint64_t(l);
    const std::string b = fmt::format("blk.{}.", l);
    add(b + "attn_norm.weight", ptr(kRmsAtt, ul * D), {Di});
    add(b + "attn_q.weight", ptr(kWq, ul * D * D), {Di, Di});
    add(b + "attn_k.weight", ptr(kWk, ul * kv * D), {KVi, Di});
    add(b + "attn_v.weight", ptr(kWv, ul * kv * D), {KVi, Di});
    add(b + "attn_output.weight", ptr(kWo, ul * D * D), {Di, Di});
    add(b + "ffn_norm.weight", ptr(kRmsFfn, ul * D), {Di});
    add(b + "ffn_gate.weight", ptr(kW1, ul * F * D), {Fi, Di});
    add(b + "ffn_down.weight", ptr(kW2, ul * D * F), {Di, Fi});
    add(b + "ffn_up.weight", ptr(kW3, ul * F * D), {Fi, Di});
  }
  add("output_norm.weight", ptr(kRmsFinal, 0), {Di});
  if (!c.shared_classifier) add("output.weight", ptr(kWcls, 0), {Vi, Di});
  return m;
}

const Llama2cTensor* Llama2cModel::Find(std::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

int64_t Llama2cModel::parameter_count() const {
  int64_t n = 0;
  for (const auto& t : tensors_) n += t.view.numel();
  return n;
}

Result<Llama2cVocab> ReadLlama2cTokenizer(const std::string& path, int64_t vocab_size) {
  LUMEN_ASSIGN_OR_RETURN(MappedFile m, MappedFile::Open(path));
  return ParseLlama2cTokenizer(m.data(), m.size(), path, vocab_size);
}

Result<Llama2cVocab> ParseLlama2cTokenizer(const uint8_t* bytes, size_t size, std::string_view name,
                                           int64_t vocab_size) {
  if (vocab_size <= 0 || vocab_size > kMaxParam)
    return Errorf("{}: vocab size {} is out of range", name, vocab_size);
  if (size < 4)
    return Errorf("{}: file is {} bytes, too short for the max_token_length field", name, size);
  Llama2cVocab v;
  v.max_token_length = LoadI32(bytes);
  if (v.max_token_length <= 0)
    return Errorf("{}: max_token_length {} must be positive", name, v.max_token_length);
  // Each token takes at least 8 bytes, so a count the file cannot hold is
  // refused before anything is allocated for it.
  if (uint64_t(vocab_size) > (size - 4) / 8)
    return Errorf("{}: file is {} bytes, too short for {} tokens (8 bytes each at least)", name,
                  size, vocab_size);
  v.scores.reserve(size_t(vocab_size));
  v.pieces.reserve(size_t(vocab_size));
  size_t pos = 4;
  for (int64_t i = 0; i < vocab_size; ++i) {
    if (size - pos < 8)
      return Errorf("{}: token {} at offset {}: the file ends inside its score and length", name, i,
                    pos);
    const float score = LoadF32(bytes + pos);
    const int32_t len = LoadI32(bytes + pos + 4);
    if (len < 0)
      return Errorf("{}: token {} at offset {}: length {} is negative", name, i, pos, len);
    if (len > v.max_token_length)
      return Errorf("{}: token {} at offset {}: length {} exceeds max_token_length {}", name, i,
                    pos, len, v.max_token_length);
    pos += 8;
    if (size_t(len) > size - pos)
      return Errorf(
          "{}: token {} at offset {}: its {} bytes run past the end of the file ({} "
          "bytes)",
          name, i, pos - 8, len, size);
    v.scores.push_back(score);
    v.pieces.emplace_back(reinterpret_cast<const char*>(bytes + pos), size_t(len));
    pos += size_t(len);
  }
  if (pos != size)
    return Errorf("{}: {} bytes follow the {} tokens the model's vocab size calls for", name,
                  size - pos, vocab_size);
  return v;
}

}  // namespace lumen::formats
