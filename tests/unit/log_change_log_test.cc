// Tests the change log: ordering, the restart rule, recovery of torn tails, segments, retention.
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "log/change_log.h"
#include "log/manifest.h"
#include "log_test_util.h"

namespace pgrelay::log {
namespace {

using testing::payload_for;
using testing::TempDir;
using testing::txn;

LogOptions options_for(const TempDir& dir, SyncPolicy sync = SyncPolicy::kNone) {
  LogOptions o;
  o.dir = dir.path();
  o.sync = sync;
  return o;
}

// Where the active segment's data ends (its file is allocated further).
std::uint64_t data_end(const ChangeLog& log) {
  return log.segments().back().bytes;
}

std::unique_ptr<ChangeLog> open_log(LogOptions o) {
  auto log = ChangeLog::open(std::move(o));
  EXPECT_TRUE(log.ok()) << (log.ok() ? "" : log.error().to_string());
  return log.ok() ? std::move(*log) : nullptr;
}

void append_txns(ChangeLog& log, std::uint64_t from, std::uint64_t to, std::size_t size = 40) {
  for (std::uint64_t n = from; n <= to; ++n) {
    std::string data = payload_for(n, size);
    PendingEntry e = txn(n, as_bytes(data));
    ASSERT_TRUE(log.append(std::span<const PendingEntry>(&e, 1)).ok()) << n;
  }
}

// Reads every visible entry from `start`, checking each payload; returns the xids in order.
std::vector<std::uint32_t> read_all(ChangeLog& log, Lsn start, std::size_t size = 40) {
  std::vector<std::uint32_t> xids;
  auto cursor = log.open_cursor(start);
  EXPECT_TRUE(cursor.ok()) << (cursor.ok() ? "" : cursor.error().to_string());
  if (!cursor.ok()) return xids;
  while (true) {
    auto meta = (*cursor)->next_entry();
    EXPECT_TRUE(meta.ok()) << (meta.ok() ? "" : meta.error().to_string());
    if (!meta.ok() || !*meta) break;
    auto data = (*cursor)->read_data();
    EXPECT_TRUE(data.ok());
    EXPECT_EQ(as_chars(*data), payload_for((*meta)->xid, size));
    EXPECT_EQ((*meta)->commit_lsn, Lsn((*meta)->xid * 100ull + 50));
    xids.push_back((*meta)->xid);
  }
  return xids;
}

std::vector<std::uint32_t> range(std::uint32_t from, std::uint32_t to) {
  std::vector<std::uint32_t> v;
  for (std::uint32_t i = from; i <= to; ++i) v.push_back(i);
  return v;
}

TEST(ChangeLog, AppendsAndReadsInOrder) {
  TempDir dir;
  auto log = open_log(options_for(dir));
  append_txns(*log, 1, 50);
  EXPECT_EQ(read_all(*log, Lsn(0)), range(1, 50));
  EXPECT_EQ(log->last_commit_lsn(), Lsn(50 * 100 + 50));
  LogStats s = log->stats();
  EXPECT_EQ(s.entries_appended, 50u);
  EXPECT_EQ(s.oldest_lsn, Lsn(150));
  EXPECT_EQ(s.newest_lsn, Lsn(5050));
}

// append_visible shows a batch to readers before its fdatasync; durable_end_lsn() tells how far
// the sync thread has made the log durable, and catches up with it.
TEST(ChangeLog, AppendVisibleIsReadableAtOnceAndDurableSoonAfter) {
  TempDir dir;
  auto log = open_log(options_for(dir, SyncPolicy::kFsyncPerCommit));
  ASSERT_NE(log, nullptr);
  append_txns(*log, 1, 3);
  const Lsn durable_before = log->durable_end_lsn();
  EXPECT_EQ(durable_before, log->last_end_lsn());
  for (std::uint64_t n = 4; n <= 40; ++n) {
    std::string data = payload_for(n, 40);
    PendingEntry e = txn(n, as_bytes(data));
    ASSERT_TRUE(log->append_visible(std::span<const PendingEntry>(&e, 1)).ok()) << n;
    EXPECT_LE(log->durable_end_lsn(), log->last_end_lsn());
  }
  EXPECT_EQ(read_all(*log, Lsn(0)), range(1, 40));
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (log->durable_end_lsn() < log->last_end_lsn() &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(log->durable_end_lsn(), log->last_end_lsn());
  EXPECT_GT(log->durable_end_lsn(), durable_before);
  const Lsn end = log->last_end_lsn();
  log.reset();
  auto reopened = open_log(options_for(dir, SyncPolicy::kFsyncPerCommit));
  ASSERT_NE(reopened, nullptr);
  EXPECT_EQ(reopened->durable_end_lsn(), end);
  EXPECT_EQ(read_all(*reopened, Lsn(0)), range(1, 40));
}

// With a hop trace, the log stamps each batch as it becomes visible and each fdatasync's reach:
// append_visible() shows a batch before it is durable, append() only after.
TEST(ChangeLog, HopTraceStampsVisibleAndDurableInTheirOrder) {
  TempDir dir;
  HopTrace trace;
  LogOptions o = options_for(dir, SyncPolicy::kFsyncPerCommit);
  o.visible_sync_delay = std::chrono::hours(1);  // only a waiter makes visible data durable
  o.hop_trace = &trace;
  auto log = open_log(o);
  ASSERT_NE(log, nullptr);
  auto stamps_of = [&](Hop hop) {
    std::vector<HopTrace::Stamp> out;
    for (const auto& s : trace.stamps()) {
      if (s.hop == hop) out.push_back(s);
    }
    return out;
  };
  append_txns(*log, 1, 1);  // append(): durable first, then visible
  const Lsn first_end = log->last_end_lsn();
  ASSERT_EQ(stamps_of(Hop::kDurable).size(), 1u);
  ASSERT_EQ(stamps_of(Hop::kAppendVisible).size(), 1u);
  EXPECT_EQ(stamps_of(Hop::kDurable)[0].through, first_end.value());
  EXPECT_EQ(stamps_of(Hop::kAppendVisible)[0].through, first_end.value());
  EXPECT_LE(stamps_of(Hop::kDurable)[0].unix_us, stamps_of(Hop::kAppendVisible)[0].unix_us);

  std::string data = payload_for(2, 40);
  PendingEntry e = txn(2, as_bytes(data));
  ASSERT_TRUE(log->append_visible(std::span<const PendingEntry>(&e, 1)).ok());
  const Lsn second_end = log->last_end_lsn();
  ASSERT_EQ(stamps_of(Hop::kAppendVisible).size(), 2u);
  EXPECT_EQ(stamps_of(Hop::kAppendVisible)[1].through, second_end.value());
  EXPECT_EQ(stamps_of(Hop::kDurable).size(), 1u);  // visible, not yet durable
  ASSERT_TRUE(
      log->wait_durable(second_end, std::chrono::steady_clock::now() + std::chrono::minutes(5)));
  ASSERT_EQ(stamps_of(Hop::kDurable).size(), 2u);
  EXPECT_EQ(stamps_of(Hop::kDurable)[1].through, second_end.value());
  EXPECT_GE(stamps_of(Hop::kDurable)[1].unix_us, stamps_of(Hop::kAppendVisible)[1].unix_us);
  for (const auto& s : trace.stamps()) EXPECT_EQ(s.session, 0u);
}

// The trace's file: one line per stamp in the order taken, the LSN as Postgres writes it, and
// what the capacity left out.
TEST(HopTraceTest, WritesEveryStampAndCountsWhatItDropped) {
  TempDir dir;
  HopTrace trace(3);
  trace.stamp(Hop::kUpstreamSend, 0x100000020ull, 1700000000000001);
  trace.stamp(Hop::kWalsenderRead, 0x30, 1700000000000002, 7);
  trace.stamp(Hop::kSocketWrite, 0x30, 1700000000000003, 7);
  trace.stamp(Hop::kDurable, 0x40, 1700000000000004);  // past the capacity
  EXPECT_EQ(trace.size(), 3u);
  EXPECT_EQ(trace.dropped(), 1u);
  const std::string path = dir.path() + "/trace.txt";
  ASSERT_TRUE(trace.write(path).ok());
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(),
            "upstream_send 1/20 1700000000000001 0\n"
            "walsender_read 0/30 1700000000000002 7\n"
            "socket_write 0/30 1700000000000003 7\n"
            "# dropped 1\n");
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  auto refused = trace.write(dir.path() + "/no/such/dir/trace.txt");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().sqlstate, sqlstate::kIoError);
  EXPECT_NE(refused.error().hint.find("--hop-trace"), std::string::npos);
}

// An appender that returns once its batch is written (trigger capture, reading its next poll
// meanwhile) has it synced at once, not after visible_sync_delay (an hour here), and shown to
// readers only then: the visible listeners are called after it is durable, never before.
TEST(ChangeLog, AppendReturningWhenWrittenShowsTheBatchOnceDurable) {
  TempDir dir;
  HopTrace trace;
  LogOptions o = options_for(dir, SyncPolicy::kFsyncPerCommit);
  o.visible_sync_delay = std::chrono::hours(1);
  o.hop_trace = &trace;
  auto log = open_log(o);
  ASSERT_NE(log, nullptr);
  append_txns(*log, 1, 2);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Lsn> calls;  // the durable end at each call
  log->on_visible([&] {
    std::lock_guard lock(mu);
    calls.push_back(log->durable_end_lsn());
    cv.notify_all();
  });
  for (std::uint64_t n = 3; n <= 20; ++n) {
    std::string data = payload_for(n, 40);
    std::vector<PendingEntry> batch{txn(n, as_bytes(data))};
    const Lsn floor(n * 100);
    batch[0].meta.begin_lsn = Lsn(0);  // relative to the base the log assigns, n * 100
    batch[0].meta.commit_lsn = Lsn(50);
    batch[0].meta.end_lsn = Lsn(51);
    auto base = log->append_assigning(batch, floor, ChangeLog::ReturnWhen::kWritten);
    ASSERT_TRUE(base.ok()) << n;
    ASSERT_EQ(*base, floor);
  }
  const Lsn end = log->last_end_lsn();
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] {
      return !calls.empty() && !(calls.back() < end);
    })) << "the sync thread did not make the batches durable and call the listeners";
    for (Lsn durable : calls) {
      EXPECT_FALSE(durable < Lsn(351)) << "a listener was called before the first was durable";
    }
  }
  EXPECT_EQ(read_all(*log, Lsn(0)), range(1, 20));
  // Each batch became visible when its fdatasync covered it, never before.
  std::vector<std::int64_t> durable_at;
  for (const auto& s : trace.stamps()) {
    if (s.hop == Hop::kDurable) durable_at.push_back(s.unix_us);
    if (s.hop != Hop::kAppendVisible || s.through < Lsn(300).value()) continue;
    bool covered = false;
    for (const auto& d : trace.stamps()) {
      covered =
          covered || (d.hop == Hop::kDurable && d.through >= s.through && d.unix_us <= s.unix_us);
    }
    EXPECT_TRUE(covered) << "visible through " << s.through << " before durable";
  }
  EXPECT_FALSE(durable_at.empty());
}

