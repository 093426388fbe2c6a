// Tests the transaction builder: schema records, spilling, and the path through the change log.
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "log/change_log.h"
#include "log/transaction.h"
#include "log/transaction_builder.h"
#include "log_test_util.h"

namespace pgrelay::log {
namespace {

using pgoutput::Column;
using pgoutput::Relation;
using pgoutput::Tuple;
using pgoutput::TupleValue;
using testing::TempDir;

constexpr pgoutput::Oid kUsers = 16384;
constexpr pgoutput::Oid kOrders = 16390;
constexpr pgoutput::Oid kMoodType = 16400;

Relation users(std::string extra_column = {}) {
  Relation r;
  r.oid = kUsers;
  r.namespace_name = "public";
  r.name = "users";
  r.columns = {Column{pgoutput::kColumnIsKey, "id", 23, -1}, Column{0, "name", 25, -1},
               Column{0, "mood", kMoodType, -1}};
  if (!extra_column.empty()) r.columns.push_back(Column{0, extra_column, 25, -1});
  return r;
}

Relation orders() {
  Relation r;
  r.oid = kOrders;
  r.namespace_name = "shop";
  r.name = "orders";
  r.columns = {Column{pgoutput::kColumnIsKey, "id", 20, -1}, Column{0, "user_id", 23, -1}};
  return r;
}

pgoutput::Type mood() {
  return pgoutput::Type{std::nullopt, kMoodType, "public", "mood"};
}

SchemaCatalog catalog() {
  SchemaCatalog c;
  c.put(mood());
  c.put(users());
  c.put(orders());
  return c;
}

TransactionHeader header(std::uint32_t xid) {
  TransactionHeader h;
  h.begin_lsn = Lsn(1);  // at or below every change LSN the tests use
  h.commit_lsn = Lsn(xid * 0x100000ull + 0x80000);
  h.end_lsn = Lsn(xid * 0x100000ull + 0x80010);
  h.commit_time = 700000000000000 + xid;
  h.xid = xid;
  return h;
}

pgoutput::Insert user_insert(int id, std::size_t name_size = 8) {
  return pgoutput::Insert{
      std::nullopt, kUsers,
      Tuple{{TupleValue::text(std::to_string(id)),
             TupleValue::text(std::string(name_size, 'a' + id % 26)), TupleValue::null()}}};
}

pgoutput::Insert order_insert(int id) {
  return pgoutput::Insert{std::nullopt, kOrders,
                          Tuple{{TupleValue::text(std::to_string(id)), TupleValue::text("1")}}};
}

Result<Transaction> decode_built(const BuiltEntry& e) {
  if (!e.spill) return decode_transaction(e.meta, e.data);
  Bytes data(e.spill->size());
  PGRELAY_TRY(e.spill->read(0, data));
  return decode_transaction(e.meta, data);
}

BuiltEntry finish_ok(TransactionBuilder& b) {
  auto e = b.finish();
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.error().to_string());
  return e.ok() ? std::move(*e) : BuiltEntry{};
}

void add_ok(TransactionBuilder& b, std::uint64_t lsn, ChangeMessage m) {
  Status st = b.add(Lsn(lsn), std::move(m));
  ASSERT_TRUE(st.ok()) << st.error().to_string();
}

std::vector<std::string> kinds(const Transaction& t) {
  std::vector<std::string> out;
  for (const Change& c : t.changes) {
    out.push_back(pgoutput::tag_name(static_cast<char>(pgoutput::tag_of(to_message(c.message)))));
  }
  return out;
}

std::size_t files_in(const std::string& dir) {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& f : std::filesystem::directory_iterator(dir)) ++n;
  return n;
}

