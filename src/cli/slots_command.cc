// `pgrelay slots [list | drop NAME]`: the replication slots, through the server or in the data dir.
#include <fcntl.h>
#include <sys/file.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <thread>

#include <nlohmann/json.hpp>

#include "cli/admin_commands.h"
#include "log/file_util.h"
#include "log/slots.h"

namespace pgrelay::cli {
namespace {

using admin::SlotInfo;

struct SlotsOptions {
  admin::Target target;
  bool json = false;
  std::string drop_name;
};

std::string lsn_text(const std::optional<wire::Lsn>& lsn) {
  return lsn ? lsn->to_string() : std::string();
}

nlohmann::json slot_json(const SlotInfo& s) {
  auto opt = [](const auto& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
  return {{"slot_name", s.slot_name},
          {"plugin", s.plugin},
          {"database", s.database},
          {"temporary", s.temporary},
          {"active", opt(s.active)},
          {"active_pid", opt(s.active_pid)},
          {"restart_lsn", s.restart_lsn ? nlohmann::json(lsn_text(s.restart_lsn)) : nullptr},
          {"confirmed_flush_lsn",
           s.confirmed_flush_lsn ? nlohmann::json(lsn_text(s.confirmed_flush_lsn)) : nullptr},
          {"wal_status", s.wal_status},
          {"lag_bytes", opt(s.lag_bytes)},
          {"lag_seconds", opt(s.lag_seconds)}};
}

// The running server's session, or null when none runs; an error when one runs but cannot be
// reached (the caller must not fall back to editing files a server owns).
Result<std::unique_ptr<capture::PgSession>> reach_server(const admin::Target& target,
                                                         const admin::ServerState& server,
                                                         const char* application_name) {
  if (!server.running) {
    if (!target.url.empty()) {
      admin::print_warning("no pgrelay serve runs on \"" + target.data_dir +
                           "\": --url is not used; working on the data directory");
    }
    return std::unique_ptr<capture::PgSession>();
  }
  const std::string url = target.url.empty() ? server.url : target.url;
  if (url.empty()) {
    return Error::make(
        sqlstate::kObjectNotInPrerequisiteState,
        "pgrelay serve (pid " + std::to_string(server.pid) + ") has not written its URL yet",
        "It is starting: try again in a moment, or pass --url.");
  }
  auto session = admin::connect_relay(url, application_name);
  if (!session.ok()) {
    Error e = session.error();
    if (e.hint.empty()) {
      e.hint = "pgrelay serve (pid " + std::to_string(server.pid) +
               ") runs on this data directory, so slots are changed through it. Pass --url "
               "with a user and password it accepts, or stop it to work on the data directory "
               "offline.";
    }
    return e;
  }
  return session;
}

// Whether a server runs on the data directory, which must exist.
Result<admin::ServerState> probe_data_dir(const std::string& dir) {
  if (!log::path_exists(dir)) {
    return Error::make(sqlstate::kUndefinedObject, "data directory \"" + dir + "\" does not exist",
                       "Pass -D with the --data-dir that pgrelay serve uses.");
  }
  return admin::probe_server(dir);
}

int run_list(const SlotsOptions& options) {
  const std::string& dir = options.target.data_dir;
  auto server = probe_data_dir(dir);
  if (!server.ok()) return admin::fail(server.error());
  auto relay = reach_server(options.target, *server, "pgrelay slots");
  std::vector<std::string> warnings;
  if (!relay.ok()) {
    // Listing is read-only: show what the data directory holds rather than nothing.
    admin::print_error(relay.error());
    warnings.push_back(relay.error().message);
    admin::print_warning(
        "showing the slots as last persisted in the data directory; whether they are active "
        "is unknown");
    relay = std::unique_ptr<capture::PgSession>();
  }
  auto opened = admin::open_log_read_only(dir);
  if (!opened.ok()) return admin::fail(opened.error());
  auto listing = admin::list_slots(dir, relay->get(), opened->get());
  if (!listing.ok()) return admin::fail(listing.error());
  if (relay->get() == nullptr && server->running) {
    for (auto& s : listing->slots) s.active.reset();
  }

  if (options.json) {
    nlohmann::json slots = nlohmann::json::array();
    for (const auto& s : listing->slots) slots.push_back(slot_json(s));
    nlohmann::json j{{"server_running", server->running},
                     {"source", listing->source},
                     {"slots", slots},
                     {"warnings", warnings}};
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
    return 0;
  }
  std::vector<std::vector<std::string>> rows;
  for (const auto& s : listing->slots) {
    std::string seconds;
    if (s.lag_seconds) {
      char buffer[32];
      std::snprintf(buffer, sizeof buffer, "%.1f", *s.lag_seconds);
      seconds = buffer;
    }
    rows.push_back({s.slot_name, s.plugin, s.temporary ? "t" : "f",
                    s.active ? (*s.active ? "t" : "f") : "",
                    s.active_pid ? std::to_string(*s.active_pid) : "", lsn_text(s.restart_lsn),
                    lsn_text(s.confirmed_flush_lsn), s.wal_status,
                    s.lag_bytes ? std::to_string(*s.lag_bytes) : "", seconds});
  }
  admin::print_table(std::cout,
                     {"slot_name", "plugin", "temporary", "active", "active_pid", "restart_lsn",
                      "confirmed_flush_lsn", "wal_status", "lag_bytes", "lag_seconds"},
                     rows, {false, false, false, false, true, false, false, false, true, true});
  return 0;
}

// Whether the persisted registry still lists `name`.
Result<bool> registry_has(const std::string& data_dir, const std::string& name) {
  const std::string dir = admin::log_dir(data_dir);
  if (!log::path_exists(dir + "/" + log::kSlotsFileName)) return false;
  auto registry = log::SlotRegistry::open(dir);
  if (!registry.ok()) return registry.error();
  return (*registry)->get(name).has_value();
}

void add_active_hint(Error& e) {
  if (e.sqlstate == sqlstate::kObjectInUse && e.hint.empty()) {
    e.hint =
        "A consumer is streaming from the slot. Stop it first (pgrelay status shows its pid; "
        "SELECT pg_terminate_backend(PID) through pgrelay ends it), then drop the slot.";
  }
}

int drop_through_server(const SlotsOptions& options, capture::PgSession& relay) {
  const std::string& name = options.drop_name;
  auto before =
      relay.exec("SELECT temporary FROM pg_replication_slots WHERE slot_name = $1", {name});
  if (!before.ok()) return admin::fail(before.error());
  const bool temporary = before->rows() > 0 && before->value(0, 0) == "t";
  // pgrelay answers this from its virtual catalog, with Postgres's checks and errors, and
  // carries the drop out on its slot registry at once.
  auto dropped = relay.exec("SELECT pg_drop_replication_slot($1)", {name});
  if (!dropped.ok()) {
    Error e = dropped.error();
    add_active_hint(e);
    return admin::fail(e);
  }
  // The registry persists a drop before the server's next request; wait until the file says
  // so, so that a stop right after this command cannot bring the slot back.
  if (!temporary) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (;;) {
      auto present = registry_has(options.target.data_dir, name);
      if (present.ok() && !*present) break;
      if (std::chrono::steady_clock::now() >= deadline) {
        admin::print_warning(
            "pgrelay serve has not yet removed replication slot \"" + name + "\" from its registry",
            "Check its log; pgrelay slots list shows whether the slot is back.");
        return 1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  std::printf("replication slot \"%s\" dropped\n", name.c_str());
  return 0;
}

int drop_offline(const SlotsOptions& options) {
  const std::string& name = options.drop_name;
  const std::string dir = admin::log_dir(options.target.data_dir);
  if (!log::path_exists(dir + "/" + log::kSlotsFileName)) {
    return admin::fail(Error::make(sqlstate::kUndefinedObject,
                                   "replication slot \"" + name + "\" does not exist"));
  }
  // The writer's lock on the log keeps a server from starting (and loading the registry we are
  // about to rewrite) while the file is edited.
  auto lock = log::open_file(dir + "/LOCK", O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (!lock.ok()) return admin::fail(lock.error());
  if (::flock(lock->get(), LOCK_EX | LOCK_NB) != 0) {
    return admin::fail(Error::make(
        sqlstate::kObjectInUse, "log directory \"" + dir + "\" is in use by another process",
        "A pgrelay serve is starting or running there: drop the slot through it (run this "
        "command again once it is up)."));
  }
  auto registry = log::SlotRegistry::open(dir);
  if (!registry.ok()) return admin::fail(registry.error());
  if (auto st = (*registry)->drop(name); !st.ok()) {
    Error e = st.error();
    add_active_hint(e);
    return admin::fail(e);
  }
  std::printf("replication slot \"%s\" dropped (pgrelay serve is not running: removed from %s)\n",
              name.c_str(), (*registry)->path().c_str());
  return 0;
}

int run_drop(const SlotsOptions& options) {
  auto server = probe_data_dir(options.target.data_dir);
  if (!server.ok()) return admin::fail(server.error());
  auto relay = reach_server(options.target, *server, "pgrelay slots");
  if (!relay.ok()) return admin::fail(relay.error());
  if (*relay) return drop_through_server(options, **relay);
  return drop_offline(options);
}

}  // namespace

Subcommand add_slots_command(CLI::App& parent) {
  auto options = std::make_shared<SlotsOptions>();
  CLI::App* cmd = parent.add_subcommand(
      "slots",
      "List or drop pgrelay's logical replication slots.\n\n"
      "While pgrelay serve runs on the data directory the command goes through it (its\n"
      "pg_replication_slots and pg_drop_replication_slot), so active slots and temporary\n"
      "slots are seen as consumers see them; otherwise it reads and edits the slot registry\n"
      "in the data directory, which the next pgrelay serve start loads.\n"
      "Without a subcommand, lists the slots.");
  cmd->require_subcommand(0, 1);
  admin::add_target_options(*cmd, options->target);
  cmd->add_flag("--json", options->json, "Print one JSON object instead of a table");

  CLI::App* list = cmd->add_subcommand(
      "list",
      "List the slots with the columns of pg_replication_slots that matter (slot_name, plugin,\n"
      "temporary, active, active_pid, restart_lsn, confirmed_flush_lsn, wal_status) and each\n"
      "one's lag behind the change log's head: lag_bytes, and lag_seconds, the age of the\n"
      "oldest transaction its consumer has not confirmed.");
  list->fallthrough();

  CLI::App* drop = cmd->add_subcommand(
      "drop",
      "Drop the replication slot NAME, as pg_drop_replication_slot does: the change log\n"
      "may then remove what only that slot still needed. Fails with 42704 when there is no\n"
      "such slot and with 55006 while a consumer streams from it.");
  drop->add_option("NAME", options->drop_name, "Name of the slot to drop")->required();
  drop->fallthrough();

  return Subcommand{
      cmd, [options, drop] { return drop->parsed() ? run_drop(*options) : run_list(*options); }};
}

}  // namespace pgrelay::cli
