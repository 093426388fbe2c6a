// Tests startup packets against Postgres 15's ProcessStartupPacket: layouts, versions, errors.
#include "wire/startup.h"

#include <gtest/gtest.h>

#include <string>

#include "wire/frame_reader.h"

namespace pgrelay::wire {
namespace {

using namespace std::string_literals;

Bytes b(std::string_view s) {
  return Bytes(s.begin(), s.end());
}

// The body of an untagged packet: everything after the length word.
Bytes body_of(const Bytes& packet) {
  return Bytes(packet.begin() + 4, packet.end());
}

StartupMessage startup(std::vector<std::pair<std::string, std::string>> params,
                       ProtocolVersion version = {3, 0}) {
  StartupMessage m;
  m.version = version;
  m.parameters = std::move(params);
  return m;
}

Result<StartupPacket> parse_via_reader(const Bytes& packet) {
  FrameReader reader(FrameReader::Phase::kStartup);
  for (std::uint8_t byte : packet) reader.feed(ByteView(&byte, 1));
  auto frame = reader.next();
  EXPECT_TRUE(frame.ok());
  EXPECT_TRUE(frame.ok() && frame->has_value());
  if (!frame.ok() || !frame->has_value()) return Error::protocol("no frame");
  EXPECT_EQ((*frame)->tag, 0);
  return parse_startup_packet((*frame)->body);
}

TEST(Startup, ByteLayouts) {
  EXPECT_EQ(encode(SSLRequest{}), b("\x00\x00\x00\x08\x04\xd2\x16\x2f"s));
  EXPECT_EQ(encode(GSSENCRequest{}), b("\x00\x00\x00\x08\x04\xd2\x16\x30"s));
  EXPECT_EQ(encode(CancelRequest{1234, 5678}),
            b("\x00\x00\x00\x10\x04\xd2\x16\x2e\x00\x00\x04\xd2\x00\x00\x16\x2e"s));
  EXPECT_EQ(encode(startup({{"user", "alice"}, {"database", "db"}})),
            b("\x00\x00\x00\x20\x00\x03\x00\x00user\x00"
              "alice\x00"
              "database\x00"
              "db\x00\x00"s));
}

TEST(Startup, RoundTripsThroughTheFrameReader) {
  const std::vector<StartupPacket> packets = {
      startup({{"user", "alice"}, {"database", "db"}, {"application_name", "psql"}}),
      startup({{"user", "u"}, {"replication", "database"}, {"_pq_.x", "1"}}, {3, 1}),
      SSLRequest{},
      GSSENCRequest{},
      CancelRequest{-1, 0x7FFFFFFF},
  };
  for (const auto& p : packets) {
    auto parsed = parse_via_reader(encode(p));
    ASSERT_TRUE(parsed.ok()) << parsed.error().message;
    EXPECT_EQ(*parsed, p);
  }
}

TEST(Startup, UserIsRequired) {
  for (const auto& m : {startup({}), startup({{"database", "db"}}), startup({{"user", ""}})}) {
    auto r = parse_startup_packet(body_of(encode(m)));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().sqlstate, "28000");
    EXPECT_EQ(r.error().message, "no PostgreSQL user name specified in startup packet");
  }
}

TEST(Startup, ParameterAccessors) {
  auto r = parse_startup_packet(
      body_of(encode(startup({{"user", "first"}, {"options", "-c x=1"}, {"user", "second"}}))));
  ASSERT_TRUE(r.ok());
  const auto& m = std::get<StartupMessage>(*r);
  EXPECT_EQ(m.user(), "second");      // later duplicates win
  EXPECT_EQ(m.database(), "second");  // database defaults to the user
  EXPECT_EQ(m.find("options"), "-c x=1");
  EXPECT_FALSE(m.find("database").has_value());
  EXPECT_EQ(m.parameters.size(), 3u);  // order and duplicates kept
  EXPECT_EQ(startup({{"user", "u"}, {"database", "d"}}).database(), "d");
}

TEST(Startup, UnsupportedMajorVersions) {
  for (ProtocolVersion v : {ProtocolVersion{2, 0}, ProtocolVersion{4, 0}, ProtocolVersion{1, 7}}) {
    auto r = parse_startup_packet(body_of(encode(startup({{"user", "u"}}, v))));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().sqlstate, "0A000");
    EXPECT_EQ(r.error().message, "unsupported frontend protocol " + std::to_string(v.major) + "." +
                                     std::to_string(v.minor) + ": server supports 3.0 to 3.0");
  }
  // What Postgres answers to an SSLRequest repeated after TLS is established.
  EXPECT_EQ(unsupported_protocol_error(ProtocolVersion::from_code(kSSLRequestCode)).message,
            "unsupported frontend protocol 1234.5679: server supports 3.0 to 3.0");
}

TEST(Startup, NewerMinorVersionNeedsNegotiation) {
  auto r = parse_startup_packet(body_of(encode(startup({{"user", "u"}}, {3, 2}))));
  ASSERT_TRUE(r.ok());
  const auto& m = std::get<StartupMessage>(*r);
  EXPECT_EQ(m.version, (ProtocolVersion{3, 2}));
  EXPECT_TRUE(needs_protocol_negotiation(m));
  const NegotiateProtocolVersion n = make_negotiate_protocol_version(m);
  EXPECT_EQ(n.newest, (ProtocolVersion{3, 0}));
  EXPECT_TRUE(n.unrecognized_options.empty());
  EXPECT_EQ(encode(n), b("v\x00\x00\x00\x0c\x00\x03\x00\x00\x00\x00\x00\x00"s));
}

