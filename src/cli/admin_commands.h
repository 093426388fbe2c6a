// The operator commands `pgrelay status`, `pgrelay slots` and `pgrelay capture`, and what they
// share.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "capture/trigger/pg_session.h"
#include "cli/subcommand.h"
#include "log/change_log.h"
#include "wire/lsn.h"

namespace pgrelay::cli {

// `pgrelay slots [list | drop NAME]`.
Subcommand add_slots_command(CLI::App& parent);
// `pgrelay status`.
Subcommand add_status_command(CLI::App& parent);
// `pgrelay capture install | uninstall`.
Subcommand add_capture_command(CLI::App& parent);

namespace admin {

inline constexpr const char* kPidFileName = "pgrelay.pid";

// Exit statuses of `pgrelay status`, as pg_ctl status has them.
inline constexpr int kExitNotRunning = 3;
inline constexpr int kExitNoDataDir = 4;

// Which pgrelay the command is about: --data-dir and --url.
struct Target {
  std::string data_dir = "./pgrelay-data";
  std::string url;  // empty: the URL in DATA_DIR/pgrelay.pid
};
void add_target_options(CLI::App& command, Target& target);

// What DATA_DIR/pgrelay.pid says. A running `pgrelay serve` holds an exclusive flock on it;
// a file nobody holds is left over from a run that ended.
struct ServerState {
  bool running = false;
  int pid = 0;
  std::string url;        // the ready URL (may hold a password: print mask_password(url))
  std::string admin_url;  // the admin page, http://HOST:PORT/; empty without one
};
Result<ServerState> probe_server(const std::string& data_dir);

// The URL or conninfo with its password replaced by "****".
std::string mask_password(std::string_view url_or_conninfo);

// The change log's directory, DATA_DIR/log.
std::string log_dir(const std::string& data_dir);
// Opens the log for reading beside a running server; nullopt when the data dir has none.
Result<std::unique_ptr<log::ChangeLog>> open_log_read_only(const std::string& data_dir);

// Connects to the running pgrelay at `url` (a bounded connect timeout; application_name set).
Result<std::unique_ptr<capture::PgSession>> connect_relay(const std::string& url,
                                                          const std::string& application_name);

// One replication slot as `slots list` and `status` show it.
struct SlotInfo {
  std::string slot_name;
  std::string plugin;
  std::string database;
  bool temporary = false;
  std::optional<bool> active;  // nullopt: unknown (the server could not be asked)
  std::optional<int> active_pid;
  std::optional<wire::Lsn> restart_lsn;
  std::optional<wire::Lsn> confirmed_flush_lsn;
  std::string wal_status;
  std::optional<std::uint64_t> lag_bytes;  // nullopt: no log to compare with
  std::optional<double> lag_seconds;       // nullopt: unknown (lost, removed, no log)
};

struct SlotListing {
  std::vector<SlotInfo> slots;
  std::string source;                 // "server" or "data directory"
  std::vector<std::string> warnings;  // printed on stderr (and in --json output)
};

// The slots of the running server (through `relay`, its pg_replication_slots), or, when
// `relay` is null, of the registry in the data dir. Lags come from `log` when given.
Result<SlotListing> list_slots(const std::string& data_dir, capture::PgSession* relay,
                               log::ChangeLog* log);

// libpq's reason from a PgSession::connect error, without the session's own prefix.
std::string connect_failure(const Error& error);

// Errors and warnings on stderr, as psql prints them with VERBOSITY verbose.
void print_error(const Error& error);
void print_warning(const std::string& message, const std::string& hint = {});
// Prints the error and returns `exit_status`.
int fail(const Error& error, int exit_status = 1);

// An aligned table as psql prints one, with "(N rows)" under it. `right` marks columns
// aligned to the right (numbers).
void print_table(std::ostream& out, const std::vector<std::string>& headers,
                 const std::vector<std::vector<std::string>>& rows,
                 const std::vector<bool>& right = {});

}  // namespace admin
}  // namespace pgrelay::cli
