// lumen synth NAME --out PATH [--quant T] [--format gguf|hf] [--seed S] [shape overrides]
// [--pooling last|mean|cls] (an embedding model: engine/embed.h)
#include <fmt/format.h>

#include "lumen/cli/common.h"
#include "lumen/cli/verbs.h"
#include "lumen/engine/synth.h"

namespace lumen::cli {

void RegisterSynth(CLI::App& app) {
  auto o = std::make_shared<engine::SynthOptions>();
  auto format = std::make_shared<std::string>("gguf");
  auto quant = std::make_shared<std::string>();
  auto pooling = std::make_shared<std::string>();
  std::string names;
  for (const auto& n : engine::SynthNames()) names += (names.empty() ? "" : ", ") + n;
  auto* cmd = app.add_subcommand("synth", "write a random-weight model of a real shape");
  cmd->add_option("name", o->name, "shape: " + names)->required();
  cmd->add_option("-o,--out", o->out, "output .gguf file or HF directory")->required();
  cmd->add_option("--format", *format, "gguf or hf")->check(CLI::IsMember({"gguf", "hf"}));
  cmd->add_option(
      "--quant,--type", *quant,
      "tensor type (f32, f16, bf16, q8_0, q4_0, q4_k, ..., q4_k_m (mix), mlx4, mlx8, mlx4-g32)");
  cmd->add_option("--seed", o->seed, "random seed");
  cmd->add_option("--layers", o->layers)->check(CLI::Range(1, 1024));
  cmd->add_option("--dim", o->dim)->check(CLI::Range(2, 1 << 16));
  cmd->add_option("--ffn", o->ffn)->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--heads", o->heads)->check(CLI::Range(1, 1024));
  cmd->add_option("--kv-heads", o->kv_heads)->check(CLI::Range(1, 1024));
  cmd->add_option("--vocab", o->vocab)->check(CLI::Range(300, 1 << 20));
  cmd->add_option("--ctx", o->ctx)->check(CLI::Range(int64_t(1), int64_t(1) << 24));
  cmd->add_option("--pooling", *pooling,
                  "write an embedding model pooling by last token, mean or cls (GGUF "
                  "pooling_type; HF sentence-transformers modules.json)")
      ->check(CLI::IsMember({"last", "mean", "cls"}));
  cmd->callback([o, format, quant, pooling] {
    if (!pooling->empty()) {
      auto p = model::ParsePooling(*pooling);
      if (!p.ok()) return ReportError(p.status());
      o->pooling = *p;
    }
    o->format = *format == "hf" ? engine::OutputFormat::kHf : engine::OutputFormat::kGguf;
    if (!quant->empty()) {
      Status q = engine::ParseSynthQuant(*quant, *o);  // f16, q4_k, ..., mlx4, mlx8-g32
      if (!q.ok()) return ReportError(q);
    }
    Status s = engine::Synthesize(*o);
    if (!s.ok()) return ReportError(s);
    fmt::print(stderr, "wrote {}\n", o->out);
  });
}

}  // namespace lumen::cli