TEST(Startup, ProtocolOptionsNeedNegotiation) {
  const StartupMessage m =
      startup({{"user", "u"}, {"_pq_.compression", "on"}, {"x", "y"}, {"_pq_.other", ""}});
  EXPECT_EQ(m.protocol_options(), (std::vector<std::string>{"_pq_.compression", "_pq_.other"}));
  EXPECT_TRUE(needs_protocol_negotiation(m));
  EXPECT_EQ(make_negotiate_protocol_version(m).unrecognized_options, m.protocol_options());
  EXPECT_FALSE(needs_protocol_negotiation(startup({{"user", "u"}, {"_pq", "x"}})));
}

TEST(Startup, ReplicationParameter) {
  struct Case {
    const char* value;
    ReplicationMode mode;
  };
  for (const Case& c :
       {Case{"database", ReplicationMode::kLogical}, Case{"true", ReplicationMode::kPhysical},
        Case{"TR", ReplicationMode::kPhysical}, Case{"on", ReplicationMode::kPhysical},
        Case{"1", ReplicationMode::kPhysical}, Case{"yes", ReplicationMode::kPhysical},
        Case{"false", ReplicationMode::kNone}, Case{"off", ReplicationMode::kNone},
        Case{"of", ReplicationMode::kNone}, Case{"0", ReplicationMode::kNone},
        Case{"n", ReplicationMode::kNone}}) {
    auto r =
        parse_startup_packet(body_of(encode(startup({{"user", "u"}, {"replication", c.value}}))));
    ASSERT_TRUE(r.ok()) << c.value;
    auto mode = std::get<StartupMessage>(*r).replication_mode();
    ASSERT_TRUE(mode.ok());
    EXPECT_EQ(*mode, c.mode) << c.value;
  }
  EXPECT_EQ(*startup({{"user", "u"}}).replication_mode(), ReplicationMode::kNone);
  for (const char* bad : {"maybe", "o", "", "truex", "10", "Database "}) {
    auto r = parse_startup_packet(body_of(encode(startup({{"user", "u"}, {"replication", bad}}))));
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().sqlstate, "22023");
    EXPECT_EQ(r.error().message,
              "invalid value for parameter \"replication\": \"" + std::string(bad) + "\"");
    EXPECT_EQ(r.error().hint, "Valid values are: \"false\", 0, \"true\", 1, \"database\".");
  }
}

TEST(Startup, LayoutErrors) {
  const std::string layout = "invalid startup packet layout: expected terminator as last byte";
  for (const std::string& body :
       {"\x00\x03\x00\x00"s,                              // no terminator
        "\x00\x03\x00\x00user\x00u\x00"s,                 // no terminator after the pairs
        "\x00\x03\x00\x00user\x00u\x00\x00\x00"s,         // bytes after the terminator
        "\x00\x03\x00\x00user\x00"s,                      // name without value
        "\x00\x03\x00\x00user"s,                          // name without NUL
        "\x00\x03\x00\x00user\x00u\x00\x00trailing"s}) {  // garbage after the terminator
    auto r = parse_startup_packet(b(body));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().sqlstate, "08P01");
    EXPECT_EQ(r.error().message, layout);
  }
}

TEST(Startup, TruncatedAtEveryOffset) {
  const Bytes body = body_of(encode(startup({{"user", "alice"}, {"database", "db"}})));
  for (std::size_t cut = 0; cut < body.size(); ++cut) {
    auto r = parse_startup_packet(ByteView(body).first(cut));
    ASSERT_FALSE(r.ok()) << cut;
    EXPECT_EQ(r.error().sqlstate, "08P01") << cut;
  }
  const Bytes cancel = body_of(encode(CancelRequest{1, 2}));
  for (std::size_t cut = 0; cut < cancel.size(); ++cut) {
    auto r = parse_startup_packet(ByteView(cancel).first(cut));
    ASSERT_FALSE(r.ok()) << cut;
    EXPECT_EQ(r.error().message, "invalid length of startup packet");
  }
}

TEST(Startup, CancelRequestMustBeExactlySixteenBytes) {
  Bytes longer = body_of(encode(CancelRequest{1, 2}));
  longer.push_back(0);
  auto r = parse_startup_packet(longer);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "invalid length of startup packet");
}

TEST(Startup, EncryptionRequestsIgnoreExtraBytesLikePostgres) {
  auto r = parse_startup_packet(b("\x04\xd2\x16\x2fjunk"s));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(std::holds_alternative<SSLRequest>(*r));
}

TEST(Startup, EncodeSkipsEmptyNamesAndCutsAtNul) {
  const StartupMessage m = startup({{"", "ignored"}, {"user", "al\0ice"s}});
  auto r = parse_startup_packet(body_of(encode(m)));
  ASSERT_TRUE(r.ok());
  const auto& parsed = std::get<StartupMessage>(*r);
  ASSERT_EQ(parsed.parameters.size(), 1u);
  EXPECT_EQ(parsed.user(), "al");
}

}  // namespace
}  // namespace pgrelay::wire
