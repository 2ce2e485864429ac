// Each verb file defines a Register<Verb>(CLI::App&) that adds its subcommand and
// sets the process exit code through SetExitCode when its callback runs.
#pragma once

#include <CLI/CLI.hpp>

namespace lumen::cli {

void RegisterVerbs(CLI::App& app);
void SetExitCode(int code);
int ExitCode();

}  // namespace lumen::cli