// A log opened again says everything it holds is durable, so its open syncs the active segment:
// a process killed between a write and its fdatasync left that write in the page cache only.
// A read-only open, or a log that never syncs, does not.
TEST(ChangeLog, OpenSyncsWhatTheLastProcessMayNotHave) {
  TempDir dir;
  {
    auto log = open_log(options_for(dir, SyncPolicy::kFsyncPerCommit));
    ASSERT_NE(log, nullptr);
    append_txns(*log, 1, 3);
  }
  auto reopened = open_log(options_for(dir, SyncPolicy::kFsyncPerCommit));
  ASSERT_NE(reopened, nullptr);
  EXPECT_EQ(reopened->stats().fsyncs, 1u);
  EXPECT_EQ(reopened->durable_end_lsn(), reopened->last_end_lsn());
  reopened.reset();
  auto unsynced = open_log(options_for(dir, SyncPolicy::kNone));
  ASSERT_NE(unsynced, nullptr);
  EXPECT_EQ(unsynced->stats().fsyncs, 0u);
  unsynced.reset();
  LogOptions read_only = options_for(dir, SyncPolicy::kFsyncPerCommit);
  read_only.read_only = true;
  auto reader = open_log(read_only);
  ASSERT_NE(reader, nullptr);
  EXPECT_EQ(reader->stats().fsyncs, 0u);
  EXPECT_EQ(read_all(*reader, Lsn(0)), range(1, 3));
}

