// llama2.c checkpoints (import only) and the llama2.c tokenizer file.
//
// Two checkpoint layouts, both little-endian fp32:
//   version 0 (legacy run.c .bin): 7 int32 (dim, hidden_dim, n_layers,
//     n_heads, n_kv_heads, vocab_size, seq_len), then token_embedding,
//     rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, freq_cis_real,
//     freq_cis_imag (skipped: RoPE is computed on the fly), and wcls only when
//     vocab_size is negative (= unshared classifier).
//   version 1 (export.py "ak42"): u32 magic 0x616b3432, int32 version 1, the 7
//     params, u8 shared_classifier, zero padding to 256 bytes; then rms_att,
//     rms_ffn, rms_final, token_embedding, wq, wk, wv, wo, w1, w2, w3, [wcls].
// Per-layer arrays are stacked layer-major; matrices are [out][in].
// The file size must equal exactly what the header implies (errors name both).
//
// Tensors are zero-copy f32 views named as in GGUF llama files, in GGUF order:
// token_embd.weight [V, D]; per layer N: blk.N.attn_norm.weight [D],
// attn_q [D, D], attn_k / attn_v [Hkv*Dh, D], attn_output [D, D],
// ffn_norm [D], ffn_gate (w1) [F, D], ffn_down (w2) [D, F], ffn_up (w3) [F, D];
// output_norm.weight [D]; output.weight [V, D] only when unshared.
// llama2.c's q/k rows are already in the interleaved-pair RoPE order GGUF's
// llama architecture uses, so no permutation is needed on the way to GGUF.
//
// The tokenizer file (tok512.bin, tokenizer.bin): int32 max_token_length,
// then per token: f32 score, int32 byte length, the bytes. The count is not
// stored; the caller passes the model's vocab size and the file must end
// exactly after that many tokens.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "lumen/core/buffer.h"
#include "lumen/core/status.h"
#include "lumen/core/tensor.h"

namespace lumen::formats {

inline constexpr uint32_t kLlama2cMagic = 0x616b3432;  // "ak42"

struct Llama2cConfig {
  int version = 0;         // 0 legacy, 1 "ak42"
  int64_t dim = 0;         // D
  int64_t hidden_dim = 0;  // F
  int64_t n_layers = 0;
  int64_t n_heads = 0;     // H
  int64_t n_kv_heads = 0;  // Hkv
  int64_t vocab_size = 0;  // V, always positive here
  int64_t seq_len = 0;     // trained context length
  bool shared_classifier = true;

  int64_t head_size() const { return dim / n_heads; }              // Dh
  int64_t kv_dim() const { return n_kv_heads * (dim / n_heads); }  // Hkv * Dh
};

struct Llama2cTensor {
  std::string name;  // GGUF-style name
  TensorView view;   // f32, zero-copy
};

class Llama2cModel {
 public:
  static Result<Llama2cModel> Open(const std::string& path);
  // Parses from memory; `bytes` must outlive the object.
  static Result<Llama2cModel> FromBytes(const uint8_t* bytes, size_t size, std::string name);

  const std::string& path() const { return path_; }
  // Bytes of the file copied into anonymous memory (Residency::kCopy), else 0.
  size_t copied_bytes() const { return file_.copied_bytes(); }
  const Llama2cConfig& config() const { return config_; }
  const std::vector<Llama2cTensor>& tensors() const { return tensors_; }
  const Llama2cTensor* Find(std::string_view name) const;
  // Parameters stored as weights (freq_cis excluded).
  int64_t parameter_count() const;

 private:
  static Result<Llama2cModel> Parse(const uint8_t* bytes, size_t size, std::string name);

  MappedFile file_;  // empty for FromBytes
  std::string path_;
  Llama2cConfig config_;
  std::vector<Llama2cTensor> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
};

struct Llama2cVocab {
  int32_t max_token_length = 0;
  std::vector<float> scores;        // [V]
  std::vector<std::string> pieces;  // [V] raw bytes (a space stands for SentencePiece's U+2581)
};

Result<Llama2cVocab> ReadLlama2cTokenizer(const std::string& path, int64_t vocab_size);
Result<Llama2cVocab> ParseLlama2cTokenizer(const uint8_t* bytes, size_t size, std::string_view name,
                                           int64_t vocab_size);

}  // namespace lumen::formats
