// Assembles a captured transaction into log entry data, spilling large ones to a temporary file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>

#include "base/bytes.h"
#include "base/result.h"
#include "log/change_log.h"
#include "log/file_util.h"
#include "log/spill_file.h"
#include "log/transaction.h"

namespace pgrelay::log {

// The Relation and Type messages capture last received from upstream, by OID. The builder
// copies from it into each transaction, so stored data never depends on earlier transactions.
class SchemaCatalog {
 public:
  // Replaces the entry for the message's OID; a streamed message's xid is dropped.
  void put(pgoutput::Relation relation);
  void put(pgoutput::Type type);
  void remove_relation(pgoutput::Oid oid) { relations_.erase(oid); }

  const pgoutput::Relation* relation(pgoutput::Oid oid) const;
  const pgoutput::Type* type(pgoutput::Oid oid) const;
  // Changes whenever put() replaces the entry, so users can tell a re-sent schema apart.
  std::uint64_t relation_version(pgoutput::Oid oid) const;
  std::uint64_t type_version(pgoutput::Oid oid) const;

 private:
  template <typename T>
  struct Versioned {
    T value;
    std::uint64_t version = 0;
  };
  std::unordered_map<pgoutput::Oid, Versioned<pgoutput::Relation>> relations_;
  std::unordered_map<pgoutput::Oid, Versioned<pgoutput::Type>> types_;
  std::uint64_t next_version_ = 1;
};

// A finished entry: its metadata and its data, in memory or in a spill file.
struct BuiltEntry {
  EntryMeta meta;
  Bytes data;                        // when not spilled
  std::unique_ptr<SpillFile> spill;  // when spilled
  bool marked = false;               // holds a publications-changed marker

  // What ChangeLog::append takes; valid while this BuiltEntry lives.
  PendingEntry pending() const { return PendingEntry{meta, data, spill.get(), marked}; }
  std::uint64_t data_size() const { return spill ? spill->size() : data.size(); }
};

// The commit time of the last transaction among `entries`; none when they hold only
// non-transactional messages (whose time is when they were sent, not a commit's).
std::optional<std::int64_t> last_commit_time(std::span<const BuiltEntry> entries);

struct BuilderOptions {
  // Where spill files are made (created 0700 if missing); only needed once a transaction
  // passes the threshold.
  std::string spill_dir;
  // Encoded bytes kept in memory before the transaction moves to a spill file.
  std::size_t spill_threshold = 8ull << 20;
  // Write buffer for a spilled transaction.
  std::size_t spill_buffer = 256ull << 10;
};

// Builds one transaction at a time: begin(), add() each change in order, finish(). Before the
// first change of a table in the transaction (and again after the catalog's Relation for it
// was replaced) it inserts the table's Type and Relation records from the catalog, so the
// caller only passes data changes. Memory stays below the threshold plus one change.
class TransactionBuilder {
 public:
  TransactionBuilder(const SchemaCatalog& catalog, BuilderOptions options);
  ~TransactionBuilder();
  TransactionBuilder(const TransactionBuilder&) = delete;
  TransactionBuilder& operator=(const TransactionBuilder&) = delete;

  Status begin(const TransactionHeader& header);
  // The open transaction's replication origin, when it arrives after begin() (pgoutput's
  // Origin message follows Begin). Set before the transaction spills, it lets the log take the
  // spill file as it is.
  void set_origin(std::string name, Lsn origin_lsn);
  // One data change: Insert, Update, Delete, Truncate or a transactional LogicalMessage (at
  // `lsn`). Relation and Type records come from the catalog and are refused here. After an
  // error the transaction is lost: abort() it (begin() also starts over).
  Status add(Lsn lsn, ChangeMessage message);
  Result<BuiltEntry> finish();
  // The same for a transaction whose size was not known at begin(): its commit and end LSNs
  // replace the header's (changes are stored relative to its begin LSN, which stays).
  Result<BuiltEntry> finish(Lsn commit_lsn, Lsn end_lsn);
  // Drops the open transaction and its spill file.
  void abort();

  // A point in the open transaction to go back to: where a subtransaction's changes begin.
  struct Mark {
    std::uint64_t size = 0;
    std::uint32_t count = 0;
    bool marked = false;
    std::unordered_map<pgoutput::Oid, std::uint64_t> sent_relations;
    std::unordered_map<pgoutput::Oid, std::uint64_t> sent_types;
  };
  Mark mark() const { return Mark{size_, count_, marked_, sent_relations_, sent_types_}; }
  // Drops every record added since `mark` was taken (a subtransaction rolled back), in memory
  // or in the spill file; the Relations they brought are added again where needed.
  Status rewind(const Mark& mark);

  bool in_transaction() const { return open_; }
  bool spilled() const { return spill_.has_value(); }
  // While spilled: the data bytes that whole records of the spill file hold, and the file for
  // reading them while the transaction goes on (InProgressWriter::attach).
  std::uint64_t spill_readable() const { return spill_ ? spill_->size_in_records() : 0; }
  struct SpillForReading {
    FileHandle file;
    std::uint64_t data_start = 0;
    std::string name;
  };
  Result<SpillForReading> spill_for_reading() const;
  // Encoded bytes of the open transaction so far.
  std::uint64_t encoded_size() const { return size_; }
  std::uint32_t change_count() const { return count_; }

 private:
  Status append(Lsn lsn, const pgoutput::Message& message);
  Status ensure_relation(Lsn lsn, pgoutput::Oid oid);
  Status start_spill();
  Status flush_spill();
  Status failure(Error error);
  void reset();

  const SchemaCatalog& catalog_;
  BuilderOptions options_;
  bool open_ = false;
  std::optional<Error> failed_;
  TransactionHeader header_;
  ByteWriter out_;  // the whole data before spilling, the unwritten tail after
  std::optional<SpillWriter> spill_;
  std::uint64_t size_ = 0;
  std::uint32_t count_ = 0;
  bool marked_ = false;  // a publications-changed marker was added
  // Catalog versions already written into this transaction.
  std::unordered_map<pgoutput::Oid, std::uint64_t> sent_relations_;
  std::unordered_map<pgoutput::Oid, std::uint64_t> sent_types_;
};

// The entry for a non-transactional logical message (pg_logical_emit_message(false, ...)).
Result<BuiltEntry> build_message_entry(const TransactionHeader& header, Lsn lsn,
                                       pgoutput::LogicalMessage message);

}  // namespace pgrelay::log