// A reader waiting for durability is a waiter like an appender: the sync thread syncs for it
// at once, not after visible_sync_delay (an hour here, so that only the waiter can make it).
TEST(ChangeLog, WaitDurableHasTheVisibleDataSyncedForItsReader) {
  TempDir dir;
  LogOptions o = options_for(dir, SyncPolicy::kFsyncPerCommit);
  o.visible_sync_delay = std::chrono::hours(1);
  auto log = open_log(o);
  ASSERT_NE(log, nullptr);
  append_txns(*log, 1, 2);
  const Lsn synced = log->durable_end_lsn();
  std::string data = payload_for(3, 40);
  PendingEntry e = txn(3, as_bytes(data));
  ASSERT_TRUE(log->append_visible(std::span<const PendingEntry>(&e, 1)).ok());
  const Lsn end = log->last_end_lsn();
  EXPECT_EQ(log->durable_end_lsn(), synced);  // visible, not yet durable
  EXPECT_TRUE(log->wait_durable(end, std::chrono::steady_clock::now() + std::chrono::minutes(5)));
  EXPECT_EQ(log->durable_end_lsn(), end);
  // Already durable: at once; and a deadline that passes answers false, never waits on.
  EXPECT_TRUE(log->wait_durable(end, std::chrono::steady_clock::now()));
  EXPECT_FALSE(log->wait_durable(Lsn(end.value() + 1000), std::chrono::steady_clock::now()));
}

// How far a source has read its upstream: reported when it passes the log's end, never going
// back, waking listeners only when it moves, and not kept across a reopen.
TEST(ChangeLog, ReadThroughIsWhatTheSourceNoted) {
  TempDir dir;
  auto log = open_log(options_for(dir));
  ASSERT_NE(log, nullptr);
  int woken = 0;
  log->on_visible([&woken] { ++woken; });
  append_txns(*log, 1, 2);
  const int after_appends = woken;
  const Lsn end = log->last_end_lsn();
  EXPECT_EQ(log->read_through(), Lsn());  // the log's end is no such report
  log->note_read_through(Lsn(end.value() - 1));  // behind the log: nothing moves
  EXPECT_EQ(log->read_through(), Lsn());
  EXPECT_EQ(woken, after_appends);
  log->note_read_through(Lsn(end.value() + 1000));
  EXPECT_EQ(log->read_through(), Lsn(end.value() + 1000));
  EXPECT_EQ(woken, after_appends + 1);
  log->note_read_through(Lsn(end.value() + 1000));  // the same again: no wake
  log->note_read_through(Lsn(end.value() + 10));    // an older report: ignored
  EXPECT_EQ(log->read_through(), Lsn(end.value() + 1000));
  EXPECT_EQ(woken, after_appends + 1);
  log.reset();
  auto reopened = open_log(options_for(dir));
  ASSERT_NE(reopened, nullptr);
  EXPECT_EQ(reopened->read_through(), Lsn());  // kept in memory only
}

TEST(ChangeLog, RestartRuleAtExactBoundaries) {
  TempDir dir;
  auto log = open_log(options_for(dir));
  append_txns(*log, 1, 10);
  // A transaction is skipped iff its commit LSN is below the start point.
  EXPECT_EQ(read_all(*log, Lsn(550)), range(5, 10));  // == commit LSN of 5: included
  EXPECT_EQ(read_all(*log, Lsn(551)), range(6, 10));  // == end LSN of 5: skipped
  EXPECT_EQ(read_all(*log, Lsn(549)), range(5, 10));
  EXPECT_EQ(read_all(*log, Lsn(1051)), std::vector<std::uint32_t>{});
  EXPECT_EQ(read_all(*log, Lsn(1050)), std::vector<std::uint32_t>{10});
}

TEST(ChangeLog, RejectsOutOfOrderCommitLsn) {
  TempDir dir;
  auto log = open_log(options_for(dir));
  append_txns(*log, 5, 5);
  std::string data = "x";
  PendingEntry same = txn(5, as_bytes(data));
  EXPECT_FALSE(log->append(std::span<const PendingEntry>(&same, 1)).ok());
  PendingEntry older = txn(4, as_bytes(data));
  EXPECT_FALSE(log->append(std::span<const PendingEntry>(&older, 1)).ok());
  append_txns(*log, 6, 6);
  EXPECT_EQ(read_all(*log, Lsn(0)), range(5, 6));
}

