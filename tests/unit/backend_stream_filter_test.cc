// BackendStreamFilter: ReadyForQuery counting, boundaries and dropped notices across any chunking.
#include "wire/backend_stream_filter.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "wire/backend_messages.h"

namespace pgrelay::wire {
namespace {

Bytes message(char tag, const std::string& body) {
  Bytes out{static_cast<std::uint8_t>(tag)};
  std::uint32_t length = static_cast<std::uint32_t>(body.size() + 4);
  for (int shift = 24; shift >= 0; shift -= 8)
    out.push_back(static_cast<std::uint8_t>(length >> shift));
  out.insert(out.end(), body.begin(), body.end());
  return out;
}

Bytes concat(std::initializer_list<Bytes> parts) {
  Bytes out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// Drops notices whose message field says "drop me".
bool drop_me(ByteView body) {
  auto notice = parse_notice_response(body);
  return notice.ok() && notice->message() == "drop me";
}

Bytes notice(const std::string& text) {
  return encode(make_notice_response(Error::make("01000", text), Severity::kWarning));
}

struct Relayed {
  Bytes out;
  std::uint64_t ready = 0;
  bool boundary = false;
  char status = 0;
  ReportedParameters reported;
};

// Feeds `stream` through a filter in chunks of `chunk` bytes, as a relay does.
Relayed relay(const Bytes& stream, std::size_t chunk) {
  BackendStreamFilter filter(drop_me);
  Bytes buffer(64 * 1024);
  Relayed r;
  std::size_t kept = 0;
  for (std::size_t fed = 0; fed < stream.size();) {
    std::size_t n = std::min(chunk, stream.size() - fed);
    std::memcpy(buffer.data() + kept, stream.data() + fed, n);
    fed += n;
    auto pass = filter.process(std::span(buffer.data(), kept + n));
    r.out.insert(r.out.end(), buffer.begin(),
                 buffer.begin() + static_cast<std::ptrdiff_t>(pass.send));
    std::memmove(buffer.data(), buffer.data() + pass.send, pass.keep);
    kept = pass.keep;
  }
  r.ready = filter.ready_for_query_count();
  r.boundary = filter.at_message_boundary();
  r.status = filter.transaction_status();
  r.reported = filter.reported_parameters();
  return r;
}

Bytes parameter(const std::string& name, const std::string& value) {
  return encode(ParameterStatus{name, value});
}

TEST(BackendStreamFilter, CountsRepliesAndDropsOnlyTheChosenNoticeAtAnyChunking) {
  Bytes big_row = message('D', std::string(20000, 'x'));
  Bytes stream =
      concat({message('T', "desc"), big_row, notice("keep me"), message('C', "SELECT 1"),
              message('Z', "T"), notice("drop me"), message('C', "CREATE"), message('Z', "I")});
  Bytes expected =
      concat({message('T', "desc"), big_row, notice("keep me"), message('C', "SELECT 1"),
              message('Z', "T"), message('C', "CREATE"), message('Z', "I")});
  for (std::size_t chunk : {1u, 2u, 3u, 4u, 5u, 6u, 7u, 13u, 64u, 1000u, 65536u}) {
    Relayed r = relay(stream, chunk);
    EXPECT_EQ(r.out, expected) << "chunk " << chunk;
    EXPECT_EQ(r.ready, 2u) << "chunk " << chunk;
    EXPECT_EQ(r.status, 'I');
    EXPECT_TRUE(r.boundary);
  }
}

TEST(BackendStreamFilter, KnowsWhenAReplyIsCutMidMessage) {
  Bytes row = message('D', std::string(100, 'y'));
  Bytes stream = concat({message('Z', "I"), row});
  stream.resize(stream.size() - 10);
  Relayed r = relay(stream, 7);
  EXPECT_EQ(r.out, stream);  // a partial DataRow passes as far as it goes
  EXPECT_EQ(r.ready, 1u);
  EXPECT_FALSE(r.boundary);
}

TEST(BackendStreamFilter, HoldsACutHeaderAndACutNoticeUntilWhole) {
  Bytes first = message('Z', "I");
  Bytes kept_notice = notice("keep me");
  Bytes stream = concat({first, kept_notice});
  Bytes cut(stream.begin(), stream.end() - 3);
  Relayed r = relay(cut, 4);
  EXPECT_EQ(r.out, first);  // the notice is held, not half sent
  EXPECT_TRUE(r.boundary);
  Bytes header_only(stream.begin(), stream.begin() + static_cast<std::ptrdiff_t>(first.size() + 3));
  EXPECT_EQ(relay(header_only, 100).out, first);
}

TEST(BackendStreamFilter, ANoticeTooLargeToHoldPassesUnfiltered) {
  std::string text = "drop me";
  Bytes large = encode(make_notice_response(
      Error::make("01000", text, std::string(BackendStreamFilter::kMaxHeldMessage, 'd')),
      Severity::kWarning));
  Relayed r = relay(concat({large, message('Z', "I")}), 4096);
  EXPECT_EQ(r.out, concat({large, message('Z', "I")}));
  EXPECT_EQ(r.ready, 1u);
}

TEST(BackendStreamFilter, RecordsTheLastValueOfEachReportedParameterAtAnyChunking) {
  Bytes stream = concat({parameter("TimeZone", "UTC"), message('C', "SET"), message('Z', "I"),
                         parameter("default_transaction_read_only", "on"), message('Z', "I"),
                         parameter("TimeZone", "Europe/Paris"), message('Z', "T")});
  for (std::size_t chunk : {1u, 2u, 3u, 5u, 8u, 13u, 64u, 65536u}) {
    Relayed r = relay(stream, chunk);
    EXPECT_EQ(r.out, stream) << "chunk " << chunk;  // every one is forwarded
    EXPECT_EQ(r.ready, 3u);
    EXPECT_EQ(r.reported, (ReportedParameters{{"TimeZone", "Europe/Paris"},
                                              {"default_transaction_read_only", "on"}}))
        << "chunk " << chunk;
  }
}

TEST(BackendStreamFilter, HoldsACutParameterStatusAndRecordsItOnlyWhole) {
  Bytes first = message('Z', "I");
  Bytes stream = concat({first, parameter("application_name", "app")});
  Bytes cut(stream.begin(), stream.end() - 2);
  Relayed r = relay(cut, 3);
  EXPECT_EQ(r.out, first);
  EXPECT_TRUE(r.reported.empty());
  EXPECT_TRUE(r.boundary);
  // A malformed one (no terminator on its value) is forwarded, and not recorded.
  Bytes malformed = message('S', std::string("name\0value", 10));
  Relayed bad = relay(concat({malformed, message('Z', "I")}), 4);
  EXPECT_EQ(bad.out, concat({malformed, message('Z', "I")}));
  EXPECT_TRUE(bad.reported.empty());
}

TEST(BackendStreamFilter, AnImpossibleLengthStopsTrackingButForwardsEverything) {
  Bytes stream = concat({message('Z', "I"), Bytes{'X', 0, 0, 0, 2}, message('Z', "I")});
  Relayed r = relay(stream, 3);
  EXPECT_EQ(r.out, stream);
  EXPECT_EQ(r.ready, 1u);
  EXPECT_FALSE(r.boundary);
}

}  // namespace
}  // namespace pgrelay::wire
