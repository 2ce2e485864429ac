#include "lumen/cli/verbs.h"

namespace lumen::cli {
namespace {
int g_exit_code = 0;  // set once by the verb that ran
}  // namespace

void SetExitCode(int code) { g_exit_code = code; }
int ExitCode() { return g_exit_code; }

void RegisterInspect(CLI::App& app);
void RegisterGenerate(CLI::App& app);
void RegisterConvert(CLI::App& app);
void RegisterSynth(CLI::App& app);
void RegisterTokenize(CLI::App& app);
void RegisterBench(CLI::App& app);
void RegisterEval(CLI::App&);
void RegisterServe(CLI::App& app);
void RegisterTrain(CLI::App& app);
void RegisterMerge(CLI::App& app);
void RegisterPerplexity(CLI::App& app);
void RegisterFit(CLI::App& app);
void RegisterEmbed(CLI::App& app);
void RegisterRoutes(CLI::App& app);
void RegisterHelp(CLI::App& app);

void RegisterVerbs(CLI::App& app) {
  RegisterInspect(app);
  RegisterGenerate(app);
  RegisterConvert(app);
  RegisterSynth(app);
  RegisterTokenize(app);
  RegisterBench(app);
  RegisterEval(app);
  RegisterServe(app);
  RegisterTrain(app);
  RegisterMerge(app);
  RegisterPerplexity(app);
  RegisterFit(app);
  RegisterEmbed(app);
  RegisterRoutes(app);
  RegisterHelp(app);  // last: it lists every other verb's flags
}

}  // namespace lumen::cli