TEST(TransactionBuilder, InsertsSchemaBeforeFirstChangeOfEachTable) {
  SchemaCatalog cat = catalog();
  TransactionBuilder b(cat, BuilderOptions{});
  ASSERT_TRUE(b.begin(header(5)).ok());
  add_ok(b, 0x10, user_insert(1));
  add_ok(b, 0x20, user_insert(2));
  add_ok(b, 0x30, order_insert(1));
  add_ok(b, 0x40, pgoutput::Truncate{std::nullopt, false, false, {kUsers, kOrders}});
  add_ok(b, 0x50, pgoutput::LogicalMessage{std::nullopt, true, Lsn(0x50), "app", "hi"});
  BuiltEntry e = finish_ok(b);
  EXPECT_FALSE(e.spill);
  EXPECT_EQ(e.meta.kind, EntryKind::kTransaction);
  EXPECT_EQ(header_of(e.meta), header(5));
  EXPECT_EQ(e.meta.change_count, 8u);
  auto t = decode_built(e);
  ASSERT_TRUE(t.ok()) << t.error().to_string();
  EXPECT_EQ(kinds(*t), (std::vector<std::string>{"TYPE", "RELATION", "INSERT", "INSERT", "RELATION",
                                                 "INSERT", "TRUNCATE", "MESSAGE"}));
  // Schema records take the LSN of the change they precede.
  EXPECT_EQ(t->changes[0].lsn, Lsn(0x10));
  EXPECT_EQ(t->changes[1], (Change{Lsn(0x10), users()}));
  EXPECT_EQ(t->changes[4], (Change{Lsn(0x30), orders()}));
  EXPECT_EQ(t->changes[2], (Change{Lsn(0x10), user_insert(1)}));
  EXPECT_FALSE(b.in_transaction());
}

TEST(TransactionBuilder, EveryTransactionDescribesItsTables) {
  SchemaCatalog cat = catalog();
  TransactionBuilder b(cat, BuilderOptions{});
  for (std::uint32_t xid : {6u, 7u}) {
    ASSERT_TRUE(b.begin(header(xid)).ok());
    add_ok(b, xid * 0x100, order_insert(1));
    auto t = decode_built(finish_ok(b));
    ASSERT_TRUE(t.ok());
    EXPECT_EQ(kinds(*t), (std::vector<std::string>{"RELATION", "INSERT"})) << xid;
  }
}

TEST(TransactionBuilder, TruncateBringsTheSchemaOfEveryTable) {
  SchemaCatalog cat = catalog();
  TransactionBuilder b(cat, BuilderOptions{});
  ASSERT_TRUE(b.begin(header(8)).ok());
  add_ok(b, 0x10, pgoutput::Truncate{std::nullopt, true, false, {kOrders, kUsers}});
  auto t = decode_built(finish_ok(b));
  ASSERT_TRUE(t.ok()) << t.error().to_string();
  EXPECT_EQ(kinds(*t), (std::vector<std::string>{"RELATION", "TYPE", "RELATION", "TRUNCATE"}));
}

TEST(TransactionBuilder, SchemaChangeWithinTransactionIsRecorded) {
  SchemaCatalog cat = catalog();
  TransactionBuilder b(cat, BuilderOptions{});
  ASSERT_TRUE(b.begin(header(9)).ok());
  add_ok(b, 0x10, user_insert(1));
  cat.put(users("email"));  // ALTER TABLE ... ADD COLUMN inside the transaction
  add_ok(b, 0x20,
         pgoutput::Insert{std::nullopt, kUsers,
                          Tuple{{TupleValue::text("2"), TupleValue::text("b"), TupleValue::null(),
                                 TupleValue::text("b@x")}}});
  cat.put(mood());  // a re-sent Type is recorded again before the next Relation needing it
  cat.put(users("email"));
  add_ok(b, 0x30,
         pgoutput::Delete{std::nullopt, kUsers,
                          pgoutput::OldTuple{pgoutput::OldKind::kKey,
                                             Tuple{{TupleValue::text("2"), TupleValue::null(),
                                                    TupleValue::null(), TupleValue::null()}}}});
  auto t = decode_built(finish_ok(b));
  ASSERT_TRUE(t.ok()) << t.error().to_string();
  EXPECT_EQ(kinds(*t), (std::vector<std::string>{"TYPE", "RELATION", "INSERT", "RELATION", "INSERT",
                                                 "TYPE", "RELATION", "DELETE"}));
  EXPECT_EQ(t->changes[3], (Change{Lsn(0x20), users("email")}));
}

