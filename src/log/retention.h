// Retention of the change log: removes segments no slot needs, enforces size and age limits.
//
// A sealed segment is removed only when every non-lost slot has confirmed past all of its
// entries, judged by the slots' PERSISTED confirmed positions (the registry is flushed first),
// so a crash can never bring back a position whose data is gone.
//
// When no slot holds data (there are none, or all are lost) the log is kept whole by default;
// RetentionOptions::keep_all_without_slots = false removes every sealed segment instead.
//
// Limits, like Postgres's max_slot_wal_keep_size: when the log exceeds max_bytes, or sealed
// segments hold only entries older than max_age, the oldest segments are removed anyway. The
// slots that still needed them are first marked lost (persisted, so the mark survives a crash
// and the slot can never stream with a silent gap) and named in the report's warnings, which
// the caller must log at WARNING level. The active segment is never removed, and removal is
// per segment: max_age never removes an entry younger than max_age, so the oldest retained
// entry may be up to one segment older than the limit; max_bytes may likewise stay exceeded by
// at most the active segment's size.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/result.h"
#include "log/change_log.h"
#include "log/slots.h"

namespace pgrelay::log {

struct RetentionOptions {
  bool keep_all_without_slots = true;
  std::uint64_t max_bytes = 0;           // total log bytes; 0 = no limit
  std::chrono::microseconds max_age{0};  // age of the oldest retained entry; 0 = no limit
  // The database this log captures: only its slots hold it, and only they can be lost by its
  // limits (the registry holds every database's slots). Empty: every slot.
  std::string database;
};

// A message the caller must log at WARNING level, with a hint.
struct RetentionWarning {
  std::string message;
  std::string hint;
};

struct RetentionReport {
  Lsn removed_before;  // what was passed to ChangeLog::remove_before; invalid if not called
  std::uint64_t segments_before = 0;
  std::uint64_t segments_after = 0;
  std::uint64_t bytes_before = 0;
  std::uint64_t bytes_after = 0;
  std::vector<std::string> lost_slots;  // slots this run invalidated
  std::vector<RetentionWarning> warnings;
};

// One retention pass. `now` is µs since 2000-01-01 (the log's commit-time clock).
Result<RetentionReport> enforce_retention(ChangeLog& log, SlotRegistry& slots,
                                          const RetentionOptions& options,
                                          std::int64_t now = now_pg_micros());

// How far a slot's consumer is behind the log.
struct SlotLag {
  std::string name;
  Lsn confirmed_flush;
  std::uint64_t bytes = 0;  // log's last end LSN minus confirmed_flush (0 when caught up)
  // now minus the commit time of the first unconfirmed entry; 0 when caught up; nullopt when
  // unknown (the slot is lost or its position was removed).
  std::optional<double> seconds;
};

Result<SlotLag> slot_lag(ChangeLog& log, const Slot& slot, std::int64_t now = now_pg_micros());
// Lag of every slot, ordered by name.
Result<std::vector<SlotLag>> slot_lags(ChangeLog& log, const SlotRegistry& slots,
                                       std::int64_t now = now_pg_micros());

// "10 GB", "512 kB", "100 bytes": sizes as pg_size_pretty prints them.
std::string format_size(std::uint64_t bytes);

}  // namespace pgrelay::log
