// Tests retention: removal only past every slot, keep-all without slots, loud limits, lag.
#include <gtest/gtest.h>

#include "log/change_log.h"
#include "log/file_util.h"
#include "log/manifest.h"
#include "log/retention.h"
#include "log/slots.h"
#include "log_test_util.h"

namespace pgrelay::log {
namespace {

using testing::payload_for;
using testing::TempDir;
using testing::txn;

constexpr std::uint64_t kTxns = 300;
constexpr std::uint64_t kSegmentSize = 8 * 1024;

Lsn commit_of(std::uint64_t n) {
  return Lsn(n * 100 + 50);
}
Lsn end_of(std::uint64_t n) {
  return Lsn(n * 100 + 51);
}
std::int64_t time_of(std::uint64_t n) {
  return static_cast<std::int64_t>(n) * 1000;
}

class RetentionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    LogOptions o;
    o.dir = dir_.path();
    o.sync = SyncPolicy::kNone;
    o.segment_size = kSegmentSize;
    auto log = ChangeLog::open(o);
    ASSERT_TRUE(log.ok()) << log.error().to_string();
    log_ = std::move(*log);
    for (std::uint64_t n = 1; n <= kTxns; ++n) {
      std::string data = payload_for(n, 100);
      PendingEntry e = txn(n, as_bytes(data));
      ASSERT_TRUE(log_->append(std::span<const PendingEntry>(&e, 1)).ok());
    }
    ASSERT_GE(log_->stats().segments, 5u) << "the tests need several segments";
    reopen_slots();
  }

  void reopen_slots(SlotRegistryOptions o = {}) {
    slots_.reset();
    auto slots = SlotRegistry::open(dir_.path(), o);
    ASSERT_TRUE(slots.ok()) << slots.error().to_string();
    slots_ = std::move(*slots);
  }

  void add_slot_of(const std::string& database, const std::string& name, Lsn confirmed) {
    Slot s;
    s.name = name;
    s.plugin = "pgoutput";
    s.database = database;
    s.confirmed_flush = confirmed;
    ASSERT_TRUE(slots_->create(s).ok());
  }

  void add_slot(const std::string& name, Lsn confirmed, bool temporary = false) {
    Slot s;
    s.name = name;
    s.plugin = "pgoutput";
    s.database = "db";
    s.temporary = temporary;
    s.confirmed_flush = confirmed;
    ASSERT_TRUE(slots_->create(s).ok());
  }

  RetentionReport run(const RetentionOptions& o = {}, std::int64_t now = time_of(kTxns)) {
    auto r = enforce_retention(*log_, *slots_, o, now);
    EXPECT_TRUE(r.ok()) << r.error().to_string();
    return r.ok() ? std::move(*r) : RetentionReport{};
  }

  std::vector<SegmentInfo> manifest_segments() const {
    std::string path = dir_.path() + "/" + kManifestName;
    auto data = read_whole_file(path);
    EXPECT_TRUE(data.ok());
    auto m = parse_manifest(*data, path);
    EXPECT_TRUE(m.ok());
    return m->segments;
  }

  // The commit LSN the oldest entry must have after removing segments entirely below `point`.
  Lsn expected_oldest(Lsn point) const {
    Lsn previous_last;
    for (const SegmentInfo& s : manifest_segments()) {
      // The manifest's record of the active segment is stale; its first entry is the txn
      // after the last sealed one.
      if (!s.sealed) return previous_last + 100;
      if (s.last_lsn >= point) return s.first_lsn;
      previous_last = s.last_lsn;
    }
    return Lsn();
  }

  std::optional<std::uint32_t> first_xid_from(Lsn start) {
    auto cursor = log_->open_cursor(start);
    if (!cursor.ok()) return std::nullopt;
    auto meta = (*cursor)->next_entry();
    if (!meta.ok() || !*meta) return std::nullopt;
    return (*meta)->xid;
  }

  TempDir dir_;
  std::unique_ptr<ChangeLog> log_;
  std::unique_ptr<SlotRegistry> slots_;
};

