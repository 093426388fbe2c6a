// `pgrelay status`: whether the server runs, the change log's head, slots, consumers, capture rate.
#include <cinttypes>
#include <cstdio>
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "base/strings.h"
#include "capture/follower/follower_checkpoint.h"
#include "cli/admin_commands.h"
#include "cli/change_json.h"
#include "cli/database_captures.h"
#include "log/change_log.h"
#include "log/file_util.h"
#include "log/retention.h"
#include "log/slots.h"
#include "log/transaction.h"
#include "nats/publisher.h"

namespace pgrelay::cli {
namespace {

using admin::SlotInfo;

constexpr int kRateWindowSeconds = 60;

struct StatusOptions {
  admin::Target target;
  bool json = false;
};

// What the log's last minute holds, by the commit times the log records (the upstream's clock).
struct CaptureRate {
  std::uint64_t transactions = 0;
  std::uint64_t changes = 0;   // inserts, updates, deletes, truncates, transactional messages
  std::uint64_t messages = 0;  // non-transactional logical messages
};

bool is_row_change(const log::ChangeMessage& m) {
  return !std::holds_alternative<pgoutput::Relation>(m) &&
         !std::holds_alternative<pgoutput::Type>(m);
}

Result<CaptureRate> capture_rate(log::ChangeLog& changelog, std::int64_t now) {
  CaptureRate rate;
  auto cursor = changelog.open_cursor_at_time(now - std::int64_t{kRateWindowSeconds} * 1000000);
  if (!cursor.ok()) return cursor.error();
  for (;;) {
    auto meta = (*cursor)->next_entry();
    if (!meta.ok()) return meta.error();
    if (!*meta) break;
    if ((*meta)->kind == log::EntryKind::kMessage) {
      ++rate.messages;
      continue;
    }
    if ((*meta)->kind != log::EntryKind::kTransaction) continue;
    ++rate.transactions;
    // The metadata's count includes the Relation and Type records a transaction carries:
    // decoding tells them apart (memory stays bounded by the largest change).
    log::EntryReader reader(**cursor, **meta);
    for (;;) {
      auto change = reader.next();
      if (!change.ok()) return change.error();
      if (!*change) break;
      if (is_row_change((*change)->message)) ++rate.changes;
    }
  }
  return rate;
}

std::string lsn_text(const std::optional<wire::Lsn>& lsn) {
  return lsn ? lsn->to_string() : std::string();
}

nlohmann::json json_or_null(const std::optional<std::string>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

std::string seconds_text(const std::optional<double>& seconds) {
  if (!seconds) return "";
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.1f", *seconds);
  return buffer;
}

std::string rate_text(std::uint64_t count) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.2f", static_cast<double>(count) / kRateWindowSeconds);
  return buffer;
}

nlohmann::json slot_json(const SlotInfo& s) {
  nlohmann::json j;
  j["slot_name"] = s.slot_name;
  j["plugin"] = s.plugin;
  j["database"] = s.database;
  j["temporary"] = s.temporary;
  j["active"] = s.active ? nlohmann::json(*s.active) : nlohmann::json(nullptr);
  j["active_pid"] = s.active_pid ? nlohmann::json(*s.active_pid) : nlohmann::json(nullptr);
  j["restart_lsn"] = s.restart_lsn ? nlohmann::json(s.restart_lsn->to_string()) : nullptr;
  j["confirmed_flush_lsn"] =
      s.confirmed_flush_lsn ? nlohmann::json(s.confirmed_flush_lsn->to_string()) : nullptr;
  j["wal_status"] = s.wal_status;
  j["lag_bytes"] = s.lag_bytes ? nlohmann::json(*s.lag_bytes) : nlohmann::json(nullptr);
  j["lag_seconds"] = s.lag_seconds ? nlohmann::json(*s.lag_seconds) : nlohmann::json(nullptr);
  return j;
}

std::vector<std::string> slot_cells(const SlotInfo& s) {
  return {s.slot_name,
          s.plugin,
          s.temporary ? "t" : "f",
          s.active ? (*s.active ? "t" : "f") : "",
          s.active_pid ? std::to_string(*s.active_pid) : "",
          lsn_text(s.restart_lsn),
          lsn_text(s.confirmed_flush_lsn),
          s.wal_status,
          s.lag_bytes ? std::to_string(*s.lag_bytes) : "",
          seconds_text(s.lag_seconds)};
}

struct Consumer {
  int pid = 0;
  std::string application_name;
  std::optional<std::string> client_addr;
  std::string state;
  std::optional<std::string> sent_lsn;
  std::optional<std::string> flush_lsn;
  std::optional<std::string> slot_name;
};

Result<std::vector<Consumer>> list_consumers(capture::PgSession& relay,
                                             const std::vector<SlotInfo>& slots) {
  auto rows = relay.exec(
      "SELECT pid, application_name, client_addr, state, sent_lsn, flush_lsn "
      "FROM pg_stat_replication ORDER BY pid");
  if (!rows.ok()) return rows.error();
  std::vector<Consumer> out;
  for (int i = 0; i < rows->rows(); ++i) {
    Consumer c;
    c.pid = std::atoi(std::string(rows->value(i, 0)).c_str());
    c.application_name = rows->value(i, 1);
    c.client_addr = rows->get(i, 2);
    c.state = rows->value(i, 3);
    c.sent_lsn = rows->get(i, 4);
    c.flush_lsn = rows->get(i, 5);
    // As in Postgres, a walsender's slot is the one whose active_pid it is.
    for (const auto& s : slots) {
      if (s.active_pid && *s.active_pid == c.pid) c.slot_name = s.slot_name;
    }
    out.push_back(std::move(c));
  }
  return out;
}

int run_status(const StatusOptions& options) {
  const std::string& dir = options.target.data_dir;
  auto server = admin::probe_server(dir);
  if (!server.ok()) return admin::fail(server.error());
  std::vector<std::string> warnings;
  auto warn = [&](std::string message, std::string hint = {}) {
    admin::print_warning(message, hint);
    warnings.push_back(std::move(message));
  };

  if (!log::path_exists(dir)) {
    if (options.json) {
      nlohmann::json j{{"data_dir", dir}, {"exists", false}, {"server", {{"running", false}}}};
      std::cout << j.dump() << '\n';
    } else {
      std::printf("pgrelay: no data directory \"%s\"\n", dir.c_str());
      std::printf("HINT:  Pass -D with the --data-dir that pgrelay serve uses.\n");
    }
    return admin::kExitNoDataDir;
  }

  auto opened = admin::open_log_read_only(dir);
  if (!opened.ok()) return admin::fail(opened.error());
  std::unique_ptr<log::ChangeLog> changelog = std::move(*opened);
  if (!changelog) warn("there is no change log in \"" + admin::log_dir(dir) + "\" yet");

  std::string url;
  std::unique_ptr<capture::PgSession> relay;
  if (server->running) {
    url = options.target.url.empty() ? server->url : options.target.url;
    if (url.empty()) {
      warn("pgrelay serve (pid " + std::to_string(server->pid) + ") has not written its URL yet",
           "It is starting; try again in a moment, or pass --url.");
    } else {
      auto connected = admin::connect_relay(url, "pgrelay status");
      if (connected.ok()) {
        relay = std::move(*connected);
      } else {
        warn(connected.error().message,
             "Slots are shown as last persisted in the data directory, without consumers. Pass "
             "--url with a user and password pgrelay accepts.");
      }
    }
  } else if (!options.target.url.empty()) {
    warn("no pgrelay serve runs on \"" + dir + "\": --url is not used");
  }

  auto slots = admin::list_slots(dir, relay.get(), changelog.get());
  if (!slots.ok() && relay) {
    warn("could not read pg_replication_slots through pgrelay: " + slots.error().message);
    relay.reset();
    slots = admin::list_slots(dir, nullptr, changelog.get());
  }
  if (!slots.ok()) return admin::fail(slots.error());

  std::vector<Consumer> consumers;
  if (relay) {
    auto listed = list_consumers(*relay, slots->slots);
    if (listed.ok()) {
      consumers = std::move(*listed);
    } else {
      warn("could not read pg_stat_replication through pgrelay: " + listed.error().message);
    }
  }

  std::optional<CaptureRate> rate;
  log::LogStats stats;
  if (changelog) {
    stats = changelog->stats();
    auto measured = capture_rate(*changelog, log::now_pg_micros());
    if (measured.ok()) {
      rate = *measured;
    } else {
      warn("could not measure the capture rate: " + measured.error().message);
    }
  }

  // Every database captured so far (each with a log of its own); the figures above are the
  // upstream URL's database's.
  // Those the last start's --capture-database left out keep their logs; they are said apart.
  std::vector<std::string> captured, left_out;
  for (const auto& entry : read_captured_databases(dir)) {
    (entry.in_scope ? captured : left_out).push_back(entry.name);
  }

  // The NATS publisher's state, as it last wrote it (when `serve --nats` ran here).
  std::optional<nlohmann::json> nats;
  if (auto text = log::read_whole_file(dir + "/" + nats::kStateFileName); text.ok()) {
    auto parsed = nlohmann::json::parse(text->begin(), text->end(), nullptr, false);
    if (parsed.is_object()) nats = std::move(parsed);
  }
  // Lag: the log's head past the end of what the stream holds.
  std::optional<std::uint64_t> nats_lag;
  if (nats && changelog) {
    auto published = wire::Lsn::parse(nats->value("published_end_lsn", std::string()));
    const std::uint64_t head = changelog->last_end_lsn().value();
    if (published) nats_lag = head > published->value() ? head - published->value() : 0;
  }

  // A follower's log (serve --follow) remembers how far it holds the stream it rebuilds from.
  std::optional<capture::FollowerCheckpoint> followed;
  if (changelog) {
    if (auto checkpoint = changelog->last_checkpoint()) {
      auto decoded = capture::decode_follower_checkpoint(*checkpoint);
      if (!decoded.ok()) {
        warn("the follower's checkpoint is damaged: " + decoded.error().message);
      } else if (decoded->has_value()) {
        followed = **decoded;
      }
    }
  }

  const std::string shown_url = admin::mask_password(url);
  const char* method =
      "entries of the change log whose commit time (the upstream's clock) lies within the last "
      "60 seconds, divided by 60";
  if (options.json) {
    nlohmann::json j;
    j["data_dir"] = dir;
    j["exists"] = true;
    j["captured_databases"] = captured;
    j["left_out_databases"] = left_out;
    j["server"] = {{"running", server->running},
                   {"pid", server->running ? nlohmann::json(server->pid) : nullptr},
                   {"url", url.empty() ? nlohmann::json(nullptr) : nlohmann::json(shown_url)},
                   {"reachable", relay != nullptr}};
    if (changelog) {
      j["log"] = {{"directory", changelog->options().dir},
                  {"head_lsn", changelog->last_end_lsn().to_string()},
                  {"newest_commit_lsn", stats.newest_lsn.to_string()},
                  {"oldest_lsn", stats.oldest_lsn.to_string()},
                  {"newest_commit_time", stats.newest_time == 0
                                             ? nlohmann::json(nullptr)
                                             : nlohmann::json(format_pg_time(stats.newest_time))},
                  {"bytes", stats.total_bytes},
                  {"segments", stats.segments}};
    } else {
      j["log"] = nullptr;
    }
    nlohmann::json slot_list = nlohmann::json::array();
    for (const auto& s : slots->slots) slot_list.push_back(slot_json(s));
    j["slots"] = slot_list;
    j["slots_source"] = slots->source;
    nlohmann::json consumer_list = nlohmann::json::array();
    for (const auto& c : consumers) {
      consumer_list.push_back({{"pid", c.pid},
                               {"application_name", c.application_name},
                               {"client_addr", json_or_null(c.client_addr)},
                               {"state", c.state},
                               {"sent_lsn", json_or_null(c.sent_lsn)},
                               {"flush_lsn", json_or_null(c.flush_lsn)},
                               {"slot_name", json_or_null(c.slot_name)}});
    }
    // Unknown (null) when a running server could not be asked.
    j["consumers"] = server->running && !relay ? nlohmann::json(nullptr) : consumer_list;
    if (rate) {
      j["capture_rate"] = {
          {"window_seconds", kRateWindowSeconds},
          {"transactions", rate->transactions},
          {"changes", rate->changes},
          {"messages", rate->messages},
          {"transactions_per_second", static_cast<double>(rate->transactions) / kRateWindowSeconds},
          {"changes_per_second", static_cast<double>(rate->changes) / kRateWindowSeconds},
          {"method", method}};
    } else {
      j["capture_rate"] = nullptr;
    }
    if (nats) {
      (*nats)["lag_bytes"] = nats_lag ? nlohmann::json(*nats_lag) : nlohmann::json(nullptr);
      // Written by a publisher that is not running now: its state is history.
      (*nats)["current"] = server->running && nats->value("pid", 0) == server->pid;
      j["nats"] = *nats;
    } else {
      j["nats"] = nullptr;
    }
    if (followed) {
      j["follower"] = {{"stream", followed->stream},
                       {"log_id", followed->log_id},
                       {"stream_seq", followed->stream_seq}};
    } else {
      j["follower"] = nullptr;
    }
    j["warnings"] = warnings;
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
    return server->running ? 0 : admin::kExitNotRunning;
  }

  std::printf("pgrelay status of data directory \"%s\"\n\n", dir.c_str());
  if (server->running) {
    std::printf("server:        running (pid %d)\n", server->pid);
    std::printf("url:           %s\n", url.empty() ? "(not written yet)" : shown_url.c_str());
  } else {
    std::printf("server:        not running (no pgrelay serve holds %s/%s)\n", dir.c_str(),
                admin::kPidFileName);
  }
  std::printf("captured databases: %s\n", captured.empty() ? "none yet" : join(captured).c_str());
  if (!left_out.empty()) {
    std::printf("left out:      %s (captured before, not by --capture-database now; logs kept)\n",
                join(left_out).c_str());
  }
  if (changelog && !stats.newest_lsn.is_valid()) {
    std::printf("log head:      %s (no transaction captured yet)\n",
                changelog->last_end_lsn().to_string().c_str());
    std::printf("log size:      %s\n", log::format_size(stats.total_bytes).c_str());
  } else if (changelog) {
    std::printf("log head:      %s (last commit %s at %s)\n",
                changelog->last_end_lsn().to_string().c_str(), stats.newest_lsn.to_string().c_str(),
                stats.newest_time == 0 ? "-" : format_pg_time(stats.newest_time).c_str());
    std::printf("log size:      %s in %" PRIu64 " segment%s, oldest LSN %s\n",
                log::format_size(stats.total_bytes).c_str(), stats.segments,
                stats.segments == 1 ? "" : "s", stats.oldest_lsn.to_string().c_str());
  } else {
    std::printf("log:           none yet\n");
  }
  if (rate) {
    std::printf("capture rate:  %s transactions/s, %s changes/s (%" PRIu64 " transactions, %" PRIu64
                " changes, %" PRIu64 " non-transactional messages committed in the last %d s)\n",
                rate_text(rate->transactions).c_str(), rate_text(rate->changes).c_str(),
                rate->transactions, rate->changes, rate->messages, kRateWindowSeconds);
    std::printf("               computed from the %s\n", method);
  }

  if (nats) {
    const bool current = server->running && nats->value("pid", 0) == server->pid;
    std::printf("nats:          %s stream %s at %s: published through %s%s%s\n",
                current ? nats->value("state", std::string("?")).c_str() : "not running;",
                nats->value("stream", std::string("?")).c_str(),
                nats->value("servers", std::string("?")).c_str(),
                nats->value("published_commit_lsn", std::string("?")).c_str(),
                nats_lag ? (", lag " + log::format_size(*nats_lag)).c_str() : "",
                current ? "" : (" as of " + nats->value("written_at", std::string("?"))).c_str());
    const std::string error = nats->value("last_error", std::string());
    if (!error.empty()) std::printf("               last error: %s\n", error.c_str());
  }

  if (followed) {
    std::printf("follower:      of JetStream stream %s (the primary's log %" PRIu64
                "): the log holds the stream through sequence %" PRIu64 "\n",
                followed->stream.c_str(), followed->log_id, followed->stream_seq);
  }

  const char* where = slots->source == "server" ? "from the server"
                      : server->running         ? "as last persisted in the data directory"
                                                : "from the data directory";
  std::printf("\nReplication slots (%s)\n", where);
  std::vector<std::vector<std::string>> slot_rows;
  for (const auto& s : slots->slots) slot_rows.push_back(slot_cells(s));
  admin::print_table(std::cout,
                     {"slot_name", "plugin", "temporary", "active", "active_pid", "restart_lsn",
                      "confirmed_flush_lsn", "wal_status", "lag_bytes", "lag_seconds"},
                     slot_rows,
                     {false, false, false, false, true, false, false, false, true, true});

  std::printf("\nConsumers (pg_stat_replication)\n");
  if (!server->running) {
    std::printf("none: the server is not running\n");
  } else if (!relay) {
    std::printf("unknown: the server could not be asked\n");
  } else {
    std::vector<std::vector<std::string>> rows;
    for (const auto& c : consumers) {
      rows.push_back({std::to_string(c.pid), c.application_name, c.client_addr.value_or(""),
                      c.state, c.sent_lsn.value_or(""), c.flush_lsn.value_or(""),
                      c.slot_name.value_or("")});
    }
    admin::print_table(
        std::cout,
        {"pid", "application_name", "client_addr", "state", "sent_lsn", "flush_lsn", "slot_name"},
        rows, {true});
  }
  std::cout.flush();
  return server->running ? 0 : admin::kExitNotRunning;
}

}  // namespace

Subcommand add_status_command(CLI::App& parent) {
  auto options = std::make_shared<StatusOptions>();
  CLI::App* cmd = parent.add_subcommand(
      "status",
      "Show the state of a pgrelay data directory and of the server using it: whether pgrelay\n"
      "serve runs (its pid and URL, password masked), the change log's head LSN, size and\n"
      "oldest LSN, each replication slot's confirmed_flush_lsn and lag in bytes and seconds,\n"
      "the connected consumers (pg_stat_replication, asked through the server) and the\n"
      "capture rate: transactions and changes per second over the last minute, from the commit\n"
      "times recorded in the log.\n\n"
      "Works without a running server, showing the slots as last persisted.\n"
      "Exit status, as for pg_ctl status: 0 when the server is running, 3 when it is not,\n"
      "4 when the data directory does not exist, 1 on errors.");
  admin::add_target_options(*cmd, options->target);
  cmd->add_flag("--json", options->json, "Print one JSON object instead of text");
  return Subcommand{cmd, [options] { return run_status(*options); }};
}

}  // namespace pgrelay::cli