TEST(ChangeLog, PersistsAcrossReopen) {
  TempDir dir;
  std::uint64_t system_id = 0;
  {
    auto log = open_log(options_for(dir, SyncPolicy::kFsyncPerCommit));
    append_txns(*log, 1, 20);
    system_id = log->system_id();
  }
  auto log = open_log(options_for(dir, SyncPolicy::kFsyncPerCommit));
  EXPECT_EQ(log->system_id(), system_id);
  EXPECT_EQ(log->last_commit_lsn(), Lsn(2050));
  append_txns(*log, 21, 25);
  EXPECT_EQ(read_all(*log, Lsn(0)), range(1, 25));
}

TEST(ChangeLog, SecondOpenOfSameDirectoryIsRefused) {
  TempDir dir;
  auto log = open_log(options_for(dir));
  auto second = ChangeLog::open(options_for(dir));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.error().sqlstate, sqlstate::kObjectInUse);
  EXPECT_NE(second.error().hint.find("--data-dir"), std::string::npos);
}

TEST(ChangeLog, LargeEntriesSpanRecords) {
  TempDir dir;
  auto log = open_log(options_for(dir));
  std::string big = payload_for(1, 3 * kMaxRecordPayload + 12345);
  PendingEntry e = txn(1, as_bytes(big));
  ASSERT_TRUE(log->append(std::span<const PendingEntry>(&e, 1)).ok());
  append_txns(*log, 2, 3, 3 * kMaxRecordPayload + 12345);
  auto cursor = log->open_cursor(Lsn(0)).value();
  int seen = 0;
  while (true) {
    auto meta = cursor->next_entry();
    ASSERT_TRUE(meta.ok());
    if (!*meta) break;
    // Skip the data of the second entry without reading it.
    if ((*meta)->xid == 2) continue;
    auto data = cursor->read_data();
    ASSERT_TRUE(data.ok());
    EXPECT_EQ(as_chars(*data), payload_for((*meta)->xid, 3 * kMaxRecordPayload + 12345));
    ++seen;
  }
  EXPECT_EQ(seen, 2);
}

// Entry data from a DataSource (a spilled transaction) is written piece by piece.
class GeneratedSource : public DataSource {
 public:
  explicit GeneratedSource(std::string text) : text_(std::move(text)) {}
  std::uint64_t size() const override { return text_.size(); }
  Status read(std::uint64_t offset, std::span<std::uint8_t> out) const override {
    ++reads_;
    std::memcpy(out.data(), text_.data() + offset, out.size());
    return {};
  }
  mutable int reads_ = 0;

 private:
  std::string text_;
};

TEST(ChangeLog, AppendsFromDataSource) {
  TempDir dir;
  auto log = open_log(options_for(dir));
  GeneratedSource source(payload_for(1, 2 * kMaxRecordPayload + 99));
  PendingEntry e = txn(1, {});
  e.source = &source;
  ASSERT_TRUE(log->append(std::span<const PendingEntry>(&e, 1)).ok());
  EXPECT_GE(source.reads_, 3);
  auto cursor = log->open_cursor(Lsn(0)).value();
  auto meta = cursor->next_entry();
  ASSERT_TRUE(meta.ok() && *meta);
  auto data = cursor->read_data();
  ASSERT_TRUE(data.ok());
  EXPECT_EQ(as_chars(*data), payload_for(1, 2 * kMaxRecordPayload + 99));
}

