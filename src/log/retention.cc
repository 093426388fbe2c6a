// Retention: picks the removal point from slots and limits, invalidates loudly, removes, lags.
#include "log/retention.h"

#include <algorithm>
#include <limits>

#include "log/manifest.h"

namespace pgrelay::log {

namespace {

// The sealed segments, oldest first: only they can be removed.
Result<std::vector<SegmentInfo>> sealed_segments(const ChangeLog& log) {
  std::vector<SegmentInfo> sealed;
  for (const SegmentInfo& s : log.segments()) {
    if (!s.sealed) break;
    sealed.push_back(s);
  }
  return sealed;
}

// The LSN that makes remove_before drop exactly segments[0, count).
std::optional<Lsn> removal_point_for(const std::vector<SegmentInfo>& segments, std::size_t count) {
  if (count == 0) return std::nullopt;
  Lsn last;
  for (std::size_t i = 0; i < count; ++i) last = std::max(last, segments[i].last_lsn);
  // Only empty segments: nothing in them can be needed, and any removal takes them along.
  if (!last.is_valid()) return std::nullopt;
  return last + 1;
}

std::string format_duration(std::chrono::microseconds d) {
  auto us = d.count();
  if (us % 1'000'000 == 0) return std::to_string(us / 1'000'000) + " s";
  if (us % 1'000 == 0) return std::to_string(us / 1'000) + " ms";
  return std::to_string(us) + " µs";
}

struct Forced {
  std::optional<Lsn> point;  // segments with every entry below this must go
  LostCause cause = LostCause::kNone;
  std::string limit_text;  // "max_bytes (10 GB)"
  std::string exceeded_text;
  std::string hint;
};

}  // namespace

std::string format_size(std::uint64_t bytes) {
  constexpr std::uint64_t kLimit = 10 * 1024;
  static constexpr const char* kUnits[] = {"kB", "MB", "GB", "TB", "PB"};
  if (bytes < kLimit) return std::to_string(bytes) + " bytes";
  // Count in half units so the final division rounds half up, as pg_size_pretty does.
  std::uint64_t halves = bytes >> 9;
  for (std::size_t i = 0;; ++i) {
    if (halves < 2 * kLimit || i + 1 == std::size(kUnits)) {
      return std::to_string((halves + 1) / 2) + " " + kUnits[i];
    }
    halves >>= 10;
  }
}

Result<RetentionReport> enforce_retention(ChangeLog& log, SlotRegistry& slots,
                                          const RetentionOptions& options, std::int64_t now) {
  // Deletion is judged by persisted positions; flushing first makes those as recent as
  // possible, so a batching persist policy costs no extra retained data.
  PGRELAY_TRY(slots.flush());

  RetentionReport report;
  LogStats before = log.stats();
  report.segments_before = before.segments;
  report.bytes_before = before.total_bytes;

  auto sealed = sealed_segments(log);
  if (!sealed.ok()) return sealed.take_error();
  const std::vector<SegmentInfo>& segs = *sealed;

  std::vector<Forced> forced;
  if (options.max_bytes > 0) {
    std::uint64_t total = before.total_bytes;
    std::size_t count = 0;
    while (total > options.max_bytes && count < segs.size()) total -= segs[count++].bytes;
    Forced f;
    f.point = removal_point_for(segs, count);
    f.cause = LostCause::kMaxBytes;
    f.limit_text = "max_bytes (" + format_size(options.max_bytes) + ")";
    f.exceeded_text = "the log exceeded " + f.limit_text;
    f.hint =
        "Its consumer fell too far behind and the changes it still needed were removed. Drop the "
        "slot, create it again and resynchronize the consumer; raise max_bytes to tolerate "
        "longer consumer outages.";
    forced.push_back(std::move(f));
  }
  if (options.max_age.count() > 0) {
    std::int64_t cutoff = now - static_cast<std::int64_t>(options.max_age.count());
    std::size_t count = 0;
    while (count < segs.size() && segs[count].last_time < cutoff) ++count;
    Forced f;
    f.point = removal_point_for(segs, count);
    f.cause = LostCause::kMaxAge;
    f.limit_text = "max_age (" + format_duration(options.max_age) + ")";
    f.exceeded_text = "the changes it needs are older than " + f.limit_text;
    f.hint =
        "Its consumer fell too far behind and the changes it still needed were removed. Drop the "
        "slot, create it again and resynchronize the consumer; raise max_age to tolerate "
        "longer consumer outages.";
    forced.push_back(std::move(f));
  }

  // Invalidate (and persist that) before removing anything: a crash in between must leave
  // the slot marked lost, never a slot that resumes across a gap.
  std::optional<Lsn> forced_point;
  for (const Forced& f : forced) {
    if (!f.point) continue;
    forced_point = forced_point ? std::max(*forced_point, *f.point) : *f.point;
    std::vector<std::string> victims;
    std::vector<RetentionWarning> warnings;
    for (const SlotHold& hold : slots.holds()) {
      if (!options.database.empty() && hold.database != options.database) continue;
      if (hold.position >= *f.point) continue;
      victims.push_back(hold.name);
      warnings.push_back({"replication slot \"" + hold.name + "\" is lost: it needs " +
                              hold.position.to_string() + " but " + f.exceeded_text,
                          f.hint});
    }
    if (victims.empty()) continue;
    std::string reason =
        f.exceeded_text + "; changes before " + f.point->to_string() + " were removed";
    PGRELAY_TRY(slots.mark_lost(victims, f.cause, reason));
    report.lost_slots.insert(report.lost_slots.end(), victims.begin(), victims.end());
    report.warnings.insert(report.warnings.end(), warnings.begin(), warnings.end());
  }

  std::optional<Lsn> point = slots.min_persisted_confirmed(options.database);
  if (!point && !options.keep_all_without_slots) {
    point = Lsn(std::numeric_limits<std::uint64_t>::max());
  }
  if (forced_point) point = point ? std::max(*point, *forced_point) : *forced_point;

  if (point) {
    PGRELAY_TRY(log.remove_before(*point));
    report.removed_before = *point;
  }
  LogStats after = log.stats();
  report.segments_after = after.segments;
  report.bytes_after = after.total_bytes;
  return report;
}

Result<SlotLag> slot_lag(ChangeLog& log, const Slot& slot, std::int64_t now) {
  SlotLag lag;
  lag.name = slot.name;
  lag.confirmed_flush = slot.confirmed_flush;
  Lsn end = log.last_end_lsn();
  lag.bytes = end > slot.confirmed_flush ? end - slot.confirmed_flush : 0;
  if (slot.is_lost()) return lag;
  auto cursor = log.open_cursor(slot.confirmed_flush);
  if (!cursor.ok()) return lag;  // the position was removed: its age is unknown
  auto entry = (*cursor)->next_entry();
  if (!entry.ok()) return entry.take_error();
  if (!entry->has_value()) {
    lag.seconds = 0.0;
    return lag;
  }
  std::int64_t micros = std::max<std::int64_t>(0, now - (*entry)->commit_time);
  lag.seconds = static_cast<double>(micros) / 1e6;
  return lag;
}

Result<std::vector<SlotLag>> slot_lags(ChangeLog& log, const SlotRegistry& slots,
                                       std::int64_t now) {
  std::vector<SlotLag> out;
  for (const Slot& slot : slots.list()) {
    auto lag = slot_lag(log, slot, now);
    if (!lag.ok()) return lag.take_error();
    out.push_back(std::move(*lag));
  }
  return out;
}

}  // namespace pgrelay::log
