// Tests the pgoutput encoder and decoder against byte layouts derived from Postgres's proto.c.
#include <gtest/gtest.h>

#include <string_view>

#include "pgoutput/decoder.h"
#include "pgoutput/encoder.h"
#include "pgoutput_samples.h"

namespace pgrelay::pgoutput {
namespace {

using testing::audit_relation;
using testing::catalog_relation;
using testing::kAuditOid;
using testing::kUsersOid;
using testing::sample_stream;
using testing::users_relation;

Bytes cat(std::initializer_list<Bytes> parts) {
  Bytes out;
  for (const Bytes& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}
// A NUL-terminated string as on the wire.
Bytes str(std::string_view s) {
  Bytes out(s.begin(), s.end());
  out.push_back(0);
  return out;
}
// Raw bytes without terminator.
Bytes raw(std::string_view s) {
  return Bytes(s.begin(), s.end());
}

std::string hex(const Bytes& b) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (std::uint8_t c : b) {
    s += digits[c >> 4];
    s += digits[c & 15];
    s += ' ';
  }
  return s;
}

// Encodes `m`, compares with `expected`, and decodes `expected` back to `m`.
void expect_wire(Decoder& decoder, const Message& m, const Bytes& expected) {
  Bytes got = encode(m);
  EXPECT_EQ(hex(got), hex(expected)) << describe(m);
  EXPECT_EQ(encoded_size(m), expected.size());
  Result<Message> back = decoder.decode(expected);
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_EQ(*back, m);
}

Decoder v4_parallel() {
  return Decoder({4, true});
}

// Timestamps and LSNs chosen so every byte is distinct and visible.
constexpr Timestamp kTs = 0x0002C4A1B2C3D4E5;
const Bytes kTsBytes = {0x00, 0x02, 0xC4, 0xA1, 0xB2, 0xC3, 0xD4, 0xE5};
constexpr std::uint64_t kLsnA = 0x0000000116B37480;
const Bytes kLsnABytes = {0x00, 0x00, 0x00, 0x01, 0x16, 0xB3, 0x74, 0x80};
constexpr std::uint64_t kLsnB = 0x0000000116B374F8;
const Bytes kLsnBBytes = {0x00, 0x00, 0x00, 0x01, 0x16, 0xB3, 0x74, 0xF8};

TEST(PgoutputWire, Begin) {
  Decoder d({1, false});
  expect_wire(d, Begin{Lsn(kLsnA), kTs, 734},
              cat({{'B'}, kLsnABytes, kTsBytes, {0x00, 0x00, 0x02, 0xDE}}));
}

TEST(PgoutputWire, CommitHasZeroFlagsByte) {
  Decoder d({1, false});
  expect_wire(d, Commit{Lsn(kLsnA), Lsn(kLsnB), kTs},
              cat({{'C', 0x00}, kLsnABytes, kLsnBBytes, kTsBytes}));
}

TEST(PgoutputWire, Origin) {
  Decoder d({1, false});
  expect_wire(d, Origin{Lsn(kLsnA), "pg_16999"}, cat({{'O'}, kLsnABytes, str("pg_16999")}));
}

TEST(PgoutputWire, Relation) {
  Decoder d({1, false});
  expect_wire(d, users_relation(),
              cat({{'R', 0x00, 0x00, 0x40, 0x00},
                   str("public"),
                   str("users"),
                   {'d', 0x00, 0x03},
                   {0x01},
                   str("id"),
                   {0x00, 0x00, 0x00, 0x17, 0xFF, 0xFF, 0xFF, 0xFF},
                   {0x00},
                   str("name"),
                   {0x00, 0x00, 0x04, 0x13, 0x00, 0x00, 0x00, 0x44},
                   {0x00},
                   str("avatar"),
                   {0x00, 0x00, 0x00, 0x11, 0xFF, 0xFF, 0xFF, 0xFF}}));
  ASSERT_NE(d.relation(kUsersOid), nullptr);
  EXPECT_EQ(*d.relation(kUsersOid), users_relation());
}

TEST(PgoutputWire, CatalogRelationHasEmptyNamespace) {
  Decoder d({1, false});
  expect_wire(d, catalog_relation(),
              cat({{'R', 0x00, 0x00, 0x0A, 0x37},
                   {0x00},  // "" stands for pg_catalog
                   str("pg_namespace"),
                   {'n', 0x00, 0x02},
                   {0x00},
                   str("oid"),
                   {0x00, 0x00, 0x00, 0x1A, 0xFF, 0xFF, 0xFF, 0xFF},
                   {0x00},
                   str("nspname"),
                   {0x00, 0x00, 0x00, 0x13, 0xFF, 0xFF, 0xFF, 0xFF}}));
  EXPECT_NE(describe(catalog_relation()).find("pg_catalog.pg_namespace"), std::string::npos);
}

TEST(PgoutputWire, StreamedRelationCarriesXid) {
  Decoder d({2, false});
  ASSERT_TRUE(d.decode(encode(StreamStart{900, true})).ok());
  Relation rel{900, 7, "s", "t", kReplicaIdentityIndex, {{kColumnIsKey, "k", 20, -1}}};
  expect_wire(d, rel,
              cat({{'R', 0x00, 0x00, 0x03, 0x84, 0x00, 0x00, 0x00, 0x07},
                   str("s"),
                   str("t"),
                   {'i', 0x00, 0x01, 0x01},
                   str("k"),
                   {0x00, 0x00, 0x00, 0x14, 0xFF, 0xFF, 0xFF, 0xFF}}));
}

TEST(PgoutputWire, Type) {
  Decoder d({1, false});
  expect_wire(d, Type{std::nullopt, 16500, "public", "mood"},
              cat({{'Y', 0x00, 0x00, 0x40, 0x74}, str("public"), str("mood")}));
  Decoder s({2, false});
  ASSERT_TRUE(s.decode(encode(StreamStart{5, false})).ok());
  expect_wire(s, Type{5, 16500, "", "int4"},
              cat({{'Y', 0x00, 0x00, 0x00, 0x05, 0x00, 0x00, 0x40, 0x74, 0x00}, str("int4")}));
}

TEST(PgoutputWire, InsertWithEveryValueKind) {
  Decoder d({1, false});
  ASSERT_TRUE(d.decode(encode(users_relation())).ok());
  Insert insert{std::nullopt, kUsersOid,
                Tuple{{TupleValue::text("42"), TupleValue::null(),
                       TupleValue::binary(std::string("\xDE\xAD\x00", 3))}}};
  expect_wire(d, insert,
              cat({{'I', 0x00, 0x00, 0x40, 0x00, 'N', 0x00, 0x03},
                   {'t', 0x00, 0x00, 0x00, 0x02, '4', '2'},
                   {'n'},
                   {'b', 0x00, 0x00, 0x00, 0x03, 0xDE, 0xAD, 0x00}}));
  Insert unchanged{std::nullopt, kUsersOid,
                   Tuple{{TupleValue::text(""), TupleValue::unchanged(), TupleValue::null()}}};
  expect_wire(d, unchanged,
              cat({{'I', 0x00, 0x00, 0x40, 0x00, 'N', 0x00, 0x03},
                   {'t', 0x00, 0x00, 0x00, 0x00},
                   {'u'},
                   {'n'}}));
}

TEST(PgoutputWire, StreamedInsertCarriesXidBeforeOid) {
  Decoder d({2, false});
  ASSERT_TRUE(d.decode(encode(users_relation())).ok());
  ASSERT_TRUE(d.decode(encode(StreamStart{0x01020304, true})).ok());
  Insert insert{0x01020304, kUsersOid,
                Tuple{{TupleValue::text("1"), TupleValue::null(), TupleValue::null()}}};
  expect_wire(d, insert,
              cat({{'I', 0x01, 0x02, 0x03, 0x04, 0x00, 0x00, 0x40, 0x00, 'N', 0x00, 0x03},
                   {'t', 0x00, 0x00, 0x00, 0x01, '1', 'n', 'n'}}));
}

TEST(PgoutputWire, UpdateWithoutOldWithKeyAndWithFullRow) {
  Decoder d({1, false});
  ASSERT_TRUE(d.decode(encode(users_relation())).ok());
  ASSERT_TRUE(d.decode(encode(audit_relation())).ok());
  const Bytes new_users = {0x00, 0x03, 't', 0x00, 0x00, 0x00, 0x01, '7', 'u', 'n'};
  Tuple new_tuple{{TupleValue::text("7"), TupleValue::unchanged(), TupleValue::null()}};

  expect_wire(d, Update{std::nullopt, kUsersOid, std::nullopt, new_tuple},
              cat({{'U', 0x00, 0x00, 0x40, 0x00, 'N'}, new_users}));

  Tuple key{{TupleValue::text("6"), TupleValue::null(), TupleValue::null()}};
  expect_wire(d, Update{std::nullopt, kUsersOid, OldTuple{OldKind::kKey, key}, new_tuple},
              cat({{'U', 0x00, 0x00, 0x40, 0x00, 'K'},
                   {0x00, 0x03, 't', 0x00, 0x00, 0x00, 0x01, '6', 'n', 'n'},
                   {'N'},
                   new_users}));

  Tuple old_row{{TupleValue::text("a"), TupleValue::null()}};
  Tuple new_row{{TupleValue::text("b"), TupleValue::null()}};
  expect_wire(d, Update{std::nullopt, kAuditOid, OldTuple{OldKind::kFull, old_row}, new_row},
              cat({{'U', 0x00, 0x00, 0x40, 0x10, 'O'},
                   {0x00, 0x02, 't', 0x00, 0x00, 0x00, 0x01, 'a', 'n'},
                   {'N'},
                   {0x00, 0x02, 't', 0x00, 0x00, 0x00, 0x01, 'b', 'n'}}));
}

TEST(PgoutputWire, DeleteWithKeyAndWithFullRow) {
  Decoder d({1, false});
  ASSERT_TRUE(d.decode(encode(users_relation())).ok());
  ASSERT_TRUE(d.decode(encode(audit_relation())).ok());
  expect_wire(d,
              Delete{std::nullopt, kUsersOid,
                     OldTuple{OldKind::kKey, Tuple{{TupleValue::text("6"), TupleValue::null(),
                                                    TupleValue::null()}}}},
              cat({{'D', 0x00, 0x00, 0x40, 0x00, 'K'},
                   {0x00, 0x03, 't', 0x00, 0x00, 0x00, 0x01, '6', 'n', 'n'}}));
  expect_wire(
      d,
      Delete{std::nullopt, kAuditOid,
             OldTuple{OldKind::kFull, Tuple{{TupleValue::null(), TupleValue::text("")}}}},
      cat({{'D', 0x00, 0x00, 0x40, 0x10, 'O'}, {0x00, 0x02, 'n', 't', 0x00, 0x00, 0x00, 0x00}}));
}

TEST(PgoutputWire, TruncateOptionBits) {
  Decoder d({1, false});
  ASSERT_TRUE(d.decode(encode(users_relation())).ok());
  ASSERT_TRUE(d.decode(encode(audit_relation())).ok());
  expect_wire(d, Truncate{std::nullopt, false, false, {kUsersOid}},
              {'T', 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x40, 0x00});
  expect_wire(d, Truncate{std::nullopt, true, false, {kUsersOid}},
              {'T', 0x00, 0x00, 0x00, 0x01, 0x01, 0x00, 0x00, 0x40, 0x00});
  expect_wire(d, Truncate{std::nullopt, false, true, {kUsersOid}},
              {'T', 0x00, 0x00, 0x00, 0x01, 0x02, 0x00, 0x00, 0x40, 0x00});
  expect_wire(d, Truncate{std::nullopt, true, true, {kUsersOid, kAuditOid}},
              {'T', 0x00, 0x00, 0x00, 0x02, 0x03, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0x40, 0x10});
}

TEST(PgoutputWire, LogicalMessageFlags) {
  Decoder d({1, false});
  expect_wire(
      d, LogicalMessage{std::nullopt, true, Lsn(kLsnA), "zero/0/ddl", "{}"},
      cat({{'M', 0x01}, kLsnABytes, str("zero/0/ddl"), {0x00, 0x00, 0x00, 0x02}, raw("{}")}));
  expect_wire(d, LogicalMessage{std::nullopt, false, Lsn(kLsnB), "", ""},
              cat({{'M', 0x00}, kLsnBBytes, {0x00}, {0x00, 0x00, 0x00, 0x00}}));
  // The content is counted, not NUL-terminated: NUL bytes inside survive.
  expect_wire(d, LogicalMessage{std::nullopt, false, Lsn(kLsnB), "p", std::string("a\0b", 3)},
              cat({{'M', 0x00}, kLsnBBytes, str("p"), {0x00, 0x00, 0x00, 0x03, 'a', 0x00, 'b'}}));
}

TEST(PgoutputWire, StreamedLogicalMessageHasXidBeforeFlags) {
  Decoder d({2, false});
  ASSERT_TRUE(d.decode(encode(StreamStart{9, true})).ok());
  expect_wire(d, LogicalMessage{9, true, Lsn(kLsnA), "x", "y"},
              cat({{'M', 0x00, 0x00, 0x00, 0x09, 0x01},
                   kLsnABytes,
                   str("x"),
                   {0x00, 0x00, 0x00, 0x01, 'y'}}));
}

TEST(PgoutputWire, StreamStartStopCommit) {
  Decoder d({2, false});
  expect_wire(d, StreamStart{0x0A0B0C0D, true}, {'S', 0x0A, 0x0B, 0x0C, 0x0D, 0x01});
  expect_wire(d, StreamStop{}, {'E'});
  expect_wire(d, StreamStart{0x0A0B0C0D, false}, {'S', 0x0A, 0x0B, 0x0C, 0x0D, 0x00});
  expect_wire(d, StreamStop{}, {'E'});
  expect_wire(d, StreamCommit{0x0A0B0C0D, Lsn(kLsnA), Lsn(kLsnB), kTs},
              cat({{'c', 0x0A, 0x0B, 0x0C, 0x0D, 0x00}, kLsnABytes, kLsnBBytes, kTsBytes}));
}

TEST(PgoutputWire, StreamAbortWithoutAndWithAbortInfo) {
  Decoder v2({2, false});
  expect_wire(v2, StreamAbort{900, 901, std::nullopt},
              {'A', 0x00, 0x00, 0x03, 0x84, 0x00, 0x00, 0x03, 0x85});
  // Protocol 4 without parallel streaming still sends the short form.
  Decoder v4({4, false});
  expect_wire(v4, StreamAbort{900, 900, std::nullopt},
              {'A', 0x00, 0x00, 0x03, 0x84, 0x00, 0x00, 0x03, 0x84});
  Decoder parallel = v4_parallel();
  expect_wire(parallel, StreamAbort{900, 901, AbortInfo{Lsn(kLsnB), kTs}},
              cat({{'A', 0x00, 0x00, 0x03, 0x84, 0x00, 0x00, 0x03, 0x85}, kLsnBBytes, kTsBytes}));
}

TEST(PgoutputWire, TwoPhaseMessages) {
  Decoder d({3, false});
  const Bytes xid = {0x00, 0x00, 0x03, 0xB6};  // 950
  expect_wire(d, BeginPrepare{Lsn(kLsnA), Lsn(kLsnB), kTs, 950, "gid-1"},
              cat({{'b'}, kLsnABytes, kLsnBBytes, kTsBytes, xid, str("gid-1")}));
  expect_wire(d, Prepare{Lsn(kLsnA), Lsn(kLsnB), kTs, 950, "gid-1"},
              cat({{'P', 0x00}, kLsnABytes, kLsnBBytes, kTsBytes, xid, str("gid-1")}));
  expect_wire(d, CommitPrepared{Lsn(kLsnA), Lsn(kLsnB), kTs, 950, "gid-1"},
              cat({{'K', 0x00}, kLsnABytes, kLsnBBytes, kTsBytes, xid, str("gid-1")}));
  expect_wire(d, RollbackPrepared{Lsn(kLsnA), Lsn(kLsnB), kTs, 0x0102030405060708, 950, ""},
              cat({{'r', 0x00},
                   kLsnABytes,
                   kLsnBBytes,
                   kTsBytes,
                   {0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08},
                   xid,
                   {0x00}}));
  expect_wire(d, StreamPrepare{Lsn(kLsnA), Lsn(kLsnB), kTs, 950, "g"},
              cat({{'p', 0x00}, kLsnABytes, kLsnBBytes, kTsBytes, xid, str("g")}));
}

// Every sample, for every protocol version: decode(encode(m)) == m, encode(decode(b)) == b,
// and encoded_size() is exact.
class PgoutputRoundTrip : public ::testing::TestWithParam<std::pair<int, bool>> {};

TEST_P(PgoutputRoundTrip, EveryMessageSurvives) {
  auto [version, parallel] = GetParam();
  Decoder d({version, parallel});
  for (const Message& m : sample_stream(version, parallel)) {
    Bytes wire = encode(m);
    EXPECT_EQ(encoded_size(m), wire.size()) << describe(m);
    Result<Message> back = d.decode(wire);
    ASSERT_TRUE(back.ok()) << describe(m) << ": " << back.error().to_string();
    EXPECT_EQ(*back, m);
    EXPECT_EQ(encode(*back), wire) << describe(m);
    // Appending to a writer gives the same bytes after what was there.
    ByteWriter w;
    w.u8(0xAA);
    encode(m, w);
    ASSERT_EQ(w.size(), wire.size() + 1);
    EXPECT_TRUE(std::equal(wire.begin(), wire.end(), w.bytes().begin() + 1));
  }
  EXPECT_FALSE(d.in_stream());
}

TEST_P(PgoutputRoundTrip, EveryTruncationFailsCleanlyAndTrailingBytesAreRejected) {
  auto [version, parallel] = GetParam();
  Decoder d({version, parallel});
  for (const Message& m : sample_stream(version, parallel)) {
    Bytes wire = encode(m);
    for (std::size_t len = 0; len < wire.size(); ++len) {
      // An exact-size copy so that ASan sees any read past the end.
      Bytes prefix(wire.begin(), wire.begin() + static_cast<std::ptrdiff_t>(len));
      Result<Message> r = d.decode(prefix);
      ASSERT_FALSE(r.ok()) << describe(m) << " truncated to " << len << " bytes";
      EXPECT_EQ(r.error().sqlstate, "08P01") << r.error().message;
      EXPECT_FALSE(r.error().message.empty());
    }
    for (std::uint8_t extra : {0x00, 0x4E, 0xFF}) {
      Bytes longer = wire;
      longer.push_back(extra);
      Result<Message> r = d.decode(longer);
      ASSERT_FALSE(r.ok()) << describe(m) << " with a trailing byte";
      EXPECT_EQ(r.error().sqlstate, "08P01");
    }
    // Failures left the decoder's state alone: the full message still decodes.
    Result<Message> full = d.decode(wire);
    ASSERT_TRUE(full.ok()) << describe(m) << ": " << full.error().to_string();
    EXPECT_EQ(*full, m);
  }
}

INSTANTIATE_TEST_SUITE_P(Versions, PgoutputRoundTrip,
                         ::testing::Values(std::pair{1, false}, std::pair{2, false},
                                           std::pair{3, false}, std::pair{4, false},
                                           std::pair{4, true}),
                         [](const auto& param_info) {
                           return "v" + std::to_string(param_info.param.first) +
                                  (param_info.param.second ? "_parallel" : "");
                         });

TEST(PgoutputEncode, EncodeReturnsExactlySizedBuffer) {
  for (const Message& m : sample_stream(4, true)) {
    Bytes wire = encode(m);
    EXPECT_EQ(wire.capacity(), wire.size()) << describe(m);
  }
}

TEST(PgoutputDescribe, OneLinePerMessageNamingTheType) {
  for (const Message& m : sample_stream(4, true)) {
    std::string line = describe(m);
    EXPECT_EQ(line.find('\n'), std::string::npos) << line;
    EXPECT_EQ(line.rfind(tag_name(static_cast<char>(tag_of(m))), 0), 0u) << line;
  }
  EXPECT_EQ(describe(Insert{7, kUsersOid,
                            Tuple{{TupleValue::text("it's"), TupleValue::null(),
                                   TupleValue::unchanged(), TupleValue::binary("\x01")}}}),
            "INSERT xid=7 relation=16384 new=('it\\'s', null, unchanged-toast, binary:'\\x01')");
  EXPECT_EQ(describe(StreamAbort{1, 2, AbortInfo{Lsn(0x16B3748), 5}}),
            "STREAM ABORT xid=1 subxid=2 abort_lsn=0/16B3748 abort_time=5");
  std::string long_value(500, 'x');
  std::string line = describe(LogicalMessage{std::nullopt, true, Lsn(1), "p", long_value});
  EXPECT_LT(line.size(), 200u);
  EXPECT_NE(line.find("(500 bytes)"), std::string::npos) << line;
}

}  // namespace
}  // namespace pgrelay::pgoutput
