// The pgoutput messages one log entry yields through a view, built once and shared by every
// walsender with the same view ("encode once, send many").
#pragma once

#include <cstddef>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "log/change_view.h"
#include "pgoutput/messages.h"

namespace pgrelay::server {

using wire::Lsn;

struct EncodedMessage {
  Lsn lsn;                // XLogData start (and end) for this message
  char tag = 0;           // pgoutput message type: 'B', 'R', 'Y', 'I', 'C', ...
  pgoutput::Oid oid = 0;  // for 'R' and 'Y': the relation or type described
  Bytes payload;          // the pgoutput message
};

struct EncodedEntry {
  std::vector<EncodedMessage> messages;
  std::size_t bytes = 0;
  bool publications_changed = false;  // the entry carried capture's marker (see change_view.h)
};

// Yields an entry's messages in order: Begin (and Origin) before the first change the view
// lets through, the changes with the Types and Relation they need, Commit last; nothing for a
// transaction the view skips entirely. Relations are yielded with every transaction that
// needs them; each session drops the ones its consumer already knows.
class EntryEncoder {
 public:
  // The caller has called view.start(meta) and the cursor has just returned `meta`.
  EntryEncoder(log::ChangeView& view, log::Cursor& cursor, const log::EntryMeta& meta);
  // The next message; nullopt at the end of the entry, or when paused().
  Result<std::optional<EncodedMessage>> next();
  // The view paused at a publications-changed marker (ChangeView): the caller may replace its
  // options, and next() goes on with the entry.
  bool paused() const { return reader_.paused(); }

 private:
  EncodedMessage make(Lsn lsn, pgoutput::Message message) const;

  log::EntryMeta meta_;
  log::ViewReader reader_;
  bool transactional_;
  bool begun_ = false;
  bool done_ = false;
  std::vector<EncodedMessage> queue_;  // Begin/Origin ahead of the first change
};

// Recently encoded entries by (view, entry), bounded in bytes, least recently used out first.
// Used from one thread (the server's executor).
class EncodedEntryCache {
 public:
  explicit EncodedEntryCache(std::size_t capacity_bytes) : capacity_(capacity_bytes) {}
  // A small number standing for a view's key (publications, options, filters), the same for
  // equal keys: looked up once per session, so the lookups per entry hash two integers.
  std::uint64_t view_id(const std::string& view_key);
  std::shared_ptr<const EncodedEntry> find(std::uint64_t view_id, Lsn end_lsn);
  void insert(std::uint64_t view_id, Lsn end_lsn, std::shared_ptr<const EncodedEntry> entry);
  std::size_t capacity() const { return capacity_; }
  std::size_t hits() const { return hits_; }
  std::size_t misses() const { return misses_; }

 private:
  struct Key {
    std::uint64_t view_id;
    std::uint64_t end_lsn;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    std::size_t operator()(const Key& k) const {
      return std::hash<std::uint64_t>()(k.end_lsn ^ (k.view_id * 0x9E3779B97F4A7C15ull));
    }
  };
  struct Node {
    Key key;
    std::shared_ptr<const EncodedEntry> entry;
  };
  std::size_t capacity_;
  std::size_t size_ = 0;
  std::size_t hits_ = 0, misses_ = 0;
  std::unordered_map<std::string, std::uint64_t> view_ids_;
  std::list<Node> lru_;  // front = most recent
  std::unordered_map<Key, std::list<Node>::iterator, KeyHash> index_;
};

}  // namespace pgrelay::server
