// Tests the stored transaction format: exact pgoutput records, streaming decode, validation.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "log/transaction.h"
#include "pgoutput/encoder.h"

namespace pgrelay::log {
namespace {

using pgoutput::Column;
using pgoutput::OldKind;
using pgoutput::OldTuple;
using pgoutput::Relation;
using pgoutput::Tuple;
using pgoutput::TupleValue;

constexpr pgoutput::Oid kUsers = 16384;
constexpr pgoutput::Oid kOrders = 16390;
constexpr pgoutput::Oid kMoodType = 16400;

Relation users() {
  Relation r;
  r.oid = kUsers;
  r.namespace_name = "public";
  r.name = "users";
  r.replica_identity = pgoutput::kReplicaIdentityDefault;
  r.columns = {Column{pgoutput::kColumnIsKey, "id", 23, -1}, Column{0, "name", 25, -1},
               Column{0, "avatar", 17, -1}, Column{0, "mood", kMoodType, -1}};
  return r;
}

Relation orders() {
  Relation r;
  r.oid = kOrders;
  r.namespace_name = "shop";
  r.name = "orders";
  r.replica_identity = pgoutput::kReplicaIdentityFull;
  r.columns = {Column{pgoutput::kColumnIsKey, "id", 20, -1},
               Column{pgoutput::kColumnIsKey, "total", 1700, 655366}};
  return r;
}

Tuple row(std::vector<TupleValue> values) {
  return Tuple{std::move(values)};
}

TransactionHeader header(std::uint32_t xid = 777) {
  TransactionHeader h;
  h.begin_lsn = Lsn(0x1000);
  h.commit_lsn = Lsn(0x2000);
  h.end_lsn = Lsn(0x2040);
  h.commit_time = 742000000123456;
  h.xid = xid;
  h.origin = "upstream_a";
  h.origin_lsn = Lsn(0xABCDEF);
  return h;
}

// A transaction with every kind of change, TOAST-unchanged values and binary bytes.
Transaction every_kind() {
  const std::string binary("\x00\xff\x01\x80\x00", 5);
  Transaction t;
  t.header = header();
  std::uint64_t lsn = 0x1000;
  auto add = [&](ChangeMessage m) { t.changes.push_back(Change{Lsn(lsn += 0x18), std::move(m)}); };
  add(pgoutput::Type{std::nullopt, kMoodType, "public", "mood"});
  add(users());
  add(pgoutput::Insert{std::nullopt, kUsers,
                       row({TupleValue::text("1"), TupleValue::text("ann"),
                            TupleValue::binary(binary), TupleValue::null()})});
  add(pgoutput::Update{std::nullopt, kUsers, std::nullopt,
                       row({TupleValue::text("1"), TupleValue::text("anne"),
                            TupleValue::unchanged(), TupleValue::text("happy")})});
  add(pgoutput::Update{std::nullopt, kUsers,
                       OldTuple{OldKind::kKey, row({TupleValue::text("1"), TupleValue::null(),
                                                    TupleValue::null(), TupleValue::null()})},
                       row({TupleValue::text("2"), TupleValue::text("anne"),
                            TupleValue::unchanged(), TupleValue::null()})});
  add(orders());
  add(pgoutput::Update{
      std::nullopt, kOrders,
      OldTuple{OldKind::kFull, row({TupleValue::text("5"), TupleValue::text("9.50")})},
      row({TupleValue::text("5"), TupleValue::text("10.00")})});
  add(pgoutput::Delete{std::nullopt, kUsers,
                       OldTuple{OldKind::kKey, row({TupleValue::text("2"), TupleValue::null(),
                                                    TupleValue::null(), TupleValue::null()})}});
  add(pgoutput::Delete{
      std::nullopt, kOrders,
      OldTuple{OldKind::kFull, row({TupleValue::text("5"), TupleValue::binary(binary)})}});
  add(pgoutput::Truncate{std::nullopt, true, true, {kUsers, kOrders}});
  add(pgoutput::LogicalMessage{std::nullopt, true, Lsn(lsn + 0x18), "app", binary});
  return t;
}

EncodedEntry encode_ok(const Transaction& t) {
  auto e = encode_transaction(t);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.error().to_string());
  return e.ok() ? std::move(*e) : EncodedEntry{};
}

// Decodes `data` fed in the given pieces, draining after each.
Result<std::vector<Change>> decode_pieces(const EntryMeta& meta, ByteView data,
                                          const std::vector<std::size_t>& cuts) {
  ChangeReader reader(meta);
  std::vector<Change> out;
  std::size_t from = 0;
  auto drain = [&]() -> Status {
    while (true) {
      auto c = reader.next();
      if (!c.ok()) return c.error();
      if (!*c) return {};
      out.push_back(std::move(**c));
    }
  };
  for (std::size_t cut : cuts) {
    reader.feed(data.subspan(from, cut - from));
    PGRELAY_TRY(drain());
    from = cut;
  }
  reader.feed(data.subspan(from));
  PGRELAY_TRY(drain());
  PGRELAY_TRY(reader.finish());
  return out;
}

// Raw record bytes, bypassing encode_transaction's checks.
void raw_change(ByteWriter& out, std::uint64_t lsn, const pgoutput::Message& m) {
  ASSERT_TRUE(encode_change(Lsn(0), Lsn(lsn), m, out).ok());  // `lsn` is the offset from begin
}

EntryMeta meta_for(std::uint32_t count, EntryKind kind = EntryKind::kTransaction) {
  return entry_meta(kind, header(), count);
}

void expect_corrupt(const Status& st, const std::string& needle) {
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().sqlstate, sqlstate::kDataCorrupted) << st.error().to_string();
  EXPECT_NE(st.error().to_string().find(needle), std::string::npos) << st.error().to_string();
  EXPECT_NE(st.error().message.find("transaction 777"), std::string::npos)
      << st.error().to_string();
}