TEST_F(RetentionTest, NoSlotsKeepsEverythingByDefault) {
  auto before = log_->stats();
  auto report = run();
  EXPECT_FALSE(report.removed_before.is_valid());
  EXPECT_EQ(report.segments_before, before.segments);
  EXPECT_EQ(report.segments_after, before.segments);
  EXPECT_EQ(report.bytes_after, before.total_bytes);
  EXPECT_EQ(log_->stats().oldest_lsn, commit_of(1));
  EXPECT_TRUE(report.warnings.empty());
}

TEST_F(RetentionTest, NoSlotsRetainsNothingWhenAsked) {
  RetentionOptions o;
  o.keep_all_without_slots = false;
  auto report = run(o);
  EXPECT_EQ(report.segments_after, 1u);  // the active segment always stays
  EXPECT_LT(report.bytes_after, report.bytes_before);
  EXPECT_GT(log_->stats().oldest_lsn, commit_of(1));
  EXPECT_EQ(first_xid_from(commit_of(kTxns)), kTxns);
}

TEST_F(RetentionTest, RemovesOnlyWhatEverySlotConfirmed) {
  add_slot("a", end_of(100));
  add_slot("b", end_of(250));
  add_slot("t", end_of(200), /*temporary=*/true);
  Lsn expected = expected_oldest(end_of(100));
  auto report = run();
  EXPECT_EQ(report.removed_before, end_of(100));
  EXPECT_LT(report.segments_after, report.segments_before);
  EXPECT_TRUE(report.lost_slots.empty());
  EXPECT_TRUE(report.warnings.empty());
  EXPECT_EQ(log_->stats().oldest_lsn, expected);
  EXPECT_GT(expected, commit_of(1));
  EXPECT_LE(expected, commit_of(101));
  EXPECT_EQ(first_xid_from(end_of(100)), 101u);

  // The temporary slot now holds the minimum.
  ASSERT_TRUE(slots_->confirm("a", end_of(280)).ok());
  expected = expected_oldest(end_of(200));
  report = run();
  EXPECT_EQ(report.removed_before, end_of(200));
  EXPECT_EQ(log_->stats().oldest_lsn, expected);
  EXPECT_EQ(first_xid_from(end_of(200)), 201u);

  ASSERT_TRUE(slots_->drop("t").ok());
  expected = expected_oldest(end_of(250));
  report = run();
  EXPECT_EQ(report.removed_before, end_of(250));
  EXPECT_EQ(log_->stats().oldest_lsn, expected);
  EXPECT_EQ(first_xid_from(end_of(250)), 251u);
}

TEST_F(RetentionTest, SlotAtTheStartHoldsEverything) {
  add_slot("zero", Lsn());
  auto report = run();
  EXPECT_EQ(report.segments_after, report.segments_before);
  EXPECT_EQ(log_->stats().oldest_lsn, commit_of(1));
}

TEST_F(RetentionTest, FlushesBatchedConfirmsBeforeRemoving) {
  SlotRegistryOptions o;
  o.persist_every = 0;
  reopen_slots(o);
  add_slot("s", end_of(10));
  ASSERT_TRUE(slots_->confirm("s", end_of(200)).ok());
  EXPECT_EQ(slots_->min_persisted_confirmed(), end_of(10));
  auto report = run();
  EXPECT_EQ(report.removed_before, end_of(200));
  reopen_slots();
  EXPECT_EQ(slots_->get("s")->confirmed_flush, end_of(200));
}