TEST(TransactionBuilder, StreamedXidsAreDropped) {
  SchemaCatalog cat;
  Relation rel = users();
  rel.xid = 44;
  cat.put(rel);
  TransactionBuilder b(cat, BuilderOptions{});
  ASSERT_TRUE(b.begin(header(10)).ok());
  pgoutput::Insert ins = user_insert(1);
  ins.xid = 44;
  add_ok(b, 0x10, ins);
  auto t = decode_built(finish_ok(b));
  ASSERT_TRUE(t.ok()) << t.error().to_string();
  ASSERT_EQ(t->changes.size(), 2u);
  EXPECT_EQ(t->changes[1].message, ChangeMessage(user_insert(1)));
}

TEST(TransactionBuilder, RefusesBadInputWithoutLosingTheTransaction) {
  SchemaCatalog cat = catalog();
  TransactionBuilder b(cat, BuilderOptions{});
  Status st = b.add(Lsn(1), user_insert(1));
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().sqlstate, sqlstate::kObjectNotInPrerequisiteState);
  EXPECT_FALSE(b.finish().ok());

  ASSERT_TRUE(b.begin(header(11)).ok());
  add_ok(b, 0x10, user_insert(1));
  st = b.add(Lsn(0x20), pgoutput::Insert{std::nullopt, 99999, Tuple{}});
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().sqlstate, sqlstate::kUndefinedObject);
  EXPECT_NE(st.error().message.find("99999"), std::string::npos);
  st = b.add(Lsn(0x20), pgoutput::Truncate{std::nullopt, false, false, {kOrders, 99999}});
  ASSERT_FALSE(st.ok());
  EXPECT_FALSE(b.add(Lsn(0x20), users()).ok());
  EXPECT_FALSE(b.add(Lsn(0x20), mood()).ok());
  st = b.add(Lsn(0x20), pgoutput::LogicalMessage{std::nullopt, false, Lsn(0x20), "p", "c"});
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().sqlstate, sqlstate::kInvalidParameterValue);
  add_ok(b, 0x30, user_insert(2));
  auto t = decode_built(finish_ok(b));
  ASSERT_TRUE(t.ok()) << t.error().to_string();
  // The refused truncate wrote nothing, not even the orders Relation.
  EXPECT_EQ(kinds(*t), (std::vector<std::string>{"TYPE", "RELATION", "INSERT", "INSERT"}));
}

TEST(TransactionBuilder, MessageEntry) {
  auto e = build_message_entry(header(12), Lsn(0x77),
                               pgoutput::LogicalMessage{99, false, Lsn(0x77), "p", "body"});
  ASSERT_TRUE(e.ok()) << e.error().to_string();
  EXPECT_EQ(e->meta.kind, EntryKind::kMessage);
  EXPECT_EQ(e->meta.change_count, 1u);
  auto t = decode_built(*e);
  ASSERT_TRUE(t.ok()) << t.error().to_string();
  ASSERT_EQ(t->changes.size(), 1u);
  EXPECT_EQ(
      t->changes[0],
      (Change{Lsn(0x77), pgoutput::LogicalMessage{std::nullopt, false, Lsn(0x77), "p", "body"}}));
  EXPECT_FALSE(build_message_entry(header(12), Lsn(0x77),
                                   pgoutput::LogicalMessage{std::nullopt, true, Lsn(0x77), "p", ""})
                   .ok());
}

