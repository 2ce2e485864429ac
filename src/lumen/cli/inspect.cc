// lumen inspect [MODEL]: architecture, parameter count, tensor table, memory.
#include <fmt/format.h>

#include "lumen/cli/common.h"
#include "lumen/cli/verbs.h"
#include "lumen/core/repack.h"

namespace lumen::cli {
namespace {

std::string Bytes(double b) {
  const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (b >= 1024 && i < 4) {
    b /= 1024;
    ++i;
  }
  return fmt::format("{:.2f} {}", b, unit[i]);
}

void Run(const ModelArgs& args, bool tensors) {
  auto m = LoadModel(args);
  if (!m.ok()) return ReportError(m.status());
  const engine::Model& model = **m;
  const model::ModelConfig& c = model.config();
  fmt::print("model:        {}\n", args.model.empty() ? model.name() : args.model);
  fmt::print("format:       {}\n", model.format());
  fmt::print("architecture: {}\n", model::FamilyName(c.family));
  fmt::print("parameters:   {} ({:.2f} M)\n", model.parameter_count(),
             model.parameter_count() / 1e6);
  fmt::print("layers {}  width {}  heads {}  kv heads {}  head dim {}  ffn {}  vocab {}\n",
             c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn_dim, c.vocab_size);
  fmt::print("context {}  rope theta {}  rope dim {}  norm eps {}  tied embeddings {}\n", c.max_ctx,
             c.rope_theta, c.rope_dim, c.norm_eps, c.tied_embeddings ? "yes" : "no");
  if (c.sliding_window > 0) fmt::print("sliding window {}\n", c.sliding_window);
  const double kv_per_token = 2.0 * c.n_layers * c.kv_dim() * 2;  // f16
  const int64_t ctx = std::min<int64_t>(c.max_ctx, engine::SessionOptions::kDefaultCtx);
  fmt::print("memory:       weights {}, KV cache {} for {} tokens (f16)\n",
             Bytes(double(model.weight_bytes())), Bytes(kv_per_token * ctx), ctx);
  fmt::print("tokenizer:    {} tokens, bos {}, eos {}, chat template {}\n",
             model.tokenizer().vocab_size(), model.tokenizer().bos(), model.tokenizer().eos(),
             model.chat_template().empty() ? "none" : "yes");
  if (!tensors) return;
  fmt::print("\n{:<40} {:>6} {:>18} {:>12}\n", "tensor", "dtype", "shape", "bytes");
  for (const auto& t : model.tensors()) {
    std::string shape = "[";
    for (size_t i = 0; i < t.shape.size(); ++i)
      shape += fmt::format("{}{}", i ? ", " : "", t.shape[i]);
    shape += "]";
    const std::string dtype = t.matrix.mlx_bits ? fmt::format("mlx{}", t.matrix.mlx_bits)
                                                : std::string(Name(PlainOf(t.matrix.w.dtype)));
    fmt::print("{:<40} {:>6} {:>18} {:>12}\n", t.name, dtype, shape, t.matrix.bytes());
  }
}

}  // namespace

void RegisterInspect(CLI::App& app) {
  auto* cmd = app.add_subcommand("inspect", "print a model's architecture, tensors and memory");
  auto args = std::make_shared<ModelArgs>();
  auto no_tensors = std::make_shared<bool>(false);
  AddModelArgs(cmd, *args);
  cmd->add_flag("--no-tensors", *no_tensors, "omit the per-tensor table");
  cmd->callback([args, no_tensors] { Run(*args, !*no_tensors); });
}

}  // namespace lumen::cli