TEST_F(RetentionTest, MaxBytesInvalidatesLaggingSlotsLoudly) {
  add_slot("slow", end_of(20));
  add_slot("medium", end_of(270));
  RetentionOptions o;
  o.max_bytes = 3 * kSegmentSize;
  auto report = run(o);

  ASSERT_EQ(report.lost_slots, std::vector<std::string>{"slow"});
  ASSERT_EQ(report.warnings.size(), 1u);
  EXPECT_EQ(report.warnings[0].message, "replication slot \"slow\" is lost: it needs " +
                                            end_of(20).to_string() +
                                            " but the log exceeded max_bytes (24 kB)");
  EXPECT_NE(report.warnings[0].hint.find("max_bytes"), std::string::npos);
  EXPECT_LE(report.bytes_after, o.max_bytes);
  // The surviving slot still drives removal.
  EXPECT_EQ(report.removed_before, end_of(270));
  EXPECT_EQ(first_xid_from(end_of(270)), 271u);

  Status st = slots_->check_usable("slow");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().sqlstate, "55000");
  EXPECT_EQ(st.error().message, "can no longer get changes from replication slot \"slow\"");
  EXPECT_TRUE(slots_->check_usable("medium").ok());

  // The lost mark is on disk, and a second pass reports nothing new.
  reopen_slots();
  EXPECT_EQ(slots_->get("slow")->lost, LostCause::kMaxBytes);
  EXPECT_NE(slots_->get("slow")->lost_reason.find("max_bytes (24 kB)"), std::string::npos);
  EXPECT_FALSE(slots_->get("medium")->is_lost());
  auto again = run(o);
  EXPECT_TRUE(again.lost_slots.empty());
  EXPECT_TRUE(again.warnings.empty());
}

// The registry holds every database's slots, each log only its own database's: a slot of
// another database neither holds this log nor is lost by its limits.
TEST_F(RetentionTest, OnlyTheLogsOwnDatabasesSlotsCount) {
  add_slot("mine", end_of(270));              // database "db"
  add_slot_of("other", "theirs", end_of(5));  // far behind, in another log's positions
  // Without the database, every slot counts, as before: the other database's holds it all.
  auto everyone = run();
  EXPECT_EQ(everyone.segments_after, everyone.segments_before);

  RetentionOptions o;
  o.database = "db";
  o.max_bytes = 3 * kSegmentSize;
  auto report = run(o);
  EXPECT_TRUE(report.lost_slots.empty());
  EXPECT_TRUE(report.warnings.empty());
  EXPECT_EQ(report.removed_before, end_of(270));
  EXPECT_FALSE(slots_->get("theirs")->is_lost());
  EXPECT_EQ(slots_->min_persisted_confirmed("db"), end_of(270));
  EXPECT_EQ(slots_->min_persisted_confirmed(), end_of(5));
}

TEST_F(RetentionTest, MaxBytesWithinLimitLosesNothing) {
  add_slot("slow", end_of(1));
  RetentionOptions o;
  o.max_bytes = log_->stats().total_bytes;
  auto report = run(o);
  EXPECT_TRUE(report.lost_slots.empty());
  EXPECT_EQ(report.segments_after, report.segments_before);
  EXPECT_TRUE(slots_->check_usable("slow").ok());
}

TEST_F(RetentionTest, MaxBytesWithoutSlotsTrimsQuietly) {
  RetentionOptions o;
  o.max_bytes = 3 * kSegmentSize;
  auto report = run(o);
  EXPECT_TRUE(report.warnings.empty());
  EXPECT_LT(report.segments_after, report.segments_before);
  EXPECT_LE(report.bytes_after, o.max_bytes);
  EXPECT_GT(report.bytes_after, o.max_bytes - kSegmentSize - 1024);  // only what was needed
}

TEST_F(RetentionTest, MaxAgeInvalidatesLaggingSlotsLoudly) {
  add_slot("slow", end_of(100));
  RetentionOptions o;
  o.max_age = std::chrono::milliseconds(100);
  std::int64_t now = time_of(kTxns) + 50'000;  // entries before txn 250 are too old
  auto report = run(o, now);

  ASSERT_EQ(report.lost_slots, std::vector<std::string>{"slow"});
  ASSERT_EQ(report.warnings.size(), 1u);
  EXPECT_EQ(report.warnings[0].message,
            "replication slot \"slow\" is lost: it needs " + end_of(100).to_string() +
                " but the changes it needs are older than max_age (100 ms)");
  EXPECT_EQ(slots_->get("slow")->lost, LostCause::kMaxAge);
  EXPECT_EQ(slots_->check_usable("slow").error().sqlstate, "55000");

  // Old segments went; nothing younger than max_age did.
  Lsn oldest = log_->stats().oldest_lsn;
  EXPECT_GT(oldest, commit_of(101));
  EXPECT_LE(oldest, commit_of(250));
  EXPECT_EQ(first_xid_from(commit_of(250)), 250u);
}

