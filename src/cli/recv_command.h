// `pgrelay recv`: a logical replication consumer in the spirit of pg_recvlogical.
#pragma once

#include <CLI/CLI.hpp>

#include <optional>
#include <string>
#include <vector>

#include "cli/subcommand.h"

namespace pgrelay::cli {

struct RecvOptions {
  std::string target;  // libpq URL, conninfo or database name; empty: PG* environment
  std::string slot;
  std::vector<std::string> publications;
  std::string start = "0/0";
  std::string endpos;  // empty: none
  bool create_slot = false;
  bool if_not_exists = false;
  bool drop_slot = false;
  std::string format = "json";  // json | pgoutput
  std::string file = "-";
  int protocol_version = 1;
  bool messages = true;
  double status_interval_seconds = 10;
  bool no_password = false;
  bool verbose = false;
};

// Runs `pgrelay recv` and returns the process exit status (0 after a clean stop on SIGINT,
// SIGTERM or --endpos, or after --drop-slot; 1 on errors, reported on stderr).
int run_recv(const RecvOptions& options);

// Defines `pgrelay recv` under `parent`.
Subcommand add_recv_command(CLI::App& parent);

}  // namespace pgrelay::cli
