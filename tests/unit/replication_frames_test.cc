// Tests replication CopyData payloads (w, k, r, h) and Postgres-epoch time conversions.
#include "wire/replication_frames.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "wire/backend_messages.h"
#include "wire/frame_reader.h"
#include "wire/messages.h"

namespace pgrelay::wire {
namespace {

using namespace std::string_literals;

Bytes b(std::string_view s) {
  return Bytes(s.begin(), s.end());
}

TEST(ReplicationFrames, ByteLayouts) {
  EXPECT_EQ(encode(StandbyStatusUpdate{Lsn(0x1'0000'0010), Lsn(0x20), Lsn(0x30), 0x0102030405060708,
                                       true}),
            b("r"
              "\x00\x00\x00\x01\x00\x00\x00\x10"
              "\x00\x00\x00\x00\x00\x00\x00\x20"
              "\x00\x00\x00\x00\x00\x00\x00\x30"
              "\x01\x02\x03\x04\x05\x06\x07\x08"
              "\x01"s));
  EXPECT_EQ(encode(PrimaryKeepalive{Lsn(0x16B3748), -1, false}),
            b("k"
              "\x00\x00\x00\x00\x01\x6b\x37\x48"
              "\xff\xff\xff\xff\xff\xff\xff\xff"
              "\x00"s));
  EXPECT_EQ(encode(XLogData{Lsn(1), Lsn(2), 3, b("abc")}), b("w"
                                                             "\x00\x00\x00\x00\x00\x00\x00\x01"
                                                             "\x00\x00\x00\x00\x00\x00\x00\x02"
                                                             "\x00\x00\x00\x00\x00\x00\x00\x03"
                                                             "abc"s));
  EXPECT_EQ(encode(HotStandbyFeedback{1, 2, 3, 4, 5}),
            b("h"
              "\x00\x00\x00\x00\x00\x00\x00\x01"
              "\x00\x00\x00\x02\x00\x00\x00\x03\x00\x00\x00\x04\x00\x00\x00\x05"s));
}

TEST(ReplicationFrames, RoundTripThroughCopyDataAndTheFrameReader) {
  const XLogData xlog{Lsn(0x16B3748), Lsn(0x16B3800), 700000000000000, b("BEGIN\x00\x01"s)};
  const Bytes wire = encode(CopyData{encode(xlog)});
  FrameReader reader(FrameReader::Phase::kRegular);
  for (std::uint8_t byte : wire) reader.feed(ByteView(&byte, 1));
  auto frame = reader.next();
  ASSERT_TRUE(frame.ok());
  ASSERT_TRUE(frame->has_value());
  auto msg = parse_backend((*frame)->tag, (*frame)->body);
  ASSERT_TRUE(msg.ok());
  ASSERT_TRUE(std::holds_alternative<CopyData>(*msg));
  auto parsed = parse_from_server(std::get<CopyData>(*msg).data);
  ASSERT_TRUE(parsed.ok());
  ASSERT_TRUE(std::holds_alternative<XLogData>(*parsed));
  EXPECT_EQ(std::get<XLogData>(*parsed), xlog);
}

TEST(ReplicationFrames, AnAppendedXLogDataFrameIsCopyDataOfTheEncodedXLogData) {
  const XLogData xlog{Lsn(0x16B3748), Lsn(0x16B3800), 700000000000000, b("Ccommit\x00"s)};
  Bytes out = b("prefix"s);
  append_xlog_data_frame(out, xlog.wal_start, xlog.wal_end, xlog.send_time, xlog.data);
  const Bytes frame = encode(CopyData{encode(xlog)});
  Bytes expected = b("prefix"s);
  expected.insert(expected.end(), frame.begin(), frame.end());
  EXPECT_EQ(out, expected);
  EXPECT_EQ(frame.size(), kXLogDataFrameHeader + xlog.data.size());
  ByteReader at_stamp(ByteView(frame).subspan(kXLogDataFrameSendTimeOffset));
  EXPECT_EQ(at_stamp.i64(), xlog.send_time);
}

TEST(ReplicationFrames, EachFrameRoundTrips) {
  const PrimaryKeepalive k{Lsn(~0ull), 123456789, true};
  auto pk = parse_from_server(encode(k));
  ASSERT_TRUE(pk.ok());
  EXPECT_EQ(std::get<PrimaryKeepalive>(*pk), k);
  EXPECT_EQ(*parse_primary_keepalive(encode(k)), k);

  const XLogData empty{Lsn(5), Lsn(5), 0, {}};
  EXPECT_EQ(*parse_xlog_data(encode(empty)), empty);

  const StandbyStatusUpdate r{Lsn(1), Lsn(2), Lsn(3), -5, false};
  auto pr = parse_from_client(encode(r));
  ASSERT_TRUE(pr.ok());
  EXPECT_EQ(std::get<StandbyStatusUpdate>(*pr), r);

  const HotStandbyFeedback h{99, 0xFFFFFFFF, 1, 0, 0xFFFFFFFF};
  auto ph = parse_from_client(encode(h));
  ASSERT_TRUE(ph.ok());
  EXPECT_EQ(std::get<HotStandbyFeedback>(*ph), h);
}

TEST(ReplicationFrames, ReplyRequestedIsAnyNonZeroByte) {
  Bytes k = encode(PrimaryKeepalive{Lsn(1), 2, false});
  k.back() = 7;
  EXPECT_TRUE(parse_primary_keepalive(k)->reply_requested);
}

TEST(ReplicationFrames, TruncatedAtEveryOffset) {
  const Bytes xlog = encode(XLogData{Lsn(1), Lsn(2), 3, {}});
  for (std::size_t cut = 0; cut < xlog.size(); ++cut) {
    auto r = parse_xlog_data(ByteView(xlog).first(cut));
    ASSERT_FALSE(r.ok()) << cut;
    EXPECT_EQ(r.error().sqlstate, "08P01");
    if (cut > 0) {
      EXPECT_EQ(r.error().message, "invalid WAL message received from primary");
    }
  }
  const Bytes k = encode(PrimaryKeepalive{Lsn(1), 2, true});
  for (std::size_t cut = 1; cut < k.size(); ++cut) {
    auto r = parse_primary_keepalive(ByteView(k).first(cut));
    ASSERT_FALSE(r.ok()) << cut;
    EXPECT_EQ(r.error().message, "invalid keepalive message received from primary");
  }
  const Bytes r = encode(StandbyStatusUpdate{Lsn(1), Lsn(2), Lsn(3), 4, false});
  for (std::size_t cut = 0; cut < r.size(); ++cut) {
    auto p = parse_standby_status_update(ByteView(r).first(cut));
    ASSERT_FALSE(p.ok()) << cut;
    EXPECT_EQ(p.error().sqlstate, "08P01");
  }
  const Bytes h = encode(HotStandbyFeedback{1, 2, 3, 4, 5});
  for (std::size_t cut = 0; cut < h.size(); ++cut) {
    auto p = parse_hot_standby_feedback(ByteView(h).first(cut));
    ASSERT_FALSE(p.ok()) << cut;
    EXPECT_EQ(p.error().sqlstate, "08P01");
  }
}

TEST(ReplicationFrames, TrailingBytesRejected) {
  Bytes k = encode(PrimaryKeepalive{Lsn(1), 2, true});
  k.push_back(0);
  auto pk = parse_primary_keepalive(k);
  ASSERT_FALSE(pk.ok());
  EXPECT_EQ(pk.error().message, "invalid keepalive message received from primary");
  Bytes r = encode(StandbyStatusUpdate{});
  r.push_back(0);
  auto pr = parse_standby_status_update(r);
  ASSERT_FALSE(pr.ok());
  EXPECT_EQ(pr.error().message, "invalid message format");
  Bytes h = encode(HotStandbyFeedback{});
  h.push_back(0);
  auto ph = parse_hot_standby_feedback(h);
  ASSERT_FALSE(ph.ok());
  EXPECT_EQ(ph.error().message, "invalid message format");
}

TEST(ReplicationFrames, UnknownOrMisdirectedTypes) {
  auto from_server = parse_from_server(encode(StandbyStatusUpdate{}));
  ASSERT_FALSE(from_server.ok());
  EXPECT_EQ(from_server.error().sqlstate, "08P01");
  EXPECT_EQ(from_server.error().message, "invalid replication message type 114");
  auto from_client = parse_from_client(encode(PrimaryKeepalive{}));
  ASSERT_FALSE(from_client.ok());
  EXPECT_EQ(from_client.error().message, "unexpected message type \"k\"");
  EXPECT_FALSE(parse_from_server({}).ok());
  EXPECT_FALSE(parse_from_client({}).ok());
  auto wrong = parse_xlog_data(encode(PrimaryKeepalive{}));
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.error().message, "expected replication message type \"w\", got \"k\"");
}

TEST(ReplicationTime, PostgresEpochConversions) {
  EXPECT_EQ(unix_micros_to_pg(946684800000000), 0);
  EXPECT_EQ(pg_to_unix_micros(0), 946684800000000);
  EXPECT_EQ(unix_micros_to_pg(0), -946684800000000);
  for (std::int64_t v :
       {std::int64_t{0}, std::int64_t{1}, std::int64_t{-1}, std::int64_t{1700000000123456}}) {
    EXPECT_EQ(pg_to_unix_micros(unix_micros_to_pg(v)), v);
  }
  using L = std::numeric_limits<std::int64_t>;
  EXPECT_EQ(unix_micros_to_pg(L::min()), L::min());
  EXPECT_EQ(pg_to_unix_micros(L::max()), L::max());
}

TEST(ReplicationTime, ChronoConversions) {
  using namespace std::chrono;
  const sys_days y2k = year(2000) / January / 1;
  EXPECT_EQ(to_pg_timestamp(y2k), 0);
  EXPECT_EQ(to_pg_timestamp(y2k + seconds(1) + microseconds(5)), 1000005);
  EXPECT_EQ(to_pg_timestamp(y2k - nanoseconds(1)), -1);  // floors, not truncates
  EXPECT_EQ(from_pg_timestamp(0), system_clock::time_point(y2k));
  EXPECT_EQ(from_pg_timestamp(-1000000), system_clock::time_point(y2k - seconds(1)));
  const auto now = floor<microseconds>(system_clock::now());
  EXPECT_EQ(from_pg_timestamp(to_pg_timestamp(now)), now);
  EXPECT_EQ(from_pg_timestamp(std::numeric_limits<std::int64_t>::max()),
            system_clock::time_point::max());
  EXPECT_EQ(from_pg_timestamp(std::numeric_limits<std::int64_t>::min()),
            system_clock::time_point::min());
}

}  // namespace
}  // namespace pgrelay::wire
