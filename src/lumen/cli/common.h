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
  // Route choices (cli/routes.h): empty means the preset's. The default preset
  // takes default_act_route (int8x2 decode + bf16 prefill; training and
  // measuring verbs set "exact").
  std::string kv_type;
  std::string act_route;
  std::string default_act_route = "int8x2+bf16";
  bool exact = false;  // --exact: every node at its lowest tier
  std::string tier;    // --tier l1|l2|l3
  bool show_routes = false;
  std::string adapter;                 // LoRA adapter directory (PEFT layout), applied unmerged
  std::string train_compute = "auto";  // the train graph's --compute (train/compute.h)
};

// A number in [lo, hi] that is finite. CLI11's Range and PositiveNumber
// compare, and NaN passes every comparison; this refuses it by name.
CLI::Validator FiniteRange(double lo, double hi);

void AddModelArgs(CLI::App* app, ModelArgs& args, bool positional = true);
// A --ctx beyond what the model was trained for runs (as in llama.cpp), with
// a warning: positions past it are extrapolated and cost KV memory.
void WarnBeyondModelContext(const engine::Model& model, int64_t ctx);
// --kv-type and --act-route with their checks (AddModelArgs, and bench's own arguments).
void AddKvTypeOption(CLI::App* app, std::string& kv_type);
void AddActRouteOption(CLI::App* app, std::string& act_route);
// --exact, --tier and --show-routes (AddModelArgs, and bench).
void AddTierOptions(CLI::App* app, ModelArgs& args);
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
