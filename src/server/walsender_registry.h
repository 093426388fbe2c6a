// The walsenders running for every database: their pids, pg_stat_replication rows and controls.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "wire/lsn.h"

namespace pgrelay::server {

using wire::Lsn;

// pg_stat_replication's view of one walsender.
struct WalsenderInfo {
  int pid = 0;
  std::string slot;
  std::string user;
  std::string application_name;
  std::string client_addr;
  std::optional<int> client_port;  // none for a Unix socket
  std::int64_t backend_start = 0;  // µs since 2000-01-01
  std::string state = "startup";   // startup, catchup, streaming, stopping
  Lsn sent, write, flush, replay;
  std::int64_t reply_time = 0;
};

// Walsender pids are above any real backend pid so that pg_terminate_backend can tell them apart.
inline constexpr int kFirstWalsenderPid = 1 << 30;

// One per server, whatever database a walsender streams: pids are unique across them, and
// pg_stat_replication lists them all, as Postgres's do. Thread-safe; the callbacks given to
// add() run on the caller's thread, outside the registry's lock, and the mirror sync blocks.
class WalsenderRegistry {
 public:
  int allocate_pid() { return next_pid_.fetch_add(1); }

  // `terminate` ends the walsender at once (pg_terminate_backend); `stop` asks it to send what
  // it has, end the stream with CopyDone and close (server shutdown).
  void add(const WalsenderInfo& info, std::function<void()> terminate, std::function<void()> stop);
  void update(const WalsenderInfo& info);
  void remove(int pid);
  std::vector<WalsenderInfo> list() const;
  // Ends the walsender with this pid; false if there is none.
  bool terminate(int pid);
  // Asks every walsender to finish gracefully; new ones are refused from now on.
  void stop_all();
  bool stopping() const { return stopping_.load(); }

  // Called after slots or walsenders changed, e.g. to refresh the upstream mirror of
  // pg_replication_slots. Set both listeners before sessions start.
  void on_change(std::function<void()> listener) { change_listener_ = std::move(listener); }
  void changed() {
    if (change_listener_) change_listener_();
  }
  // Blocking: returns once the effects of earlier changed() calls are visible to clients of
  // the upstream (the pg_replication_slots mirror), so a slot command's result is never ahead
  // of what SQL sees.
  void on_mirror_sync(std::function<void()> sync) { mirror_sync_ = std::move(sync); }
  void sync_mirror() const {
    if (mirror_sync_) mirror_sync_();
  }

 private:
  struct Running {
    WalsenderInfo info;
    std::function<void()> terminate;
    std::function<void()> stop;
  };
  std::atomic<int> next_pid_{kFirstWalsenderPid};
  std::atomic<bool> stopping_{false};
  mutable std::mutex mu_;  // running_
  std::map<int, Running> running_;
  std::function<void()> change_listener_;
  std::function<void()> mirror_sync_;
};

}  // namespace pgrelay::server
