// Test support: a real PG15 upstream and a pgrelay Server running in-process on its own thread.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <memory>
#include <string_view>
#include <thread>

#include "log/change_log.h"
#include "log/slots.h"
#include "pg_server.h"
#include "server/backend_pool.h"
#include "server/relay_loop.h"
#include "server/replication_hubs.h"
#include "server/server.h"
#include "server/tls_setup.h"
#include "wire/scram.h"

namespace pgrelay::test {

// Stands in for the capture in server tests that feed the log directly: exports a real upstream
// snapshot and calls everything in the log so far "before" it.
class DirectCaptureLink final : public server::CaptureLink {
 public:
  DirectCaptureLink(std::string conninfo, log::ChangeLog& log)
      : conninfo_(std::move(conninfo)), log_(log) {}
  Result<server::ExportedSnapshot> export_snapshot() override {
    PGconn* conn = PQconnectdb(conninfo_.c_str());
    std::shared_ptr<PGconn> holder(conn, &PQfinish);
    if (PQstatus(conn) != CONNECTION_OK) return Error::make("08006", PQerrorMessage(conn));
    PGresult* begin = PQexec(conn, "BEGIN ISOLATION LEVEL REPEATABLE READ");
    PQclear(begin);
    PGresult* res = PQexec(conn, "SELECT pg_export_snapshot()");
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
      PQclear(res);
      return Error::make("XX000", PQerrorMessage(conn));
    }
    server::ExportedSnapshot out{holder, PQgetvalue(res, 0, 0), log_.last_end_lsn()};
    PQclear(res);
    return out;
  }
  Result<wire::Lsn> sync() override { return log_.last_end_lsn(); }

 private:
  std::string conninfo_;
  log::ChangeLog& log_;
};

struct RelayOptions {
  bool tls = false;
  bool replication = false;  // a log, slots and a DirectCaptureLink in a temp dir
  std::string client_password = "relay-secret";
  // Plain-socket pass-through sessions run on a RelayLoop, as in `pgrelay serve`. The
  // environment can turn it off (PGRELAY_TEST_RELAY_LOOP=off) to test the io thread's path.
  bool relay_loop = relay_loop_by_default();
  // Above zero: upstream backends are kept between sessions this long (BackendPool).
  std::chrono::milliseconds pool_idle_timeout{0};

  static bool relay_loop_by_default() {
    const char* setting = std::getenv("PGRELAY_TEST_RELAY_LOOP");
    return !(setting && std::string_view(setting) == "off");
  }
};

// Upstream role `app` (password "app-pw", SCRAM over TCP), pgrelay user `app` with
// RelayOptions::client_password, listening on an ephemeral loopback port.
class RelayHarness {
 public:
  explicit RelayHarness(PgServer& pg, RelayOptions options = {}) : pg_(pg) {
    pg_.create_role("app", std::string("app-pw"), "CREATEDB");
    pg_.add_hba_lines({"host all app 127.0.0.1/32 scram-sha-256"});
    pg_.exec("GRANT ALL ON DATABASE postgres TO app; GRANT ALL ON SCHEMA public TO app");
    auto upstream = upstream::UpstreamConfig::parse(
        "postgresql://app:app-pw@127.0.0.1:" + std::to_string(pg_.port()) +
        "/postgres?sslmode=disable");
    if (!upstream.ok()) throw PgError(upstream.error().message);
    context_.upstream = *upstream;
    auto verifier = wire::ScramVerifier::from_password(options.client_password);
    context_.auth.users.push_back({"app", verifier->to_string(), true});
    context_.auth.mock_secret = Bytes(32, 7);
    dir_ =
        std::filesystem::temp_directory_path() /
        ("pgrelay-server-test-" + std::to_string(::getpid()) + "-" + std::to_string(port_seq()++));
    std::filesystem::create_directories(dir_);
    if (options.replication) {
      log::LogOptions log_options;
      log_options.dir = (dir_ / "log").string();
      log_options.sync = log::SyncPolicy::kNone;
      auto opened = log::ChangeLog::open(log_options);
      if (!opened.ok()) throw PgError(opened.error().message);
      log_ = std::move(*opened);
      auto slots = log::SlotRegistry::open(log_options.dir);
      if (!slots.ok()) throw PgError(slots.error().message);
      slots_ = std::move(*slots);
      pool_ = std::make_unique<asio::thread_pool>(2);
      capture_ = std::make_unique<DirectCaptureLink>(context_.upstream->conninfo(), *log_);
      // One captured database, postgres; the others are refused.
      hubs_ = std::make_unique<server::ReplicationHubs>(
          io_.get_executor(), *pool_, *slots_, *context_.upstream,
          server::CaptureScope(context_.upstream->dbname, {}),
          [this](const std::string&) -> Result<server::CapturedParts> {
            return server::CapturedParts{log_.get(), capture_.get(), nullptr};
          });
      auto first = hubs_->open(context_.upstream->dbname);
      if (!first.ok()) throw PgError(first.error().message);
      hub_ = *first;
      context_.hubs = hubs_.get();
      context_.settings.wal_sender_timeout = std::chrono::seconds(10);
    }
    if (options.tls) {
      std::string cert = (dir_ / "server.crt").string(), key = (dir_ / "server.key").string();
      auto made = server::ensure_self_signed_certificate(cert, key, "pgrelay-test");
      if (!made.ok()) throw PgError(made.error().message);
      auto tls = server::make_server_tls(cert, key);
      if (!tls.ok()) throw PgError(tls.error().message);
      tls_ = std::move(*tls);
      context_.server_tls = tls_.get();
    }
    if (options.relay_loop) {
      auto started = relay_loop_.start();
      if (!started.ok()) throw PgError(started.error().message);
      context_.relay_loop = &relay_loop_;
    }
    if (options.pool_idle_timeout.count() > 0) {
      server::BackendPool::Settings pool;
      pool.idle_timeout = options.pool_idle_timeout;
      pool_backends_ = std::make_unique<server::BackendPool>(io_.get_executor(), pool);
      pool_backends_->start();
      context_.backend_pool = pool_backends_.get();
    }
    server_ = std::make_unique<server::Server>(io_, context_);
    auto bound = server_->listen("127.0.0.1", 0);
    if (!bound.ok()) throw PgError(bound.error().message);
    port_ = bound->port();
    server_->start();
    thread_ = std::thread([this] { io_.run(); });
  }
  ~RelayHarness() {
    relay_loop_.stop();  // its sessions go back to the io thread, which ends them below
    asio::post(io_, [this] {
      server_->stop();
      io_.stop();
    });
    thread_.join();
    if (pool_) pool_->join();
    std::filesystem::remove_all(dir_);
  }

