// `pgrelay dump` and `pgrelay restore`: Debian's pg_dump and pg_restore, custom format, run
// against a running pgrelay through its pass-through, with pgrelay's and zero's objects left out.
#pragma once

#include <CLI/CLI.hpp>

#include "cli/subcommand.h"

namespace pgrelay::cli {

// `pgrelay dump [--data-dir DIR | --url URL] FILE`.
Subcommand add_dump_command(CLI::App& parent);
// `pgrelay restore [--data-dir DIR | --url URL] FILE`.
Subcommand add_restore_command(CLI::App& parent);

}  // namespace pgrelay::cli
