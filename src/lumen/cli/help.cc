// `lumen help flags`: every flag of every verb, grouped by what it means
// (issue 18): a route choice (changes a node's route and perhaps its tier:
// parity against speed), a knob (memory/compute trade-off at the same tier),
// a hyperparameter (sampling, training), or input/output. A flag with the
// same meaning is one option across verbs, so it is classified once by name.
// `lumen help flags --check` fails on a flag nobody classified (CI runs it).
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "lumen/cli/verbs.h"

namespace lumen::cli {
namespace {

enum class FlagKind { kRoute, kKnob, kHyper, kIo };

constexpr const char* kKindTitle[] = {
    "route choices (change a node's route and may change its tier; `lumen routes`)",
    "knobs (memory/compute trade-offs at the same tier)",
    "hyperparameters (what is computed: sampling, training)",
    "inputs, outputs and serving plumbing",
};

const std::map<std::string, FlagKind>& Classes() {
  static const std::map<std::string, FlagKind> m = [] {
    std::map<std::string, FlagKind> c;
    for (const char* f :
         {"--act-route", "--kv-type", "--exact", "--tier", "--fused-ce", "--no-fused-ce",
          "--prefix-share", "--no-prefix-share", "--ce-skip-eps", "--compute"})
      c[f] = FlagKind::kRoute;
    for (const char* f :
         {"--threads", "--ctx", "--batch", "--parallel", "--queue", "--prompt-cache-mb",
          "--segment", "--mlp-chunk", "--memory-budget", "--grad-accum", "--store-entries",
          "--store-mb", "--store-ttl", "--max-body-mb", "--stride", "--show-routes"})
      c[f] = FlagKind::kKnob;
    for (const char* f : {"--n-predict",
                          "--stop",
                          "--ignore-eos",
                          "--seed",
                          "--method",
                          "--lr",
                          "--lr-schedule",
                          "--warmup",
                          "--iters",
                          "--epochs",
                          "--batch-size",
                          "--rank",
                          "--alpha",
                          "--dropout",
                          "--targets",
                          "--rs-lora",
                          "--lora-plus-ratio",
                          "--beta",
                          "--betas",
                          "--gamma",
                          "--lambda",
                          "--label-smoothing",
                          "--weight-decay",
                          "--grad-clip",
                          "--eps",
                          "--mask-prompt",
                          "--no-mask-prompt",
                          "--max-seq-len",
                          "--num-layers",
                          "--sft-scope",
                          "--val-size",
                          "--lambda-controller",
                          "--lambda-min",
                          "--lambda-max",
                          "--lambda-ramp",
                          "--lambda-backoff",
                          "--lambda-hysteresis",
                          "--lambda-warmup-readings",
                          "--lambda-schedule",
                          "--control-every",
                          "--control-probe",
                          "--controlled-param",
                          "--scale",
                          "--samples",
                          "--seeds",
                          "--max-tokens",
                          "--temperatures",
                          "--pooling",
                          "--dimensions",
                          "--instruction"})
      c[f] = FlagKind::kHyper;
    for (const char* f : {"--model",
                          "--tokenizer",
                          "--adapter",
                          "--clamp-max-tokens",
                          "--prompt",
                          "--no-echo",
                          "--no-bos",
                          "--file",
                          "--chat-template",
                          "--json",
                          "--dot",
                          "--check",
                          "--lint",
                          "--for",
                          "--out",
                          "--to",
                          "--type",
                          "--quant",
                          "--format",
                          "--data",
                          "--inspect",
                          "--plan",
                          "--probe-ranges",
                          "--resume",
                          "--save-every",
                          "--steps-per-eval",
                          "--steps-per-report",
                          "--skip-bad-rows",
                          "--quiet",
                          "--host",
                          "--port",
                          "--api-key",
                          "--cors",
                          "--alias",
                          "--no-ui",
                          "--runs",
                          "--train-data",
                          "--base",
                          "--ids",
                          "--add-special",
                          "--no-special",
                          "--skip-special",
                          "--no-tensors",
                          "--prompts",
                          "--gen",
                          "--repeat",
                          "--membw",
                          "--no-membw",
                          "--configs",
                          "--seq",
                          "--steps",
                          "--layers",
                          "--dim",
                          "--ffn",
                          "--heads",
                          "--kv-heads",
                          "--vocab",
                          "--no-speed",
                          "--remeasure",
                          "--messages",
                          "--add-generation-prompt",
                          "--kwargs",
                          "--help",
                          "--version"})
      c[f] = FlagKind::kIo;
    return c;
  }();
  return m;
}

struct FlagUse {
  FlagKind kind;
  std::string description;
  std::set<std::string> verbs;
};

void Collect(const CLI::App* app, const std::string& path, std::map<std::string, FlagUse>& flags,
             std::vector<std::string>& unclassified) {
  for (const CLI::Option* o : app->get_options()) {
    if (o->get_lnames().empty()) continue;  // positionals and short-only flags
    const std::string name = "--" + o->get_lnames().front();
    FlagKind kind;
    if (auto it = Classes().find(name); it != Classes().end()) {
      kind = it->second;
    } else if (o->get_group() == "Sampling") {
      kind = FlagKind::kHyper;
    } else {
      unclassified.push_back(path + " " + name);
      continue;
    }
    FlagUse& u = flags.try_emplace(name, FlagUse{kind, o->get_description(), {}}).first->second;
    u.verbs.insert(path);
  }
  for (const CLI::App* sub : app->get_subcommands({}))
    Collect(sub, path.empty() ? sub->get_name() : path + " " + sub->get_name(), flags,
            unclassified);
}

}  // namespace

void RegisterHelp(CLI::App& app) {
  auto* help = app.add_subcommand("help", "help topics: `lumen help flags`");
  auto* flags_cmd = help->add_subcommand("flags", "every flag of every verb, grouped by meaning");
  auto check = std::make_shared<bool>(false);
  flags_cmd->add_flag("--check", *check, "exit 1 if a flag of some verb is not classified");
  help->require_subcommand(1);
  CLI::App* root = &app;
  flags_cmd->callback([root, check] {
    std::map<std::string, FlagUse> flags;
    std::vector<std::string> unclassified;
    for (const CLI::App* sub : root->get_subcommands({}))
      if (sub->get_name() != "help") Collect(sub, sub->get_name(), flags, unclassified);
    if (*check) {
      for (const std::string& u : unclassified) std::printf("unclassified flag: %s\n", u.c_str());
      std::printf("%zu flags classified, %zu unclassified\n", flags.size(), unclassified.size());
      if (!unclassified.empty()) SetExitCode(1);
      return;
    }
    for (int k = 0; k < 4; ++k) {
      std::printf("%s%s:\n", k ? "\n" : "", kKindTitle[k]);
      for (const auto& [name, use] : flags) {
        if (static_cast<int>(use.kind) != k) continue;
        std::string verbs;
        for (const std::string& v : use.verbs) verbs += (verbs.empty() ? "" : ", ") + v;
        std::printf("  %-26s %s\n  %-26s   [%s]\n", name.c_str(), use.description.c_str(), "",
                    verbs.c_str());
      }
    }
  });
}

}  // namespace lumen::cli
