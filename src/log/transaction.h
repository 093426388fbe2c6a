// The stored form of a committed transaction: changes kept as exact pgoutput messages.
//
// An entry's data is a sequence of change records:
//
//   change := length:u32 | lsn_offset:u64 | message[length]
//
// lsn_offset is the change's LSN minus the entry's begin LSN. Storing offsets keeps the data
// valid when ChangeLog::append_assigning moves a whole entry to the LSNs the log chooses.
// `message` is the pgoutput message exactly as Postgres's pgoutput plugin writes it outside a
// streamed block (no xid field), so a sender can put it on the wire as it is; `length` counts
// the message bytes only. EntryMeta::change_count is the number of records, Relation and Type
// records included.
//
// Data is self-describing: a transaction carries the Relation of every table it touches before
// the table's first change (preceded by the Type records of its non-built-in column types when
// the capture had them), so a reader can start at any transaction. A kMessage entry holds
// exactly one non-transactional LogicalMessage.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "base/bytes.h"
#include "base/result.h"
#include "log/change_log.h"
#include "log/format.h"
#include "pgoutput/decoder.h"
#include "pgoutput/messages.h"

namespace pgrelay::log {

using ChangeMessage =
    std::variant<pgoutput::Relation, pgoutput::Type, pgoutput::Insert, pgoutput::Update,
                 pgoutput::Delete, pgoutput::Truncate, pgoutput::LogicalMessage>;

// The prefix of the logical message that capture writes into the transaction that changed the
// upstream's publications (or at the next check, without an event trigger). The log marks the
// entries that hold one (PendingEntry::marked), so that readers find them without decoding.
inline constexpr std::string_view kPublicationsChangedPrefix = "pgrelay.publications.changed";

// The message when it is capture's publications-changed marker, else null.
const pgoutput::LogicalMessage* publications_marker(const ChangeMessage& message);

// One change of a transaction and the WAL position it was decoded at.
struct Change {
  Lsn lsn;
  ChangeMessage message;
  bool operator==(const Change&) const = default;
};

// What Begin, Origin and Commit say about a transaction.
struct TransactionHeader {
  Lsn begin_lsn;
  Lsn commit_lsn;
  Lsn end_lsn;
  std::int64_t commit_time = 0;  // µs since 2000-01-01
  std::uint32_t xid = 0;
  std::string origin;  // empty when none
  Lsn origin_lsn;
  bool operator==(const TransactionHeader&) const = default;
};

TransactionHeader header_of(const EntryMeta& meta);
EntryMeta entry_meta(EntryKind kind, const TransactionHeader& header, std::uint32_t change_count);

// A whole transaction (or non-transactional message) in memory: for small ones, tests, tools.
struct Transaction {
  EntryKind kind = EntryKind::kTransaction;  // kTransaction or kMessage
  TransactionHeader header;
  std::vector<Change> changes;
  bool operator==(const Transaction&) const = default;
};

inline constexpr std::size_t kChangeHeaderSize = 12;
// pgoutput builds each message in one StringInfo, which Postgres caps below 1 GiB.
inline constexpr std::size_t kMaxChangeMessageSize = (1u << 30) - 1;

// Appends one change record for a change at `lsn` of an entry beginning at `begin_lsn`.
// Fails (54000) for a message over kMaxChangeMessageSize, (22023) for lsn < begin_lsn.
Status encode_change(Lsn begin_lsn, Lsn lsn, const pgoutput::Message& message, ByteWriter& out);
// The bytes encode_change appends.
std::size_t encoded_change_size(const pgoutput::Message& message);
// The pgoutput message a change is stored as: the same, without a streamed xid.
pgoutput::Message to_message(ChangeMessage message);

// An encoded entry ready for ChangeLog::append.
struct EncodedEntry {
  EntryMeta meta;
  Bytes data;
  bool marked = false;  // holds a publications-changed marker
  PendingEntry pending() const { return PendingEntry{meta, data, nullptr, marked}; }
};

// Encodes a small in-memory transaction as given (the caller supplies its Relation records) and
// checks the result with ChangeReader, so it never produces data a reader would reject.
Result<EncodedEntry> encode_transaction(const Transaction& txn);

// Decodes the data of one entry, fed in pieces of any size, one change at a time. It keeps
// at most one partial change, so its memory is bounded by the largest change, not by the
// transaction: drain next() before feeding the following piece. Damaged data gives XX001
// (data_corrupted) errors that name the change's LSN; the first error is sticky.
class ChangeReader {
 public:
  explicit ChangeReader(const EntryMeta& meta);

  // Makes `piece` the data to read next; it must stay valid until next() returns nullopt.
  // Unread bytes of the previous piece are copied first.
  void feed(ByteView piece);
  // The next whole change, or nullopt when the data fed so far holds no further whole change.
  Result<std::optional<Change>> next();
  // After the last piece: the data must end at a change boundary after change_count changes.
  Status finish();

  std::uint32_t changes_read() const { return changes_read_; }
  // The data offset of the next change (after the last one next() returned).
  std::uint64_t offset() const { return offset_; }
  // Drops what is buffered and unread, and goes on with data fed from `offset` (a change
  // boundary it has passed): a reader of a transaction in progress (InProgressReader) reads
  // again from where a rewind cut it. The Relations already read still describe what follows.
  void restart_at(std::uint64_t offset);
  // Bytes of the partial change held now, and the most ever held (its buffer's capacity).
  std::size_t buffered() const { return buf_.size(); }
  std::size_t peak_buffer_size() const { return peak_; }
  // The Relation this entry last declared for `oid`, or nullptr.
  const pgoutput::Relation* relation(pgoutput::Oid oid) const { return decoder_.relation(oid); }

 private:
  Result<std::optional<Change>> decode_record(ByteView record);
  Result<std::uint32_t> record_length(ByteView header);
  void take(std::size_t n);
  void note_capacity();
  Error corrupt(std::string why, std::optional<Lsn> lsn, std::string detail = {}) const;
  Error fail(Error error);
  friend Result<EncodedEntry> encode_transaction(const Transaction& txn);

  EntryMeta meta_;
  pgoutput::Decoder decoder_;
  ByteView piece_;            // unread rest of the piece last fed
  Bytes buf_;                 // a change split across pieces
  std::uint64_t offset_ = 0;  // offset in the entry's data of the next unread change
  std::uint32_t changes_read_ = 0;
  std::size_t peak_ = 0;
  std::optional<Error> failed_;
  bool checking_input_ = false;  // errors blame the caller's input, not the log
};

// Reads the changes of the entry a Cursor has just returned from next_entry().
class EntryReader {
 public:
  EntryReader(Cursor& cursor, const EntryMeta& meta) : cursor_(cursor), reader_(meta) {}

  // The next change, or nullopt after the last one (the entry's end is then validated).
  Result<std::optional<Change>> next();
  const ChangeReader& reader() const { return reader_; }

 private:
  Cursor& cursor_;
  ChangeReader reader_;
  bool done_ = false;
};

// The whole entry in memory; for small entries (tests, tools).
Result<Transaction> read_transaction(Cursor& cursor, const EntryMeta& meta);
Result<Transaction> decode_transaction(const EntryMeta& meta, ByteView data);

}  // namespace pgrelay::log
