// What `serve` keeps for each captured database of the upstream: its directory, log, capture
// and virtual catalog, started when ReplicationHubs asks.
#pragma once

#include <asio.hpp>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "base/hop_trace.h"
#include "base/logger.h"
#include "base/result.h"
#include "cli/capture_link.h"
#include "cli/catalog_worker.h"
#include "cli/serve_command.h"
#include "log/change_log.h"
#include "server/replication_hubs.h"
#include "upstream/asio_reading_loop.h"
#include "upstream/upstream_config.h"

namespace pgrelay::cli {

// The capture mode asked for: trigger, native or auto.
std::string capture_mode(const ServeOptions& options);

// Where a database's log, spill files and capture state live: DATA_DIR itself for the
// upstream URL's database (as before pgrelay captured more than one), DATA_DIR/databases/NAME
// for the others, NAME percent-encoded outside [A-Za-z0-9_-].
std::string capture_dir(const std::string& data_dir, const std::string& first_database,
                        const std::string& database);

// DATA_DIR/databases.json: every database captured so far and its directory, for the next
// start and for `pgrelay status`.
struct CapturedDatabaseEntry {
  std::string name;
  std::string dir;  // relative to DATA_DIR; "" is DATA_DIR itself
  // Whether the last start's --capture-database admits it; false: left out, its log kept.
  bool in_scope = true;
};
std::vector<CapturedDatabaseEntry> read_captured_databases(const std::string& data_dir);

// What /metrics shows of one captured database.
struct DatabaseFigures {
  std::string database;
  std::string mode;  // "trigger" or "native"
  CaptureFigures capture;
  log::LogStats log;
  wire::Lsn head;
};

class DatabaseCaptures {
 public:
  // `hop_trace` (may be null) goes to every database's log; it outlives this.
  DatabaseCaptures(const ServeOptions& options, upstream::UpstreamConfig upstream,
                   asio::io_context& io, Logger& logger, HopTrace* hop_trace = nullptr);
  // Workers first (they read the hubs), then the captures they outlive.
  ~DatabaseCaptures();
  DatabaseCaptures(const DatabaseCaptures&) = delete;
  DatabaseCaptures& operator=(const DatabaseCaptures&) = delete;

  // The hubs the catalog workers mirror; set once, before the first prepare().
  void attach(server::ReplicationHubs& hubs) { hubs_ = &hubs; }

  // server::CaptureStarter: opens the database's log and starts its capture (blocking).
  Result<server::CapturedParts> start(const std::string& database);
  // server::DatabasePreparer: installs the virtual catalog there on first use, starts its
  // worker, and writes whether pgrelay captures the database (blocking; waits until written).
  void prepare(const std::string& database, const std::optional<Error>& refusal);

  // server::DatabaseForgetter: before DROP DATABASE (no slot of pgrelay's is there, and its
  // capture has stopped), closes the catalog worker's connection there, drops native capture's
  // upstream slot in it (which would otherwise keep the drop from happening, or outlive a
  // failed one holding WAL), removes its directory, whose log no slot needs, and takes it off
  // DATA_DIR/databases.json. A later session there captures it afresh.
  void forget(const std::string& database);

  // Slots or walsenders changed (io thread): every database's mirror follows.
  void refresh_all();
  // Blocks until every mirror has what refresh_all() asked before the call.
  void flush_all();
  // Databases captured by an earlier run, to start again now.
  std::vector<std::string> captured_before() const;
  // Records which of them this run's scope admits (for `pgrelay status`).
  Status note_scope(const server::CaptureScope& scope);
  // Every running capture's figures (io thread).
  std::vector<DatabaseFigures> figures() const;
  // Stops the catalog workers (before the hubs they read go).
  void stop_workers();
  // io_ no longer runs: native captures read their streams on their own threads again, so that
  // blocking work still waiting on them (a slot's sync, a snapshot export) can finish. Any
  // thread.
  void leave_loop();

 private:
  struct Running {
    std::unique_ptr<log::ChangeLog> log;
    log::InProgressTransactions in_progress;  // native capture's, for walsenders
    std::unique_ptr<ServeCapture> capture;
    ~Running() { capture.reset(); }  // the capture writes to the log: it stops first
  };
  Result<server::CapturedParts> start_capture_of(const std::string& database);
  Status remember(const std::string& database, const std::string& dir);
  Status write_index(const std::vector<CapturedDatabaseEntry>& entries);

  const ServeOptions& options_;
  upstream::UpstreamConfig upstream_;
  asio::io_context& io_;
  // Native capture reads its stream on io_, the walsenders' loop (asio_reading_loop.h).
  std::shared_ptr<capture::ReadingLoop> reading_loop_ =
      std::make_shared<upstream::AsioReadingLoop>(io_.get_executor());
  Logger& logger_;
  HopTrace* hop_trace_;
  server::ReplicationHubs* hubs_ = nullptr;
  mutable std::mutex mu_;
  std::mutex index_mu_;  // DATA_DIR/databases.json
  std::map<std::string, std::weak_ptr<Running>> running_;
  std::map<std::string, std::uint64_t> log_ids_;  // each started database's log system id
  std::map<std::string, std::unique_ptr<CatalogWorker>> workers_;
  // Stopped workers of forgotten databases: the io thread may still hold work for them.
  std::vector<std::unique_ptr<CatalogWorker>> retired_;
};

}  // namespace pgrelay::cli