  log::ChangeLog& log() { return *log_; }
  log::SlotRegistry& slots() { return *slots_; }
  server::ReplicationHub& hub() { return *hub_; }

  int port() const { return port_; }
  std::string conninfo(const std::string& extra = {}) const {
    return "host=127.0.0.1 port=" + std::to_string(port_) +
           " dbname=postgres user=app password=relay-secret " + extra;
  }
  server::ServerContext& context() { return context_; }
  // What `pgrelay serve` does on SIGTERM before its deadline: stop accepting, tell sessions.
  void begin_shutdown() {
    std::promise<void> done;
    asio::post(io_, [&] {
      server_->stop_accepting();
      context_.shutdown.trigger();
      relay_loop_.recall_all();
      if (pool_backends_) pool_backends_->stop();
      done.set_value();
    });
    done.get_future().get();
  }
  // Upstream backends kept for reuse, read on the io thread.
  std::size_t kept_backends() {
    std::promise<std::size_t> count;
    asio::post(io_, [&] { count.set_value(pool_backends_ ? pool_backends_->size() : 0); });
    return count.get_future().get();
  }
  // Sessions given a kept backend so far, read on the io thread.
  std::uint64_t reused_backends() {
    std::promise<std::uint64_t> count;
    asio::post(io_, [&] { count.set_value(pool_backends_ ? pool_backends_->reused() : 0); });
    return count.get_future().get();
  }
  // Sessions the server holds, read on its io thread.
  std::size_t session_count() {
    std::promise<std::size_t> count;
    asio::post(io_, [&] { count.set_value(server_->session_count()); });
    return count.get_future().get();
  }

 private:
  PgServer& pg_;
  asio::io_context io_;
  // Keeps io_.run() going when no session or acceptor is left (after begin_shutdown()).
  asio::executor_work_guard<asio::io_context::executor_type> work_{io_.get_executor()};
  static int& port_seq() {
    static int seq = 0;
    return seq;
  }
  server::RelayLoop relay_loop_;
  server::ServerContext context_;
  std::unique_ptr<server::BackendPool> pool_backends_;
  std::unique_ptr<log::ChangeLog> log_;
  std::unique_ptr<log::SlotRegistry> slots_;
  std::unique_ptr<asio::thread_pool> pool_;
  std::unique_ptr<DirectCaptureLink> capture_;
  std::unique_ptr<server::ReplicationHubs> hubs_;
  server::ReplicationHub* hub_ = nullptr;
  std::unique_ptr<asio::ssl::context> tls_;
  std::unique_ptr<server::Server> server_;
  std::filesystem::path dir_;
  int port_ = 0;
  std::thread thread_;
};

}  // namespace pgrelay::test
