// A subcommand of the pgrelay command line: its CLI11 definition and the code that runs it.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace pgrelay::cli {

// add_*_command(parent) functions define a subcommand (options bound to state they own,
// captured by `run`) and return it; main calls `run` when that subcommand was parsed and
// exits with the status it returns.
struct Subcommand {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

}  // namespace pgrelay::cli
