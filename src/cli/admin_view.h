// What the admin page shows of a running pgrelay, and what its buttons do: the bridge between
// the admin server (admin/) and the relay's parts.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "admin/admin_server.h"
#include "admin/status_history.h"
#include "base/line_tail.h"
#include "cli/database_captures.h"
#include "cli/followed_database.h"
#include "server/replication_hubs.h"
#include "zero/zero_supervisor.h"

namespace pgrelay::cli {

// The parts it reads; each may be null where this pgrelay has none. All must outlive it.
struct AdminSources {
  std::string upstream;      // described, without a password
  std::string capture_mode;  // as asked: trigger, native, auto, or follower
  std::string data_dir;
  bool private_postgres = false;
  const DatabaseCaptures* captures = nullptr;
  FollowedDatabase* followed = nullptr;
  server::ReplicationHubs* hubs = nullptr;
  zero::ZeroSupervisor* zero = nullptr;
  std::string zero_replica_file;  // ZERO_REPLICA_FILE, for reset
  std::string zero_app_id;        // ZERO_APP_ID (default "zero"): its slots are APP_*
  const LineTail* pgrelay_log = nullptr;
};

class AdminView {
 public:
  explicit AdminView(AdminSources sources) : sources_(std::move(sources)) {}

  // Called once a second: a sample for the charts.
  void sample();
  // The handlers the admin server serves.
  admin::AdminHandlers handlers();

  nlohmann::json status() const;
  std::optional<std::vector<std::string>> logs(const std::string& source, std::size_t lines,
                                               const std::string& filter) const;
  // Reset zero, while zero-cache is stopped: its slots and its replica file go.
  Result<nlohmann::json> drop_zero_state() const;

 private:
  struct Database {
    std::string name;
    std::string mode;
    std::uint64_t head = 0;
    std::uint64_t log_bytes = 0;
    std::uint64_t transactions = 0;
  };
  std::vector<Database> databases() const;

  AdminSources sources_;
  admin::StatusHistory history_;
};

}  // namespace pgrelay::cli
