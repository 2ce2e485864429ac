// lumen: one binary, one verb per file (cli/<verb>.cc). main only dispatches.
#include <CLI/CLI.hpp>

#include "lumen/cli/verbs.h"

int main(int argc, char** argv) {
  CLI::App app{"lumen: a local LLM runtime and lab"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "lumen 0.1.0");
  lumen::cli::RegisterVerbs(app);
  CLI11_PARSE(app, argc, argv);
  return lumen::cli::ExitCode();
}
