// The marks file: the commit LSNs of the log's marked entries, so readers find them unread.
//
// An entry appended with PendingEntry::marked holds a change that readers look for without
// decoding the whole log (capture's publications-changed marker). The log writes the entry's
// commit LSN here, durably, before it writes the entry, so the file lists every marked entry the
// log holds; a crash between the two leaves an LSN that no entry (or an unmarked one) has, which
// readers, checking each, pass over. Marked entries are rare: one fdatasync per batch holding
// one costs nothing measurable.
//
// Layout: a 20-byte header (magic "PGRLMRK1", u64 unmarked_through, u32 CRC-32C of the 16
// bytes before) and 12-byte records (u64 commit LSN, u32 CRC-32C of it), big-endian as the
// segments are. A torn last record is dropped on open. unmarked_through is set when the file is
// first made for a log that already had entries (one written before marks were kept): entries up to
// it may be marked without being listed, and a reader searches their data instead.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/result.h"
#include "log/file_util.h"
#include "wire/lsn.h"

namespace pgrelay::log {

using wire::Lsn;

inline constexpr char kMarksName[] = "marks";

class MarkFile {
 public:
  // Opens `dir`/marks. When it is missing it is made (unless `read_only`), with
  // unmarked_through = `log_end`: the end LSN of the log's last entry, invalid for an empty
  // log. LSNs at or below `removed_through` (entries retention removed) are dropped from the
  // file here, so it stays as small as the marked entries the log holds. `sync`: add() makes
  // its records durable before it returns.
  static Result<MarkFile> open(const std::string& dir, Lsn log_end, Lsn removed_through,
                               bool read_only, bool sync);
  MarkFile(MarkFile&&) = default;
  MarkFile& operator=(MarkFile&&) = default;

  // Appends the LSNs, durably when the file was opened with `sync`. After a failure nothing
  // counts as added, and the next add() writes over whatever part reached the file.
  Status add(std::span<const Lsn> commit_lsns);
  // The listed LSNs >= `start`, ascending and without repeats.
  std::vector<Lsn> from(Lsn start) const;
  Lsn unmarked_through() const { return unmarked_through_; }

 private:
  MarkFile() = default;
  // Reads the file: its header and whole records. Returns the file's size.
  Result<std::uint64_t> load();

  std::string path_;
  bool read_only_ = false;
  bool sync_ = false;
  FileHandle file_;
  std::uint64_t size_ = 0;  // bytes of the header and the whole records
  Lsn unmarked_through_;
  std::vector<Lsn> lsns_;  // in the order written
};

}  // namespace pgrelay::log
