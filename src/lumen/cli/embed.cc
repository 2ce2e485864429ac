// lumen embed [MODEL] [--file F | TEXT...] [--instruction I] [--dimensions N]
// [--pooling mean|cls|last] [--json]: one L2-normalized vector per input from an embedding model
// (engine/embed.h). The first argument is MODEL when it names an existing file
// or directory; --file holds one input per non-empty line. Plain output: one
// line per input, the components separated by spaces (%.9g: f32 round-trips).
#include <algorithm>
#include <filesystem>
#include <sstream>

#include <fmt/format.h>

#include "lumen/cli/common.h"
#include "lumen/cli/verbs.h"
#include "lumen/core/buffer.h"
#include "lumen/engine/embed.h"

namespace lumen::cli {
namespace {

struct EmbedArgs {
  ModelArgs model;
  std::vector<std::string> pos;
  std::string file;
  std::string instruction;
  int dimensions = 0;
  std::string pooling;  // --pooling: overrides the model's
  bool json = false;
};

void Run(EmbedArgs& a) {
  std::vector<std::string> texts = a.pos;
  std::error_code ec;
  if (!texts.empty() && std::filesystem::exists(texts[0], ec)) {
    a.model.model = texts[0];
    texts.erase(texts.begin());
  }
  if (!a.file.empty()) {
    auto t = ReadFile(a.file);
    if (!t.ok()) return ReportError(t.status().WithContext("--file"));
    std::istringstream in(*t);
    std::string line;
    while (std::getline(in, line))
      if (!line.empty()) texts.push_back(line);
  }
  if (texts.empty())
    return ReportError(Error("embed: nothing to embed: give TEXT... or --file F (one per line)"));
  auto m = LoadModel(a.model);
  if (!m.ok()) return ReportError(m.status());
  const engine::Model& model = **m;
  model::Pooling pooling = model::Pooling::kNone;
  if (!a.pooling.empty()) {
    auto p = model::ParsePooling(a.pooling);
    if (!p.ok()) return ReportError(p.status().WithContext("--pooling"));
    pooling = *p;
  }
  auto e = engine::Embedder::Create(model, model.pool(), pooling);
  if (!e.ok()) return ReportError(e.status());
  const int D = (*e)->dim();
  if (a.dimensions > D)
    return ReportError(
        Errorf("--dimensions {} is more than the model's {} dimensions", a.dimensions, D));
  std::vector<std::vector<int32_t>> tokens;
  for (const auto& t : texts)
    tokens.push_back(model.tokenizer().Encode(
        a.instruction.empty() ? t : fmt::format("Instruct: {}\nQuery:{}", a.instruction, t),
        /*add_special=*/true));
  const int64_t ctx = a.model.ctx > 0 ? a.model.ctx : std::max<int64_t>(model.config().max_ctx, 1);
  auto vecs = (*e)->Embed(tokens, ctx);
  if (!vecs.ok()) return ReportError(vecs.status());
  for (auto& v : *vecs)
    if (a.dimensions > 0 && a.dimensions < D) engine::TruncateNormalized(v, a.dimensions);
  if (a.json) {
    nlohmann::ordered_json data = nlohmann::ordered_json::array();
    for (size_t i = 0; i < vecs->size(); ++i)
      data.push_back({{"index", i}, {"tokens", tokens[i].size()}, {"embedding", (*vecs)[i]}});
    const nlohmann::ordered_json j = {{"model", model.name()},
                                      {"pooling", std::string(PoolingName((*e)->pooling()))},
                                      {"dimensions", (*vecs)[0].size()},
                                      {"data", data}};
    fmt::print("{}\n", j.dump());
    return;
  }
  for (const auto& v : *vecs) {
    std::string line;
    for (size_t d = 0; d < v.size(); ++d) line += fmt::format("{}{:.9g}", d ? " " : "", v[d]);
    fmt::print("{}\n", line);
  }
}

}  // namespace

void RegisterEmbed(CLI::App& app) {
  auto* cmd = app.add_subcommand("embed", "embedding vectors of texts (embedding models)");
  auto a = std::make_shared<EmbedArgs>();
  // Exact products by default, as the server's /v1/embeddings computes them,
  // so the CLI and the server give the same bits (--tier l3 opts in to bf16).
  a->model.default_act_route = "exact";
  AddModelArgs(cmd, a->model, /*positional=*/false);
  cmd->add_option("args", a->pos, "[MODEL] TEXT...");
  cmd->add_option("--file", a->file, "one input per non-empty line");
  cmd->add_option("--instruction", a->instruction,
                  "Qwen3-Embedding-style task: each input becomes "
                  "\"Instruct: <task>\\nQuery:<text>\"");
  cmd->add_option("--dimensions", a->dimensions,
                  "keep the first N components and re-normalize (matryoshka)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--pooling", a->pooling,
                  "mean, cls or last: pool this way instead of the model's pooling (as "
                  "llama.cpp's --pooling; also embeds with a generative model)")
      ->check(CLI::IsMember({"mean", "cls", "last"}));
  cmd->add_flag("--json", a->json,
                "print {model, pooling, dimensions, data: [{index, tokens, "
                "embedding}]}");
  cmd->callback([a] { Run(*a); });
}

}  // namespace lumen::cli
