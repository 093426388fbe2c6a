// The marks file: the commit LSNs of the log's marked entries, so readers find them unread.
#include "log/marks.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "log/crc32c.h"

namespace pgrelay::log {

namespace {

constexpr char kMarksMagic[8] = {'P', 'G', 'R', 'L', 'M', 'R', 'K', '1'};
constexpr std::size_t kHeaderSize = 20;
constexpr std::size_t kRecordSize = 12;

void encode_record(Lsn lsn, ByteWriter& out) {
  ByteWriter value;
  value.u64(lsn.value());
  out.raw(value.bytes());
  out.u32(crc32c(value.bytes()));
}

// A whole marks file: its header, then a record per LSN.
Bytes encode_file(Lsn unmarked_through, const std::vector<Lsn>& lsns) {
  ByteWriter header;
  header.raw(std::string_view(kMarksMagic, sizeof kMarksMagic));
  header.u64(unmarked_through.value());
  ByteWriter out;
  out.raw(header.bytes());
  out.u32(crc32c(header.bytes()));
  for (Lsn lsn : lsns) encode_record(lsn, out);
  return std::move(out).take();
}

Error marks_error(const std::string& path, const std::string& why) {
  return Error::make(sqlstate::kDataCorrupted, "marks file \"" + path + "\" is invalid: " + why,
                     "Remove the file: pgrelay makes it again, and searches the data of the "
                     "entries it then cannot vouch for instead.");
}

}  // namespace

Result<MarkFile> MarkFile::open(const std::string& dir, Lsn log_end, Lsn removed_through,
                                bool read_only, bool sync) {
  MarkFile marks;
  marks.path_ = dir + "/" + kMarksName;
  marks.read_only_ = read_only;
  marks.sync_ = sync;
  if (!path_exists(marks.path_)) {
    marks.unmarked_through_ = log_end;
    if (read_only) return marks;
    // Made whole or not at all, so that a crash never leaves a file without its header.
    PGRELAY_TRY(write_file_atomically(dir, kMarksName, encode_file(log_end, {})));
  }
  auto whole = marks.load();
  if (!whole.ok()) return whole.take_error();
  if (read_only) return marks;
  // Entries that retention removed need no marks: the file is written anew without them
  // (whole or not at all, and read back either way).
  auto removed = [&](Lsn lsn) { return lsn <= removed_through; };
  const bool stale_unmarked =
      marks.unmarked_through_.is_valid() && removed(marks.unmarked_through_);
  if (stale_unmarked || std::any_of(marks.lsns_.begin(), marks.lsns_.end(), removed)) {
    std::erase_if(marks.lsns_, removed);
    const Lsn unmarked = stale_unmarked ? Lsn::invalid() : marks.unmarked_through_;
    PGRELAY_TRY(write_file_atomically(dir, kMarksName, encode_file(unmarked, marks.lsns_)));
    whole = marks.load();
    if (!whole.ok()) return whole.take_error();
  }
  auto file = open_file(marks.path_, O_RDWR);
  if (!file.ok()) return file.take_error();
  marks.file_ = std::move(*file);
  if (*whole != marks.size_ &&
      ::ftruncate(marks.file_.get(), static_cast<off_t>(marks.size_)) != 0) {
    return io_error("truncate", marks.path_, errno);
  }
  return marks;
}

Result<std::uint64_t> MarkFile::load() {
  auto data = read_whole_file(path_);
  if (!data.ok()) return data.take_error();
  ByteView bytes(*data);
  if (bytes.size() < kHeaderSize ||
      std::memcmp(bytes.data(), kMarksMagic, sizeof kMarksMagic) != 0) {
    return marks_error(path_, "it does not start with a marks header");
  }
  ByteReader header(bytes.subspan(0, kHeaderSize));
  header.bytes(sizeof kMarksMagic);
  unmarked_through_ = Lsn(header.u64());
  if (header.u32() != crc32c(bytes.subspan(0, kHeaderSize - 4))) {
    return marks_error(path_, "its header's CRC does not match");
  }
  lsns_.clear();
  std::size_t whole = kHeaderSize;
  while (bytes.size() - whole >= kRecordSize) {
    ByteReader record(bytes.subspan(whole, kRecordSize));
    const std::uint64_t lsn = record.u64();
    if (record.u32() != crc32c(bytes.subspan(whole, 8))) break;  // torn by a crash: dropped
    lsns_.push_back(Lsn(lsn));
    whole += kRecordSize;
  }
  size_ = whole;
  return static_cast<std::uint64_t>(bytes.size());
}

Status MarkFile::add(std::span<const Lsn> commit_lsns) {
  if (commit_lsns.empty()) return {};
  if (read_only_) {
    return Error::make(sqlstate::kFeatureNotSupported,
                       "marks file \"" + path_ + "\" was opened read-only");
  }
  ByteWriter out;
  for (Lsn lsn : commit_lsns) encode_record(lsn, out);
  PGRELAY_TRY(pwrite_all(file_.get(), size_, out.bytes(), path_));
  if (sync_) PGRELAY_TRY(sync_file(file_.get(), path_));
  size_ += out.size();
  lsns_.insert(lsns_.end(), commit_lsns.begin(), commit_lsns.end());
  return {};
}

std::vector<Lsn> MarkFile::from(Lsn start) const {
  std::vector<Lsn> result;
  for (Lsn lsn : lsns_) {
    if (lsn >= start) result.push_back(lsn);
  }
  // A crash's leftover may lie past LSNs appended after it, and an entry the crash took may
  // be marked again when its source sends it once more.
  std::sort(result.begin(), result.end());
  result.erase(std::unique(result.begin(), result.end()), result.end());
  return result;
}

}  // namespace pgrelay::log