Status decode_status(const EntryMeta& meta, ByteView data) {
  auto t = decode_transaction(meta, data);
  if (!t.ok()) return t.error();
  return {};
}

TEST(TransactionCodec, RoundTripsEveryChangeKind) {
  Transaction t = every_kind();
  EncodedEntry e = encode_ok(t);
  EXPECT_EQ(e.meta.change_count, t.changes.size());
  EXPECT_EQ(e.meta.kind, EntryKind::kTransaction);
  EXPECT_EQ(e.meta.xid, 777u);
  EXPECT_EQ(e.meta.origin, "upstream_a");
  EXPECT_EQ(e.meta.origin_lsn, Lsn(0xABCDEF));
  EXPECT_EQ(header_of(e.meta), t.header);
  auto back = decode_transaction(e.meta, e.data);
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_EQ(*back, t);
}

TEST(TransactionCodec, StoredFormIsExactPgoutput) {
  Transaction t = every_kind();
  EncodedEntry e = encode_ok(t);
  ByteReader r(e.data);
  for (const Change& c : t.changes) {
    Bytes wire = pgoutput::encode(to_message(c.message));
    EXPECT_EQ(r.u32(), wire.size());
    EXPECT_EQ(r.u64(), c.lsn - t.header.begin_lsn);  // stored as an offset from begin
    ByteView body = r.bytes(wire.size());
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(Bytes(body.begin(), body.end()), wire) << pgoutput::describe(to_message(c.message));
  }
  EXPECT_TRUE(r.at_end());
}

// Found by fuzz_log_parsers: an offset that overflows past the top of the LSN space is damage.
TEST(ChangeReaderErrors, LsnOffsetOverflowIsCorruption) {
  ByteWriter out;
  raw_change(out, 0xFFFFFFFFFFFFFF00ull, pgoutput::Message(users()));
  expect_corrupt(decode_status(meta_for(1), out.bytes()), "overflows");
}

TEST(TransactionCodec, StreamedXidIsNotStored) {
  Transaction t;
  t.header = header();
  Relation rel = users();
  rel.xid = 99;
  t.changes.push_back(Change{t.header.begin_lsn + 1, rel});
  auto e = encode_transaction(t);
  ASSERT_TRUE(e.ok());
  rel.xid.reset();
  // Without the xid the record is exactly the non-streamed message.
  EXPECT_EQ(e->data.size(), kChangeHeaderSize + pgoutput::encoded_size(pgoutput::Message(rel)));
}

