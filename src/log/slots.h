// The persisted registry of logical replication slots: names, positions, owners, lost state.
//
// The registry lives in one file, `slots`, in the log directory, replaced atomically (temp
// file, fsync, rename, fsync of the directory) on every persisted change.
//
// Durability of confirmed positions (SlotRegistryOptions::persist_every / persist_interval):
// confirm() always updates memory at once; it persists only every `persist_every` confirms or
// once `persist_interval` has passed since the last write, and flush() persists on demand. A
// confirmed position lost in a crash is never data loss: the slot merely resumes from an older
// position and the consumer receives a few transactions again (which it must tolerate anyway,
// as with Postgres). This holds because retention deletes log data only up to
// min_persisted_confirmed(): positions that are on disk, so a crash cannot resurrect a
// position whose data was already removed. Creating, dropping and losing a slot always persist
// at once.
//
// Temporary slots are never written to the file, so they vanish on restart, as in Postgres.
// Since no crash can bring back an older position of theirs, retention honours their
// in-memory position.
//
// Times are microseconds since 2000-01-01 00:00:00 UTC, Postgres's epoch, like commit times
// in the log. The active PID is runtime state and is not persisted.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/bytes.h"
#include "base/result.h"
#include "wire/lsn.h"

namespace pgrelay::log {

using wire::Lsn;

// Why a slot was invalidated by retention.
enum class LostCause : std::uint8_t {
  kNone = 0,
  kMaxBytes = 1,  // the log exceeded its size limit (Postgres: max_slot_wal_keep_size)
  kMaxAge = 2,    // the slot's unconfirmed data exceeded the age limit
};

struct Slot {
  std::string name;
  std::string plugin;    // output plugin, e.g. "pgoutput"
  std::string database;  // database name the slot decodes
  bool temporary = false;
  bool two_phase = false;
  Lsn confirmed_flush;          // consumer has everything that ends at or before this
  Lsn restart_lsn;              // where streaming resumes; advances with confirmed_flush
  std::int64_t created_at = 0;  // µs since 2000-01-01; create() fills in now when 0
  int active_pid = 0;           // 0 = inactive; runtime only
  LostCause lost = LostCause::kNone;
  std::string lost_reason;  // human-readable, for logs and pg_replication_slots-like views

  bool is_lost() const { return lost != LostCause::kNone; }
  bool operator==(const Slot&) const = default;
};

struct SlotRegistryOptions {
  // Postgres's max_replication_slots: temporary and persistent slots both count.
  std::size_t max_slots = 10;
  // confirm() persists after this many unpersisted confirms; 1 = every confirm (one fsync
  // each), 0 = only through flush() or persist_interval.
  std::uint32_t persist_every = 1;
  // confirm() also persists when the last write is older than this; 0 = no time trigger.
  std::chrono::milliseconds persist_interval{0};
};

inline constexpr const char* kSlotsFileName = "slots";
// NAMEDATALEN - 1.
inline constexpr std::size_t kMaxSlotNameLength = 63;

// Checks a name as Postgres's ReplicationSlotValidateName does, with its error texts.
Status validate_slot_name(std::string_view name);

// Microseconds since 2000-01-01 00:00:00 UTC, now.
std::int64_t now_pg_micros();

// The registry file's format: "PGRSLOTS", version u32, count u32, slots, CRC-32C u32 of all
// that precedes it. Integers big-endian. `path` names the file in errors.
Bytes serialize_slots(const std::vector<Slot>& persistent_slots);
Result<std::vector<Slot>> parse_slots(ByteView data, const std::string& path);

// What one non-lost slot keeps from removal: retention may delete entries below `position`.
struct SlotHold {
  std::string name;
  std::string database;
  Lsn position;
};

class SlotRegistry {
 public:
  // Loads `dir`/slots (an absent file means no slots yet), creating `dir` if needed.
  static Result<std::unique_ptr<SlotRegistry>> open(std::string dir,
                                                    SlotRegistryOptions options = {});
  SlotRegistry(const SlotRegistry&) = delete;
  SlotRegistry& operator=(const SlotRegistry&) = delete;

  // Adds a slot (persisting it unless temporary). Lost state in `slot` is ignored; its
  // active_pid is kept, so a session may create and own a slot in one step.
  Status create(Slot slot);
  // Removes a slot; refused while it is active. Lost slots can be dropped.
  Status drop(std::string_view name);
  std::optional<Slot> get(std::string_view name) const;
  // All slots, ordered by name.
  std::vector<Slot> list() const;
  std::size_t size() const;

  // Advances confirmed_flush (and restart_lsn with it); an older `lsn` is ignored, as
  // Postgres ignores a feedback message that moves backwards. Persists per the policy.
  Status confirm(std::string_view name, Lsn lsn);
  // Persists unpersisted confirms now; a no-op when there are none.
  Status flush();

  // Marks the slot in use by `pid`; 55006 if another PID holds it. Re-acquiring by the same
  // PID succeeds. Lost slots can be acquired (to inspect or drop them); check_usable() says
  // whether they can stream.
  Status acquire(std::string_view name, int pid);
  // Marks the slot inactive; 42704 if it does not exist.
  Status release(std::string_view name);

  // 42704 if the slot does not exist, 55000 if it is lost; ok if it can stream changes.
  Status check_usable(std::string_view name) const;

  // Marks slots lost with a cause and reason and persists that before returning: a lost mark
  // must be on disk before the data it protected is removed.
  Status mark_lost(const std::vector<std::string>& names, LostCause cause,
                   const std::string& reason);

  // The position below which no non-lost slot needs data: the minimum, over persistent slots,
  // of the confirmed_flush last written to disk, and over temporary slots, of their current
  // confirmed_flush. nullopt when no non-lost slot exists. Non-empty `database`: its slots only.
  std::optional<Lsn> min_persisted_confirmed(const std::string& database = {}) const;
  // The same positions per non-lost slot, ordered by name.
  std::vector<SlotHold> holds() const;

  const std::string& path() const { return path_; }

 private:
  struct Entry {
    Slot slot;
    Lsn persisted_confirmed;  // confirmed_flush as last written to disk (persistent slots)
  };

  SlotRegistry(std::string dir, SlotRegistryOptions options);
  Status persist_locked();
  Status persist_if_due_locked();

  std::string dir_;
  std::string path_;
  SlotRegistryOptions options_;
  mutable std::mutex mu_;
  std::map<std::string, Entry, std::less<>> slots_;
  std::uint32_t unpersisted_confirms_ = 0;
  std::chrono::steady_clock::time_point last_persist_;
};

}  // namespace pgrelay::log