TEST_F(RetentionTest, MaxAgeSparesSlotsThatConfirmedRecentData) {
  add_slot("recent", end_of(280));
  add_slot("temp", end_of(290), /*temporary=*/true);
  RetentionOptions o;
  o.max_age = std::chrono::milliseconds(100);
  auto report = run(o, time_of(kTxns) + 50'000);
  EXPECT_TRUE(report.lost_slots.empty());
  EXPECT_EQ(report.removed_before, end_of(280));
}

TEST_F(RetentionTest, TemporarySlotsAreLostToo) {
  add_slot("temp", end_of(5), /*temporary=*/true);
  RetentionOptions o;
  o.max_bytes = 2 * kSegmentSize;
  auto report = run(o);
  ASSERT_EQ(report.lost_slots, std::vector<std::string>{"temp"});
  EXPECT_EQ(report.warnings.size(), 1u);
  EXPECT_TRUE(slots_->get("temp")->is_lost());
}

TEST_F(RetentionTest, LagInBytesAndSeconds) {
  add_slot("behind", end_of(250));
  add_slot("current", end_of(kTxns));
  add_slot("lost", end_of(10));
  ASSERT_TRUE(slots_->mark_lost({"lost"}, LostCause::kMaxBytes, "test").ok());
  std::int64_t now = time_of(kTxns) + 1'000'000;

  auto lags = slot_lags(*log_, *slots_, now);
  ASSERT_TRUE(lags.ok()) << lags.error().to_string();
  ASSERT_EQ(lags->size(), 3u);
  const SlotLag& behind = (*lags)[0];
  EXPECT_EQ(behind.name, "behind");
  EXPECT_EQ(behind.confirmed_flush, end_of(250));
  EXPECT_EQ(behind.bytes, end_of(kTxns) - end_of(250));
  ASSERT_TRUE(behind.seconds.has_value());
  // The first unconfirmed entry is txn 251.
  EXPECT_DOUBLE_EQ(*behind.seconds, static_cast<double>(now - time_of(251)) / 1e6);

  const SlotLag& current = (*lags)[1];
  EXPECT_EQ(current.name, "current");
  EXPECT_EQ(current.bytes, 0u);
  ASSERT_TRUE(current.seconds.has_value());
  EXPECT_EQ(*current.seconds, 0.0);

  const SlotLag& lost = (*lags)[2];
  EXPECT_EQ(lost.name, "lost");
  EXPECT_EQ(lost.bytes, end_of(kTxns) - end_of(10));
  EXPECT_FALSE(lost.seconds.has_value());
}

TEST_F(RetentionTest, LagOfPositionAlreadyRemovedIsUnknown) {
  RetentionOptions o;
  o.keep_all_without_slots = false;
  (void)run(o);
  add_slot("late", end_of(5));
  auto lag = slot_lag(*log_, *slots_->get("late"), time_of(kTxns));
  ASSERT_TRUE(lag.ok());
  EXPECT_EQ(lag->bytes, end_of(kTxns) - end_of(5));
  EXPECT_FALSE(lag->seconds.has_value());
}

TEST(FormatSizeTest, MatchesPgSizePretty) {
  EXPECT_EQ(format_size(0), "0 bytes");
  EXPECT_EQ(format_size(10239), "10239 bytes");
  EXPECT_EQ(format_size(10240), "10 kB");
  EXPECT_EQ(format_size(24576), "24 kB");
  EXPECT_EQ(format_size(10ull << 20), "10 MB");
  EXPECT_EQ(format_size(10ull << 30), "10 GB");
  EXPECT_EQ(format_size(1536ull << 30), "1536 GB");
  EXPECT_EQ(format_size(20ull << 40), "20 TB");
}

}  // namespace
}  // namespace pgrelay::log
