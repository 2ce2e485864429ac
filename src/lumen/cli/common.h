// Shared CLI plumbing: model arguments (MODEL positional, --threads, --ctx,
// --kv-type, --tokenizer), sampler flags, and error reporting. Verbs hold no
// model logic; they call engine/ and print.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "lumen/core/status.h"
#include "lumen/engine/model.h"
#include "lumen/engine/session.h"
#include "lumen/sample/config.h"

namespace lumen::cli {

struct ModelArgs {
  std::string model;      // empty: the embedded default model
  std::string tokenizer;  // llama2.c models
  int threads = 0;
  int64_t ctx = 0;
  std::string kv_type = "f16";
  std::string act_route = "exact";
  std::string adapter;  // LoRA adapter directory (PEFT layout), applied unmerged
};

void AddModelArgs(CLI::App* app, ModelArgs& args, bool positional = true);
// --kv-type and --act-route with their checks (AddModelArgs, and bench's own arguments).
void AddKvTypeOption(CLI::App* app, std::string& kv_type);
void AddActRouteOption(CLI::App* app, std::string& act_route);
Result<std::unique_ptr<engine::Model>> LoadModel(const ModelArgs& args);
Result<engine::SessionOptions> SessionOptionsFrom(const ModelArgs& args);

// Registers every sampler flag (sample::SamplerFlags) as a string option; after
// parsing, BuildSamplerConfig applies those given, in command-line order.
struct SamplerArgs {
  std::vector<std::pair<std::string, std::string>> given;
  std::vector<std::unique_ptr<std::string>> storage;
};
void AddSamplerFlags(CLI::App* app, SamplerArgs& args);
Result<sample::SamplerConfig> BuildSamplerConfig(const CLI::App* app, SamplerArgs& args,
                                                 sample::SamplerConfig base);

// Prints "lumen: error: <message>" to stderr and sets exit code 1.
void ReportError(const Status& s);

}  // namespace lumen::cli
