#include "lumen/engine/writer.h"

#include <unistd.h>

#include <filesystem>

#include "lumen/core/buffer.h"
#include "lumen/core/progress.h"
#include "lumen/core/quant.h"
#include "lumen/core/thread_pool.h"
#include "lumen/engine/embed.h"
#include "lumen/formats/gguf.h"
#include "lumen/formats/safetensors.h"
#include "lumen/kernels/rope.h"
#include "lumen/model/weights.h"

namespace lumen::engine {
namespace {

int EncodeThreads(const WriteOptions& opts) {
  return opts.threads > 0 ? opts.threads : ThreadPool::DefaultThreads();
}

// Encodes every row of `p` as `dtype` into one contiguous byte string, the
// rows split over `pool` (each row's bytes depend on that row alone, so the
// result is the same for any thread count; the K-quant fits search a grid of
// scales per sub-block and take minutes for a 1B model on one thread).
Result<std::string> Encode(const TensorPlan& p, DType dtype, ThreadPool& pool) {
  const int64_t cols = p.shape.back();
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < p.shape.size(); ++i) rows *= p.shape[i];
  const auto rb = RowBytes(dtype, cols);
  if (!rb)
    return Errorf("tensor '{}': {} columns is not a whole number of {} blocks", p.name, cols,
                  Name(dtype));
  std::string out(*rb * rows, '\0');
  pool.ParallelFor(rows, [&](int64_t b, int64_t e, int) {
    std::vector<float> buf(cols);
    for (int64_t r = b; r < e; ++r) {
      p.row(r, buf.data());
      QuantizeRow(dtype, buf.data(), out.data() + r * *rb, cols);
    }
  });
  return out;
}

// llama.cpp has no rope.scaling.type for Llama 3's scaling (it aborts on
// "llama3"): its converter writes the per-pair frequency divisors as the tensor
// rope_freqs.weight [rope_dim / 2] and no scaling keys. For an arch "llama"
// model with llama3 scaling this returns the config without the scaling and
// puts that tensor in `freqs` (unless the plans already carry one).
model::ModelConfig LlamaCppRope(const model::ModelConfig& config,
                                const std::vector<TensorPlan>& plans,
                                std::vector<TensorPlan>& freqs) {
  using model::Family;
  model::ModelConfig c = config;
  if (c.rope_scaling.type != kernels::RopeScaling::Type::kLlama3 ||
      (c.family != Family::kLlama && c.family != Family::kMistral))
    return c;
  c.rope_scaling = {};
  for (const auto& p : plans)
    if (p.name == "rope_freqs.weight") return c;
  const auto scaled = kernels::MakeRopeTable(config.rope_dim, config.rope_theta,
                                             config.rope_scaling, config.max_ctx, 1);
  const auto plain =
      kernels::MakeRopeTable(config.rope_dim, config.rope_theta, {}, config.max_ctx, 1);
  TensorPlan t;
  t.name = "rope_freqs.weight";
  t.shape = {config.rope_dim / 2};
  t.row = [scaled, plain](int64_t, float* out) {
    for (size_t i = 0; i < plain.inv_freq.size(); ++i)
      out[i] = float(plain.inv_freq[i] / scaled.inv_freq[i]);
  };
  freqs.push_back(std::move(t));
  return c;
}

}  // namespace

