// What every session of one server shares: settings, authentication, upstream, replication.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "base/logger.h"
#include "server/auth.h"
#include "server/metrics.h"
#include "server/primary_facts.h"
#include "server/replication_hubs.h"
#include "server/shutdown_signal.h"
#include "server/sql_rewrite.h"
#include "upstream/upstream_config.h"
#include "wire/backend_messages.h"

namespace pgrelay::server {

class BackendPool;
class RelayLoop;

// Values pgrelay reports for the replication settings it owns.
struct ReplicationSettings {
  std::chrono::milliseconds wal_sender_timeout{60000};
  int max_wal_senders = 10;
  int max_replication_slots = 10;
  // How often a walsender behind the log head logs its progress.
  std::chrono::milliseconds catch_up_report_interval{10000};
};

// Maps the cancel keys pgrelay hands out to what they cancel.
class CancelRegistry {
 public:
  // A fresh random secret for `pid`, remembered with the upstream key it stands for (nullopt
  // for sessions pgrelay answers itself).
  wire::BackendKeyData issue(int pid, std::optional<wire::BackendKeyData> upstream);
  void forget(const wire::BackendKeyData& key);
  // The upstream key behind a client's CancelRequest, if the key is one we issued.
  std::optional<wire::BackendKeyData> lookup(int pid, int secret) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<int, int>, std::optional<wire::BackendKeyData>> keys_;
};

// Rewrites a statement that names virtualized catalog objects, for a session of a user with or
// without the REPLICATION right, of pg_dump or not; nullopt leaves it unchanged.
using SqlRewrite =
    std::function<std::optional<std::string>(std::string_view, const StatementSource&)>;

struct ServerContext {
  // Where ordinary sessions go; none on a follower started without --upstream, whose
  // replication sessions answer from primary_facts alone.
  std::optional<upstream::UpstreamConfig> upstream;
  asio::ssl::context* upstream_tls = nullptr;  // client side, for sslmode
  asio::ssl::context* server_tls = nullptr;    // our side; nullptr answers SSLRequest with N
  AuthConfig auth;
  // Replication of the upstream's databases; null: this server answers no replication.
  ReplicationHubs* hubs = nullptr;
  // A follower's: replication sessions answer from these rather than from an upstream
  // connection, opened then only for SQL (primary_facts.h). Null on a primary.
  PrimaryFacts* primary_facts = nullptr;
  SqlRewrite rewrite;
  // Where plain-socket pass-through sessions run once logged in; null: on the io thread.
  RelayLoop* relay_loop = nullptr;
  // Where a pass-through session's upstream backend goes when its client leaves cleanly, and
  // where a new session looks first; null: every session logs in anew and ends its backend.
  BackendPool* backend_pool = nullptr;
  CancelRegistry cancels;
  // Triggered on the io thread when the server shuts down: pass-through sessions then end as
  // soon as no reply is in flight.
  ShutdownSignal shutdown;
  ReplicationSettings settings;
  // Both optional (null: nothing is logged, nothing counted). When set, they must outlive the
  // io_context the sessions run on (declare them before it): a session's frame destroyed with
  // the io_context still logs its disconnection and updates the open-sessions gauge.
  Logger* logger = nullptr;
  Metrics* metrics = nullptr;
};

// Accounts for an ErrorResponse pgrelay itself sends a client (not one the upstream sends
// through a session): counted by SQLSTATE. One that ends the session is logged: a protocol
// violation as a warning (and counted as a session closed for it), others at info. Internal
// errors (class XX) are logged as errors whether or not the session ends.
// Authentication failures are the caller's to log. `host` is the client's address, if known.
void note_error_sent(ServerContext& context, const Error& error, bool ends_session,
                     std::string_view host = {});

}  // namespace pgrelay::server
