// A walsender's entry source: log order always, entries linked in the cache taken without the log.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "log_test_util.h"
#include "server/entry_source.h"

namespace pgrelay::server {
namespace {

using log::testing::payload_for;
using log::testing::TempDir;
using log::testing::txn;

constexpr std::uint64_t kView = 7;

class EntrySourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    log::LogOptions options;
    options.dir = dir_.path();
    options.sync = log::SyncPolicy::kNone;
    auto opened = log::ChangeLog::open(options);
    ASSERT_TRUE(opened.ok()) << opened.error().message;
    log_ = std::move(*opened);
  }

  // Appends transactions first..last (LSNs from log_test_util's txn()).
  void append(std::uint64_t first, std::uint64_t last) {
    for (std::uint64_t n = first; n <= last; ++n) {
      std::string data = payload_for(n);
      auto entry = txn(n, as_bytes(data));
      ASSERT_TRUE(log_->append(std::span<const log::PendingEntry>(&entry, 1)).ok());
    }
  }

  EntrySource source(EncodedEntryCache& cache) {
    auto cursor = log_->open_cursor(Lsn(0));
    EXPECT_TRUE(cursor.ok());
    return EntrySource(*log_, std::move(*cursor), cache);
  }

  // Stands for the walsender's encoding: one message naming the entry's commit LSN, cached.
  static void encode_into(EncodedEntryCache& cache, const log::EntryMeta& meta) {
    auto built = std::make_shared<EncodedEntry>();
    EncodedMessage m;
    m.lsn = meta.end_lsn;
    m.tag = 'C';
    const std::string text = std::to_string(meta.commit_lsn.value());
    m.payload.assign(text.begin(), text.end());
    built->add(m);
    cache.insert(kView, meta.end_lsn, std::move(built));
  }

  // Takes `count` entries (fewer if caught up), as a walsender does: an entry that did not
  // come from the cache is read from the cursor and "encoded" into it. Returns the commit LSNs
  // in the order taken, checking that every cached entry is the one its meta names.
  static std::vector<std::uint64_t> take(EntrySource& from, EncodedEntryCache& cache,
                                         std::size_t count) {
    std::vector<std::uint64_t> commits;
    while (commits.size() < count) {
      auto next = from.next(kView);
      EXPECT_TRUE(next.ok()) << (next.ok() ? "" : next.error().message);
      if (!next.ok() || !next->has_value()) break;
      const log::EntryMeta& meta = (*next)->meta;
      if ((*next)->cached) {
        const auto& cached = *(*next)->cached;
        EXPECT_EQ(as_chars(cached.payload(cached.messages.at(0))),
                  std::to_string(meta.commit_lsn.value()));
      } else {
        auto data = from.cursor().read_data();
        EXPECT_TRUE(data.ok());
        if (data.ok()) {
          EXPECT_EQ(as_chars(*data), payload_for(meta.commit_lsn.value() / 100));
        }
        encode_into(cache, meta);
      }
      commits.push_back(meta.commit_lsn.value());
    }
    return commits;
  }

  static std::vector<std::uint64_t> drain(EntrySource& from, EncodedEntryCache& cache) {
    return take(from, cache, SIZE_MAX);
  }

  static std::vector<std::uint64_t> commits_of(std::uint64_t first, std::uint64_t last) {
    std::vector<std::uint64_t> out;
    for (std::uint64_t n = first; n <= last; ++n) out.push_back(n * 100 + 50);
    return out;
  }

  TempDir dir_;
  std::unique_ptr<log::ChangeLog> log_;
};

TEST_F(EntrySourceTest, AFollowerTakesWhatTheLeaderLinkedAndReadsTheRestFromTheLog) {
  EncodedEntryCache cache(64u << 20);
  append(1, 150);
  EntrySource leader = source(cache);
  EXPECT_EQ(drain(leader, cache), commits_of(1, 150));
  EXPECT_EQ(leader.taken_from_cache(), 0u);

  // Everything after the first entry is linked: 149 taken from the cache, more than
  // kReadPastLimit, so the cursor is replaced by one at the next commit when the links end.
  EntrySource follower = source(cache);
  EXPECT_EQ(drain(follower, cache), commits_of(1, 150));
  EXPECT_EQ(follower.taken_from_cache(), 149u);

  // A few more, linked by the leader: the follower takes them and reads past them.
  append(151, 170);
  EXPECT_EQ(drain(leader, cache), commits_of(151, 170));
  EXPECT_EQ(drain(follower, cache), commits_of(151, 170));
  EXPECT_EQ(follower.taken_from_cache(), 149u + 20u);

  // Ahead of the leader, the follower reads the log itself, and links for the leader.
  append(171, 180);
  EXPECT_EQ(drain(follower, cache), commits_of(171, 180));
  EXPECT_EQ(follower.taken_from_cache(), 169u);
  EXPECT_EQ(drain(leader, cache), commits_of(171, 180));
  EXPECT_EQ(leader.taken_from_cache(), 10u);
}

TEST_F(EntrySourceTest, WhereTheLinksBreakTheCursorIsBroughtLevelBothWays) {
  append(1, 200);
  // A first source takes 1..`linked` (encoding and linking them), a second then reads the whole
  // log: all of 2..`linked` from the cache, the rest from its cursor, brought level first.
  auto entries_followed = [&](std::size_t linked) {
    EncodedEntryCache cache(64u << 20);
    EntrySource first = source(cache);
    EXPECT_EQ(take(first, cache, linked), commits_of(1, linked));
    EntrySource second = source(cache);
    EXPECT_EQ(drain(second, cache), commits_of(1, 200));
    return second.taken_from_cache();
  };
  // More than kReadPastLimit: a new cursor at entry 101 carries on.
  EXPECT_EQ(entries_followed(100), 99u);
  // Fewer: the cursor reads past the 19 taken from the cache.
  EXPECT_EQ(entries_followed(20), 19u);
}

TEST_F(EntrySourceTest, EvictionBreaksLinksWithoutLosingOrRepeatingAnEntry) {
  append(1, 300);
  // Room for a few dozen entries: links vanish with the entries they hang from.
  EncodedEntryCache cache(40 * (sizeof(EncodedEntry) + 96));
  EntrySource leader = source(cache);
  EntrySource follower = source(cache);
  std::vector<std::uint64_t> lead, follow;
  // The two advance in turns of different lengths, so the follower is sometimes close behind
  // (links), sometimes too far (evicted), sometimes ahead (reads the log itself).
  for (std::size_t round = 0; round < 40; ++round) {
    auto l = take(leader, cache, 3 + round % 11);
    lead.insert(lead.end(), l.begin(), l.end());
    auto f = take(follower, cache, 1 + (round * 7) % 13);
    follow.insert(follow.end(), f.begin(), f.end());
  }
  auto rest = drain(follower, cache);
  follow.insert(follow.end(), rest.begin(), rest.end());
  EXPECT_EQ(follow, commits_of(1, 300));
  EXPECT_EQ(lead, commits_of(1, lead.size()));
  EXPECT_GT(follower.taken_from_cache(), 0u);
  EXPECT_LT(follower.taken_from_cache(), 299u);
}

}  // namespace
}  // namespace pgrelay::server
