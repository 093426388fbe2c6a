// Transactions capture is still receiving, readable by walsenders before they commit.
//
// Native capture builds a transaction that the upstream streams before its commit in a spill
// file (transaction_builder.h). Registered here, that file can be read while it grows, so that
// a consumer that asks for streaming gets the transaction in stream blocks as it arrives, as
// Postgres's walsender streams one that outgrows logical_decoding_work_mem. The log still takes
// the transaction only at its commit, whole: what is read here is never durable, and a consumer
// confirms nothing of it (it confirms the Stream Commit's end LSN, which the log holds then).
//
// One writer (the capture thread) and any number of readers (walsenders, on the server's
// thread) share a transaction's state under its mutex:
//  - Readers read what whole records of the spill file hold: data there does not change, unless
//    a subtransaction rolls back. The writer then lowers what is readable before it truncates
//    the file, and tells each reader that had read past the new end where it was cut, so that
//    it can take back what it sent (Stream Abort of the subtransaction). A read that a rewind
//    overlapped is thrown away and made again.
//  - Each change belongs to the top-level transaction or to one of its subtransactions: the
//    writer records where the (sub)transaction changes (XidRun), which the stream's messages
//    name, so that a subscriber can drop a subtransaction's changes at its Stream Abort.
//  - The writer ends the transaction with finish() (committed: all of it readable, and the log
//    gets it next, at the LSNs finish() names) or abort() (rolled back, or capture lost it and
//    the upstream streams it again). Either takes it off the list; readers keep what they hold.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "base/bytes.h"
#include "base/result.h"
#include "log/file_util.h"
#include "wire/lsn.h"

namespace pgrelay::log {

using wire::Lsn;

// From data offset `offset` on, the changes belong to (sub)transaction `xid`.
struct XidRun {
  std::uint64_t offset = 0;
  std::uint32_t xid = 0;
  bool operator==(const XidRun&) const = default;
};

// How a transaction in progress ended, as far as readers can tell.
enum class InProgressPhase { kOpen, kFinished, kAborted };

// What finish() says about the committed transaction.
struct InProgressCommit {
  std::uint64_t size = 0;  // its data, all readable now
  Lsn commit_lsn;
  Lsn end_lsn;
  std::int64_t commit_time = 0;
};

class InProgressTransactions;
class TransactionBuilder;

namespace in_progress_detail {
struct Shared;
struct ReaderState;
}  // namespace in_progress_detail

// Capture's side of one transaction. Destroyed before finish(), it aborts the transaction.
class InProgressWriter {
 public:
  InProgressWriter() = default;
  InProgressWriter(InProgressWriter&& other) noexcept
      : shared_(std::move(other.shared_)),
        owner_(other.owner_),
        attached_(other.attached_),
        shown_(other.shown_) {}
  InProgressWriter& operator=(InProgressWriter&& other) noexcept;
  ~InProgressWriter();
  explicit operator bool() const { return shared_ != nullptr; }

  // The changes from data offset `offset` on belong to `xid` (call in increasing offsets).
  void note_xid(std::uint64_t offset, std::uint32_t xid);
  // The transaction was replicated into the upstream from origin `name` (pgoutput sends that
  // inside its first stream block).
  void set_origin(std::string name);
  // The spill file exists now: readers read it through `file` (a descriptor of its own, which
  // they only pread), its data starting at file offset `data_start`.
  void attach(FileHandle file, std::uint64_t data_start, std::string name);
  // The file's whole records hold the first `readable` data bytes.
  void set_readable(std::uint64_t readable);
  // The data past `size` is dropped (subtransaction `subxid` rolled back). Call before the
  // file is truncated: what is readable drops to the records before the one holding `size`.
  void rewind(std::uint64_t size, std::uint32_t subxid);
  void finish(const InProgressCommit& commit);
  // Shows what `builder`'s spill file holds now (nothing before it spills): attaches the file
  // the first time, then sets what is readable. Call after each change added, and after a
  // rewind (which goes before the builder's own).
  Status show(const TransactionBuilder& builder);
  void abort();

