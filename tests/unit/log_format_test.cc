// Tests the log's CRC32C, record framing, entry metadata and manifest encoding.
#include <gtest/gtest.h>

#include <random>

#include "log/crc32c.h"
#include "log/format.h"
#include "log/manifest.h"

namespace pgrelay::log {
namespace {

TEST(Crc32c, KnownVectors) {
  EXPECT_EQ(crc32c(as_bytes("123456789")), 0xE3069283u);
  EXPECT_EQ(crc32c(as_bytes("")), 0u);
  Bytes zeros(32, 0);
  EXPECT_EQ(crc32c(zeros), 0x8A9136AAu);  // RFC 3720 B.4
  Bytes ones(32, 0xFF);
  EXPECT_EQ(crc32c(ones), 0x62A8AB43u);
}

TEST(Crc32c, ExtendEqualsWholeForEverySplit) {
  std::mt19937 rng(7);
  Bytes data(1000);
  for (auto& b : data) b = static_cast<std::uint8_t>(rng());
  std::uint32_t whole = crc32c(data);
  for (std::size_t split = 0; split <= data.size(); split += 37) {
    std::uint32_t c = crc32c_extend(0, data.data(), split);
    c = crc32c_extend(c, data.data() + split, data.size() - split);
    EXPECT_EQ(c, whole) << split;
  }
}

TEST(RecordFraming, RoundTripsAndDetectsEveryBitFlip) {
  ByteWriter w;
  append_record(RecordType::kFull, kEndOfBatch, as_bytes("hello, log"), w);
  Bytes rec = w.bytes();
  ParsedRecord parsed;
  std::string why;
  ASSERT_EQ(parse_record(rec, &parsed, &why), RecordStatus::kOk) << why;
  EXPECT_EQ(as_chars(parsed.payload), "hello, log");
  EXPECT_EQ(parsed.header.flags, kEndOfBatch);
  EXPECT_EQ(parsed.total_size, rec.size());
  for (std::size_t i = 0; i < rec.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      Bytes bad = rec;
      bad[i] ^= static_cast<std::uint8_t>(1 << bit);
      EXPECT_NE(parse_record(bad, &parsed, &why), RecordStatus::kOk) << i << ":" << bit;
    }
  }
}

TEST(RecordFraming, TruncationIsIncomplete) {
  ByteWriter w;
  append_record(RecordType::kFirst, 0, as_bytes("payload bytes"), w);
  for (std::size_t n = 0; n < w.size(); ++n) {
    ParsedRecord parsed;
    std::string why;
    EXPECT_EQ(parse_record(ByteView(w.bytes()).subspan(0, n), &parsed, &why),
              RecordStatus::kIncomplete)
        << n;
  }
}

TEST(EntryMeta, RoundTripsAndRejectsTruncation) {
  EntryMeta m;
  m.kind = EntryKind::kTransaction;
  m.begin_lsn = Lsn(10);
  m.commit_lsn = Lsn(20);
  m.end_lsn = Lsn(21);
  m.commit_time = 123456789;
  m.xid = 42;
  m.change_count = 3;
  m.origin = "node_a";
  m.origin_lsn = Lsn(5);
  ByteWriter w;
  encode_entry_meta(m, w);
  ByteReader r(w.bytes());
  auto back = decode_entry_meta(r);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, m);
  for (std::size_t n = 0; n < w.size(); ++n) {
    ByteReader shortr(ByteView(w.bytes()).subspan(0, n));
    EXPECT_FALSE(decode_entry_meta(shortr).ok()) << n;
  }
}

TEST(SegmentHeader, RoundTripsAndNamesFileOnDamage) {
  ByteWriter w;
  encode_segment_header(77, w);
  ASSERT_EQ(w.size(), kSegmentHeaderSize);
  auto seq = decode_segment_header(w.bytes(), "x.seg");
  ASSERT_TRUE(seq.ok());
  EXPECT_EQ(*seq, 77u);
  Bytes bad = w.bytes();
  bad[12] ^= 1;
  auto err = decode_segment_header(bad, "x.seg");
  ASSERT_FALSE(err.ok());
  EXPECT_NE(err.error().message.find("x.seg"), std::string::npos);
  EXPECT_EQ(err.error().sqlstate, sqlstate::kDataCorrupted);
}

TEST(Manifest, RoundTripsAndDetectsDamage) {
  Manifest m;
  m.system_id = 7345678901234567890ull;
  m.next_seq = 4;
  m.removed_through = Lsn(0x100);
  m.segments.push_back(SegmentInfo{2, true, Lsn(0x200), Lsn(0x300), 10, 20, 4096});
  m.segments.push_back(SegmentInfo{3, false, Lsn(0x400), Lsn(0x400), 30, 30, 100});
  Bytes data = serialize_manifest(m);
  auto back = parse_manifest(data, "MANIFEST");
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(*back, m);
  for (std::size_t i = 0; i < data.size(); ++i) {
    Bytes bad = data;
    bad[i] = static_cast<std::uint8_t>(bad[i] ^ 0x01);
    EXPECT_FALSE(parse_manifest(bad, "MANIFEST").ok()) << i;
  }
  EXPECT_EQ(segment_file_name(0x1A), "000000000000001A.seg");
}

}  // namespace
}  // namespace pgrelay::log
