// Test support: a real PG15 upstream and a pgrelay Server running in-process on its own thread.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <thread>

#include "pg_server.h"
#include "server/server.h"
#include "server/tls_setup.h"
#include "wire/scram.h"

namespace pgrelay::test {

struct RelayOptions {
  bool tls = false;
  std::string client_password = "relay-secret";
};

// Upstream role `app` (password "app-pw", SCRAM over TCP), pgrelay user `app` with
// RelayOptions::client_password, listening on an ephemeral loopback port.
class RelayHarness {
 public:
  explicit RelayHarness(PgServer& pg, RelayOptions options = {}) : pg_(pg) {
    pg_.create_role("app", std::string("app-pw"), "CREATEDB");
    pg_.add_hba_lines({"host all app 127.0.0.1/32 scram-sha-256"});
    pg_.exec("GRANT ALL ON DATABASE postgres TO app; GRANT ALL ON SCHEMA public TO app");
    auto upstream = upstream::UpstreamConfig::parse("postgresql://app:app-pw@127.0.0.1:" +
                                                    std::to_string(pg_.port()) +
                                                    "/postgres?sslmode=disable");
    if (!upstream.ok()) throw PgError(upstream.error().message);
    context_.upstream = *upstream;
    auto verifier = wire::ScramVerifier::from_password(options.client_password);
    context_.auth.users.push_back({"app", verifier->to_string(), true});
    context_.auth.mock_secret = Bytes(32, 7);
    if (options.tls) {
      dir_ = std::filesystem::temp_directory_path() / ("pgrelay-tls-" + std::to_string(::getpid()));
      std::filesystem::create_directories(dir_);
      std::string cert = (dir_ / "server.crt").string(), key = (dir_ / "server.key").string();
      auto made = server::ensure_self_signed_certificate(cert, key, "pgrelay-test");
      if (!made.ok()) throw PgError(made.error().message);
      auto tls = server::make_server_tls(cert, key);
      if (!tls.ok()) throw PgError(tls.error().message);
      tls_ = std::move(*tls);
      context_.server_tls = tls_.get();
    }
    server_ = std::make_unique<server::Server>(io_, context_);
    auto bound = server_->listen("127.0.0.1", 0);
    if (!bound.ok()) throw PgError(bound.error().message);
    port_ = bound->port();
    server_->start();
    thread_ = std::thread([this] { io_.run(); });
  }
  ~RelayHarness() {
    asio::post(io_, [this] {
      server_->stop();
      io_.stop();
    });
    thread_.join();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  int port() const { return port_; }
  std::string conninfo(const std::string& extra = {}) const {
    return "host=127.0.0.1 port=" + std::to_string(port_) +
           " dbname=postgres user=app password=relay-secret " + extra;
  }
  server::ServerContext& context() { return context_; }

 private:
  PgServer& pg_;
  asio::io_context io_;
  server::ServerContext context_;
  std::unique_ptr<asio::ssl::context> tls_;
  std::unique_ptr<server::Server> server_;
  std::filesystem::path dir_;
  int port_ = 0;
  std::thread thread_;
};

}  // namespace pgrelay::test
