// Keeps one database's virtual catalog in step with pgrelay: the slot and walsender mirror, the
// log head, whether pgrelay captures it, and the requests clients make through it.
#pragma once

#include <asio.hpp>

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/result.h"
#include "log/slots.h"
#include "server/replication_hubs.h"
#include "upstream/virtual_catalog.h"

namespace pgrelay::cli {

// On a thread of its own (libpq blocks). Every database's worker mirrors every slot and
// walsender, as each database's pg_replication_slots lists them all on Postgres.
class CatalogWorker {
 public:
  CatalogWorker(std::unique_ptr<upstream::VirtualCatalog> catalog, std::string conninfo,
                std::string database, asio::io_context& io, server::ReplicationHubs& hubs);
  ~CatalogWorker();
  CatalogWorker(const CatalogWorker&) = delete;
  CatalogWorker& operator=(const CatalogWorker&) = delete;

  // Takes the slots and walsenders as they are now, to write them (any thread).
  void refresh();
  // Blocks until every refresh() and set_capture_refusal() before the call is written upstream
  // (bounded: a broken upstream connection must not hang a replication command).
  void flush();
  // Whether pgrelay captures this database (nullopt) or why not; any thread.
  void set_capture_refusal(std::optional<Error> refusal);
  // Ends the worker's thread and closes its connection (the database is about to be dropped).
  // The object stays usable by what the io thread still has queued for it; it writes nothing.
  void stop();

 private:
  struct Snapshot {
    std::vector<log::Slot> slots;
    std::vector<server::WalsenderInfo> walsenders;
  };

  void loop();
  void reconnect();
  void write_mirror(const Snapshot& snapshot);
  // On the io thread: carry out what clients asked through the catalog functions.
  void apply(const std::vector<upstream::CatalogRequest>& requests);

  std::unique_ptr<upstream::VirtualCatalog> catalog_;
  std::string conninfo_;
  std::string database_;
  asio::io_context& io_;
  server::ReplicationHubs& hubs_;
  std::mutex mu_;
  std::condition_variable written_cv_;
  std::optional<Snapshot> pending_;
  std::optional<std::optional<Error>> pending_refusal_;
  std::optional<Error> refusal_;  // the last one asked for, rewritten after a reconnect
  std::uint64_t requested_ = 0;   // refresh() and set_capture_refusal() calls so far
  std::uint64_t written_ = 0;     // the newest of them written upstream
  bool stopping_ = false;
  // What the upstream mirror holds, to write only what changed (catalog thread only).
  std::map<std::string, std::string> mirrored_slots_;
  std::string mirrored_walsenders_ = "-";
  bool mirror_reconciled_ = false;
  std::thread thread_;
};

}  // namespace pgrelay::cli
