// The pgoutput messages one log entry yields through a view, built once and shared by every
// walsender with the same view ("encode once, send many").
#include "server/entry_encoder.h"

#include "pgoutput/encoder.h"

namespace pgrelay::server {

EntryEncoder::EntryEncoder(log::ChangeView& view, log::Cursor& cursor, const log::EntryMeta& meta)
    : meta_(meta),
      reader_(view, cursor, meta),
      transactional_(meta.kind == log::EntryKind::kTransaction) {}

EncodedMessage EntryEncoder::encode(PendingMessage pending) {
  EncodedMessage out;
  out.lsn = pending.lsn;
  if (auto* rel = std::get_if<pgoutput::Relation>(&pending.message)) out.oid = rel->oid;
  if (auto* type = std::get_if<pgoutput::Type>(&pending.message)) out.oid = type->oid;
  out.payload = pgoutput::encode(pending.message);
  out.tag = out.payload.empty() ? 0 : static_cast<char>(out.payload[0]);
  return out;
}

Result<std::optional<EncodedMessage>> EntryEncoder::next() {
  auto pending = next_message();
  if (!pending.ok()) return pending.error();
  if (!pending->has_value()) return std::optional<EncodedMessage>();
  return std::optional<EncodedMessage>(encode(std::move(**pending)));
}

Result<std::optional<PendingMessage>> EntryEncoder::next_message() {
  using Out = std::optional<PendingMessage>;
  if (!queue_.empty()) {
    PendingMessage m = std::move(queue_.front());
    queue_.erase(queue_.begin());
    return Out(std::move(m));
  }
  if (done_) return Out();
  auto change = reader_.next();
  if (!change.ok()) return change.error();
  if (change->has_value()) {
    log::Change& c = **change;
    PendingMessage m{c.lsn, log::to_message(std::move(c.message))};
    if (transactional_ && !begun_) {
      begun_ = true;
      queue_.push_back(std::move(m));
      if (!meta_.origin.empty()) {
        queue_.insert(
            queue_.begin(),
            PendingMessage{meta_.begin_lsn, pgoutput::Origin{meta_.origin_lsn, meta_.origin}});
      }
      return Out(PendingMessage{meta_.begin_lsn,
                                pgoutput::Begin{meta_.commit_lsn, meta_.commit_time, meta_.xid}});
    }
    return Out(std::move(m));
  }
  if (reader_.paused()) return Out();
  done_ = true;
  if (transactional_ && reader_.send_entry()) {
    queue_.push_back(PendingMessage{
        meta_.end_lsn, pgoutput::Commit{meta_.commit_lsn, meta_.end_lsn, meta_.commit_time}});
    if (!begun_) {
      begun_ = true;
      return Out(PendingMessage{meta_.begin_lsn,
                                pgoutput::Begin{meta_.commit_lsn, meta_.commit_time, meta_.xid}});
    }
    return next_message();
  }
  return Out();
}

void EncodedEntry::add(const EncodedMessage& m) {
  Message where;
  where.offset = static_cast<std::uint32_t>(frames.size());
  where.size = static_cast<std::uint32_t>(kFrameHeader + m.payload.size());
  where.tag = m.tag;
  where.oid = m.oid;
  // Postgres's walsender sets both XLogData LSNs to the message's; the send time is stamped
  // by each session as it writes the frame.
  wire::append_xlog_data_frame(frames, m.lsn, m.lsn, 0, m.payload);
  messages.push_back(where);
}

std::uint64_t EncodedEntryCache::view_id(const std::string& view_key) {
  return view_ids_.try_emplace(view_key, view_ids_.size()).first->second;
}

EncodedEntryCache::ViewUse::ViewUse(EncodedEntryCache& cache, const std::string& view_key)
    : cache_(&cache), users_(cache.users_), id_(cache.view_id(view_key)) {
  ++(*users_)[id_];
}

void EncodedEntryCache::ViewUse::release() {
  auto it = users_->find(id_);
  if (it != users_->end() && --it->second == 0) users_->erase(it);
}

void EncodedEntryCache::ViewUse::switch_to(const std::string& view_key) {
  const std::uint64_t next = cache_->view_id(view_key);
  if (next == id_) return;
  release();
  id_ = next;
  ++(*users_)[id_];
}

bool EncodedEntryCache::shared(std::uint64_t view_id) const {
  auto it = users_->find(view_id);
  return it != users_->end() && it->second >= 2;
}

std::shared_ptr<const EncodedEntry> EncodedEntryCache::find(std::uint64_t view_id, Lsn end_lsn) {
  auto it = index_.find(Key{view_id, end_lsn.value()});
  if (it == index_.end()) {
    ++misses_;
    return nullptr;
  }
  ++hits_;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->entry;
}

void EncodedEntryCache::insert(std::uint64_t view_id, Lsn end_lsn,
                               std::shared_ptr<const EncodedEntry> entry) {
  if (!entry || entry->bytes() > capacity_) return;
  const Key key{view_id, end_lsn.value()};
  if (index_.contains(key)) return;
  size_ += entry->bytes();
  lru_.push_front(Node{key, std::move(entry), std::nullopt});
  index_[key] = lru_.begin();
  while (size_ > capacity_ && !lru_.empty()) {
    size_ -= lru_.back().entry->bytes();
    index_.erase(lru_.back().key);
    lru_.pop_back();
  }
}

std::optional<EncodedEntryCache::Followed> EncodedEntryCache::follow(std::uint64_t view_id,
                                                                     Lsn end_lsn) {
  auto it = index_.find(Key{view_id, end_lsn.value()});
  if (it == index_.end() || !it->second->next) return std::nullopt;
  log::EntryMeta meta = *it->second->next;
  auto entry = find(view_id, meta.end_lsn);
  if (!entry) return std::nullopt;
  ++follows_;
  return Followed{std::move(meta), std::move(entry)};
}

void EncodedEntryCache::link(std::uint64_t view_id, Lsn end_lsn, const log::EntryMeta& next) {
  auto it = index_.find(Key{view_id, end_lsn.value()});
  if (it != index_.end() && !it->second->next) it->second->next = next;
}

}  // namespace pgrelay::server