// Builds the same 300 KB transaction with `options`.
BuiltEntry build_sample(const SchemaCatalog& cat, BuilderOptions options, bool* spilled_early,
                        std::uint64_t* size_when_spilled) {
  TransactionBuilder b(cat, std::move(options));
  EXPECT_TRUE(b.begin(header(20)).ok());
  *spilled_early = false;
  *size_when_spilled = 0;
  for (int i = 0; i < 300; ++i) {
    EXPECT_TRUE(b.add(Lsn(0x1000 + i), user_insert(i, 1000)).ok());
    if (i % 7 == 0) {
      EXPECT_TRUE(b.add(Lsn(0x1000 + i), order_insert(i)).ok());
    }
    if (b.spilled() && *size_when_spilled == 0) *size_when_spilled = b.encoded_size();
    if (i == 0) *spilled_early = b.spilled();
  }
  auto e = b.finish();
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.error().to_string());
  return e.ok() ? std::move(*e) : BuiltEntry{};
}

TEST(TransactionBuilder, SpillsPastTheThresholdWithIdenticalData) {
  TempDir tmp;
  SchemaCatalog cat = catalog();
  bool early = false;
  std::uint64_t at = 0;
  BuiltEntry memory = build_sample(cat, BuilderOptions{}, &early, &at);
  ASSERT_FALSE(memory.spill);
  EXPECT_EQ(at, 0u);

  const std::string spill_dir = tmp.path() + "/spill";
  BuilderOptions small;
  small.spill_dir = spill_dir;
  small.spill_threshold = 64 << 10;
  small.spill_buffer = 16 << 10;
  BuiltEntry spilled = build_sample(cat, small, &early, &at);
  ASSERT_TRUE(spilled.spill);
  EXPECT_FALSE(early);
  // It spilled at the first change that took the size past the threshold.
  EXPECT_GT(at, 64u << 10);
  EXPECT_LT(at, (64u << 10) + 1100);
  EXPECT_TRUE(spilled.data.empty());
  EXPECT_EQ(spilled.meta, memory.meta);
  EXPECT_EQ(spilled.data_size(), memory.data.size());
  EXPECT_EQ(spilled.pending().source, spilled.spill.get());
  EXPECT_EQ(spilled.pending().data_size(), memory.data.size());

  // The DataSource yields exactly the in-memory encoding, whole or in odd pieces.
  Bytes whole(spilled.spill->size());
  ASSERT_TRUE(spilled.spill->read(0, whole).ok());
  EXPECT_EQ(whole, memory.data);
  Bytes piece(1234);
  ASSERT_TRUE(spilled.spill->read(5000, piece).ok());
  EXPECT_TRUE(std::equal(piece.begin(), piece.end(), memory.data.begin() + 5000));
  EXPECT_FALSE(spilled.spill->read(whole.size() - 10, piece).ok());

  // The directory was made private and the file has no name in it.
  struct stat st;
  ASSERT_EQ(::stat(spill_dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_EQ(files_in(spill_dir), 0u);
}

// Options that spill early, into `dir`/spill, with a small write buffer.
BuilderOptions spill_options(const TempDir& dir, std::size_t threshold, std::size_t buffer) {
  BuilderOptions o;
  o.spill_dir = dir.path() + "/spill";
  o.spill_threshold = threshold;
  o.spill_buffer = buffer;
  return o;
}

// The whole data of a built entry, in memory or spilled.
Bytes data_of(const BuiltEntry& e) {
  if (!e.spill) return e.data;
  Bytes out(e.spill->size());
  EXPECT_TRUE(e.spill->read(0, out).ok());
  return out;
}

// A rolled-back subtransaction: rewinding to a mark gives exactly the entry that never had
// what came after it, whether the mark and the end lie in memory or in the spill file, and the
// Relations first sent after the mark are sent again where needed.
TEST(TransactionBuilder, RewindDropsWhatCameAfterTheMark) {
  TempDir tmp;
  SchemaCatalog cat = catalog();
  const BuilderOptions small = spill_options(tmp, 64 << 10, 16 << 10);
  auto add_users = [](TransactionBuilder& b, int from, int to) {
    for (int i = from; i < to; ++i) ASSERT_TRUE(b.add(Lsn(0x1000 + i), user_insert(i, 1000)).ok());
  };
  // (changes before the mark, changes rewound): marks in memory and in the spill file, ends
  // in memory, across the spill point and in the spill file.
  for (auto [before, rewound] :
       {std::pair{10, 20}, std::pair{10, 150}, std::pair{100, 30}, std::pair{100, 200}}) {
    SCOPED_TRACE("before " + std::to_string(before) + ", rewound " + std::to_string(rewound));
    TransactionBuilder with(cat, small);
    ASSERT_TRUE(with.begin(header(30)).ok());
    add_users(with, 0, before);
    const TransactionBuilder::Mark mark = with.mark();
    ASSERT_TRUE(with.add(Lsn(0x5000), order_insert(1)).ok());  // orders' Relation, after the mark
    add_users(with, before, before + rewound);
    ASSERT_TRUE(with.rewind(mark).ok());
    EXPECT_EQ(with.encoded_size(), mark.size);
    ASSERT_TRUE(with.add(Lsn(0x6000), order_insert(2)).ok());
    add_users(with, 400, 420);
    auto built_with = with.finish();
    ASSERT_TRUE(built_with.ok()) << built_with.error().to_string();

    TransactionBuilder without(cat, small);
    ASSERT_TRUE(without.begin(header(30)).ok());
    add_users(without, 0, before);
    ASSERT_TRUE(without.add(Lsn(0x6000), order_insert(2)).ok());
    add_users(without, 400, 420);
    auto built_without = without.finish();
    ASSERT_TRUE(built_without.ok()) << built_without.error().to_string();

    EXPECT_EQ(built_with->meta, built_without->meta);
    EXPECT_EQ(data_of(*built_with), data_of(*built_without));
  }
  // A mark from beyond where the transaction is refused.
  TransactionBuilder b(cat, small);
  ASSERT_TRUE(b.begin(header(31)).ok());
  add_users(b, 0, 5);
  const TransactionBuilder::Mark later = b.mark();
  ASSERT_TRUE(b.rewind(TransactionBuilder::Mark{}).ok());
  EXPECT_FALSE(b.rewind(later).ok());
}

TEST(TransactionBuilder, AnEntryHoldingAPublicationsMarkerIsMarkedUnlessRewoundPastIt) {
  SchemaCatalog cat = catalog();
  const pgoutput::LogicalMessage marker{std::nullopt, true, Lsn(0x30),
                                        std::string(kPublicationsChangedPrefix), "9\n{}\n{}"};
  const pgoutput::LogicalMessage other{std::nullopt, true, Lsn(0x30), "app", "hello"};
  TransactionBuilder b(cat, BuilderOptions{});
  ASSERT_TRUE(b.begin(header(41)).ok());
  add_ok(b, 0x10, user_insert(1));
  add_ok(b, 0x20, other);
  EXPECT_FALSE(finish_ok(b).marked);

  ASSERT_TRUE(b.begin(header(42)).ok());
  add_ok(b, 0x10, user_insert(1));
  add_ok(b, 0x30, marker);
  add_ok(b, 0x40, user_insert(2));
  const BuiltEntry built = finish_ok(b);
  EXPECT_TRUE(built.marked);
  EXPECT_TRUE(built.pending().marked);
  ASSERT_TRUE(b.begin(header(43)).ok());
  EXPECT_FALSE(finish_ok(b).marked);  // a new transaction starts unmarked

  // A subtransaction that wrote the marker and rolled back takes the mark with it.
  ASSERT_TRUE(b.begin(header(44)).ok());
  add_ok(b, 0x10, user_insert(1));
  const TransactionBuilder::Mark before = b.mark();
  add_ok(b, 0x30, marker);
  ASSERT_TRUE(b.rewind(before).ok());
  EXPECT_FALSE(finish_ok(b).marked);

  pgoutput::LogicalMessage untransactional = marker;
  untransactional.transactional = false;
  auto message = build_message_entry(header(45), Lsn(0x30), untransactional);
  ASSERT_TRUE(message.ok()) << message.error().to_string();
  EXPECT_TRUE(message->marked);
}

TEST(TransactionBuilder, AbortDropsTheSpill) {
  TempDir tmp;
  SchemaCatalog cat = catalog();
  BuilderOptions o;
  o.spill_dir = tmp.path();
  o.spill_threshold = 4096;
  TransactionBuilder b(cat, o);
  ASSERT_TRUE(b.begin(header(21)).ok());
  for (int i = 0; i < 20; ++i) add_ok(b, 0x10 + i, user_insert(i, 500));
  EXPECT_TRUE(b.spilled());
  b.abort();
  EXPECT_FALSE(b.in_transaction());
  EXPECT_FALSE(b.spilled());
  EXPECT_EQ(files_in(tmp.path()), 0u);
  // The builder is reusable.
  ASSERT_TRUE(b.begin(header(22)).ok());
  add_ok(b, 0x10, user_insert(1));
  EXPECT_FALSE(b.spilled());
  auto t = decode_built(finish_ok(b));
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->changes.size(), 3u);
}

TEST(TransactionBuilder, SpillWithoutDirectoryOrWithBadDirectoryFails) {
  SchemaCatalog cat = catalog();
  BuilderOptions o;
  o.spill_threshold = 1000;
  TransactionBuilder b(cat, o);
  ASSERT_TRUE(b.begin(header(23)).ok());
  Status st = b.add(Lsn(1), user_insert(1, 2000));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("no spill directory"), std::string::npos);

  TempDir tmp;
  const std::string file = tmp.path() + "/not-a-dir";
  std::ofstream(file) << "x";
  o.spill_dir = file;
  TransactionBuilder c(cat, o);
  ASSERT_TRUE(c.begin(header(24)).ok());
  st = c.add(Lsn(1), user_insert(1, 2000));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find(file), std::string::npos) << st.error().to_string();
  // The failure sticks to the transaction.
  EXPECT_FALSE(c.add(Lsn(2), user_insert(2)).ok());
  EXPECT_FALSE(c.finish().ok());
}

