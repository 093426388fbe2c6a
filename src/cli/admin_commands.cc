// What the operator commands share: finding the running server, reaching it, reading the data dir.
#include "cli/admin_commands.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ostream>

#include "cli/pid_file.h"
#include "log/file_util.h"
#include "log/manifest.h"
#include "log/retention.h"
#include "log/slots.h"
#include "upstream/upstream_config.h"

namespace pgrelay::cli::admin {
namespace {

std::string trim(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ')) {
    text.pop_back();
  }
  return text;
}

// Replaces text[from, to) with "****" when it is not empty.
void mask_range(std::string& text, std::size_t from, std::size_t to) {
  if (to > from) text.replace(from, to - from, "****");
}

// "password=VALUE" in a URL's query string.
void mask_query_password(std::string& url) {
  auto query = url.find('?');
  while (query != std::string::npos) {
    auto key = url.find("password=", query);
    if (key == std::string::npos) return;
    if (url[key - 1] != '?' && url[key - 1] != '&') {
      query = key + 1;
      continue;
    }
    auto from = key + std::strlen("password=");
    auto to = url.find('&', from);
    mask_range(url, from, to == std::string::npos ? url.size() : to);
    return;
  }
}

// "password = VALUE" in a key=value conninfo string; VALUE bare or single-quoted.
void mask_conninfo_password(std::string& conninfo) {
  std::size_t pos = 0;
  while ((pos = conninfo.find("password", pos)) != std::string::npos) {
    const bool starts_word = pos == 0 || conninfo[pos - 1] == ' ' || conninfo[pos - 1] == '\t';
    std::size_t at = pos + std::strlen("password");
    while (at < conninfo.size() && conninfo[at] == ' ') ++at;
    if (!starts_word || at >= conninfo.size() || conninfo[at] != '=') {
      pos = at;
      continue;
    }
    ++at;
    while (at < conninfo.size() && conninfo[at] == ' ') ++at;
    std::size_t end = at;
    if (end < conninfo.size() && conninfo[end] == '\'') {
      ++end;
      while (end < conninfo.size() && conninfo[end] != '\'') end += conninfo[end] == '\\' ? 2 : 1;
      end = std::min(end + 1, conninfo.size());
    } else {
      while (end < conninfo.size() && conninfo[end] != ' ') ++end;
    }
    mask_range(conninfo, at, end);
    pos = at;
  }
}

// Psql's alignment: the header centred, values left (text) or right (numbers).
std::string pad(const std::string& text, std::size_t width,
                int align /* -1 left, 0 centre, 1 right */) {
  if (text.size() >= width) return text;
  std::size_t space = width - text.size();
  if (align < 0) return text + std::string(space, ' ');
  if (align > 0) return std::string(space, ' ') + text;
  return std::string(space / 2, ' ') + text + std::string(space - space / 2, ' ');
}

std::optional<wire::Lsn> lsn_of(const capture::QueryResult& r, int row, int col) {
  if (r.is_null(row, col)) return std::nullopt;
  return wire::Lsn::parse(r.value(row, col));
}

}  // namespace

void add_target_options(CLI::App& command, Target& target) {
  command
      .add_option("-D,--data-dir", target.data_dir,
                  "The data directory of the pgrelay serve in question (its change log, slots\n"
                  "and pgrelay.pid)")
      ->capture_default_str();
  command.add_option(
      "--url", target.url,
      "Reach the running server with this URL (postgres://USER[:PASSWORD]@HOST:PORT/DB)\n"
      "instead of the one it wrote to DATA_DIR/pgrelay.pid, for instance when that one\n"
      "carries no password. Without a password in either, libpq's PGPASSWORD and\n"
      "~/.pgpass apply.");
}

Result<ServerState> probe_server(const std::string& data_dir) {
  const std::string path = data_dir + "/" + kPidFileName;
  // find_running_server() cannot tell an unreadable file from a missing one; a server run by
  // another user must not look like no server.
  if (::access(path.c_str(), R_OK) != 0 && errno == EACCES) {
    return Error::make(sqlstate::kInsufficientPrivilege,
                       "could not open file \"" + path + "\": " + std::strerror(EACCES),
                       "The file is readable only by the user that runs pgrelay serve: run this "
                       "command as that user.");
  }
  auto running = find_running_server(data_dir);
  if (!running) return ServerState{};
  ServerState state;
  state.running = true;
  state.pid = static_cast<int>(running->pid);
  state.url = trim(running->url);
  state.admin_url = trim(running->admin_url);
  return state;
}

std::string mask_password(std::string_view url_or_conninfo) {
  std::string text(url_or_conninfo);
  auto scheme = text.find("://");
  if (text.rfind("postgres://", 0) != 0 && text.rfind("postgresql://", 0) != 0) {
    mask_conninfo_password(text);
    return text;
  }
  const std::size_t authority = scheme + 3;
  std::size_t end = text.find_first_of("/?", authority);
  if (end == std::string::npos) end = text.size();
  // A password's own '@' is percent-encoded: the last one ends the user info.
  auto at = text.rfind('@', end);
  if (at != std::string::npos && at >= authority) {
    auto colon = text.find(':', authority);
    if (colon != std::string::npos && colon < at) mask_range(text, colon + 1, at);
  }
  mask_query_password(text);
  return text;
}

std::string log_dir(const std::string& data_dir) {
  return data_dir + "/log";
}

Result<std::unique_ptr<log::ChangeLog>> open_log_read_only(const std::string& data_dir) {
  log::LogOptions options;
  options.dir = log_dir(data_dir);
  options.read_only = true;
  options.sync = log::SyncPolicy::kNone;
  if (!log::path_exists(options.dir + "/" + log::kManifestName)) {
    return std::unique_ptr<log::ChangeLog>();
  }
  return log::ChangeLog::open(options);
}

