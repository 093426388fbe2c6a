// The composition root of `pgrelay serve`: its parts, owned in start order, stopped in reverse.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <asio.hpp>
#include <asio/ssl.hpp>

#include "admin/admin_server.h"
#include "base/background_thread.h"
#include "base/hop_trace.h"
#include "base/line_tail.h"
#include "base/logger.h"
#include "base/result.h"
#include "cli/admin_view.h"
#include "cli/database_captures.h"
#include "cli/followed_database.h"
#include "cli/pid_file.h"
#include "cli/serve_command.h"
#include "cli/serve_plan.h"
#include "log/slots.h"
#include "nats/publisher.h"
#include "server/backend_pool.h"
#include "server/metrics.h"
#include "server/metrics_endpoint.h"
#include "server/relay_loop.h"
#include "server/replication_hubs.h"
#include "server/server.h"
#include "server/server_context.h"
#include "server/sql_rewrite.h"
#include "upstream/embedded_postgres.h"
#include "upstream/upstream_config.h"
#include "zero/zero_supervisor.h"

namespace pgrelay::cli {

// Each part is a member, declared in the order the parts start, so that they are destroyed in
// reverse: nothing outlives what it uses. start() builds them one by one, each step a small
// function that returns a Status; a failure leaves the parts started so far to the destructor.
// run() serves until SIGINT or SIGTERM, then shuts down as Postgres does.
class Relay {
 public:
  // `options`, `logger` and `log_tail` (the last lines `logger` wrote, for the admin page;
  // may be null) must outlive the relay.
  static Result<std::unique_ptr<Relay>> start(const ServeOptions& options, ServePlan plan,
                                              Logger& logger, const LineTail* log_tail = nullptr);
  ~Relay();
  Relay(const Relay&) = delete;
  Relay& operator=(const Relay&) = delete;

  // Serves until a signal, then stops the parts that run on the loop; returns the exit status.
  int run();

 private:
  // The serve loop. After run() it can destroy the work it still holds (the coroutine frames
  // of sessions that were mid-wait when it stopped) while the hubs, logs and registries those
  // frames point into are still there; left to its own destructor, that would happen after.
  class Loop : public asio::io_context {
   public:
    // One thread runs it (run()); others only post to it. The hint lets completions that
    // happen on that thread skip the scheduler's lock (two per pass-through round trip).
    Loop() : asio::io_context(1) {}
    void drop_pending_work() { shutdown(); }
  };

  Relay(const ServeOptions& options, ServePlan plan, Logger& logger, const LineTail* log_tail);
  // The steps of start(), in order.
  Status start_upstream();
  // A follower started without --upstream: nothing to pass ordinary sessions to.
  bool upstream_absent() const { return plan_.follow && !plan_.upstream; }
  std::string upstream_description() const;
  Status open_slots();
  Status start_captures();
  // --follow, instead of start_captures(): the log rebuilt from the primary's stream.
  Status start_follower();
  Status start_publisher();
  Status configure_sessions();
  Status install_catalog();
  Status start_listener();
  Status start_metrics();
  void handle_signals();
  // "pgrelay ready: URL" on stdout and in the pid file, and the ready log line.
  void announce_ready();
  // `pgrelay zero`: zero-cache, once clients can connect.
  Status start_zero();
  // --admin: the admin page, and the sampler behind its charts.
  Status start_admin();
  // The host a client on this machine connects to (loopback for a wildcard --listen), and
  // the URL it connects to `database` with.
  std::string client_host() const;
  std::string client_url(const std::string& database) const;
  // Shutdown: stop accepting, let walsenders end their streams with CopyDone and pass-through
  // sessions finish the reply in flight (then FATAL 57P01, as Postgres), close what is left
  // after a few seconds, and stop the loop.
  void shut_down();
  void wait_for_sessions();

  const ServeOptions& options_;
  ServePlan plan_;
  Logger& logger_;
  const LineTail* log_tail_;  // the last lines logger_ wrote; may be null
  server::Metrics metrics_;   // before the loop: sessions it still holds count their end
  std::optional<PidFile> pid_file_;
  // Without --upstream, pgrelay serves a private PostgreSQL of its own. It stops last, once
  // nothing of pgrelay uses it.
  std::unique_ptr<upstream::EmbeddedPostgres> embedded_;
  upstream::UpstreamConfig upstream_;
  std::unique_ptr<log::SlotRegistry> slots_;
  Loop io_;
  asio::thread_pool blocking_{4};
  std::unique_ptr<HopTrace> hop_trace_;  // --hop-trace; the logs, capture and walsenders stamp it
  std::unique_ptr<DatabaseCaptures> captures_;  // null in a follower
  std::shared_ptr<FollowedDatabase> followed_;  // --follow; the hubs share it
  std::unique_ptr<server::ReplicationHubs> hubs_;
  // --nats: publishes the URL's database's log, which the hubs hold.
  std::unique_ptr<nats::Publisher> publisher_;
  std::unique_ptr<asio::ssl::context> server_tls_;
  std::unique_ptr<asio::ssl::context> upstream_tls_;
  server::SqlRewriter rewriter_;
  // Plain-socket pass-through sessions, once logged in. Stopped after io_ has stopped: what it
  // still holds goes back to the session coroutines, which io_ then drops. Destroyed before io_.
  server::RelayLoop relay_loop_;
  // --pool-idle-timeout: upstream backends kept between pass-through sessions. On io_.
  std::unique_ptr<server::BackendPool> backend_pool_;
  server::ServerContext context_;
  std::unique_ptr<server::Server> server_;
  std::unique_ptr<server::MetricsEndpoint> metrics_endpoint_;
  asio::signal_set signals_{io_, SIGINT, SIGTERM};
  asio::steady_timer shutdown_timer_{io_};
  std::chrono::steady_clock::time_point shutdown_deadline_ =
      std::chrono::steady_clock::time_point::max();
  int port_ = 0;  // where the listener bound
  // `pgrelay zero`: started last, stopped first, while pgrelay still serves its sessions.
  std::unique_ptr<zero::ZeroSupervisor> zero_;
  std::string zero_replica_file_;
  std::string zero_app_id_;
  // --admin: what it shows, sampled once a second, and the server; stopped before the rest.
  std::unique_ptr<AdminView> admin_view_;
  BackgroundThread admin_sampler_;
  std::unique_ptr<admin::AdminServer> admin_;
};

}  // namespace pgrelay::cli
