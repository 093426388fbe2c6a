// The NATS messages one log entry is published as: a JSON message per change, then its bytes.
//
// For an entry committed at LSN C with N change messages:
//  - change messages 0..N-1, in the entry's order, one per Insert, Update, Delete, logical
//    message and truncated table (capture's own publications markers are left out). The
//    payload is the JSON object `pgrelay recv --format json` prints for the change, with
//    "commit_lsn" (C), "index" (0..N-1) and "count" (N) added. Subjects: subjects.h.
//  - parts 0..P-1 on the _tx subject: the entry's log bytes (its encoded metadata, then its
//    data, as the log stores them), cut into pieces of `part_size` bytes, the last shorter.
// Every message is sent with the same headers (see publisher.h), its Msg-Id from message_id.h.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>

#include "base/bytes.h"
#include "base/result.h"
#include "log/format.h"
#include "log/transaction.h"
#include "nats/message_id.h"
#include "nats/subjects.h"

namespace pgrelay::nats {

struct OutMessage {
  std::string subject;
  MessageId id;
  wire::Lsn lsn;  // the change's LSN; a part's is the commit LSN
  std::string payload;
  bool last = false;  // the entry's last message
};

class EntryMessages {
 public:
  // `data` is the entry's whole data; it and `subjects` must outlive the object. Fails on data
  // the log's own reader refuses.
  static Result<EntryMessages> make(const log::EntryMeta& meta, ByteView data,
                                    const Subjects& subjects, std::size_t part_size);

  const log::EntryMeta& meta() const { return meta_; }
  std::uint32_t change_count() const { return change_count_; }
  std::uint32_t part_count() const { return part_count_; }
  std::uint64_t size() const { return std::uint64_t{change_count_} + part_count_; }
  std::size_t part_size() const { return part_size_; }

  // Leaves out the first `n` messages (those a stream already holds).
  Status skip(std::uint64_t n);
  // The next message; nullopt after the last.
  Result<std::optional<OutMessage>> next();

 private:
  EntryMessages(const log::EntryMeta& meta, ByteView data, const Subjects& subjects,
                std::size_t part_size);
  // Renders the next change's messages into pending_; false when no change is left.
  Result<bool> render_next_change();
  OutMessage part(std::uint32_t k) const;

  log::EntryMeta meta_;
  ByteView data_;
  const Subjects* subjects_;
  std::size_t part_size_;
  Bytes meta_bytes_;  // the encoded metadata: the parts cut it and data_ as one, uncopied
  std::uint32_t change_count_ = 0;
  std::uint32_t part_count_ = 0;
  log::ChangeReader reader_;
  std::deque<OutMessage> pending_;  // rendered, not yet returned (a TRUNCATE's tables)
  std::uint32_t next_change_ = 0;   // index of the next change message rendered
  std::uint64_t returned_ = 0;      // messages returned or skipped
};

}  // namespace pgrelay::nats
