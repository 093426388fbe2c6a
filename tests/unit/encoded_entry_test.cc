// The walsender's shared encoded entries: frames built once, stamped per send, cached by bytes.
#include <gtest/gtest.h>

#include <memory>

#include "server/entry_encoder.h"
#include "wire/replication_frames.h"

namespace pgrelay::server {
namespace {

EncodedMessage message(std::uint64_t lsn, char tag, std::string payload, pgoutput::Oid oid = 0) {
  EncodedMessage m;
  m.lsn = Lsn(lsn);
  m.tag = tag;
  m.oid = oid;
  m.payload.assign(payload.begin(), payload.end());
  return m;
}

// The XLogData inside one framed message, read back with the wire layer's parser.
wire::XLogDataView xlog_of(const EncodedEntry& entry, const EncodedEntry::Message& m) {
  ByteView frame = ByteView(entry.frames).subspan(m.offset, m.size);
  EXPECT_EQ(frame[0], 'd');
  ByteReader r(frame.subspan(1));
  EXPECT_EQ(r.u32(), m.size - 1) << "CopyData length counts itself, not the type byte";
  auto x = wire::view_xlog_data(frame.subspan(5));
  EXPECT_TRUE(x.ok());
  return x.ok() ? *x : wire::XLogDataView{};
}

TEST(EncodedEntryTest, FramesEachMessageAsCopyDataOfXLogDataAtItsLsn) {
  EncodedEntry entry;
  entry.add(message(0x100, 'B', "Bbegin"));
  entry.add(message(0x101, 'R', "Rrelation", 16384));
  entry.add(message(0x102, 'I', std::string("Iinsert\0tail", 12)));
  ASSERT_EQ(entry.messages.size(), 3u);
  EXPECT_EQ(entry.messages[0].offset, 0u);
  EXPECT_EQ(entry.messages[1].offset, entry.messages[0].size);
  EXPECT_EQ(entry.messages[1].tag, 'R');
  EXPECT_EQ(entry.messages[1].oid, 16384u);
  EXPECT_EQ(entry.frames.size(), entry.messages[2].offset + entry.messages[2].size);

  const char* payloads[] = {"Bbegin", "Rrelation"};
  for (std::size_t i = 0; i < 2; ++i) {
    auto x = xlog_of(entry, entry.messages[i]);
    EXPECT_EQ(x.wal_start, Lsn(0x100 + i));
    EXPECT_EQ(x.wal_end, Lsn(0x100 + i));
    EXPECT_EQ(as_chars(x.data), payloads[i]);
    EXPECT_EQ(as_chars(entry.payload(entry.messages[i])), payloads[i]);
  }
  EXPECT_EQ(entry.payload(entry.messages[2]).size(), 12u);  // embedded NUL kept
}

TEST(EncodedEntryTest, SendTimeOffsetIsTheXLogDataSendTime) {
  EncodedEntry entry;
  entry.add(message(0x200, 'C', "Ccommit"));
  std::int64_t stamp = 0x0102030405060708;
  Bytes frame(entry.frames.begin(), entry.frames.end());
  store_be(frame.data() + EncodedEntry::kSendTimeOffset, static_cast<std::uint64_t>(stamp));
  auto x = wire::view_xlog_data(ByteView(frame).subspan(5));
  ASSERT_TRUE(x.ok());
  EXPECT_EQ(x->send_time, stamp);
  EXPECT_EQ(x->wal_end, Lsn(0x200));
  EXPECT_EQ(as_chars(x->data), "Ccommit");
}

std::shared_ptr<const EncodedEntry> entry_of(std::size_t payload_bytes) {
  auto e = std::make_shared<EncodedEntry>();
  e->add(message(1, 'I', std::string(payload_bytes, 'x')));
  return e;
}

TEST(EncodedEntryCacheTest, FindsByViewAndEndLsnAndEvictsLeastRecentlyUsedPastItsBytes) {
  const std::size_t one = entry_of(1000)->bytes();
  EncodedEntryCache cache(3 * one);
  const std::uint64_t a = cache.view_id("pub_a\nno messages");
  const std::uint64_t b = cache.view_id("pub_b\nno messages");
  EXPECT_NE(a, b);
  EXPECT_EQ(cache.view_id("pub_a\nno messages"), a);

  // Neighbouring LSNs (closer than the hash's granularity) stay distinct entries.
  cache.insert(a, Lsn(0x1000), entry_of(1000));
  cache.insert(a, Lsn(0x1001), entry_of(1000));
  cache.insert(b, Lsn(0x1000), entry_of(1000));
  EXPECT_NE(cache.find(a, Lsn(0x1000)), nullptr);
  EXPECT_NE(cache.find(a, Lsn(0x1001)), nullptr);
  EXPECT_NE(cache.find(b, Lsn(0x1000)), nullptr);
  EXPECT_EQ(cache.find(b, Lsn(0x1001)), nullptr);

  // (a, 0x1000) was used before (a, 0x1001) and (b, 0x1000): it is the one a fourth entry evicts.
  cache.insert(a, Lsn(0x2000), entry_of(1000));
  EXPECT_EQ(cache.find(a, Lsn(0x1000)), nullptr);
  EXPECT_NE(cache.find(a, Lsn(0x1001)), nullptr);
  EXPECT_NE(cache.find(a, Lsn(0x2000)), nullptr);

  // An entry larger than the whole cache is never kept.
  cache.insert(a, Lsn(0x3000), entry_of(4 * one));
  EXPECT_EQ(cache.find(a, Lsn(0x3000)), nullptr);
  EXPECT_NE(cache.find(a, Lsn(0x2000)), nullptr);
}

// A view is shared while two or more sessions use it; a session that switches views leaves the
// old one, and a use may outlive its cache.
TEST(EncodedEntryCacheTest, AViewIsSharedWhileTwoSessionsUseIt) {
  EncodedEntryCache cache(64u << 20);
  auto lone = std::make_unique<EncodedEntryCache::ViewUse>(cache, "pub_a");
  const std::uint64_t a = lone->id();
  EXPECT_FALSE(cache.shared(a));
  {
    EncodedEntryCache::ViewUse second(cache, "pub_a");
    EXPECT_EQ(second.id(), a);
    EXPECT_TRUE(cache.shared(a));
  }
  EXPECT_FALSE(cache.shared(a));

  EncodedEntryCache::ViewUse other(cache, "pub_b");
  EncodedEntryCache::ViewUse mover(cache, "pub_a");
  EXPECT_TRUE(cache.shared(a));
  EXPECT_FALSE(cache.shared(other.id()));
  mover.switch_to("pub_b");
  EXPECT_EQ(mover.id(), other.id());
  EXPECT_FALSE(cache.shared(a));
  EXPECT_TRUE(cache.shared(other.id()));
  mover.switch_to("pub_b");  // the same view: no change
  EXPECT_TRUE(cache.shared(other.id()));
  lone.reset();
  EXPECT_FALSE(cache.shared(a));

  std::unique_ptr<EncodedEntryCache::ViewUse> outliving;
  {
    EncodedEntryCache gone(1024);
    outliving = std::make_unique<EncodedEntryCache::ViewUse>(gone, "pub_x");
  }
  outliving.reset();  // after its cache: touches only what it shares with it (ASan checks)
}

}  // namespace
}  // namespace pgrelay::server