Status WriteGgufModel(const model::ModelConfig& config, const tokenize::Tokenizer& tok,
                      const std::vector<TensorPlan>& plans, const WriteOptions& opts,
                      const std::string& path) {
  // A type asked for must be one a GGUF file holds and the quantizer writes:
  // the load-time layouts (q4_0_cols, ...) and the integer types are neither,
  // and falling back to f16 below would write another model than asked.
  if (opts.dtype && (!CanQuantize(*opts.dtype) || !formats::GgmlFromDType(*opts.dtype)))
    return Errorf(
        "{}: cannot write {} tensors to GGUF: not a file type (f32, f16, bf16, q4_0, "
        "q4_1, q5_0, q5_1, q8_0, q2_k .. q6_k are)",
        path, Name(*opts.dtype));
  formats::GgufWriter w;
  std::vector<TensorPlan> freqs;
  const model::ModelConfig c = LlamaCppRope(config, plans, freqs);
  model::ConfigToGguf(c, w);
  // lumen-only record of the scaling behind rope_freqs.weight (llama.cpp ignores it).
  const kernels::RopeScaling& src = freqs.empty() ? config.rope_freqs_source : config.rope_scaling;
  if (src.type == kernels::RopeScaling::Type::kLlama3 && c.rope_scaling.type != src.type) {
    const std::string k = "llama.rope_freqs.lumen_llama3.";
    w.SetF32(k + "factor", float(src.factor));
    w.SetF32(k + "low_freq_factor", float(src.low_freq_factor));
    w.SetF32(k + "high_freq_factor", float(src.high_freq_factor));
    w.SetU32(k + "original_context_length", uint32_t(src.original_max_pos));
  }
  w.SetString("general.name",
              opts.name.empty() ? std::filesystem::path(path).stem().string() : opts.name);
  LUMEN_RETURN_IF_ERROR(tok.ExportGguf(w));
  if (!opts.chat_template.empty()) w.SetString("tokenizer.chat_template", opts.chat_template);
  Progress progress("writing " + path, static_cast<int64_t>(plans.size() + freqs.size()));
  ThreadPool pool(EncodeThreads(opts));
  std::vector<const TensorPlan*> all;
  all.reserve(freqs.size() + plans.size());
  for (const auto& p : freqs) all.push_back(&p);  // llama.cpp's converter writes it first
  for (const auto& p : plans) all.push_back(&p);
  for (const TensorPlan* pp : all) {
    const TensorPlan& p = *pp;
    DType dt = p.dtype ? *p.dtype : opts.dtype.value_or(p.source_dtype);
    if (p.shape.size() == 1) dt = DType::kF32;
    if (!formats::GgmlFromDType(dt)) dt = DType::kF16;
    // K-quants need 256-wide rows; fall back like llama.cpp does for odd shapes.
    if (!RowBytes(dt, p.shape.back()))
      dt = RowBytes(DType::kQ8_0, p.shape.back()) ? DType::kQ8_0 : DType::kF16;
    LUMEN_ASSIGN_OR_RETURN(std::string bytes, Encode(p, dt, pool));
    LUMEN_RETURN_IF_ERROR(w.AddTensor(p.name, dt, p.shape, std::move(bytes)));
    progress.Advance();
  }
  return w.Write(path);
}

namespace {

// One MLX-quantized module: packed U32 weight, f16 scales and biases.
Status AddMlx(formats::SafetensorsWriter& w, const std::string& hf_weight, const TensorPlan& p,
              int bits, int group) {
  const int64_t rows = p.shape[0], cols = p.shape[1];
  const int64_t words = cols * bits / 32, groups = cols / group;
  std::string packed(size_t(rows * words) * 4, '\0');
  std::string scales(size_t(rows * groups) * 2, '\0'), biases(scales.size(), '\0');
  std::vector<float> buf(cols), sc(groups), bi(groups);
  for (int64_t r = 0; r < rows; ++r) {
    p.row(r, buf.data());
    QuantizeMlxRow(buf.data(), bits, group, reinterpret_cast<uint32_t*>(packed.data()) + r * words,
                   sc.data(), bi.data(), cols);
    QuantizeRow(DType::kF16, sc.data(), scales.data() + r * groups * 2, groups);
    QuantizeRow(DType::kF16, bi.data(), biases.data() + r * groups * 2, groups);
  }
  const std::string module = hf_weight.substr(0, hf_weight.rfind('.'));
  LUMEN_RETURN_IF_ERROR(w.Add(hf_weight, DType::kU32, {rows, words}, std::move(packed)));
  LUMEN_RETURN_IF_ERROR(w.Add(module + ".scales", DType::kF16, {rows, groups}, std::move(scales)));
  return w.Add(module + ".biases", DType::kF16, {rows, groups}, std::move(biases));
}

// Moves the files of a finished staging directory into dir, replacing
// same-named ones. A previous model's files that would load beside the new
// ones and that this write did not make (weight shards and their index, a
// sentence-transformers pooling, another tokenizer) go first, so dir never
// holds two models; anything else of the user's stays.
Status CommitStaged(const std::filesystem::path& staged, const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Errorf("{}: cannot create directory: {}", dir.string(), ec.message());
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    const bool model_file = (n.starts_with("model-") && n.ends_with(".safetensors")) ||
                            n == "model.safetensors.index.json" || n == "modules.json" ||
                            n == "1_Pooling" || n == "2_Normalize" ||
                            n == "tokenizer_config.json" || n == "tokenizer.model";
    std::error_code ignored;  // a stale file that stays is overwritten or unread
    if (model_file && !fs::exists(staged / n, ignored)) fs::remove_all(e.path(), ignored);
  }
  if (ec) return Errorf("{}: cannot list the directory: {}", dir.string(), ec.message());
  for (const auto& e : fs::directory_iterator(staged, ec)) {
    const fs::path to = dir / e.path().filename();
    if (e.is_directory()) fs::remove_all(to, ec);
    fs::rename(e.path(), to, ec);
    if (ec)
      return Errorf("{}: cannot move the written file into place: {}", to.string(), ec.message());
  }
  if (ec) return Errorf("{}: cannot list the directory: {}", staged.string(), ec.message());
  return Status::Ok();
}

}  // namespace

