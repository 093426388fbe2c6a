// `pgrelay doctor`: checks an upstream PostgreSQL and says what works and how to fix the rest.
#pragma once

#include <string>
#include <vector>

#include "cli/subcommand.h"

namespace pgrelay::cli {

struct DoctorOptions {
  std::string url;  // libpq URL or conninfo; empty: PGHOST, PGUSER, ... as psql
  std::string schema = "_pgrelay";
  std::vector<std::string> capture_databases{"*"};  // serve's --capture-database
  bool json = false;
};

// Exit status: 0 pgrelay can serve the upstream (warnings allowed), 1 a check failed, 2 usage
// or connection error. Prints the report on stdout; never prints a password.
int run_doctor(const DoctorOptions& options);

Subcommand add_doctor_command(CLI::App& parent);

}  // namespace pgrelay::cli
