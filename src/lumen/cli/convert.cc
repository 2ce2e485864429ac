// lumen convert IN OUT [--to gguf|hf] [--type T] [--tokenizer tok.bin]
#include <fmt/format.h>

#include "lumen/cli/common.h"
#include "lumen/cli/verbs.h"
#include "lumen/engine/convert.h"

namespace lumen::cli {
namespace {

struct ConvertArgs {
  ModelArgs model;
  std::string out, to, type;
};

void Run(ConvertArgs& a) {
  engine::OutputFormat format = engine::OutputFormat::kGguf;
  if (a.to.empty()) a.to = a.out.ends_with(".gguf") ? "gguf" : "hf";
  if (a.to == "hf")
    format = engine::OutputFormat::kHf;
  else if (a.to != "gguf")
    return ReportError(Errorf("--to: '{}' is not gguf or hf", a.to));
  std::optional<DType> dtype;
  if (!a.type.empty()) {
    dtype = ParseDType(a.type);
    if (!dtype) return ReportError(Errorf("--type: unknown type '{}'", a.type));
  }
  auto m = LoadModel(a.model);
  if (!m.ok()) return ReportError(m.status());
  Status s = engine::ConvertModel(**m, format, a.out, dtype);
  if (!s.ok()) return ReportError(s);
  fmt::print(stderr, "wrote {}\n", a.out);
}

}  // namespace

void RegisterConvert(CLI::App& app) {
  auto a = std::make_shared<ConvertArgs>();
  auto* cmd = app.add_subcommand(
      "convert",
      "convert a GGUF, Hugging Face, MLX or llama2.c model to GGUF or a Hugging Face directory");
  cmd->add_option("in", a->model.model, "input model")->required();
  cmd->add_option("out", a->out, "output: a .gguf path or a directory")->required();
  cmd->add_option("--to", a->to, "output format: gguf or hf (default: from the OUT name)");
  cmd->add_option("--type", a->type, "tensor type: f32, f16, bf16 or (GGUF) q8_0, q4_0, q4_k, ...");
  cmd->add_option("--tokenizer", a->model.tokenizer, "tokenizer file for llama2.c .bin input");
  cmd->callback([a] { Run(*a); });
}

}  // namespace lumen::cli