// Every file is written into a staging directory beside dir first, so a
// failure (a vocabulary with no tokenizer.json form, a type Hugging Face
// files do not hold, a full disk) leaves dir as it was, and no partial model
// behind; then CommitStaged moves them in.
Status WriteHfModel(const model::ModelConfig& config, const tokenize::Tokenizer& tok,
                    const std::vector<TensorPlan>& plans, const WriteOptions& opts,
                    const std::string& out_dir) {
  namespace fs = std::filesystem;
  const bool mlx = opts.mlx_bits != 0;
  if (mlx && (opts.mlx_bits != 4 && opts.mlx_bits != 8))
    return Errorf("MLX quantization: bits must be 4 or 8, got {}", opts.mlx_bits);
  if (mlx && (opts.mlx_group != 32 && opts.mlx_group != 64 && opts.mlx_group != 128))
    return Errorf("MLX quantization: group size must be 32, 64 or 128, got {}", opts.mlx_group);
  fs::path target = fs::path(out_dir);
  if (target.filename().empty()) target = target.parent_path();  // "out/"
  const fs::path staged = target.string() + fmt::format(".partial-{}", ::getpid());
  std::error_code ec;
  fs::remove_all(staged, ec);
  fs::create_directories(staged, ec);
  if (ec) return Errorf("{}: cannot create directory: {}", staged.string(), ec.message());
  struct Cleanup {
    fs::path p;
    ~Cleanup() {
      std::error_code e;
      fs::remove_all(p, e);
    }
  } cleanup{staged};
  const std::string dir = staged.string();
  formats::SafetensorsWriter w;
  w.SetMetadata("format", mlx ? "mlx" : "pt");
  nlohmann::json quant = nlohmann::json::object();
  DType float_type = DType::kF32;
  ThreadPool pool(EncodeThreads(opts));
  for (const auto& p : plans) {
    DType dt = opts.dtype.value_or(p.source_dtype);
    if (dt != DType::kF32 && dt != DType::kF16 && dt != DType::kBF16) {
      if (opts.dtype) return Errorf("Hugging Face output holds f32, f16 or bf16, not {}", Name(dt));
      dt = DType::kF16;
    }
    if (p.shape.size() == 2) float_type = dt;
    const std::string hf = model::HfName(config.family, p.name);
    if (mlx && p.shape.size() == 2 && hf.ends_with(".weight")) {
      const std::string module = hf.substr(0, hf.rfind('.'));
      if (p.shape[1] % opts.mlx_group == 0) {
        LUMEN_RETURN_IF_ERROR(AddMlx(w, hf, p, opts.mlx_bits, opts.mlx_group));
        continue;
      }
      quant[module] = false;  // mlx-lm leaves such modules unquantized
    }
    LUMEN_ASSIGN_OR_RETURN(std::string bytes, Encode(p, dt, pool));
    LUMEN_RETURN_IF_ERROR(w.Add(hf, dt, p.shape, std::move(bytes)));
  }
  LUMEN_RETURN_IF_ERROR(w.Write(dir + "/model.safetensors"));
  nlohmann::json cfg = model::ConfigToHf(config);
  cfg["torch_dtype"] = float_type == DType::kF32    ? "float32"
                       : float_type == DType::kBF16 ? "bfloat16"
                                                    : "float16";
  if (mlx) {
    quant["group_size"] = opts.mlx_group;
    quant["bits"] = opts.mlx_bits;
    cfg["quantization"] = quant;
    cfg["quantization_config"] = quant;
  }
  LUMEN_RETURN_IF_ERROR(WriteFileAtomic(dir + "/config.json", cfg.dump(2) + "\n"));
  if (config.pooling != model::Pooling::kNone)
    LUMEN_RETURN_IF_ERROR(WriteSentenceTransformersPooling(dir, config.pooling, config.dim));
  LUMEN_RETURN_IF_ERROR(tok.ExportHf(dir));
  return CommitStaged(staged, target);
}

}  // namespace lumen::engine
