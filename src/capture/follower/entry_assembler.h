// Rebuilds the log entries a JetStream stream's _tx subject holds from their parts, checked.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "base/bytes.h"
#include "base/result.h"
#include "log/change_log.h"
#include "log/format.h"
#include "nats/message_id.h"

namespace pgrelay::capture {

// One _tx message as a follower reads it: its stream position, pgrelay's headers and payload.
struct TxMessage {
  std::uint64_t stream_seq = 0;
  nats::MessageId id;  // "X/Y/tx/k"
  nats::PartHeader part;
  std::uint64_t log_id = 0;
  wire::Lsn previous;  // Pgrelay-Previous-Lsn; invalid when absent
  ByteView payload;
};

// A whole entry: the bytes the primary's log stores for it, its metadata decoded.
struct AssembledEntry {
  log::EntryMeta meta;
  Bytes bytes;  // encoded metadata, then data
  std::size_t data_offset = 0;
  bool marked = false;           // it holds capture's publications marker
  wire::Lsn previous;            // the primary's entry before it (invalid: not known)
  std::uint64_t stream_seq = 0;  // of its last part

  log::PendingEntry pending() const {
    return log::PendingEntry{meta, ByteView(bytes).subspan(data_offset), nullptr, marked};
  }
};

// Collects one entry's parts, in stream order. Parts of an entry whose first part came before
// where reading began are skipped (a follower starting inside one). Anything else out of order
// (a part missing, two entries interleaved, sizes that disagree, bytes the log would refuse)
// is an error: the stream is damaged or not pgrelay's.
class EntryAssembler {
 public:
  // The entry once its last part is in; nullopt while parts are missing or skipped.
  Result<std::optional<AssembledEntry>> add(const TxMessage& message);
  // Parts taken in of an entry not yet whole.
  bool in_entry() const { return current_.has_value(); }
  // Parts left out because their entry began before the first part read.
  std::uint64_t skipped_parts() const { return skipped_parts_; }

 private:
  Error damaged(const TxMessage& message, const std::string& why) const;
  Result<AssembledEntry> finish(const TxMessage& last);

  std::optional<TxMessage> current_;  // its first part (payload not kept)
  std::uint32_t next_part_ = 0;
  Bytes bytes_;
  std::uint64_t skipped_parts_ = 0;
};

}  // namespace pgrelay::capture