// A source whose second read waits until the test lets it go: an append stuck in its write.
class StalledSource : public DataSource {
 public:
  explicit StalledSource(std::string text) : text_(std::move(text)) {}
  std::uint64_t size() const override { return text_.size(); }
  Status read(std::uint64_t offset, std::span<std::uint8_t> out) const override {
    std::unique_lock lock(mu_);
    if (offset > 0) {
      stalled_ = true;
      cv_.notify_all();
      cv_.wait_for(lock, std::chrono::seconds(60), [&] { return released_; });
    }
    std::memcpy(out.data(), text_.data() + offset, out.size());
    return {};
  }
  void wait_until_stalled() const {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(60), [&] { return stalled_; });
  }
  void release() const {
    std::lock_guard lock(mu_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  std::string text_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  mutable bool stalled_ = false, released_ = false;
};

// The write of a batch holds only the appenders back: readers (a walsender's event loop on
// its thread) still learn the log's state and read what is visible while it runs, and the
// next appender goes after it, in order.
TEST(ChangeLog, AWriteInProgressHoldsBackAppendersOnly) {
  TempDir dir;
  auto log = open_log(options_for(dir, SyncPolicy::kFsyncPerCommit));
  append_txns(*log, 1, 2);
  const std::string big = payload_for(3, 2 * kMaxRecordPayload + 7);
  StalledSource source(big);
  std::thread first([&] {
    PendingEntry e = txn(3, {});
    e.source = &source;
    EXPECT_TRUE(log->append_visible(std::span<const PendingEntry>(&e, 1)).ok());
  });
  source.wait_until_stalled();
  std::atomic<bool> second_done{false};
  std::thread second([&] {
    append_txns(*log, 4, 4);
    second_done = true;
  });

  // All of these take the log's state lock; none may wait for the stalled write.
  std::atomic<bool> read{false};
  std::unique_ptr<Cursor> cursor;
  std::thread reader([&] {
    EXPECT_EQ(log->last_end_lsn(), Lsn(2 * 100 + 51));
    EXPECT_EQ(log->stats().entries_appended, 2u);
    EXPECT_FALSE(log->segments().empty());
    EXPECT_EQ(read_all(*log, Lsn(0)), range(1, 2));
    cursor = log->open_cursor(Lsn(0)).value();
    read = true;
  });
  for (int i = 0; i < 3000 && !read.load(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(read.load()) << "a reader waited for the write in progress";
  EXPECT_FALSE(second_done.load());  // it waits for the first append's write

  source.release();
  reader.join();
  first.join();
  second.join();
  EXPECT_TRUE(second_done.load());
  std::vector<std::uint32_t> xids;
  while (true) {
    auto meta = cursor->next_entry();
    ASSERT_TRUE(meta.ok());
    if (!*meta) break;
    xids.push_back((*meta)->xid);
    if ((*meta)->xid == 3) {
      EXPECT_EQ(as_chars(cursor->read_data().value()), big);
    }
  }
  EXPECT_EQ(xids, range(1, 4));
}

TEST(ChangeLog, AppendAssigningChoosesIncreasingLsnsAcrossReopen) {
  TempDir dir;
  std::string data = "x";
  auto relative = [&] {
    EntryMeta m;
    m.begin_lsn = Lsn(0);
    m.commit_lsn = Lsn(10);
    m.end_lsn = Lsn(11);
    return std::vector<PendingEntry>{PendingEntry{m, as_bytes(data)}};
  };
  Lsn first_base;
  {
    auto log = open_log(options_for(dir));
    auto batch = relative();
    auto base = log->append_assigning(batch, Lsn(1000));
    ASSERT_TRUE(base.ok());
    EXPECT_EQ(*base, Lsn(1000));
    EXPECT_EQ(batch[0].meta.commit_lsn, Lsn(1010));
    // A floor below the log's end is raised past it: LSNs are never reused.
    batch = relative();
    base = log->append_assigning(batch, Lsn(5));
    ASSERT_TRUE(base.ok());
    EXPECT_EQ(*base, Lsn(1012));
    first_base = *base;
  }
  auto log = open_log(options_for(dir));
  auto batch = relative();
  auto base = log->append_assigning(batch, Lsn(5));
  ASSERT_TRUE(base.ok());
  EXPECT_GT(*base, first_base + 11);
  EXPECT_EQ(log->stats().entries_appended, 1u);
}

TEST(ChangeLog, MarkedEntriesAreListedAtTheirFinalLsnsAcrossReopen) {
  TempDir dir;
  std::string data = "x";
  {
    auto log = open_log(options_for(dir));
    EXPECT_FALSE(log->marked_entries(Lsn(0)).unmarked_through.is_valid());
    std::vector<PendingEntry> batch{txn(1, as_bytes(data)), txn(2, as_bytes(data))};
    batch[1].marked = true;
    ASSERT_TRUE(log->append(batch).ok());
    // Relative LSNs, shifted by the log: the list holds the LSN the entry was written at.
    EntryMeta m;
    m.begin_lsn = Lsn(0);
    m.commit_lsn = Lsn(10);
    m.end_lsn = Lsn(11);
    std::vector<PendingEntry> assigned{PendingEntry{m, as_bytes(data), nullptr, true}};
    auto base = log->append_assigning(assigned, Lsn(1000));
    ASSERT_TRUE(base.ok());
    EXPECT_EQ(log->marked_entries(Lsn(0)).commit_lsns, (std::vector<Lsn>{Lsn(250), Lsn(1010)}));
  }
  auto log = open_log(options_for(dir));
  const MarkedEntries marked = log->marked_entries(Lsn(251));
  EXPECT_EQ(marked.commit_lsns, std::vector<Lsn>{Lsn(1010)});
  EXPECT_FALSE(marked.unmarked_through.is_valid());
}

TEST(ChangeLog, ALogWithoutAMarksFileListsNoneOfItsEntriesAndSaysSo) {
  TempDir dir;
  std::string data = "x";
  {
    auto log = open_log(options_for(dir));
    std::vector<PendingEntry> batch{txn(1, as_bytes(data))};
    batch[0].marked = true;
    ASSERT_TRUE(log->append(batch).ok());
  }
  // As a log from before marks were kept: its entries may hold markers nobody listed.
  ASSERT_EQ(::unlink((dir.path() + "/" + kMarksName).c_str()), 0);
  LogOptions read_only = options_for(dir);
  read_only.read_only = true;
  {
    auto inspect = ChangeLog::open(read_only);
    ASSERT_TRUE(inspect.ok()) << inspect.error().to_string();
    EXPECT_EQ((*inspect)->marked_entries(Lsn(0)).unmarked_through, Lsn(151));
  }
  auto log = open_log(options_for(dir));
  std::vector<PendingEntry> batch{txn(2, as_bytes(data))};
  batch[0].marked = true;
  ASSERT_TRUE(log->append(batch).ok());
  const MarkedEntries marked = log->marked_entries(Lsn(0));
  EXPECT_EQ(marked.unmarked_through, Lsn(151));  // the end of txn 1
  EXPECT_EQ(marked.commit_lsns, std::vector<Lsn>{Lsn(250)});
}

TEST(ChangeLog, BatchIsAtomicAndOrdered) {
  TempDir dir;
  auto log = open_log(options_for(dir));
  std::vector<std::string> datas;
  for (int n = 1; n <= 5; ++n) datas.push_back(payload_for(static_cast<std::uint64_t>(n)));
  std::vector<PendingEntry> batch;
  for (int n = 1; n <= 5; ++n)
    batch.push_back(txn(static_cast<std::uint64_t>(n), as_bytes(datas[n - 1])));
  ASSERT_TRUE(log->append(batch).ok());
  EXPECT_EQ(read_all(*log, Lsn(0)), range(1, 5));
}

TEST(ChangeLog, SegmentsRollAndSeekUsesIndex) {
  TempDir dir;
  LogOptions o = options_for(dir);
  o.segment_size = 16 * 1024;
  o.index_interval = 512;
  {
    auto log = open_log(o);
    append_txns(*log, 1, 2000);
    EXPECT_GT(log->stats().segments, 5u);
    EXPECT_EQ(read_all(*log, Lsn(0)), range(1, 2000));
    for (std::uint32_t n : {1u, 2u, 77u, 500u, 1234u, 1999u, 2000u}) {
      auto xids = read_all(*log, Lsn(n * 100ull + 50));
      ASSERT_FALSE(xids.empty());
      EXPECT_EQ(xids.front(), n);
      EXPECT_EQ(xids.size(), 2000u - n + 1);
    }
  }
  // Index files are optional: without them, seeks rebuild the index by scanning.
  for (const auto& f : std::filesystem::directory_iterator(dir.path())) {
    if (f.path().extension() == ".idx") std::filesystem::remove(f.path());
  }
  auto log = open_log(o);
  auto xids = read_all(*log, Lsn(777 * 100 + 50));
  ASSERT_FALSE(xids.empty());
  EXPECT_EQ(xids.front(), 777u);
}

TEST(ChangeLog, SeekByTime) {
  TempDir dir;
  LogOptions o = options_for(dir);
  o.segment_size = 8 * 1024;
  auto log = open_log(o);
  append_txns(*log, 1, 500);
  auto cursor = log->open_cursor_at_time(321 * 1000).value();
  auto meta = cursor->next_entry();
  ASSERT_TRUE(meta.ok() && *meta);
  EXPECT_EQ((*meta)->xid, 321u);
}

TEST(ChangeLog, RemoveBeforeDeletesOnlyConfirmedSegments) {
  TempDir dir;
  LogOptions o = options_for(dir);
  o.segment_size = 8 * 1024;
  auto log = open_log(o);
  append_txns(*log, 1, 1000);
  std::uint64_t before = log->stats().segments;
  ASSERT_TRUE(log->remove_before(Lsn(500 * 100 + 50)).ok());
  std::uint64_t after = log->stats().segments;
  EXPECT_LT(after, before);
  // Everything at or after the retention point is still readable.
  auto xids = read_all(*log, Lsn(500 * 100 + 50));
  EXPECT_EQ(xids, range(500, 1000));
  // The removed range is refused with a clear error.
  auto gone = log->open_cursor(Lsn(150));
  ASSERT_FALSE(gone.ok());
  EXPECT_NE(gone.error().message.find("removed"), std::string::npos);
  // And the state survives a reopen.
  log.reset();
  log = open_log(o);
  EXPECT_EQ(log->stats().segments, after);
  EXPECT_EQ(read_all(*log, Lsn(500 * 100 + 50)), range(500, 1000));
}

TEST(ChangeLog, CheckpointPersistsAndIsInvisible) {
  TempDir dir;
  LogOptions o = options_for(dir, SyncPolicy::kFsyncPerCommit);
  o.segment_size = 8 * 1024;
  {
    auto log = open_log(o);
    for (std::uint64_t n = 1; n <= 300; ++n) {
      std::string data = payload_for(n);
      std::string cp = "snapshot-" + std::to_string(n);
      EntryMeta meta;
      meta.kind = EntryKind::kCheckpoint;
      std::vector<PendingEntry> batch{txn(n, as_bytes(data)), PendingEntry{meta, as_bytes(cp)}};
      ASSERT_TRUE(log->append(batch).ok());
    }
    EXPECT_GT(log->stats().segments, 2u);
  }
  auto log = open_log(o);
  auto cp = log->last_checkpoint();
  ASSERT_TRUE(cp.has_value());
  EXPECT_EQ(as_chars(*cp), "snapshot-300");
  EXPECT_EQ(read_all(*log, Lsn(0)), range(1, 300));
}

// Truncating the last batch at every byte offset recovers to the previous whole batch, and
// appending continues.
TEST(ChangeLog, TornTailAtEveryOffsetRecoversLastWholeBatch) {
  TempDir dir;
  std::string seg;
  std::uintmax_t whole_size = 0;
  std::uintmax_t before_last = 0;
  {
    auto log = open_log(options_for(dir));
    append_txns(*log, 1, 5);
    seg = log->segment_path(1);
    before_last = data_end(*log);
    append_txns(*log, 6, 6, 300);
    whole_size = data_end(*log);
  }
  std::ifstream in(seg, std::ios::binary);
  std::string original((std::istreambuf_iterator<char>(in)), {});
  original.resize(whole_size);
  for (std::uintmax_t cut = before_last; cut < whole_size; ++cut) {
    {
      std::ofstream out(seg, std::ios::binary | std::ios::trunc);
      out.write(original.data(), static_cast<std::streamsize>(cut));
    }
    auto log = open_log(options_for(dir));
    ASSERT_TRUE(log);
    EXPECT_EQ(read_all(*log, Lsn(0)), range(1, 5)) << "cut at " << cut;
    // The torn bytes through the last non-zero one (zeros after it read as preallocation).
    std::uintmax_t torn_end = cut;
    while (torn_end > before_last && original[torn_end - 1] == '\0') --torn_end;
    EXPECT_EQ(log->stats().recovered_truncated_bytes, torn_end - before_last);
    EXPECT_EQ(log->last_commit_lsn(), Lsn(550));
    append_txns(*log, 6, 6);
    EXPECT_EQ(read_all(*log, Lsn(0)), range(1, 6));
  }
}

// Corrupting any single byte of the last batch loses that batch only.
TEST(ChangeLog, CorruptTailAtEveryOffsetRecoversLastWholeBatch) {
  TempDir dir;
  std::string seg;
  std::uintmax_t before_last = 0;
  std::uintmax_t whole_size = 0;
  {
    auto log = open_log(options_for(dir));
    append_txns(*log, 1, 5);
    seg = log->segment_path(1);
    before_last = data_end(*log);
    append_txns(*log, 6, 6);
    whole_size = data_end(*log);
  }
  std::ifstream in(seg, std::ios::binary);
  std::string original((std::istreambuf_iterator<char>(in)), {});
  original.resize(whole_size);
  for (std::size_t at = before_last; at < original.size(); ++at) {
    std::string damaged = original;
    damaged[at] = static_cast<char>(damaged[at] ^ 0x5A);
    {
      std::ofstream out(seg, std::ios::binary | std::ios::trunc);
      out.write(damaged.data(), static_cast<std::streamsize>(damaged.size()));
    }
    auto log = open_log(options_for(dir));
    ASSERT_TRUE(log);
    EXPECT_EQ(read_all(*log, Lsn(0)), range(1, 5)) << "damage at " << at;
  }
}

// A segment's file is allocated to segment_size when it starts, so that an fdatasync after an
// append need not write the file's size; the zeros past the data are no torn tail, and a
// sealed segment gives its space back (readers of sealed segments read to the file's end).
TEST(ChangeLog, SegmentsArePreallocatedAndTrimmedWhenSealed) {
  TempDir dir;
  LogOptions o = options_for(dir, SyncPolicy::kFsyncPerCommit);
  o.segment_size = 16 * 1024;
  {
    auto log = open_log(o);
    EXPECT_EQ(std::filesystem::file_size(log->segment_path(1)), o.segment_size);
    append_txns(*log, 1, 10);
    EXPECT_LT(data_end(*log), o.segment_size);
    EXPECT_EQ(std::filesystem::file_size(log->segment_path(1)), o.segment_size);
  }
  {
    auto log = open_log(o);
    EXPECT_EQ(log->stats().recovered_truncated_bytes, 0u);
    EXPECT_EQ(read_all(*log, Lsn(0)), range(1, 10));
    append_txns(*log, 11, 400);  // several rolls
    const auto segments = log->segments();
    ASSERT_GE(segments.size(), 3u);
    for (std::size_t i = 0; i + 1 < segments.size(); ++i) {
      EXPECT_TRUE(segments[i].sealed);
      EXPECT_EQ(std::filesystem::file_size(log->segment_path(segments[i].seq)), segments[i].bytes)
          << "sealed segment " << segments[i].seq;
    }
    EXPECT_EQ(std::filesystem::file_size(log->segment_path(segments.back().seq)), o.segment_size);
    EXPECT_EQ(read_all(*log, Lsn(0)), range(1, 400));
  }
  auto log = open_log(o);
  EXPECT_EQ(log->stats().recovered_truncated_bytes, 0u);
  EXPECT_EQ(read_all(*log, Lsn(0)), range(1, 400));
  LogOptions read_only = options_for(dir);
  read_only.read_only = true;
  log.reset();
  auto inspect = open_log(read_only);
  EXPECT_EQ(inspect->stats().recovered_truncated_bytes, 0u);
  EXPECT_EQ(read_all(*inspect, Lsn(0)), range(1, 400));
}

// A crash can leave a later page of a batch on disk without an earlier one: written bytes
// beyond zeros in the preallocated space. They are a torn tail like any other: counted,
// truncated away (none of them may ever be read as a batch), and the space allocated again.
TEST(ChangeLog, BytesBeyondZerosInPreallocatedSpaceAreATornTail) {
  TempDir dir;
  LogOptions o = options_for(dir, SyncPolicy::kFsyncPerCommit);
  o.segment_size = 16 * 1024;
  std::string seg;
  std::uint64_t end = 0;
  {
    auto log = open_log(o);
    append_txns(*log, 1, 5);
    seg = log->segment_path(1);
    end = data_end(*log);
  }
  {
    std::fstream f(seg, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(static_cast<std::streamoff>(end + 4096));
    f.write("page of a later write", 21);
  }
  {
    auto log = open_log(o);
    EXPECT_EQ(log->stats().recovered_truncated_bytes, 4096u + 21u);
    EXPECT_EQ(log->stats().torn_tail_offset, end);
    EXPECT_EQ(read_all(*log, Lsn(0)), range(1, 5));
    EXPECT_EQ(std::filesystem::file_size(seg), o.segment_size);
    std::ifstream in(seg, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    EXPECT_EQ(bytes.find("page of a later write"), std::string::npos);
    append_txns(*log, 6, 8);
  }
  auto log = open_log(o);
  EXPECT_EQ(log->stats().recovered_truncated_bytes, 0u);
  EXPECT_EQ(read_all(*log, Lsn(0)), range(1, 8));
}

TEST(ChangeLog, DamagedSealedSegmentIsReportedWithFileAndOffset) {
  TempDir dir;
  LogOptions o = options_for(dir);
  o.segment_size = 8 * 1024;
  auto log = open_log(o);
  append_txns(*log, 1, 500);
  ASSERT_GT(log->stats().segments, 3u);
  std::string victim = log->segment_path(2);
  {
    std::fstream f(victim, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(1000);
    f.put('\x7f');
  }
  auto cursor = log->open_cursor(Lsn(0)).value();
  Error error;
  bool failed = false;
  for (int i = 0; i < 1000; ++i) {
    auto meta = cursor->next_entry();
    if (!meta.ok()) {
      error = meta.error();
      failed = true;
      break;
    }
    if (!*meta) break;
  }
  ASSERT_TRUE(failed);
  EXPECT_EQ(error.sqlstate, sqlstate::kDataCorrupted);
  EXPECT_NE(error.message.find(victim), std::string::npos) << error.message;
  EXPECT_NE(error.message.find("offset"), std::string::npos);
  EXPECT_FALSE(error.hint.empty());
}

TEST(ChangeLog, CursorWaitsForAppends) {
  TempDir dir;
  auto log = open_log(options_for(dir, SyncPolicy::kFsyncPerCommit));
  auto cursor = log->open_cursor(Lsn(0)).value();
  auto none = cursor->next_entry();
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  EXPECT_FALSE(cursor->wait(std::chrono::milliseconds(20)));
  std::thread writer([&] { append_txns(*log, 1, 1); });
  EXPECT_TRUE(cursor->wait(std::chrono::seconds(30)));
  writer.join();
  auto meta = cursor->next_entry();
  ASSERT_TRUE(meta.ok() && *meta);
  EXPECT_EQ((*meta)->xid, 1u);
}

TEST(ChangeLog, GroupCommitSharesFsyncs) {
  TempDir dir;
  auto log = open_log(options_for(dir, SyncPolicy::kFsyncPerCommit));
  constexpr int kThreads = 8;
  constexpr int kPerThread = 50;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        std::string data = "thread-" + std::to_string(t) + "-" + std::to_string(i);
        EntryMeta m;
        m.commit_lsn = Lsn(1);
        m.end_lsn = Lsn(2);
        m.xid = static_cast<std::uint32_t>(t * 1000 + i);
        std::vector<PendingEntry> batch{PendingEntry{m, as_bytes(data)}};
        ASSERT_TRUE(log->append_assigning(batch, Lsn(0)).ok());
      }
    });
  }
  for (auto& t : threads) t.join();
  LogStats s = log->stats();
  EXPECT_EQ(s.entries_appended, static_cast<std::uint64_t>(kThreads * kPerThread));
  // Each append waits for at most one fsync of its own making.
  EXPECT_LE(s.fsyncs, s.entries_appended);
  // Every thread's entries are present, in its own order, with strictly increasing LSNs.
  auto cursor = log->open_cursor(Lsn(0)).value();
  std::vector<int> next_of_thread(kThreads, 0);
  Lsn last;
  int count = 0;
  while (true) {
    auto meta = cursor->next_entry();
    ASSERT_TRUE(meta.ok());
    if (!*meta) break;
    EXPECT_GT((*meta)->commit_lsn, last);
    last = (*meta)->commit_lsn;
    int thread = static_cast<int>((*meta)->xid / 1000);
    int i = static_cast<int>((*meta)->xid % 1000);
    EXPECT_EQ(i, next_of_thread[thread]++);
    auto data = cursor->read_data();
    ASSERT_TRUE(data.ok());
    EXPECT_EQ(as_chars(*data), "thread-" + std::to_string(thread) + "-" + std::to_string(i));
    ++count;
  }
  EXPECT_EQ(count, kThreads * kPerThread);
}

TEST(ChangeLog, WriteFailureLeavesLogIntactAndAppendable) {
  TempDir dir;
  auto log = open_log(options_for(dir, SyncPolicy::kFsyncPerCommit));
  append_txns(*log, 1, 3);
  // Simulate a full disk: file size limit just above the current size.
  auto size = data_end(*log);
  struct rlimit old_limit;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit limit = old_limit;
  limit.rlim_cur = size + 20;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limit), 0);
  std::string data = payload_for(4, 200);
  PendingEntry e = txn(4, as_bytes(data));
  Status st = log->append(std::span<const PendingEntry>(&e, 1));
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old_limit), 0);
  std::signal(SIGXFSZ, old_handler);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find(log->segment_path(1)), std::string::npos) << st.error().message;
  EXPECT_FALSE(st.error().hint.empty());
  EXPECT_EQ(std::filesystem::file_size(log->segment_path(1)), size);
  append_txns(*log, 4, 5);
  EXPECT_EQ(read_all(*log, Lsn(0)), range(1, 5));
  log.reset();
  log = open_log(options_for(dir));
  EXPECT_EQ(read_all(*log, Lsn(0)), range(1, 5));
}

TEST(ChangeLog, UnusableDirectoryIsAClearError) {
  TempDir dir;
  std::string file = dir.path() + "/not-a-dir";
  std::ofstream(file) << "x";
  LogOptions o;
  o.dir = file;
  auto log = ChangeLog::open(o);
  ASSERT_FALSE(log.ok());
  EXPECT_NE(log.error().message.find(file), std::string::npos);
  EXPECT_FALSE(log.error().hint.empty());
  o.dir = file + "/sub";
  log = ChangeLog::open(o);
  ASSERT_FALSE(log.ok());
  EXPECT_NE(log.error().message.find(file + "/sub"), std::string::npos);
}

TEST(ChangeLog, MissingManifestWithSegmentsIsRefused) {
  TempDir dir;
  {
    auto log = open_log(options_for(dir));
    append_txns(*log, 1, 3);
  }
  std::filesystem::remove(dir.path() + "/MANIFEST");
  auto log = ChangeLog::open(options_for(dir));
  ASSERT_FALSE(log.ok());
  EXPECT_NE(log.error().message.find("MANIFEST"), std::string::npos);
}

}  // namespace
}  // namespace pgrelay::log
