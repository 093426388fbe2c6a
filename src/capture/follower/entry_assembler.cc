// Rebuilds the log entries a JetStream stream's _tx subject holds from their parts, checked.
#include "capture/follower/entry_assembler.h"

#include "log/transaction.h"

namespace pgrelay::capture {

Error EntryAssembler::damaged(const TxMessage& message, const std::string& why) const {
  return Error::make(sqlstate::kDataCorrupted,
                     "message " + std::to_string(message.stream_seq) +
                         " of the JetStream stream does not continue the transaction parts "
                         "before it: " +
                         why,
                     "The stream was written by something other than one pgrelay publisher. "
                     "Point the follower at a stream only pgrelay writes (--nats-stream).");
}

Result<std::optional<AssembledEntry>> EntryAssembler::add(const TxMessage& message) {
  const nats::PartHeader& part = message.part;
  if (!current_) {
    if (part.number != 0) {
      ++skipped_parts_;
      return std::optional<AssembledEntry>();
    }
  } else {
    if (part.number == 0) {
      return damaged(message, "a new transaction (" + message.id.commit_lsn.to_string() +
                                  ") began before part " + std::to_string(next_part_) +
                                  " of the one committed at " +
                                  current_->id.commit_lsn.to_string());
    }
    if (message.id.commit_lsn != current_->id.commit_lsn || part.number != next_part_ ||
        part.count != current_->part.count || part.size != current_->part.size) {
      return damaged(message, "part " + std::to_string(part.number) + " of " +
                                  message.id.commit_lsn.to_string() + " came where part " +
                                  std::to_string(next_part_) + " of " +
                                  current_->id.commit_lsn.to_string() + " belongs");
    }
  }
  const bool last = part.number + 1 == part.count;
  if (message.payload.size() > part.size || (!last && message.payload.size() != part.size)) {
    return damaged(message, "part " + std::to_string(part.number) + " holds " +
                                std::to_string(message.payload.size()) + " bytes where its " +
                                "header says parts are " + std::to_string(part.size));
  }
  if (!current_) {
    current_ = message;
    current_->payload = {};
    bytes_.clear();
    next_part_ = 0;
  }
  bytes_.insert(bytes_.end(), message.payload.begin(), message.payload.end());
  ++next_part_;
  if (!last) return std::optional<AssembledEntry>();
  auto entry = finish(message);
  current_.reset();
  bytes_ = Bytes();
  if (!entry.ok()) return entry.error();
  return std::optional<AssembledEntry>(std::move(*entry));
}

Result<AssembledEntry> EntryAssembler::finish(const TxMessage& last) {
  AssembledEntry entry;
  entry.bytes = std::move(bytes_);
  entry.previous = current_->previous;
  entry.stream_seq = last.stream_seq;
  ByteReader reader(entry.bytes);
  auto meta = log::decode_entry_meta(reader);
  if (!meta.ok()) return damaged(last, "its bytes are no log entry: " + meta.error().message);
  if (meta->commit_lsn != last.id.commit_lsn || meta->kind == log::EntryKind::kCheckpoint) {
    return damaged(last, "its bytes hold an entry committed at " + meta->commit_lsn.to_string() +
                             ", not at " + last.id.commit_lsn.to_string());
  }
  entry.meta = *meta;
  entry.data_offset = entry.bytes.size() - reader.remaining();
  // Decoding checks the bytes as the log's readers will read them, and finds the marker.
  auto txn = log::decode_transaction(entry.meta, ByteView(entry.bytes).subspan(entry.data_offset));
  if (!txn.ok()) return damaged(last, "its changes do not decode: " + txn.error().message);
  for (const auto& change : txn->changes) {
    if (log::publications_marker(change.message) != nullptr) entry.marked = true;
  }
  return entry;
}

}  // namespace pgrelay::capture
