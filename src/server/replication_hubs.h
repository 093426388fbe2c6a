// The replication hubs of the upstream's databases: which may be captured, which are, and
// starting capture of one when a session first needs it.
#pragma once

#include <asio.hpp>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/result.h"
#include "log/change_log.h"
#include "log/slots.h"
#include "server/replication_hub.h"
#include "server/walsender_registry.h"
#include "upstream/upstream_config.h"

namespace pgrelay::server {

// Which databases pgrelay may capture: the upstream URL's always, and those named (or all).
class CaptureScope {
 public:
  // `names` as --capture-database gives them; "*" admits every database.
  CaptureScope(std::string always, std::vector<std::string> names);
  bool admits(const std::string& database) const;
  // What pgrelay says where it may not capture: SQLSTATE 55000, and the option that would.
  Error refusal(const std::string& database) const;

 private:
  std::string always_;
  bool all_ = false;
  std::set<std::string> names_;
};

// A database's log and capture, started by whoever knows how (the command line); `owner`
// keeps both alive and stops the capture when released.
struct CapturedParts {
  log::ChangeLog* log = nullptr;
  CaptureLink* capture = nullptr;
  std::shared_ptr<void> owner;
  // Transactions capture shows before they commit (native capture); may be null.
  log::InProgressTransactions* in_progress = nullptr;
};
// Blocking: starts capturing `database` (its log opened or created).
using CaptureStarter = std::function<Result<CapturedParts>(const std::string& database)>;
// Blocking: readies a database for sessions (pgrelay's virtual catalog there); told whether
// pgrelay captures it, or why not.
using DatabasePreparer =
    std::function<void(const std::string& database, const std::optional<Error>& refusal)>;

// Blocking: pgrelay lets go of a database (its catalog there): it is about to be dropped.
using DatabaseForgetter = std::function<void(const std::string& database)>;

class ReplicationHubs {
 public:
  ReplicationHubs(asio::any_io_executor executor, asio::thread_pool& blocking,
                  log::SlotRegistry& slots, upstream::UpstreamConfig upstream, CaptureScope scope,
                  CaptureStarter start, DatabasePreparer prepare = {},
                  DatabaseForgetter forget = {});
  // Hubs go first, then what they use (captures, logs).
  ~ReplicationHubs();
  ReplicationHubs(const ReplicationHubs&) = delete;
  ReplicationHubs& operator=(const ReplicationHubs&) = delete;

  // Blocking: the hub of `database`, its capture started first if it has none yet and the
  // scope admits it; the scope's refusal otherwise, or the error that stopped the capture.
  Result<ReplicationHub*> open(const std::string& database);
  // Blocking: what a session in `database` needs before its first statement: capture started
  // where the scope admits it, then the preparer run there once, told whether pgrelay
  // captures it (a failure to start is the preparer's to report, never the session's; open()
  // tries again). A database that does not exist is left to the session's own login.
  void prepare(const std::string& database);
  // Whether prepare() has nothing left to do for `database` (any thread).
  bool prepared(const std::string& database) const;
  // Blocking: before DROP DATABASE, stops capturing `database` and forgets it (its
  // connections would keep the drop from happening), unless a slot of pgrelay's is in it or a
  // replication session uses it: then it stays, and the upstream refuses the drop as in use, as
  // Postgres refuses to drop a database with slots. The URL's database always stays. A later
  // session there (the drop failed, or a new database of that name) starts capture afresh.
  // True when it was let go.
  bool release(const std::string& database);
  // A replication session holds this while it runs in `database`, which then stays (any
  // thread). The token may outlive the hubs: a session frame destroyed with the io_context
  // after them still lets go of it safely.
  std::shared_ptr<void> use(const std::string& database);
  // The hub of a database being captured, or null (any thread).
  ReplicationHub* find(const std::string& database) const;
  // The databases being captured, in name order (any thread).
  std::vector<std::string> captured() const;
  const CaptureScope& scope() const { return scope_; }

  log::SlotRegistry& slots() { return slots_; }
  WalsenderRegistry& walsenders() { return walsenders_; }
  asio::thread_pool& blocking() { return blocking_; }
  const upstream::UpstreamConfig& upstream() const { return upstream_; }

 private:
  struct Captured {
    CapturedParts parts;
    std::unique_ptr<ReplicationHub> hub;
  };

  asio::any_io_executor executor_;
  asio::thread_pool& blocking_;
  log::SlotRegistry& slots_;
  upstream::UpstreamConfig upstream_;
  CaptureScope scope_;
  CaptureStarter start_;
  DatabasePreparer prepare_;
  DatabaseForgetter forget_;
  WalsenderRegistry walsenders_;
  std::mutex start_mu_;    // one start or preparation at a time (held while it blocks)
  mutable std::mutex mu_;  // the maps below
  std::map<std::string, Captured> captured_;
  std::set<std::string> prepared_;
  // Replication sessions per database, shared with their use() tokens.
  struct Users {
    std::mutex mu;
    std::map<std::string, int> count;
  };
  std::shared_ptr<Users> users_ = std::make_shared<Users>();
};

}  // namespace pgrelay::server
