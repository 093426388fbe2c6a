// Upstream backends whose clients left, reset and kept for the next session that asks the same.
#pragma once

#include <asio/steady_timer.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "server/metrics.h"
#include "server/session_start.h"
#include "upstream/upstream_login.h"

namespace pgrelay::server {

// A new upstream backend costs a fork, a login and warming its caches: measured with pgbench,
// fresh backends spent about a third more CPU per short transaction (62-66 against 47 us)
// than ones that had served earlier sessions. Like pgbouncer's session mode, pgrelay can keep
// a backend whose client ended its session cleanly (Terminate, no reply owed, no transaction
// open) and give it to the next session of the same database and startup parameters; the
// upstream user is pgrelay's own, so those two decide everything a backend was started with.
//
// Before a backend is kept, DISCARD ALL resets what its last session changed: settings, SET
// ROLE and SET SESSION AUTHORIZATION, prepared statements, cursors, temporary tables, LISTEN,
// advisory locks, cached plans and sequence state. What it does not reset stays, as it does
// behind pgbouncer: placeholder settings of extensions' prefixes (`SET app.x`) read back as ''
// rather than unknown, and the backend keeps its pid and backend_start.
//
// One thread (the io thread) uses the pool; it holds no lock.
class BackendPool {
 public:
  struct Settings {
    // How long a backend waits unused before it is closed; above zero.
    std::chrono::milliseconds idle_timeout{std::chrono::seconds(60)};
    // Backends kept at most, over all databases: beyond it, one more is closed, not kept.
    std::size_t capacity = 64;
    // How long DISCARD ALL may take before the backend is closed instead.
    std::chrono::milliseconds reset_timeout{std::chrono::seconds(5)};
  };

  BackendPool(asio::any_io_executor executor, Settings settings, Metrics* metrics = nullptr);
  ~BackendPool();
  BackendPool(const BackendPool&) = delete;
  BackendPool& operator=(const BackendPool&) = delete;

  // Closes backends idle longer than the timeout, from now on.
  void start();
  // Closes every backend kept, and keeps none given after: the server shuts down.
  void stop();

  // A kept backend for `database` and `parameters`, the most recently used first, with the
  // ParameterStatus values it reported last. One that its upstream closed or wrote to meanwhile
  // (a FATAL for idle_session_timeout or pg_terminate_backend) is closed and skipped.
  std::optional<upstream::UpstreamLink> take(const std::string& database,
                                             const StartupParameters& parameters);
  // A backend whose client left cleanly: reset and kept, or closed if the reset fails, times
  // out, or the pool is full or stopped.
  upstream::awaitable<void> give_back(std::string database, StartupParameters parameters,
                                      upstream::UpstreamLink link);
  // Closes the backends kept for `database`, which the upstream would count as in use by the
  // statements of databases_used_alone (DROP DATABASE and others).
  void close_database(const std::string& database);

  std::size_t size() const { return size_; }
  // Sessions given a kept backend so far.
  std::uint64_t reused() const { return reused_; }

 private:
  struct Key {
    std::string database;
    StartupParameters parameters;  // sorted by name
    auto operator<=>(const Key&) const = default;
  };
  struct Kept {
    upstream::UpstreamLink link;
    std::chrono::steady_clock::time_point since;
  };

  static Key key_of(std::string database, StartupParameters parameters);
  static void close(upstream::UpstreamLink& link);
  void close_idle();
  void schedule_sweep();
  void count_size();

  Settings settings_;
  // The pool's series, looked up once (null without metrics): updated once per session.
  Gauge* kept_gauge_ = nullptr;
  Counter* reused_counter_ = nullptr;
  asio::steady_timer sweep_;
  std::map<Key, std::vector<Kept>> kept_;  // each vector oldest first
  std::size_t size_ = 0;
  std::uint64_t reused_ = 0;
  bool stopped_ = false;
};

}  // namespace pgrelay::server