TEST(TransactionCodec, MessageEntryRoundTrips) {
  Transaction t;
  t.kind = EntryKind::kMessage;
  t.header = header();
  t.changes.push_back(
      Change{Lsn(0x2000), pgoutput::LogicalMessage{std::nullopt, false, Lsn(0x2000), "p",
                                                   std::string("\x00payload", 8)}});
  EncodedEntry e = encode_ok(t);
  EXPECT_EQ(e.meta.kind, EntryKind::kMessage);
  auto back = decode_transaction(e.meta, e.data);
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_EQ(*back, t);
}

TEST(TransactionCodec, EncodeRefusesInvalidTransactions) {
  // A change before its relation's Relation.
  Transaction t;
  t.header = header();
  t.changes.push_back(Change{Lsn(0x1100), pgoutput::Insert{std::nullopt, kUsers, row({})}});
  auto e = encode_transaction(t);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.error().sqlstate, sqlstate::kInvalidParameterValue);
  EXPECT_NE(e.error().message.find("0/1100"), std::string::npos) << e.error().message;
  EXPECT_NE(e.error().message.find("16384"), std::string::npos) << e.error().message;

  // A message entry with two messages, or with a transactional one.
  Transaction m;
  m.kind = EntryKind::kMessage;
  m.header = header();
  pgoutput::LogicalMessage msg{std::nullopt, false, Lsn(5), "p", "c"};
  m.changes = {Change{Lsn(5), msg}, Change{Lsn(6), msg}};
  EXPECT_FALSE(encode_transaction(m).ok());
  msg.transactional = true;
  m.changes = {Change{Lsn(5), msg}};
  EXPECT_FALSE(encode_transaction(m).ok());

  // A non-transactional message inside a transaction.
  Transaction n;
  n.header = header();
  n.changes = {Change{Lsn(5), pgoutput::LogicalMessage{std::nullopt, false, Lsn(5), "p", "c"}}};
  EXPECT_FALSE(encode_transaction(n).ok());
}

TEST(ChangeReader, DecodesWithEveryTwoPieceCut) {
  Transaction t = every_kind();
  EncodedEntry e = encode_ok(t);
  for (std::size_t cut = 0; cut <= e.data.size(); ++cut) {
    auto got = decode_pieces(e.meta, e.data, {cut});
    ASSERT_TRUE(got.ok()) << "cut " << cut << ": " << got.error().to_string();
    ASSERT_EQ(*got, t.changes) << "cut " << cut;
  }
}

TEST(ChangeReader, DecodesOneByteAtATime) {
  Transaction t = every_kind();
  EncodedEntry e = encode_ok(t);
  std::vector<std::size_t> cuts;
  for (std::size_t i = 1; i < e.data.size(); ++i) cuts.push_back(i);
  auto got = decode_pieces(e.meta, e.data, cuts);
  ASSERT_TRUE(got.ok()) << got.error().to_string();
  EXPECT_EQ(*got, t.changes);
}

TEST(ChangeReader, FeedingWithoutDrainingKeepsUnreadBytes) {
  Transaction t = every_kind();
  EncodedEntry e = encode_ok(t);
  ChangeReader reader(e.meta);
  const std::size_t half = e.data.size() / 2;
  reader.feed(ByteView(e.data).first(half));
  reader.feed(ByteView(e.data).subspan(half));  // the first piece is copied before it goes
  std::vector<Change> got;
  while (true) {
    auto c = reader.next();
    ASSERT_TRUE(c.ok()) << c.error().to_string();
    if (!*c) break;
    got.push_back(std::move(**c));
  }
  ASSERT_TRUE(reader.finish().ok());
  EXPECT_EQ(got, t.changes);
}

