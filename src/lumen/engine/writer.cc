#include "lumen/engine/writer.h"

#include <filesystem>

#include "lumen/core/buffer.h"
#include "lumen/core/progress.h"
#include "lumen/formats/gguf.h"
#include "lumen/core/quant.h"
#include "lumen/formats/safetensors.h"
#include "lumen/model/weights.h"

namespace lumen::engine {
namespace {

// Encodes every row of `p` as `dtype` into one contiguous byte string.
Result<std::string> Encode(const TensorPlan& p, DType dtype) {
  const int64_t cols = p.shape.back();
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < p.shape.size(); ++i) rows *= p.shape[i];
  const auto rb = RowBytes(dtype, cols);
  if (!rb) return Errorf("tensor '{}': {} columns is not a whole number of {} blocks", p.name, cols,
                         Name(dtype));
  std::string out(*rb * rows, '\0');
  std::vector<float> buf(cols);
  for (int64_t r = 0; r < rows; ++r) {
    p.row(r, buf.data());
    QuantizeRow(dtype, buf.data(), out.data() + r * *rb, cols);
  }
  return out;
}

}  // namespace

Status WriteGgufModel(const model::ModelConfig& config, const tokenize::Tokenizer& tok,
                      const std::vector<TensorPlan>& plans, const WriteOptions& opts,
                      const std::string& path) {
  formats::GgufWriter w;
  model::ConfigToGguf(config, w);
  w.SetString("general.name", std::filesystem::path(path).stem().string());
  LUMEN_RETURN_IF_ERROR(tok.ExportGguf(w));
  if (!opts.chat_template.empty()) w.SetString("tokenizer.chat_template", opts.chat_template);
  Progress progress("writing " + path, static_cast<int64_t>(plans.size()));
  for (const auto& p : plans) {
    DType dt = opts.dtype.value_or(p.source_dtype);
    if (p.shape.size() == 1) dt = DType::kF32;
    if (!formats::GgmlFromDType(dt)) dt = DType::kF16;
    // K-quants need 256-wide rows; fall back like llama.cpp does for odd shapes.
    if (!RowBytes(dt, p.shape.back())) dt = RowBytes(DType::kQ8_0, p.shape.back()) ? DType::kQ8_0 : DType::kF16;
    LUMEN_ASSIGN_OR_RETURN(std::string bytes, Encode(p, dt));
    LUMEN_RETURN_IF_ERROR(w.AddTensor(p.name, dt, p.shape, std::move(bytes)));
    progress.Advance();
  }
  return w.Write(path);
}

Status WriteHfModel(const model::ModelConfig& config, const tokenize::Tokenizer& tok,
                    const std::vector<TensorPlan>& plans, const WriteOptions& opts,
                    const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Errorf("{}: cannot create directory: {}", dir, ec.message());
  formats::SafetensorsWriter w;
  w.SetMetadata("format", "pt");
  for (const auto& p : plans) {
    DType dt = opts.dtype.value_or(p.source_dtype);
    if (dt != DType::kF32 && dt != DType::kF16 && dt != DType::kBF16) {
      if (opts.dtype) return Errorf("Hugging Face output holds f32, f16 or bf16, not {}", Name(dt));
      dt = DType::kF16;
    }
    LUMEN_ASSIGN_OR_RETURN(std::string bytes, Encode(p, dt));
    LUMEN_RETURN_IF_ERROR(w.Add(model::HfName(config.family, p.name), dt, p.shape, std::move(bytes)));
  }
  LUMEN_RETURN_IF_ERROR(w.Write(dir + "/model.safetensors"));
  nlohmann::json cfg = model::ConfigToHf(config);
  cfg["torch_dtype"] = "float32";
  LUMEN_RETURN_IF_ERROR(WriteFileAtomic(dir + "/config.json", cfg.dump(2) + "\n"));
  LUMEN_RETURN_IF_ERROR(tok.ExportHf(dir));
  return Status::Ok();
}

}  // namespace lumen::engine
