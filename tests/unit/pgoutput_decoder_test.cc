// Tests the pgoutput decoder's rejection of malformed streams and its relation and stream state.
#include <gtest/gtest.h>

#include "pgoutput/decoder.h"
#include "pgoutput/encoder.h"
#include "pgoutput_samples.h"

namespace pgrelay::pgoutput {
namespace {

using testing::audit_relation;
using testing::kAuditOid;
using testing::kUsersOid;
using testing::users_relation;

Bytes cat(std::initializer_list<Bytes> parts) {
  Bytes out;
  for (const Bytes& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// Decodes `wire`, expecting a protocol violation whose message contains `needle`.
void expect_violation(Decoder& d, const Bytes& wire, const std::string& needle) {
  Result<Message> r = d.decode(wire);
  ASSERT_FALSE(r.ok()) << "decoded: " << describe(*r);
  EXPECT_EQ(r.error().sqlstate, "08P01") << r.error().to_string();
  EXPECT_NE(r.error().message.find(needle), std::string::npos) << r.error().to_string();
}

void decode_ok(Decoder& d, const Message& m) {
  Result<Message> r = d.decode(encode(m));
  ASSERT_TRUE(r.ok()) << describe(m) << ": " << r.error().to_string();
  ASSERT_EQ(*r, m);
}

Decoder with_users(int version = 1) {
  Decoder d({version, false});
  decode_ok(d, users_relation());
  return d;
}

TEST(PgoutputDecoder, RejectsEmptyPayloadAndUnknownTags) {
  Decoder d({4, true});
  expect_violation(d, {}, "insufficient data left in message");
  expect_violation(d, {'Z'}, "invalid logical replication message type \"??? (90)\"");
  expect_violation(d, {0x00}, "\"??? (0)\"");
  expect_violation(d, {0xFF, 1, 2, 3}, "\"??? (255)\"");
  expect_violation(d, {'w'}, "\"??? (119)\"");  // an XLogData tag is not a pgoutput tag
}

TEST(PgoutputDecoder, StreamingMessagesNeedProtocol2) {
  Decoder v1({1, false});
  for (const Message& m :
       {Message(StreamStart{1, true}), Message(StreamStop{}),
        Message(StreamCommit{1, Lsn(1), Lsn(2), 3}), Message(StreamAbort{1, 1, std::nullopt})}) {
    expect_violation(v1, encode(m), "requires protocol version 2 or higher");
  }
  Decoder v2({2, false});
  decode_ok(v2, StreamStart{1, true});
  decode_ok(v2, StreamStop{});
}

TEST(PgoutputDecoder, TwoPhaseMessagesNeedProtocol3) {
  const std::vector<Message> two_phase = {
      BeginPrepare{Lsn(1), Lsn(2), 3, 4, "g"}, Prepare{Lsn(1), Lsn(2), 3, 4, "g"},
      CommitPrepared{Lsn(1), Lsn(2), 3, 4, "g"}, RollbackPrepared{Lsn(1), Lsn(2), 3, 4, 5, "g"},
      StreamPrepare{Lsn(1), Lsn(2), 3, 4, "g"}};
  for (int version : {1, 2}) {
    Decoder d({version, false});
    for (const Message& m : two_phase) {
      expect_violation(d, encode(m), "requires protocol version 3 or higher");
    }
  }
  Decoder v3({3, false});
  for (const Message& m : two_phase) decode_ok(v3, m);
}

TEST(PgoutputDecoder, RejectsUnsupportedOptions) {
  for (DecoderOptions bad : {DecoderOptions{0, false}, DecoderOptions{5, false},
                             DecoderOptions{-1, false}, DecoderOptions{3, true}}) {
    Decoder d(bad);
    Result<Message> r = d.decode(encode(Begin{Lsn(1), 2, 3}));
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("proto_version="), std::string::npos) << r.error().message;
  }
  Decoder too_new({5, false});
  EXPECT_EQ(too_new.decode(encode(StreamStop{})).error().message,
            "client sent proto_version=5 but server only supports protocol 4 or lower");
  Decoder parallel_v3({3, true});
  EXPECT_EQ(parallel_v3.decode(encode(StreamStop{})).error().sqlstate, "22023");
}

TEST(PgoutputDecoder, ChangeForUnknownRelation) {
  Decoder d({1, false});
  Tuple row{{TupleValue::text("1"), TupleValue::null(), TupleValue::null()}};
  for (const Message& m : {Message(Insert{std::nullopt, kUsersOid, row}),
                           Message(Update{std::nullopt, kUsersOid, std::nullopt, row}),
                           Message(Delete{std::nullopt, kUsersOid, OldTuple{OldKind::kKey, row}}),
                           Message(Truncate{std::nullopt, false, false, {kUsersOid}})}) {
    Result<Message> r = d.decode(encode(m));
    ASSERT_FALSE(r.ok()) << describe(m);
    EXPECT_EQ(r.error().sqlstate, "08P01");
    EXPECT_EQ(r.error().message,
              "logical replication relation OID 16384 not found; the stream must send a Relation "
              "message before its first change");
  }
  EXPECT_EQ(d.relation(kUsersOid), nullptr);
  decode_ok(d, users_relation());
  decode_ok(d, Insert{std::nullopt, kUsersOid, row});
  // A truncate naming one known and one unknown relation is still rejected.
  expect_violation(d, encode(Truncate{std::nullopt, false, false, {kUsersOid, 99}}),
                   "relation OID 99 not found");
}

TEST(PgoutputDecoder, TupleColumnCountMustMatchRelation) {
  Decoder d = with_users();
  Tuple two{{TupleValue::text("1"), TupleValue::null()}};
  Tuple four{{TupleValue::text("1"), TupleValue::null(), TupleValue::null(), TupleValue::null()}};
  Tuple three{{TupleValue::text("1"), TupleValue::null(), TupleValue::null()}};
  expect_violation(d, encode(Insert{std::nullopt, kUsersOid, two}),
                   "has a tuple of 2 columns, but its Relation message declares 3");
  expect_violation(d, encode(Insert{std::nullopt, kUsersOid, four}), "tuple of 4 columns");
  expect_violation(d, encode(Update{std::nullopt, kUsersOid, OldTuple{OldKind::kKey, two}, three}),
                   "tuple of 2 columns");
  expect_violation(d, encode(Update{std::nullopt, kUsersOid, std::nullopt, Tuple{}}),
                   "tuple of 0 columns");
  expect_violation(d, encode(Delete{std::nullopt, kUsersOid, OldTuple{OldKind::kFull, four}}),
                   "tuple of 4 columns");
}

TEST(PgoutputDecoder, RelationResentForSameOidReplacesTheOldOne) {
  Decoder d = with_users();
  Relation wider = users_relation();
  wider.columns.push_back({0, "bio", 25, -1});
  wider.replica_identity = kReplicaIdentityFull;
  decode_ok(d, wider);
  ASSERT_NE(d.relation(kUsersOid), nullptr);
  EXPECT_EQ(*d.relation(kUsersOid), wider);
  Tuple three{{TupleValue::text("1"), TupleValue::null(), TupleValue::null()}};
  Tuple four{{TupleValue::text("1"), TupleValue::null(), TupleValue::null(), TupleValue::null()}};
  expect_violation(d, encode(Insert{std::nullopt, kUsersOid, three}), "declares 4");
  decode_ok(d, Insert{std::nullopt, kUsersOid, four});
  // Other relations are untouched.
  decode_ok(d, audit_relation());
  EXPECT_EQ(*d.relation(kUsersOid), wider);
  EXPECT_EQ(*d.relation(kAuditOid), audit_relation());
}

TEST(PgoutputDecoder, RejectsUnknownValueKindAndNegativeLengths) {
  Decoder d = with_users();
  const Bytes head = {'I', 0x00, 0x00, 0x40, 0x00, 'N', 0x00, 0x03};
  expect_violation(d, cat({head, {'n', 'x', 'n'}}), "unrecognized data representation type 'x'");
  expect_violation(d, cat({head, {'n', 'n', 0x01}}), "unrecognized data representation type");
  expect_violation(d, cat({head, {'t', 0xFF, 0xFF, 0xFF, 0xFF, 'n', 'n'}}),
                   "invalid column value length -1");
  expect_violation(d, cat({head, {'n', 'b', 0x80, 0x00, 0x00, 0x00, 'n'}}),
                   "invalid column value length -2147483648");
  // A length larger than what is left is a truncation, not an over-read.
  expect_violation(d, cat({head, {'t', 0x7F, 0xFF, 0xFF, 0xFF, 'n', 'n'}}),
                   "insufficient data left in message");
  // Message content length and truncate count.
  expect_violation(d, cat({{'M', 0x00}, Bytes(8, 0x01), {'p', 0x00, 0xFF, 0xFF, 0xFF, 0xFE}}),
                   "invalid content length -2");
  expect_violation(d, {'T', 0xFF, 0xFF, 0xFF, 0xFF, 0x00}, "invalid relation count -1");
  expect_violation(d, {'T', 0x7F, 0xFF, 0xFF, 0xFF, 0x00, 0x00, 0x00, 0x40, 0x00},
                   "insufficient data left in message");
}

TEST(PgoutputDecoder, RejectsUnexpectedTupleMarkers) {
  Decoder d = with_users();
  const Bytes oid = {0x00, 0x00, 0x40, 0x00};
  const Bytes tuple = {0x00, 0x03, 'n', 'n', 'n'};
  expect_violation(d, cat({{'I'}, oid, {'K'}, tuple}), "expected new tuple but got 75");
  expect_violation(d, cat({{'I'}, oid, {'O'}, tuple}), "expected new tuple but got 79");
  expect_violation(d, cat({{'U'}, oid, {'X'}, tuple}), "expected action 'N', 'O' or 'K', got X");
  expect_violation(d, cat({{'U'}, oid, {'K'}, tuple, {'K'}, tuple}), "expected action 'N', got K");
  expect_violation(d, cat({{'U'}, oid, {'O'}, tuple, {'O'}, tuple}), "expected action 'N', got O");
  expect_violation(d, cat({{'U'}, oid, {'K'}, tuple, {0x01}, tuple}),
                   "expected action 'N', got \\x01");
  expect_violation(d, cat({{'D'}, oid, {'N'}, tuple}), "expected action 'O' or 'K', got N");
  // The well-formed versions of the same bytes decode.
  EXPECT_TRUE(d.decode(cat({{'I'}, oid, {'N'}, tuple})).ok());
  EXPECT_TRUE(d.decode(cat({{'U'}, oid, {'K'}, tuple, {'N'}, tuple})).ok());
  EXPECT_TRUE(d.decode(cat({{'D'}, oid, {'O'}, tuple})).ok());
}

TEST(PgoutputDecoder, RejectsFlagsPostgresDoesNotSend) {
  Decoder d({3, false});
  const Bytes lsn = {0, 0, 0, 0, 0, 0, 0, 1};
  const Bytes tail = cat({lsn, lsn, Bytes(8, 0)});
  expect_violation(d, cat({{'C', 0x01}, tail}), "unrecognized flags 1 in commit message");
  expect_violation(d, cat({{'P', 0x02}, tail, {0, 0, 0, 1, 0}}),
                   "unrecognized flags 2 in prepare message");
  expect_violation(d, cat({{'K', 0x01}, tail, {0, 0, 0, 1, 0}}),
                   "unrecognized flags 1 in commit prepared message");
  expect_violation(d, cat({{'r', 0x01}, tail, Bytes(8, 0), {0, 0, 0, 1, 0}}),
                   "unrecognized flags 1 in rollback prepared message");
  expect_violation(d, cat({{'p', 0x01}, tail, {0, 0, 0, 1, 0}}),
                   "unrecognized flags 1 in stream prepare message");
  expect_violation(d, cat({{'M', 0x02}, lsn, {0x00, 0, 0, 0, 0}}), "unrecognized flags 2");
  expect_violation(d, {'T', 0, 0, 0, 0, 0x04}, "unrecognized options 4 in truncate message");
  expect_violation(d, {'S', 0, 0, 0, 1, 0x02}, "invalid first segment flag 2");
}

TEST(PgoutputDecoder, RejectsUnsetLsnsAndXidsAsPostgresDoes) {
  Decoder d({3, false});
  const Bytes zero = Bytes(8, 0);
  const Bytes one = {0, 0, 0, 0, 0, 0, 0, 1};
  expect_violation(d, cat({{'B'}, zero, zero, {0, 0, 0, 1}}), "final_lsn not set in begin message");
  expect_violation(d, cat({{'b'}, zero, one, zero, {0, 0, 0, 1, 0}}),
                   "prepare_lsn not set in begin prepare message");
  expect_violation(d, cat({{'P', 0}, one, zero, zero, {0, 0, 0, 1, 0}}),
                   "end_lsn is not set in prepare message");
  expect_violation(d, cat({{'P', 0}, one, one, zero, {0, 0, 0, 0, 0}}),
                   "invalid two-phase transaction ID in prepare message");
  expect_violation(d, cat({{'K', 0}, zero, one, zero, {0, 0, 0, 1, 0}}),
                   "commit_lsn is not set in commit prepared message");
  expect_violation(d, cat({{'r', 0}, one, zero, zero, zero, {0, 0, 0, 1, 0}}),
                   "rollback_end_lsn is not set in rollback prepared message");
}

TEST(PgoutputDecoder, StreamBlockDecidesWhetherChangesCarryAnXid) {
  Decoder d = with_users(2);
  Insert plain{std::nullopt, kUsersOid,
               Tuple{{TupleValue::text("1"), TupleValue::null(), TupleValue::null()}}};
  Insert streamed = plain;
  streamed.xid = 77;
  // Outside a block, xid-prefixed bytes misparse: the xid is read as the relation OID.
  expect_violation(d, encode(streamed), "relation OID 77 not found");
  decode_ok(d, plain);
  decode_ok(d, StreamStart{77, true});
  EXPECT_TRUE(d.in_stream());
  expect_violation(d, encode(plain), "not found");
  decode_ok(d, streamed);
  decode_ok(d, StreamStop{});
  EXPECT_FALSE(d.in_stream());
  decode_ok(d, plain);
}

TEST(PgoutputDecoder, StreamBlockOrderingErrors) {
  Decoder d({3, false});
  expect_violation(d, encode(StreamStop{}), "STREAM STOP message without STREAM START");
  decode_ok(d, StreamStart{5, true});
  expect_violation(d, encode(StreamStart{5, false}), "duplicate STREAM START message");
  expect_violation(d, encode(StreamCommit{5, Lsn(1), Lsn(2), 3}),
                   "STREAM COMMIT message without STREAM STOP");
  expect_violation(d, encode(StreamAbort{5, 5, std::nullopt}),
                   "STREAM ABORT message without STREAM STOP");
  expect_violation(d, encode(StreamPrepare{Lsn(1), Lsn(2), 3, 5, "g"}),
                   "STREAM PREPARE message without STREAM STOP");
  decode_ok(d, StreamStop{});
  decode_ok(d, StreamCommit{5, Lsn(1), Lsn(2), 3});
}

TEST(PgoutputDecoder, StreamAbortInfoOnlyWithParallelStreaming) {
  Bytes with_info = encode(StreamAbort{1, 2, AbortInfo{Lsn(3), 4}});
  Bytes without_info = encode(StreamAbort{1, 2, std::nullopt});
  Decoder on({4, false});
  expect_violation(on, with_info, "invalid message format");
  EXPECT_TRUE(on.decode(without_info).ok());
  Decoder parallel({4, true});
  expect_violation(parallel, without_info, "insufficient data left in message");
  Result<Message> r = parallel.decode(with_info);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(std::get<StreamAbort>(*r).abort_info, (AbortInfo{Lsn(3), 4}));
}

TEST(PgoutputDecoder, StreamedRelationsApplyWhenTheTransactionCommits) {
  Decoder d = with_users(2);
  Relation wider = users_relation(40);
  wider.columns.push_back({0, "bio", 25, -1});
  Tuple three{{TupleValue::text("1"), TupleValue::null(), TupleValue::null()}};
  Tuple four{{TupleValue::text("1"), TupleValue::null(), TupleValue::null(), TupleValue::null()}};

  decode_ok(d, StreamStart{40, true});
  decode_ok(d, wider);
  EXPECT_EQ(d.relation(kUsersOid)->columns.size(), 4u);
  decode_ok(d, Insert{40, kUsersOid, four});
  decode_ok(d, StreamStop{});
  // A concurrent transaction still sees the committed definition.
  EXPECT_EQ(d.relation(kUsersOid)->columns.size(), 3u);
  decode_ok(d, Insert{std::nullopt, kUsersOid, three});
  // Another streamed transaction does not see transaction 40's relation either.
  decode_ok(d, StreamStart{41, true});
  decode_ok(d, Insert{41, kUsersOid, three});
  decode_ok(d, StreamStop{});
  // Back in transaction 40, its own definition applies without being re-sent.
  decode_ok(d, StreamStart{40, false});
  decode_ok(d, Insert{40, kUsersOid, four});
  decode_ok(d, StreamStop{});
  decode_ok(d, StreamAbort{41, 41, std::nullopt});
  decode_ok(d, StreamCommit{40, Lsn(1), Lsn(2), 3});
  EXPECT_EQ(*d.relation(kUsersOid), wider);
  decode_ok(d, Insert{std::nullopt, kUsersOid, four});
}

TEST(PgoutputDecoder, StreamedRelationsOfAnAbortedTransactionAreDropped) {
  Decoder d = with_users(2);
  Relation wider = users_relation(50);
  wider.columns.push_back({0, "bio", 25, -1});
  decode_ok(d, StreamStart{50, true});
  decode_ok(d, wider);
  decode_ok(d, StreamStop{});
  // A subtransaction abort keeps the transaction going.
  decode_ok(d, StreamAbort{50, 51, std::nullopt});
  decode_ok(d, StreamStart{50, false});
  EXPECT_EQ(d.relation(kUsersOid)->columns.size(), 4u);
  decode_ok(d, StreamStop{});
  decode_ok(d, StreamAbort{50, 50, std::nullopt});
  EXPECT_EQ(*d.relation(kUsersOid), users_relation());
  // A relation known only from the aborted transaction is gone.
  Decoder e({2, false});
  decode_ok(e, StreamStart{60, true});
  decode_ok(e, audit_relation(60));
  decode_ok(e, StreamStop{});
  decode_ok(e, StreamAbort{60, 60, std::nullopt});
  EXPECT_EQ(e.relation(kAuditOid), nullptr);
}

TEST(PgoutputDecoder, StreamPrepareAppliesStreamedRelations) {
  Decoder d({3, false});
  decode_ok(d, StreamStart{70, true});
  decode_ok(d, audit_relation(70));
  decode_ok(d, StreamStop{});
  EXPECT_EQ(d.relation(kAuditOid), nullptr);
  decode_ok(d, StreamPrepare{Lsn(1), Lsn(2), 3, 70, "g"});
  ASSERT_NE(d.relation(kAuditOid), nullptr);
  EXPECT_EQ(d.relation(kAuditOid)->name, "audit");
}

TEST(PgoutputDecoder, FailedMessagesLeaveStateUnchanged) {
  Decoder d({2, false});
  Bytes start = encode(StreamStart{1, true});
  start.push_back(0);  // trailing byte
  EXPECT_FALSE(d.decode(start).ok());
  EXPECT_FALSE(d.in_stream());
  Bytes rel = encode(users_relation());
  rel.pop_back();
  EXPECT_FALSE(d.decode(rel).ok());
  EXPECT_EQ(d.relation(kUsersOid), nullptr);
}

TEST(PgoutputDecoder, HugeCountsDoNotAllocateOrOverRead) {
  Decoder d = with_users();
  // A relation declaring 65535 columns with no bytes behind the count.
  expect_violation(d, {'R', 0, 0, 0, 9, 0, 't', 0, 'd', 0xFF, 0xFF},
                   "insufficient data left in message");
  // A tuple declaring 65535 columns.
  expect_violation(d, {'I', 0x00, 0x00, 0x40, 0x00, 'N', 0xFF, 0xFF, 'n'},
                   "insufficient data left in message");
  // A string without its terminating NUL.
  expect_violation(d, {'O', 0, 0, 0, 0, 0, 0, 0, 1, 'a', 'b'}, "insufficient data left in message");
}

}  // namespace
}  // namespace pgrelay::pgoutput
