// Upstream views and functions answering for pgrelay's slots, walsenders and settings.
#pragma once

#include <libpq-fe.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "wire/lsn.h"

namespace pgrelay::upstream {

// One row of pg_replication_slots (PG 15 columns); `database` is resolved to datoid upstream.
struct SlotRow {
  std::string slot_name;
  std::string plugin = "pgoutput";
  std::string slot_type = "logical";
  std::string database;  // empty: NULL datoid (physical slots)
  bool temporary = false;
  bool active = false;
  std::optional<std::int32_t> active_pid;
  std::optional<std::uint32_t> xmin;
  std::optional<std::uint32_t> catalog_xmin;
  std::optional<wire::Lsn> restart_lsn;
  std::optional<wire::Lsn> confirmed_flush_lsn;
  std::string wal_status = "reserved";  // empty: NULL
  std::optional<std::int64_t> safe_wal_size;
  bool two_phase = false;
};

// One row of pg_stat_replication (PG 15 columns); `usename` is resolved to usesysid upstream.
struct WalsenderRow {
  std::int32_t pid = 0;  // pgrelay's walsender pids are >= kFirstWalsenderPid
  std::string usename;
  std::string application_name;
  std::optional<std::string> client_addr;  // inet text; nullopt for unix sockets
  std::optional<std::string> client_hostname;
  std::optional<std::int32_t> client_port;  // -1 for unix sockets, as Postgres
  std::chrono::system_clock::time_point backend_start{};
  std::optional<std::uint32_t> backend_xmin;
  std::string state = "streaming";
  std::optional<wire::Lsn> sent_lsn;
  std::optional<wire::Lsn> write_lsn;
  std::optional<wire::Lsn> flush_lsn;
  std::optional<wire::Lsn> replay_lsn;
  std::optional<std::chrono::microseconds> write_lag;
  std::optional<std::chrono::microseconds> flush_lag;
  std::optional<std::chrono::microseconds> replay_lag;
  std::int32_t sync_priority = 0;
  std::string sync_state = "async";
  std::optional<std::chrono::system_clock::time_point> reply_time;
  std::string slot_name;  // not a pg_stat_replication column; empty: none
};

// The settings pgrelay answers for (current_setting, SHOW, pg_settings).
struct CatalogSettings {
  std::int32_t max_replication_slots = 10;
  std::int32_t max_wal_senders = 10;
  std::int32_t wal_sender_timeout_ms = 60000;
};

// Something a client asked for through the virtual catalog, for pgrelay to carry out.
struct CatalogRequest {
  enum class Kind { kCreateSlot, kDropSlot, kTerminate };
  std::int64_t id = 0;  // increasing in request order
  Kind kind = Kind::kCreateSlot;
  std::string slot_name;  // create_slot, drop_slot
  std::string plugin;     // create_slot
  bool temporary = false;
  bool two_phase = false;
  std::int32_t pid = 0;          // terminate: the walsender pid; otherwise 0
  wire::Lsn lsn;                 // create_slot: the LSN returned to the client
  std::int32_t backend_pid = 0;  // the upstream backend that asked (temporary slots die with it)
};

// pids at or above this are pgrelay walsenders; pg_terminate_backend routes them to pgrelay.
inline constexpr std::int32_t kFirstWalsenderPid = 1073741824;

// Installs and feeds the virtual catalog in one upstream schema over one libpq connection
// (blocking; use from one thread). The objects belong to the connecting role; clients get
// SELECT/EXECUTE through PUBLIC. Slot creation, drop and walsender termination by clients are
// recorded as requests (and NOTIFY) for pgrelay to take.
class VirtualCatalog {
 public:
  // 2: privilege checks as Postgres's, relay_/denied_ entry points, pg_publication_tables.
  // 3: the dump_ views pg_dump's sessions read. 4: catalog_is_walsender_pid.
  // 5: catalog_server.refusal (databases pgrelay does not capture).
  static constexpr int kVersion = 5;

  // Connects (08000 with libpq's message on failure) and LISTENs for requests.
  static Result<std::unique_ptr<VirtualCatalog>> open(std::string conninfo, std::string schema);
  ~VirtualCatalog();
  VirtualCatalog(const VirtualCatalog&) = delete;
  VirtualCatalog& operator=(const VirtualCatalog&) = delete;

  // Creates the schema (when missing) and every object; idempotent; an older version is replaced
  // (state is kept only when the version matches: pgrelay refills it), a newer one refused.
  Status install();
  // Drops every object install() created, and the schema when nothing else is left in it.
  Status uninstall();

  Status upsert_slot(const SlotRow& slot);
  Status remove_slot(std::string_view slot_name);
  // Removes every mirrored slot not named here: rows left by a run that ended before it could
  // remove them (a slot dropped while pgrelay was stopped).
  Status retain_slots(const std::vector<std::string>& slot_names);
  // Replaces all walsender rows.
  Status set_walsenders(const std::vector<WalsenderRow>& walsenders);
  // pgrelay's log head: pg_current_wal_*lsn() answer at least this.
  Status set_log_head(wire::Lsn head);
  // nullopt while pgrelay captures this database: slots may be created through the catalog and
  // wal_level reads logical. Otherwise pg_create_logical_replication_slot raises `refusal`'s
  // message and hint with SQLSTATE 55000, and wal_level reads the upstream's own setting.
  // A fresh installation refuses until this is called.
  Status set_capture_refusal(const std::optional<Error>& refusal);
  Status set_settings(const CatalogSettings& settings);

  // Reads and deletes the pending requests, oldest first.
  Result<std::vector<CatalogRequest>> take_requests();
  // Returns true when a request was notified (possibly before this call), false after
  // `timeout` without one.
  Result<bool> wait_for_requests(std::chrono::milliseconds timeout);

  const std::string& schema() const { return schema_; }
  // The NOTIFY channel requests are announced on.
  const std::string& channel() const { return channel_; }

 private:
  VirtualCatalog(PGconn* conn, std::string schema, std::string channel);

  PGconn* conn_;
  std::string schema_;
  std::string channel_;
};

}  // namespace pgrelay::upstream