Result<std::unique_ptr<capture::PgSession>> connect_relay(const std::string& url,
                                                          const std::string& application_name) {
  auto config = upstream::UpstreamConfig::parse(url);
  if (!config.ok()) return config.error();
  // A server that accepts but never answers must not hang an operator's command.
  std::string conninfo =
      config->conninfo() + " connect_timeout=10 application_name='" + application_name + "'";
  auto session = capture::PgSession::connect(conninfo);
  if (!session.ok()) {
    Error e = session.error();
    e.message = "could not connect to pgrelay at " + mask_password(url) + ": " + connect_failure(e);
    return e;
  }
  return session;
}

Result<SlotListing> list_slots(const std::string& data_dir, capture::PgSession* relay,
                               log::ChangeLog* log) {
  SlotListing listing;
  if (relay != nullptr) {
    listing.source = "server";
    auto rows = relay->exec(
        "SELECT slot_name, plugin, database, temporary, active, active_pid, restart_lsn, "
        "confirmed_flush_lsn, wal_status FROM pg_replication_slots ORDER BY slot_name");
    if (!rows.ok()) return rows.error();
    for (int i = 0; i < rows->rows(); ++i) {
      SlotInfo s;
      s.slot_name = rows->value(i, 0);
      s.plugin = rows->value(i, 1);
      s.database = rows->value(i, 2);
      s.temporary = rows->value(i, 3) == "t";
      s.active = rows->value(i, 4) == "t";
      if (!rows->is_null(i, 5)) s.active_pid = std::atoi(std::string(rows->value(i, 5)).c_str());
      s.restart_lsn = lsn_of(*rows, i, 6);
      s.confirmed_flush_lsn = lsn_of(*rows, i, 7);
      s.wal_status = rows->value(i, 8);
      listing.slots.push_back(std::move(s));
    }
  } else {
    listing.source = "data directory";
    const std::string dir = log_dir(data_dir);
    if (log::path_exists(dir + "/" + log::kSlotsFileName)) {
      auto registry = log::SlotRegistry::open(dir);
      if (!registry.ok()) return registry.error();
      for (const auto& slot : (*registry)->list()) {
        SlotInfo s;
        s.slot_name = slot.name;
        s.plugin = slot.plugin;
        s.database = slot.database;
        s.temporary = slot.temporary;
        s.active = false;  // nothing streams without a server
        s.restart_lsn = slot.restart_lsn;
        s.confirmed_flush_lsn = slot.confirmed_flush;
        s.wal_status = slot.is_lost() ? "lost" : "reserved";
        listing.slots.push_back(std::move(s));
      }
    }
  }
  if (log != nullptr) {
    const std::int64_t now = log::now_pg_micros();
    for (auto& s : listing.slots) {
      if (!s.confirmed_flush_lsn) continue;
      log::Slot slot;
      slot.name = s.slot_name;
      slot.confirmed_flush = *s.confirmed_flush_lsn;
      if (s.wal_status == "lost") slot.lost = log::LostCause::kMaxBytes;
      auto lag = log::slot_lag(*log, slot, now);
      if (!lag.ok()) return lag.error();
      s.lag_bytes = lag->bytes;
      s.lag_seconds = lag->seconds;
    }
  }
  return listing;
}

std::string connect_failure(const Error& error) {
  constexpr std::string_view kPrefix = "could not connect to upstream: ";
  std::string_view message = error.message;
  if (message.substr(0, kPrefix.size()) == kPrefix) message.remove_prefix(kPrefix.size());
  return std::string(message);
}

void print_error(const Error& error) {
  std::fprintf(stderr, "pgrelay: error: %s: %s\n", error.sqlstate.c_str(), error.message.c_str());
  if (!error.detail.empty()) std::fprintf(stderr, "DETAIL:  %s\n", error.detail.c_str());
  if (!error.hint.empty()) std::fprintf(stderr, "HINT:  %s\n", error.hint.c_str());
}

void print_warning(const std::string& message, const std::string& hint) {
  std::fprintf(stderr, "pgrelay: warning: %s\n", message.c_str());
  if (!hint.empty()) std::fprintf(stderr, "HINT:  %s\n", hint.c_str());
}

int fail(const Error& error, int exit_status) {
  print_error(error);
  return exit_status;
}

void print_table(std::ostream& out, const std::vector<std::string>& headers,
                 const std::vector<std::vector<std::string>>& rows,
                 const std::vector<bool>& right) {
  std::vector<std::size_t> width(headers.size());
  for (std::size_t c = 0; c < headers.size(); ++c) width[c] = headers[c].size();
  for (const auto& row : rows) {
    for (std::size_t c = 0; c < row.size() && c < width.size(); ++c) {
      width[c] = std::max(width[c], row[c].size());
    }
  }
  auto line = [&](const std::vector<std::string>& cells, bool header) {
    std::string text;
    for (std::size_t c = 0; c < width.size(); ++c) {
      const std::string cell = c < cells.size() ? cells[c] : "";
      const int align = header ? 0 : (c < right.size() && right[c] ? 1 : -1);
      text += (c == 0 ? " " : " | ") + pad(cell, width[c], align);
    }
    while (!text.empty() && text.back() == ' ') text.pop_back();
    out << text << '\n';
  };
  line(headers, true);
  std::string rule;
  for (std::size_t c = 0; c < width.size(); ++c) {
    rule += (c == 0 ? "" : "+") + std::string(width[c] + 2, '-');
  }
  out << rule << '\n';
  for (const auto& row : rows) line(row, false);
  out << '(' << rows.size() << (rows.size() == 1 ? " row)" : " rows)") << '\n';
}

}  // namespace pgrelay::cli::admin
