// What the admin page shows of a running pgrelay, and what its buttons do: the bridge between
// the admin server (admin/) and the relay's parts.
#include "cli/admin_view.h"

#include <chrono>
#include <filesystem>
#include <map>
#include <thread>

namespace pgrelay::cli {

std::vector<AdminView::Database> AdminView::databases() const {
  std::vector<Database> out;
  if (sources_.captures != nullptr) {
    for (const auto& db : sources_.captures->figures()) {
      out.push_back(
          {db.database, db.mode, db.head.value(), db.log.total_bytes, db.capture.transactions});
    }
  }
  if (sources_.followed != nullptr) {
    auto& followed = *sources_.followed;
    out.push_back({followed.database(), "follower", followed.log().last_end_lsn().value(),
                   followed.log().stats().total_bytes, followed.figures().entries});
  }
  return out;
}

void AdminView::sample() {
  admin::StatusSample sample;
  sample.time = std::chrono::system_clock::now();
  for (const auto& db : databases()) {
    sample.captured_transactions += db.transactions;
    sample.heads[db.name] = db.head;
  }
  if (sources_.hubs != nullptr) {
    for (const auto& slot : sources_.hubs->slots().list()) {
      const std::uint64_t head = sample.heads[slot.database];
      const std::uint64_t confirmed = slot.confirmed_flush.value();
      sample.slot_lag[slot.name] = head > confirmed ? head - confirmed : 0;
    }
  }
  history_.add(std::move(sample));
}

nlohmann::json AdminView::status() const {
  const auto now = std::chrono::system_clock::now();
  nlohmann::json out;
  out["upstream"] = sources_.upstream;
  out["private_postgres"] = sources_.private_postgres;
  std::map<std::string, std::uint64_t> heads;
  std::string modes;
  nlohmann::json databases = nlohmann::json::array();
  for (const auto& db : this->databases()) {
    heads[db.name] = db.head;
    if (modes.find(db.mode) == std::string::npos) modes += (modes.empty() ? "" : ", ") + db.mode;
    databases.push_back({{"database", db.name},
                         {"capture_mode", db.mode},
                         {"head_lsn", wire::Lsn(db.head).to_string()},
                         {"log_bytes", db.log_bytes},
                         {"captured_transactions", db.transactions}});
  }
  out["capture_mode"] = modes.empty() ? sources_.capture_mode : modes;
  out["databases"] = std::move(databases);
  nlohmann::json slots = nlohmann::json::array();
  if (sources_.hubs != nullptr) {
    const auto walsenders = sources_.hubs->walsenders().list();
    for (const auto& slot : sources_.hubs->slots().list()) {
      const std::uint64_t head = heads[slot.database];
      const std::uint64_t confirmed = slot.confirmed_flush.value();
      nlohmann::json consumers = nlohmann::json::array();
      for (const auto& w : walsenders) {
        if (w.slot != slot.name) continue;
        consumers.push_back({{"pid", w.pid},
                             {"user", w.user},
                             {"application_name", w.application_name},
                             {"client_addr", w.client_addr},
                             {"state", w.state},
                             {"sent_lsn", w.sent.to_string()},
                             {"flush_lsn", w.flush.to_string()}});
      }
      slots.push_back({{"name", slot.name},
                       {"database", slot.database},
                       {"active", slot.active_pid != 0},
                       {"temporary", slot.temporary},
                       {"lost", slot.is_lost()},
                       {"confirmed_flush_lsn", slot.confirmed_flush.to_string()},
                       {"lag_bytes", head > confirmed ? head - confirmed : 0},
                       {"lag_seconds", history_.lag_seconds(slot.database, confirmed, now)},
                       {"consumers", std::move(consumers)}});
    }
  }
  out["slots"] = std::move(slots);
  if (sources_.zero != nullptr) {
    const auto zero = sources_.zero->figures();
    out["zero"] = {{"state", zero.state},
                   {"pid", zero.pid},
                   {"starts", zero.starts},
                   {"url", zero.url},
                   {"replica_file", sources_.zero_replica_file}};
  } else {
    out["zero"] = nullptr;
  }
  out["time"] =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count();
  return out;
}

std::optional<std::vector<std::string>> AdminView::logs(const std::string& source,
                                                        std::size_t lines,
                                                        const std::string& filter) const {
  if (source == "pgrelay") {
    return sources_.pgrelay_log != nullptr ? sources_.pgrelay_log->last(lines, filter)
                                           : std::vector<std::string>{};
  }
  if (source == "postgres") {
    if (!sources_.private_postgres) {
      return std::vector<std::string>{
          "(pgrelay serves an upstream it did not start: its log is on its own server)"};
    }
    return tail_file(sources_.data_dir + "/pg/postgresql.log", lines, filter);
  }
  if (source == "zero-cache") {
    if (sources_.zero == nullptr) return std::vector<std::string>{"(no zero-cache runs here)"};
    return tail_file(sources_.data_dir + "/zero/zero-cache.log", lines, filter);
  }
  return std::nullopt;
}

Result<nlohmann::json> AdminView::drop_zero_state() const {
  nlohmann::json dropped = nlohmann::json::array();
  const std::string prefix = sources_.zero_app_id + "_";
  for (const auto& slot : sources_.hubs->slots().list()) {
    if (!slot.name.starts_with(prefix)) continue;
    // zero-cache has just stopped: its walsender may take a moment to let the slot go.
    Status st = sources_.hubs->slots().drop(slot.name);
    for (int i = 0; !st.ok() && i < 100; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      st = sources_.hubs->slots().drop(slot.name);
    }
    if (!st.ok()) return st.error();
    dropped.push_back(slot.name);
  }
  std::error_code ec;
  bool removed = false;
  for (const char* suffix : {"", "-wal", "-wal2", "-shm"}) {
    removed |= std::filesystem::remove(sources_.zero_replica_file + suffix, ec);
  }
  return nlohmann::json{{"dropped_slots", std::move(dropped)}, {"replica_removed", removed}};
}

admin::AdminHandlers AdminView::handlers() {
  admin::AdminHandlers out;
  out.status = [this] { return status(); };
  out.history = [this] { return history_.to_json(); };
  out.logs = [this](const std::string& source, std::size_t lines, const std::string& filter) {
    return logs(source, lines, filter);
  };
  if (sources_.zero != nullptr) {
    out.restart_zero = [this]() -> Result<nlohmann::json> {
      PGRELAY_TRY(sources_.zero->restart());
      return nlohmann::json{{"restarted", true}};
    };
    out.reset_zero = [this]() -> Result<nlohmann::json> {
      nlohmann::json result;
      Status restarted = sources_.zero->restart([&]() -> Status {
        auto dropped = drop_zero_state();
        if (!dropped.ok()) return dropped.error();
        result = std::move(*dropped);
        return {};
      });
      if (!restarted.ok()) return restarted.error();
      result["reset"] = true;
      return result;
    };
  }
  return out;
}

}  // namespace pgrelay::cli
