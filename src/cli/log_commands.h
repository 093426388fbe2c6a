// `pgrelay log dump` and `pgrelay log stat`: read a change log offline and print it.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace pgrelay::cli {

struct LogDumpOptions {
  std::string data_dir;
  std::optional<std::string> from_lsn;
  std::optional<std::string> since;
  std::vector<std::string> tables;
  bool follow = false;
};

struct LogStatOptions {
  std::string data_dir;
  bool json = false;
};

// Both return a process exit status and print errors on stderr.
int run_log_dump(const LogDumpOptions& options);
int run_log_stat(const LogStatOptions& options);

}  // namespace pgrelay::cli