TEST(ChangeReader, LargeTransactionUsesMemoryOfOneChange) {
  // ~50 MB: 780 rows of 64 KiB and one of 3 MiB, fed in log-sized pieces that do not line up
  // with the changes.
  ByteWriter out;
  raw_change(out, 1, pgoutput::Message(users()));
  std::uint32_t count = 1;
  std::size_t largest = 0;
  std::size_t last = out.size();
  for (std::uint32_t i = 0; i < 781; ++i) {
    std::size_t value = i == 400 ? (3u << 20) : (64u << 10);
    raw_change(out, 100 + i,
               pgoutput::Message(pgoutput::Insert{
                   std::nullopt, kUsers,
                   row({TupleValue::text(std::to_string(i)), TupleValue::text("n"),
                        TupleValue::binary(std::string(value, static_cast<char>(i))),
                        TupleValue::null()})}));
    largest = std::max(largest, out.size() - last);
    last = out.size();
    ++count;
  }
  const Bytes data = std::move(out).take();
  ASSERT_GT(data.size(), 50u << 20);

  ChangeReader reader(meta_for(count));
  const std::size_t piece = (256u << 10) - 10;
  std::uint32_t inserts = 0;
  for (std::size_t from = 0; from < data.size(); from += piece) {
    reader.feed(ByteView(data).subspan(from, std::min(piece, data.size() - from)));
    while (true) {
      auto c = reader.next();
      ASSERT_TRUE(c.ok()) << c.error().to_string();
      if (!*c) break;
      if (auto* ins = std::get_if<pgoutput::Insert>(&(*c)->message)) {
        EXPECT_EQ(ins->new_tuple.columns[0].bytes, std::to_string(inserts));
        EXPECT_EQ(ins->new_tuple.columns[2].bytes.size(),
                  inserts == 400 ? (3u << 20) : (64u << 10));
        ++inserts;
      }
    }
  }
  ASSERT_TRUE(reader.finish().ok());
  EXPECT_EQ(inserts, 781u);
  EXPECT_EQ(reader.changes_read(), count);
  EXPECT_GT(reader.peak_buffer_size(), 0u);
  EXPECT_LE(reader.peak_buffer_size(), largest);
  EXPECT_EQ(reader.buffered(), 0u);
}

TEST(ChangeReader, UnknownRelationIsCorruption) {
  ByteWriter out;
  raw_change(out, 0x1234, pgoutput::Message(pgoutput::Insert{std::nullopt, kUsers, row({})}));
  Status st = decode_status(meta_for(1), out.bytes());
  expect_corrupt(st, "0/2234");  // begin 0/1000 + offset 0x1234
  EXPECT_NE(st.error().message.find("16384"), std::string::npos);
}

TEST(ChangeReader, RelationFromAnotherEntryDoesNotCount) {
  // Every entry must describe its own relations; a fresh reader knows none.
  ByteWriter first;
  raw_change(first, 1, pgoutput::Message(users()));
  ASSERT_TRUE(decode_status(meta_for(1), first.bytes()).ok());
  ByteWriter second;
  raw_change(second, 2,
             pgoutput::Message(pgoutput::Delete{
                 std::nullopt, kUsers,
                 OldTuple{OldKind::kKey, row({TupleValue::text("1"), TupleValue::null(),
                                              TupleValue::null(), TupleValue::null()})}}));
  expect_corrupt(decode_status(meta_for(1), second.bytes()), "0/1002");
}

TEST(ChangeReader, ColumnCountMismatchIsCorruption) {
  ByteWriter out;
  raw_change(out, 0x10, pgoutput::Message(users()));
  raw_change(
      out, 0xBEEF,
      pgoutput::Message(pgoutput::Insert{std::nullopt, kUsers, row({TupleValue::text("1")})}));
  Status st = decode_status(meta_for(2), out.bytes());
  expect_corrupt(st, "0/CEEF");
  EXPECT_NE(st.error().message.find("1 columns"), std::string::npos) << st.error().message;
}

TEST(ChangeReader, TruncatedDataIsCorruption) {
  EncodedEntry e = encode_ok(every_kind());
  for (std::size_t drop : {1u, 5u, 13u}) {
    Bytes cut(e.data.begin(), e.data.end() - static_cast<std::ptrdiff_t>(drop));
    expect_corrupt(decode_status(e.meta, cut), "ends inside a change");
  }
}