 private:
  friend class InProgressTransactions;
  InProgressWriter(std::shared_ptr<in_progress_detail::Shared> shared,
                   InProgressTransactions* owner)
      : shared_(std::move(shared)), owner_(owner) {}
  void end(InProgressPhase phase, const InProgressCommit* commit);

  std::shared_ptr<in_progress_detail::Shared> shared_;
  InProgressTransactions* owner_ = nullptr;
  bool attached_ = false;    // show() attached the builder's spill file
  std::uint64_t shown_ = 0;  // what show() last made readable
};

// A transaction in progress as the registry lists it: follow it with an InProgressReader.
class InProgressSource {
 public:
  std::uint64_t id() const;  // unique within the registry, increasing in open order
  std::uint32_t xid() const;
  Lsn begin_lsn() const;

 private:
  friend class InProgressTransactions;
  friend class InProgressReader;
  explicit InProgressSource(std::shared_ptr<in_progress_detail::Shared> shared)
      : shared_(std::move(shared)) {}
  std::shared_ptr<in_progress_detail::Shared> shared_;
};

// One walsender's reading of one transaction in progress, from its first byte.
class InProgressReader {
 public:
  explicit InProgressReader(const InProgressSource& source);
  ~InProgressReader();
  InProgressReader(const InProgressReader&) = delete;
  InProgressReader& operator=(const InProgressReader&) = delete;

  std::uint64_t id() const;
  std::uint32_t xid() const;
  Lsn begin_lsn() const;
  InProgressPhase phase() const;
  std::string origin() const;  // empty when none
  // Set once phase() is kFinished.
  std::optional<InProgressCommit> commit() const;

  // Where a rewind cut what this reader had read: everything from `offset` on is gone, and
  // the first subtransaction it belonged to was `subxid`.
  struct Cut {
    std::uint64_t offset = 0;
    std::uint32_t subxid = 0;
  };
  // The lowest cut since the last call; the read position is moved back to it.
  std::optional<Cut> take_cut();

  // Data bytes readable past the read position.
  std::uint64_t available() const;
  // Bytes at the read position (offset) and the runs that name their transactions: the first
  // is the one in effect at `offset`. Empty when nothing is readable, or a rewind overlapped
  // the read (read again after take_cut()).
  struct Piece {
    std::uint64_t offset = 0;
    Bytes data;
    std::vector<XidRun> runs;
  };
  Result<Piece> read(std::size_t max_bytes);
  std::uint64_t position() const { return position_; }

 private:
  std::shared_ptr<in_progress_detail::Shared> shared_;
  std::shared_ptr<in_progress_detail::ReaderState> state_;
  std::uint64_t position_ = 0;
};

// The transactions in progress of one log's capture. It outlives its writers (the capture).
class InProgressTransactions {
 public:
  InProgressTransactions() = default;
  InProgressTransactions(const InProgressTransactions&) = delete;
  InProgressTransactions& operator=(const InProgressTransactions&) = delete;

  InProgressWriter open(std::uint32_t xid, Lsn begin_lsn);
  // The transactions open now, in open order.
  std::vector<InProgressSource> list() const;
  // Grows whenever one is opened: a reader lists again only when it changed.
  std::uint64_t generation() const;
  // Called from the writer's thread, without locks held, whenever readers may find something
  // new (more readable data, a rewind, an end, a new transaction).
  void on_change(std::function<void()> listener);

 private:
  friend class InProgressWriter;
  void remove(const in_progress_detail::Shared* shared);
  void notify() const;

  mutable std::mutex mu_;
  std::vector<std::shared_ptr<in_progress_detail::Shared>> open_;
  std::uint64_t next_id_ = 1;
  std::uint64_t generation_ = 0;
  std::vector<std::function<void()>> listeners_;
};

}  // namespace pgrelay::log
