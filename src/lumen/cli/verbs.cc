#include "lumen/cli/verbs.h"

namespace lumen::cli {
namespace {
int g_exit_code = 0;  // set once by the verb that ran
}  // namespace

void SetExitCode(int code) { g_exit_code = code; }
int ExitCode() { return g_exit_code; }

void RegisterVerbs(CLI::App& app) {
  (void)app;
}

}  // namespace lumen::cli