TEST(ChangeReader, ChangeCountMustMatch) {
  EncodedEntry e = encode_ok(every_kind());
  EntryMeta more = e.meta;
  ++more.change_count;
  expect_corrupt(decode_status(more, e.data), "metadata declares");
  EntryMeta fewer = e.meta;
  --fewer.change_count;
  expect_corrupt(decode_status(fewer, e.data), "more changes than");
}

TEST(ChangeReader, ImpossibleLengthsAreCorruption) {
  ByteWriter zero;
  zero.u32(0);
  zero.u64(0x77);
  expect_corrupt(decode_status(meta_for(1), zero.bytes()), "length 0");

  // A huge length is refused at once, without waiting for (or allocating) that much data.
  ByteWriter huge;
  huge.u32(0xFFFFFFF0u);
  huge.u64(0x78);
  huge.u8('I');
  ChangeReader reader(meta_for(1));
  reader.feed(huge.bytes());
  auto c = reader.next();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().sqlstate, sqlstate::kDataCorrupted);
  EXPECT_NE(c.error().message.find("0/1078"), std::string::npos) << c.error().message;
  EXPECT_LT(reader.peak_buffer_size(), 1024u);
}

TEST(ChangeReader, LengthLongerThanMessageIsCorruption) {
  ByteWriter out;
  raw_change(out, 0x10, pgoutput::Message(users()));
  out.patch_u32(0, static_cast<std::uint32_t>(out.size() - kChangeHeaderSize + 1));
  out.u8(0);
  expect_corrupt(decode_status(meta_for(1), out.bytes()), "trailing");
}

TEST(ChangeReader, UnknownTagIsCorruption) {
  ByteWriter out;
  out.u32(3);
  out.u64(0x99);
  out.raw(std::string_view("Zab"));
  expect_corrupt(decode_status(meta_for(1), out.bytes()), "0/1099");
}

TEST(ChangeReader, TransactionControlMessagesAreNotChanges) {
  ByteWriter out;
  raw_change(out, 0x42, pgoutput::Message(pgoutput::Begin{Lsn(5), 1, 2}));
  expect_corrupt(decode_status(meta_for(1), out.bytes()), "unexpected BEGIN");
  ByteWriter streamed;
  raw_change(streamed, 0x43, pgoutput::Message(pgoutput::StreamStart{5, true}));
  expect_corrupt(decode_status(meta_for(1), streamed.bytes()), "0/1043");
}

TEST(ChangeReader, MessageKindsMustFitTheEntry) {
  ByteWriter nontx;
  raw_change(nontx, 0x50,
             pgoutput::Message(pgoutput::LogicalMessage{std::nullopt, false, Lsn(0x50), "p", "c"}));
  expect_corrupt(decode_status(meta_for(1), nontx.bytes()), "non-transactional");
  ByteWriter rel;
  raw_change(rel, 0x51, pgoutput::Message(users()));
  Status st = decode_status(meta_for(1, EntryKind::kMessage), rel.bytes());
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().sqlstate, sqlstate::kDataCorrupted);
  EXPECT_NE(st.error().message.find("logical message entry"), std::string::npos);
  EXPECT_FALSE(decode_status(meta_for(1, EntryKind::kCheckpoint), nontx.bytes()).ok());
}

TEST(ChangeReader, ErrorsAreSticky) {
  ByteWriter out;
  raw_change(out, 0x1234, pgoutput::Message(pgoutput::Insert{std::nullopt, kUsers, row({})}));
  raw_change(out, 0x1235, pgoutput::Message(users()));
  ChangeReader reader(meta_for(2));
  reader.feed(out.bytes());
  auto first = reader.next();
  ASSERT_FALSE(first.ok());
  auto again = reader.next();
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().message, first.error().message);
  EXPECT_FALSE(reader.finish().ok());
}

TEST(ChangeReader, EmptyTransaction) {
  Transaction t;
  t.header = header();
  EncodedEntry e = encode_ok(t);
  EXPECT_TRUE(e.data.empty());
  auto back = decode_transaction(e.meta, e.data);
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(back->changes.empty());
}

}  // namespace
}  // namespace pgrelay::log
