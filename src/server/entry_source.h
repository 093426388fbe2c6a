// Where a walsender's next log entry comes from: its log cursor, or links in the shared cache.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>

#include "log/change_log.h"
#include "server/entry_encoder.h"

namespace pgrelay::server {

// Sessions with the same view read the same entries. A session that reads two entries in a row
// from its cursor links them in the cache (EncodedEntryCache::link); a session whose last entry
// has a cached successor takes it from the cache, metadata and frames, without reading the log.
// With many consumers on one backlog, one of them reads and encodes and the rest only copy
// frames. The cursor, left behind meanwhile, is brought level when the links run out: by
// reading past the entries taken from the cache when they are few, else by a new cursor at
// the next commit LSN (a seek through the log's index instead of a scan).
class EntrySource {
 public:
  struct Next {
    log::EntryMeta meta;
    // Set when the entry came from the cache: its data was not read, and must not be read,
    // from cursor().
    std::shared_ptr<const EncodedEntry> cached;
  };
  // Entries taken from the cache beyond which a new cursor replaces reading past them.
  static constexpr std::size_t kReadPastLimit = 64;

  EntrySource(log::ChangeLog& log, std::unique_ptr<log::Cursor> cursor, EncodedEntryCache& cache)
      : log_(log), cursor_(std::move(cursor)), cache_(cache) {}

  // The entry after the last one returned, looked up through `view_id`'s cache entries;
  // nullopt when the log shows nothing more yet.
  Result<std::optional<Next>> next(std::uint64_t view_id);
  // Reads the data of an entry next() returned without `cached`.
  log::Cursor& cursor() { return *cursor_; }
  // Entries taken from the cache so far (for tests and metrics).
  std::size_t taken_from_cache() const { return taken_from_cache_; }

 private:
  Status bring_cursor_level();

  log::ChangeLog& log_;
  std::unique_ptr<log::Cursor> cursor_;
  EncodedEntryCache& cache_;
  Lsn last_commit_;                // commit LSN of the last entry returned
  Lsn last_end_;                   // its end LSN: the cache key of its successor link
  std::size_t cursor_behind_ = 0;  // entries returned from the cache since the cursor's last
  std::size_t taken_from_cache_ = 0;
};

}  // namespace pgrelay::server
