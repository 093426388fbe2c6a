// `pgrelay log dump` and `pgrelay log stat`: read a change log offline and print it.
#include "cli/log_commands.h"

#include <chrono>
#include <cstdio>
#include <iostream>

#include "cli/change_json.h"
#include "log/change_log.h"
#include "log/change_view.h"
#include "log/file_util.h"
#include "log/manifest.h"
#include "log/retention.h"
#include "log/slots.h"
#include "wire/lsn.h"

namespace pgrelay::cli {

namespace {

int fail(const Error& error) {
  std::fprintf(stderr, "pgrelay: error: %s\n", error.message.c_str());
  if (!error.detail.empty()) std::fprintf(stderr, "DETAIL:  %s\n", error.detail.c_str());
  if (!error.hint.empty()) std::fprintf(stderr, "HINT:  %s\n", error.hint.c_str());
  return 1;
}

// The log lives in DATA_DIR/log; accept the log directory itself too.
std::string log_dir_of(const std::string& data_dir) {
  if (log::path_exists(data_dir + "/" + log::kManifestName)) return data_dir;
  return data_dir + "/log";
}

Result<std::unique_ptr<log::ChangeLog>> open_read_only(const std::string& data_dir) {
  log::LogOptions options;
  options.dir = log_dir_of(data_dir);
  options.read_only = true;
  options.sync = log::SyncPolicy::kNone;
  return log::ChangeLog::open(options);
}

// Bytes after the last whole batch: a write cut short by a crash (pgrelay discards them when it
// next opens the log), or damage. Either way they are not shown, and the user should know.
void warn_about_torn_tail(const log::LogStats& stats) {
  if (stats.recovered_truncated_bytes == 0) return;
  std::fprintf(stderr,
               "pgrelay: warning: log segment \"%s\" ends with %llu bytes at offset %llu that are "
               "not a whole batch (%s); they are not shown\n"
               "HINT:  After a crash this is the write that was cut short, and nothing in it was "
               "acknowledged. If pgrelay did not crash, the file is damaged: restore the data "
               "directory from a backup.\n",
               stats.torn_tail_file.c_str(),
               static_cast<unsigned long long>(stats.recovered_truncated_bytes),
               static_cast<unsigned long long>(stats.torn_tail_offset),
               stats.torn_tail_reason.c_str());
}

std::string dump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

int run_log_dump(const LogDumpOptions& options) {
  if (options.from_lsn && options.since) {
    return fail(Error::make(sqlstate::kSyntaxError, "--from and --since cannot be combined",
                            "Give a starting LSN or a starting time, not both."));
  }
  log::ViewOptions view_options;
  if (!options.tables.empty()) {
    log::TableFilter filter;
    for (const auto& t : options.tables) {
      Status st = filter.add_name(t);
      if (!st.ok()) return fail(st.error());
    }
    view_options.tables = std::move(filter);
  }
  auto opened = open_read_only(options.data_dir);
  if (!opened.ok()) return fail(opened.error());
  auto& changelog = **opened;
  warn_about_torn_tail(changelog.stats());
  Result<std::unique_ptr<log::Cursor>> cursor = Error{};
  if (options.since) {
    auto time = parse_pg_time(*options.since);
    if (!time) {
      return fail(Error::make(sqlstate::kInvalidParameterValue,
                              "invalid --since time \"" + *options.since + "\"",
                              "Write it as 2026-11-29T17:30:00Z or \"2026-11-29 17:30:00+01\"."));
    }
    cursor = changelog.open_cursor_at_time(*time);
  } else {
    wire::Lsn start;
    if (options.from_lsn) {
      auto lsn = wire::Lsn::parse(*options.from_lsn);
      if (!lsn) {
        return fail(Error::make(sqlstate::kInvalidParameterValue,
                                "invalid --from LSN \"" + *options.from_lsn + "\"",
                                "Write an LSN as Postgres does, for example 0/16B3748."));
      }
      start = *lsn;
    }
    cursor = changelog.open_cursor(start);
  }
  if (!cursor.ok()) return fail(cursor.error());
  log::ChangeView view(view_options);
  while (true) {
    auto meta = (*cursor)->next_entry();
    if (!meta.ok()) return fail(meta.error());
    if (!*meta) break;
    log::ViewReader reader(view, **cursor, **meta);
    RelationMap relations;
    bool begun = false;
    while (true) {
      auto change = reader.next();
      if (!change.ok()) return fail(change.error());
      if (!*change) break;
      if (!begun && (*meta)->kind == log::EntryKind::kTransaction) {
        std::cout << dump(entry_begin_json(**meta)) << '\n';
        begun = true;
      }
      nlohmann::json line = change_json(**change, relations);
      if ((*meta)->kind == log::EntryKind::kMessage) {
        line["xid"] = (*meta)->xid;
        line["commit_time"] = format_pg_time((*meta)->commit_time);
      }
      std::cout << dump(line) << '\n';
    }
    if ((*meta)->kind == log::EntryKind::kTransaction && reader.send_entry()) {
      if (!begun) std::cout << dump(entry_begin_json(**meta)) << '\n';
      std::cout << dump(entry_commit_json(**meta)) << '\n';
    }
  }
  std::cout.flush();
  return std::cout.good() ? 0 : 1;
}

int run_log_stat(const LogStatOptions& options) {
  auto opened = open_read_only(options.data_dir);
  if (!opened.ok()) return fail(opened.error());
  auto& changelog = **opened;
  log::LogStats stats = changelog.stats();
  warn_about_torn_tail(stats);
  nlohmann::json j;
  j["directory"] = changelog.options().dir;
  j["system_identifier"] = std::to_string(changelog.system_id());
  j["segments"] = stats.segments;
  j["bytes"] = stats.total_bytes;
  j["oldest_lsn"] = stats.oldest_lsn.to_string();
  j["newest_lsn"] = stats.newest_lsn.to_string();
  j["newest_commit_time"] = stats.newest_time == 0
                                ? nlohmann::json(nullptr)
                                : nlohmann::json(format_pg_time(stats.newest_time));
  j["removed_through"] = changelog.removed_through().to_string();
  j["torn_tail_bytes"] = stats.recovered_truncated_bytes;
  nlohmann::json slots = nlohmann::json::array();
  if (log::path_exists(changelog.options().dir + "/slots")) {
    auto registry = log::SlotRegistry::open(changelog.options().dir);
    if (!registry.ok()) return fail(registry.error());
    auto lags = log::slot_lags(changelog, **registry, log::now_pg_micros());
    if (!lags.ok()) return fail(lags.error());
    for (const auto& slot : (*registry)->list()) {
      nlohmann::json s;
      s["slot_name"] = slot.name;
      s["plugin"] = slot.plugin;
      s["database"] = slot.database;
      s["confirmed_flush_lsn"] = slot.confirmed_flush.to_string();
      s["wal_status"] = slot.lost != log::LostCause::kNone ? "lost" : "reserved";
      for (const auto& lag : *lags) {
        if (lag.name != slot.name) continue;
        s["lag_bytes"] = lag.bytes;
        s["lag_seconds"] = lag.seconds ? nlohmann::json(*lag.seconds) : nlohmann::json(nullptr);
      }
      slots.push_back(s);
    }
  }
  j["slots"] = slots;
  if (options.json) {
    std::cout << dump(j) << '\n';
    return 0;
  }
  for (const auto& [key, value] : j.items()) {
    if (key == "slots") continue;
    std::cout << key << ": " << (value.is_string() ? value.get<std::string>() : dump(value))
              << '\n';
  }
  std::cout << "slots: " << slots.size() << '\n';
  for (const auto& s : slots) std::cout << "  " << dump(s) << '\n';
  return 0;
}

}  // namespace pgrelay::cli
