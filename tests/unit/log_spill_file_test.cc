// Tests spill files in segment layout and the log taking them as segments instead of copying.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "log/change_log.h"
#include "log/manifest.h"
#include "log/spill_file.h"
#include "log_test_util.h"

namespace pgrelay::log {
namespace {

using testing::payload_for;
using testing::TempDir;
using testing::txn;

constexpr std::size_t K = kMaxRecordPayload;

// Exactly `size` bytes that depend on `n` (payload_for has a minimum length).
std::string data_of(std::uint64_t n, std::size_t size) {
  std::string s = payload_for(n, size);
  s.resize(size);
  return s;
}

std::size_t meta_size_of(const EntryMeta& meta) {
  ByteWriter w;
  encode_entry_meta(meta, w);
  return w.size();
}

std::unique_ptr<SpillFile> spill(const std::string& dir, const std::string& data,
                                 const EntryMeta& meta, std::size_t piece = 7001) {
  auto writer = SpillWriter::create(dir, "test.spill", meta_size_of(meta));
  EXPECT_TRUE(writer.ok()) << (writer.ok() ? "" : writer.error().to_string());
  ByteView rest = as_bytes(data);
  while (!rest.empty()) {
    const std::size_t n = std::min(piece, rest.size());
    EXPECT_TRUE(writer->write(rest.subspan(0, n)).ok());
    rest = rest.subspan(n);
  }
  auto file = writer->finish();
  EXPECT_TRUE(file.ok());
  return std::move(*file);
}

std::string read_back(const SpillFile& file) {
  Bytes out(file.size());
  EXPECT_TRUE(file.read(0, out).ok());
  return std::string(as_chars(out));
}

std::uint64_t fd_size(int fd) {
  struct stat st {};
  EXPECT_EQ(::fstat(fd, &st), 0);
  return static_cast<std::uint64_t>(st.st_size);
}

std::size_t files_in(const std::string& dir) {
  std::size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    (void)e;
    ++n;
  }
  return n;
}

TEST(SpillFile, DataReadsBackAtEveryRecordBoundaryAndTheLayoutIsASegments) {
  TempDir dir;
  for (std::size_t size : {std::size_t{1}, K - 1, K, K + 1, 2 * K, 3 * K + 17}) {
    SCOPED_TRACE(size);
    const std::string data = data_of(size, size);
    EntryMeta meta = txn(1, {}).meta;
    auto file = spill(dir.path(), data, meta);
    EXPECT_EQ(file->size(), size);
    EXPECT_EQ(read_back(*file), data);
    // Pieces across record boundaries.
    for (std::uint64_t at : {std::uint64_t{0}, std::uint64_t{K - 3}, std::uint64_t{size / 2}}) {
      if (at >= size) continue;
      Bytes piece(std::min<std::uint64_t>(10, size - at));
      ASSERT_TRUE(file->read(at, piece).ok());
      EXPECT_EQ(std::string(as_chars(piece)), data.substr(at, piece.size()));
    }
    Bytes past(2);
    EXPECT_FALSE(file->read(size - 1, past).ok());
    auto image = file->segment_image();
    ASSERT_TRUE(image.has_value()) << "this file system has O_TMPFILE";
    EXPECT_EQ(image->file_size, fd_size(image->fd));
    EXPECT_EQ(image->data_size, size);
    EXPECT_EQ(image->meta_size, meta_size_of(meta));
  }
  // Unnamed files leave nothing in the directory.
  EXPECT_EQ(files_in(dir.path()), 0u);
}

TEST(SpillFile, RewindToEveryKindOfPointThenWriteOn) {
  TempDir dir;
  const std::string data = payload_for(7, 3 * K + 500);
  for (std::uint64_t to : {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{K - 1},
                           std::uint64_t{K}, std::uint64_t{K + 1}, std::uint64_t{2 * K},
                           std::uint64_t{3 * K + 100}, std::uint64_t{3 * K + 500}}) {
    SCOPED_TRACE(to);
    EntryMeta meta = txn(1, {}).meta;
    auto writer = SpillWriter::create(dir.path(), "rewind.spill", meta_size_of(meta));
    ASSERT_TRUE(writer.ok());
    ASSERT_TRUE(writer->write(as_bytes(data)).ok());
    ASSERT_TRUE(writer->rewind(to).ok());
    EXPECT_EQ(writer->size(), to);
    EXPECT_FALSE(writer->rewind(to + 1).ok()) << "cannot rewind forward";
    const std::string more = payload_for(8, K + 33);
    ASSERT_TRUE(writer->write(as_bytes(more)).ok());
    auto file = writer->finish();
    ASSERT_TRUE(file.ok());
    EXPECT_EQ(read_back(**file), data.substr(0, to) + more);
    auto image = (*file)->segment_image();
    ASSERT_TRUE(image.has_value());
    EXPECT_EQ(image->file_size, fd_size(image->fd));
  }
}

LogOptions log_options(const TempDir& dir, SyncPolicy sync = SyncPolicy::kFsyncPerCommit) {
  LogOptions o;
  o.dir = dir.path() + "/log";
  o.sync = sync;
  o.segment_size = 1 << 20;
  return o;
}

// Reads every entry: (xid, data) pairs.
std::vector<std::pair<std::uint32_t, std::string>> read_entries(ChangeLog& log, Lsn from = Lsn(0)) {
  std::vector<std::pair<std::uint32_t, std::string>> out;
  auto cursor = log.open_cursor(from);
  EXPECT_TRUE(cursor.ok()) << (cursor.ok() ? "" : cursor.error().to_string());
  if (!cursor.ok()) return out;
  while (true) {
    auto meta = (*cursor)->next_entry();
    EXPECT_TRUE(meta.ok()) << (meta.ok() ? "" : meta.error().to_string());
    if (!meta.ok() || !*meta) break;
    auto data = (*cursor)->read_data();
    EXPECT_TRUE(data.ok()) << (data.ok() ? "" : data.error().to_string());
    out.emplace_back((*meta)->xid, std::string(as_chars(*data)));
  }
  return out;
}

TEST(SpillLinking, ASpilledEntryBecomesASegmentOfItsOwnBetweenTheOthers) {
  TempDir dir;
  auto opened = ChangeLog::open(log_options(dir));
  ASSERT_TRUE(opened.ok()) << opened.error().to_string();
  auto& log = *opened;
  const std::string spill_dir = dir.path() + "/spill";
  const std::string small1 = payload_for(1), small3 = payload_for(3), small5 = payload_for(5);
  const std::string big2 = payload_for(2, 2 * K + 5), big4 = payload_for(4, K + 1);
  PendingEntry e1 = txn(1, as_bytes(small1));
  PendingEntry e2 = txn(2, {});
  PendingEntry e3 = txn(3, as_bytes(small3));
  PendingEntry e4 = txn(4, {});
  PendingEntry e5 = txn(5, as_bytes(small5));
  auto s2 = spill(spill_dir, big2, e2.meta);
  auto s4 = spill(spill_dir, big4, e4.meta);
  e2.source = s2.get();
  e4.source = s4.get();
  const std::string state = "capture state";
  EntryMeta cp;
  cp.kind = EntryKind::kCheckpoint;
  cp.commit_lsn = e5.meta.commit_lsn;
  // The checkpoint sits before the last linked entry: the new active segment carries it.
  PendingEntry checkpoint{cp, as_bytes(state)};
  checkpoint.meta.commit_lsn = e3.meta.commit_lsn;
  std::vector<PendingEntry> batch{e1, e2, e3, checkpoint, e4, e5};
  const std::uint64_t segments_before = log->stats().segments;
  const std::uint64_t fsyncs_before = log->stats().fsyncs;

  // A reader waiting at the end sees the whole batch at once.
  auto live = log->open_cursor(Lsn(0));
  ASSERT_TRUE(live.ok());
  ASSERT_TRUE(log->append(batch).ok());
  EXPECT_GT(log->stats().fsyncs, fsyncs_before);

  // sealed active | run {1} | linked 2 | run {3, checkpoint} | linked 4 | active {5, checkpoint}
  auto segments = log->segments();
  ASSERT_EQ(segments.size(), segments_before + 5);
  const SegmentInfo& linked2 = segments[segments_before + 1];
  EXPECT_TRUE(linked2.sealed);
  EXPECT_EQ(linked2.first_lsn, e2.meta.commit_lsn);
  EXPECT_EQ(linked2.last_lsn, e2.meta.commit_lsn);
  EXPECT_EQ(linked2.bytes, s2->segment_image()->file_size);
  EXPECT_FALSE(segments.back().sealed);
  EXPECT_EQ(std::filesystem::file_size(log->segment_path(linked2.seq)),
            s2->segment_image()->file_size);
  // The link is the spill file itself: no copy was made.
  struct stat linked_stat {
  }, spill_stat{};
  ASSERT_EQ(::stat(log->segment_path(linked2.seq).c_str(), &linked_stat), 0);
  ASSERT_EQ(::fstat(s2->segment_image()->fd, &spill_stat), 0);
  EXPECT_EQ(linked_stat.st_ino, spill_stat.st_ino);

  const std::vector<std::pair<std::uint32_t, std::string>> expected{
      {1, small1}, {2, big2}, {3, small3}, {4, big4}, {5, small5}};
  EXPECT_EQ(read_entries(*log), expected);
  std::vector<std::pair<std::uint32_t, std::string>> seen;
  while (true) {
    auto meta = (*live)->next_entry();
    ASSERT_TRUE(meta.ok());
    if (!*meta) break;
    seen.emplace_back((*meta)->xid, std::string(as_chars((*live)->read_data().value())));
  }
  EXPECT_EQ(seen, expected);
  // Seeking into the linked segment (by its index) finds the entry.
  EXPECT_EQ(read_entries(*log, e4.meta.commit_lsn).front().first, 4u);
  EXPECT_EQ(log->last_checkpoint(), std::optional<Bytes>(Bytes(state.begin(), state.end())));
  EXPECT_EQ(log->last_commit_lsn(), e5.meta.commit_lsn);
  EXPECT_EQ(log->durable_end_lsn(), e5.meta.end_lsn);

  // Appending goes on in the new active segment; all of it survives a reopen.
  const std::string small6 = payload_for(6);
  PendingEntry e6 = txn(6, as_bytes(small6));
  ASSERT_TRUE(log->append(std::span<const PendingEntry>(&e6, 1)).ok());
  s2.reset();
  s4.reset();
  opened->reset();
  auto reopened = ChangeLog::open(log_options(dir));
  ASSERT_TRUE(reopened.ok()) << reopened.error().to_string();
  auto after = read_entries(**reopened);
  auto with6 = expected;
  with6.emplace_back(6, small6);
  EXPECT_EQ(after, with6);
  EXPECT_EQ((*reopened)->last_checkpoint(),
            std::optional<Bytes>(Bytes(state.begin(), state.end())));
  EXPECT_EQ((*reopened)->last_commit_lsn(), e6.meta.commit_lsn);

  // Retention removes a linked segment like any other once it is confirmed.
  ASSERT_TRUE((*reopened)->remove_before(e3.meta.commit_lsn).ok());
  EXPECT_FALSE(std::filesystem::exists((*reopened)->segment_path(linked2.seq)));
  EXPECT_EQ(read_entries(**reopened, e3.meta.commit_lsn).front().first, 3u);
}

TEST(SpillLinking, AssignedLsnsAreWrittenIntoTheLinkedFile) {
  TempDir dir;
  auto log = ChangeLog::open(log_options(dir, SyncPolicy::kNone)).value();
  const std::string big = payload_for(9, 3 * K);
  PendingEntry e = txn(0, {});  // LSNs relative to the batch, as trigger capture gives them
  e.meta.begin_lsn = Lsn(0);
  e.meta.commit_lsn = Lsn(10);
  e.meta.end_lsn = Lsn(11);
  auto file = spill(dir.path() + "/spill", big, e.meta, K + 1);
  e.source = file.get();
  std::vector<PendingEntry> batch{e};
  auto base = log->append_assigning(batch, Lsn(0x5000));
  ASSERT_TRUE(base.ok());
  EXPECT_EQ(*base, Lsn(0x5000));
  auto cursor = log->open_cursor(Lsn(0)).value();
  auto meta = cursor->next_entry();
  ASSERT_TRUE(meta.ok() && *meta);
  EXPECT_EQ((*meta)->commit_lsn, Lsn(0x500A));
  EXPECT_EQ((*meta)->end_lsn, Lsn(0x500B));
  EXPECT_EQ(std::string(as_chars(cursor->read_data().value())), big);
  EXPECT_EQ(log->segments().size(), 3u);  // the first (empty), the linked one, the new active
}

TEST(SpillLinking, AFileWithoutRoomForTheMetadataIsCopied) {
  TempDir dir;
  auto log = ChangeLog::open(log_options(dir)).value();
  const std::string big = payload_for(1, K + 10);
  PendingEntry e = txn(1, {});
  auto file = spill(dir.path() + "/spill", big, e.meta);
  // The origin arrived after the spill started: the FIRST record has no room for it.
  e.meta.origin = "sub_origin";
  e.source = file.get();
  ASSERT_TRUE(log->append(std::span<const PendingEntry>(&e, 1)).ok());
  EXPECT_EQ(log->segments().size(), 1u);
  auto cursor = log->open_cursor(Lsn(0)).value();
  auto meta = cursor->next_entry();
  ASSERT_TRUE(meta.ok() && *meta);
  EXPECT_EQ((*meta)->origin, "sub_origin");
  EXPECT_EQ(std::string(as_chars(cursor->read_data().value())), big);
}

TEST(SpillLinking, LeftoversOfAnAppendCutShortAreReplacedAndRemovedOnOpen) {
  TempDir dir;
  const LogOptions o = log_options(dir);
  std::uint64_t next = 0;
  {
    auto log = ChangeLog::open(o).value();
    next = log->segments().back().seq + 1;
  }
  // What a kill -9 between the link and the manifest switch leaves: files the manifest does
  // not name. Opening removes them.
  const std::string leftover = o.dir + "/" + segment_file_name(next);
  { std::ofstream(leftover) << "not a segment"; }
  auto log = ChangeLog::open(o).value();
  EXPECT_FALSE(std::filesystem::exists(leftover));
  // One made while the log runs (it cannot be, but a link must not fail on it) is replaced.
  { std::ofstream(leftover) << "not a segment"; }
  const std::string big = payload_for(1, K + 10);
  PendingEntry e = txn(1, {});
  auto file = spill(dir.path() + "/spill", big, e.meta);
  e.source = file.get();
  ASSERT_TRUE(log->append(std::span<const PendingEntry>(&e, 1)).ok());
  auto entries = read_entries(*log);
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].second, big);
  EXPECT_EQ(log->segments().at(1).bytes, std::filesystem::file_size(leftover));
}

}  // namespace
}  // namespace pgrelay::log