TEST(TransactionBuilder, SpillWriteErrorNamesTheFile) {
  TempDir tmp;
  SchemaCatalog cat = catalog();
  BuilderOptions o = spill_options(tmp, 8 << 10, 4 << 10);
  TransactionBuilder b(cat, o);
  ASSERT_TRUE(b.begin(header(25)).ok());

  // A file size limit makes write(2) fail as a full disk would.
  struct rlimit old_limit;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit limit = old_limit;
  limit.rlim_cur = 32 << 10;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limit), 0);
  Status st;
  for (int i = 0; i < 1000 && st.ok(); ++i) st = b.add(Lsn(0x10 + i), user_insert(i, 1000));
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old_limit), 0);
  ::signal(SIGXFSZ, old_handler);

  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find(o.spill_dir + "/xid-25.spill"), std::string::npos)
      << st.error().to_string();
  EXPECT_NE(st.error().message.find("could not write"), std::string::npos);
  EXPECT_FALSE(st.error().hint.empty());
  EXPECT_FALSE(b.finish().ok());
  b.abort();
  ASSERT_TRUE(b.begin(header(26)).ok());
  add_ok(b, 1, user_insert(1));
  EXPECT_TRUE(b.finish().ok());
}

// builder -> ChangeLog::append -> Cursor -> EntryReader gives back what was added.
TEST(TransactionBuilder, EndToEndThroughTheLog) {
  TempDir tmp;
  SchemaCatalog cat = catalog();
  LogOptions lo;
  lo.dir = tmp.path() + "/log";
  lo.sync = SyncPolicy::kNone;
  lo.segment_size = 256 << 10;
  auto log = ChangeLog::open(lo);
  ASSERT_TRUE(log.ok()) << log.error().to_string();

  BuilderOptions bo;
  bo.spill_dir = tmp.path() + "/spill";
  bo.spill_threshold = 128 << 10;
  TransactionBuilder b(cat, bo);

  std::vector<BuiltEntry> built;
  std::vector<std::vector<Change>> expected;
  // A small transaction, a >1 MiB spilled one, a message, another small one.
  for (std::uint32_t xid : {30u, 31u, 32u, 33u}) {
    if (xid == 32) {
      auto m = build_message_entry(
          header(xid), header(xid).commit_lsn,
          pgoutput::LogicalMessage{std::nullopt, false, header(xid).commit_lsn, "p", "m"});
      ASSERT_TRUE(m.ok());
      built.push_back(std::move(*m));
      auto t = decode_built(built.back());
      ASSERT_TRUE(t.ok());
      expected.push_back(t->changes);
      continue;
    }
    ASSERT_TRUE(b.begin(header(xid)).ok());
    const int rows = xid == 31 ? 1500 : 3;
    for (int i = 0; i < rows; ++i) {
      add_ok(b, header(xid).begin_lsn.value() + i, user_insert(i, 800));
      if (i % 100 == 0) add_ok(b, header(xid).begin_lsn.value() + i, order_insert(i));
    }
    EXPECT_EQ(b.spilled(), xid == 31);
    built.push_back(finish_ok(b));
    auto t = decode_built(built.back());
    ASSERT_TRUE(t.ok()) << t.error().to_string();
    expected.push_back(t->changes);
  }
  ASSERT_GT(built[1].data_size(), 1u << 20);
  ASSERT_TRUE(built[1].spill);
  for (const BuiltEntry& e : built) {
    PendingEntry p = e.pending();
    Status st = (*log)->append(std::span<const PendingEntry>(&p, 1));
    ASSERT_TRUE(st.ok()) << st.error().to_string();
  }
  EXPECT_GT((*log)->stats().segments, 2u);

  auto cursor = (*log)->open_cursor(Lsn(0));
  ASSERT_TRUE(cursor.ok());
  for (std::size_t i = 0; i < built.size(); ++i) {
    auto meta = (*cursor)->next_entry();
    ASSERT_TRUE(meta.ok() && *meta) << i;
    EXPECT_EQ(**meta, built[i].meta);
    EntryReader reader(**cursor, **meta);
    std::vector<Change> got;
    while (true) {
      auto c = reader.next();
      ASSERT_TRUE(c.ok()) << c.error().to_string();
      if (!*c) break;
      got.push_back(std::move(**c));
    }
    EXPECT_EQ(got, expected[i]) << i;
    EXPECT_EQ(reader.reader().changes_read(), built[i].meta.change_count);
    // Pieces come from ~256 KiB records; the buffer never holds more than one change.
    EXPECT_LT(reader.reader().peak_buffer_size(), 4096u);
    auto again = reader.next();
    ASSERT_TRUE(again.ok());
    EXPECT_FALSE(*again);
  }
  auto end = (*cursor)->next_entry();
  ASSERT_TRUE(end.ok());
  EXPECT_FALSE(*end);

  // read_transaction for small entries.
  auto cursor2 = (*log)->open_cursor(header(33).commit_lsn);
  ASSERT_TRUE(cursor2.ok());
  auto meta = (*cursor2)->next_entry();
  ASSERT_TRUE(meta.ok() && *meta);
  auto txn = read_transaction(**cursor2, **meta);
  ASSERT_TRUE(txn.ok()) << txn.error().to_string();
  EXPECT_EQ(txn->header, header(33));
  EXPECT_EQ(txn->changes, expected[3]);
}

TEST(LastCommitTime, IsTheLastTransactionsNotAMessagesAndNoneWithoutATransaction) {
  std::vector<BuiltEntry> entries(3);
  entries[0].meta.commit_time = 100;
  entries[1].meta.commit_time = 200;
  entries[2].meta.kind = EntryKind::kMessage;
  entries[2].meta.commit_time = 300;  // a message's send time
  EXPECT_EQ(last_commit_time(entries), 200);
  entries[0].meta.kind = entries[1].meta.kind = EntryKind::kMessage;
  EXPECT_EQ(last_commit_time(entries), std::nullopt);
  EXPECT_EQ(last_commit_time({}), std::nullopt);
}

}  // namespace
}  // namespace pgrelay::log
