// Where a walsender's next log entry comes from: its log cursor, or links in the shared cache.
#include "server/entry_source.h"

namespace pgrelay::server {

Result<std::optional<EntrySource::Next>> EntrySource::next(std::uint64_t view_id) {
  if (last_end_.is_valid()) {
    if (auto followed = cache_.follow(view_id, last_end_)) {
      last_commit_ = followed->meta.commit_lsn;
      last_end_ = followed->meta.end_lsn;
      ++cursor_behind_;
      ++taken_from_cache_;
      return std::optional<Next>(Next{std::move(followed->meta), std::move(followed->entry)});
    }
  }
  if (cursor_behind_ > 0) PGRELAY_TRY(bring_cursor_level());
  auto meta = cursor_->next_entry();
  if (!meta.ok()) return meta.take_error();
  if (!meta->has_value()) return std::optional<Next>();
  // The cursor returns entries in log order and checkpoints never: the last entry returned
  // (however it came) and this one are neighbours.
  if (last_end_.is_valid()) cache_.link(view_id, last_end_, **meta);
  last_commit_ = (*meta)->commit_lsn;
  last_end_ = (*meta)->end_lsn;
  return std::optional<Next>(Next{std::move(**meta), nullptr});
}

Status EntrySource::bring_cursor_level() {
  if (cursor_behind_ <= kReadPastLimit) {
    for (;;) {
      auto meta = cursor_->next_entry();
      if (!meta.ok()) return meta.take_error();
      if (!meta->has_value() || (*meta)->commit_lsn > last_commit_) {
        return Error::make(sqlstate::kInternalError,
                           "the log does not hold the cached entry at " + last_commit_.to_string());
      }
      if ((*meta)->commit_lsn == last_commit_) break;
    }
  } else {
    // Commit LSNs strictly increase: the first entry at or after the next one is the successor.
    auto cursor = log_.open_cursor(Lsn(last_commit_.value() + 1));
    if (!cursor.ok()) return cursor.take_error();
    cursor_ = std::move(*cursor);
  }
  cursor_behind_ = 0;
  return {};
}

}  // namespace pgrelay::server
