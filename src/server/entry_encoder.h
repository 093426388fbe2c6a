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
#include "wire/replication_frames.h"

namespace pgrelay::server {

using wire::Lsn;

// A message the encoder yields, before encoding: what binary mode converts first.
struct PendingMessage {
  Lsn lsn;
  pgoutput::Message message;
};

struct EncodedMessage {
  Lsn lsn;                // XLogData start (and end) for this message
  char tag = 0;           // pgoutput message type: 'B', 'R', 'Y', 'I', 'C', ...
  pgoutput::Oid oid = 0;  // for 'R' and 'Y': the relation or type described
  Bytes payload;          // the pgoutput message
};

// One entry's messages through one view, framed for the wire once: each a CopyData wrapping
// XLogData, with the send time left for the session to fill in as it writes (a cached entry is
// sent long after it was framed, and Postgres stamps each message when it sends it).
struct EncodedEntry {
  // Where in `frames` a message is: offset of its CopyData, and the frame's size.
  struct Message {
    std::uint32_t offset = 0;
    std::uint32_t size = 0;
    char tag = 0;
    pgoutput::Oid oid = 0;
  };
  static constexpr std::size_t kFrameHeader = wire::kXLogDataFrameHeader;
  static constexpr std::size_t kSendTimeOffset = wire::kXLogDataFrameSendTimeOffset;

  Bytes frames;
  std::vector<Message> messages;
  bool publications_changed = false;  // the entry carried capture's marker (see change_view.h)
  log::PublicationsChange publications_change;  // what the last marker says

  void add(const EncodedMessage& m);
  // The pgoutput message inside a frame.
  ByteView payload(const Message& m) const {
    return ByteView(frames).subspan(m.offset + kFrameHeader, m.size - kFrameHeader);
  }
  std::size_t bytes() const {
    return sizeof(*this) + frames.capacity() + messages.capacity() * sizeof(Message);
  }
  void clear() {
    frames.clear();
    messages.clear();
  }
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
  // The same, not encoded yet (encode it with encode()).
  Result<std::optional<PendingMessage>> next_message();
  static EncodedMessage encode(PendingMessage message);
  // The view paused at a publications-changed marker (ChangeView): the caller may replace its
  // options, and next() goes on with the entry.
  bool paused() const { return reader_.paused(); }

 private:
  log::EntryMeta meta_;
  log::ViewReader reader_;
  bool transactional_;
  bool begun_ = false;
  bool done_ = false;
  std::vector<PendingMessage> queue_;  // Begin/Origin ahead of the first change
};

// Recently encoded entries by (view, entry), bounded in bytes, least recently used out first.
// Used from one thread (the server's executor).
class EncodedEntryCache {
 public:
  explicit EncodedEntryCache(std::size_t capacity_bytes) : capacity_(capacity_bytes) {}

  // A session's use of one view, for as long as it lives. Only its destructor may run after
  // the cache is gone (a session's frame destroyed with its event loop).
  class ViewUse {
   public:
    ViewUse(EncodedEntryCache& cache, const std::string& view_key);
    ~ViewUse() { release(); }
    ViewUse(const ViewUse&) = delete;
    ViewUse& operator=(const ViewUse&) = delete;
    std::uint64_t id() const { return id_; }
    // The session goes on through another view (the publications changed).
    void switch_to(const std::string& view_key);

   private:
    void release();
    EncodedEntryCache* cache_;
    std::shared_ptr<std::unordered_map<std::uint64_t, std::size_t>> users_;
    std::uint64_t id_;
  };

  // A small number standing for a view's key (publications, options, filters), the same for
  // equal keys: looked up once per session, so the lookups per entry hash two integers.
  std::uint64_t view_id(const std::string& view_key);
  // Whether two or more sessions use the view now (ViewUse). Only another session ever reads
  // a kept entry: a text-mode walsender alone on its view keeps nothing (see walsender.cc),
  // which spares it the allocations, the index and, while the cache grows to its bound, the
  // page faults.
  bool shared(std::uint64_t view_id) const;
  std::shared_ptr<const EncodedEntry> find(std::uint64_t view_id, Lsn end_lsn);
  void insert(std::uint64_t view_id, Lsn end_lsn, std::shared_ptr<const EncodedEntry> entry);
  // Links: a session that read two entries in a row records that `next` follows the entry
  // ending at `end_lsn` (which must be cached; eviction drops the link). Sessions with the
  // view then go from cached entry to cached entry without reading the log: follow() gives
  // the next entry's metadata and frames when both the link and that entry are cached.
  struct Followed {
    log::EntryMeta meta;
    std::shared_ptr<const EncodedEntry> entry;
  };
  void link(std::uint64_t view_id, Lsn end_lsn, const log::EntryMeta& next);
  std::optional<Followed> follow(std::uint64_t view_id, Lsn end_lsn);
  std::size_t capacity() const { return capacity_; }
  std::size_t hits() const { return hits_; }
  std::size_t misses() const { return misses_; }
  std::size_t follows() const { return follows_; }  // entries given by follow()
  std::size_t bytes() const { return size_; }       // what the kept entries take

 private:
  struct Key {
    std::uint64_t view_id;
    std::uint64_t end_lsn;
    bool operator==(const Key&) const = default;
  };
  // Sessions look entries up in log order: entries next to each other in the log should land
  // in buckets next to each other, so that a scan stays in cache. A commit record alone is
  // longer than 32 bytes of WAL, so dropping the low 5 bits keeps distinct entries apart.
  struct KeyHash {
    std::size_t operator()(const Key& k) const {
      return static_cast<std::size_t>((k.end_lsn >> 5) + k.view_id * 0x9E3779B97F4A7C15ull);
    }
  };
  struct Node {
    Key key;
    std::shared_ptr<const EncodedEntry> entry;
    std::optional<log::EntryMeta> next;  // the entry after this one in the log, once known
  };
  std::size_t capacity_;
  std::size_t size_ = 0;
  std::size_t hits_ = 0, misses_ = 0, follows_ = 0;
  std::unordered_map<std::string, std::uint64_t> view_ids_;
  // Sessions per view id (ViewUse); shared with the uses, which may outlive the cache.
  std::shared_ptr<std::unordered_map<std::uint64_t, std::size_t>> users_ =
      std::make_shared<std::unordered_map<std::uint64_t, std::size_t>>();
  std::list<Node> lru_;  // front = most recent
  std::unordered_map<Key, std::list<Node>::iterator, KeyHash> index_;
};

}  // namespace pgrelay::server
