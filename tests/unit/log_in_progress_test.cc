// Tests transactions in progress: readers following a spill file as it grows, rewinds, ends.
#include <gtest/gtest.h>

#include <atomic>
#include <limits>
#include <thread>
#include <vector>

#include "log/in_progress.h"
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

constexpr pgoutput::Oid kItems = 16384;
constexpr std::uint32_t kXid = 700;

SchemaCatalog catalog() {
  Relation r;
  r.oid = kItems;
  r.namespace_name = "public";
  r.name = "items";
  r.columns = {Column{pgoutput::kColumnIsKey, "id", 23, -1}, Column{0, "body", 25, -1}};
  SchemaCatalog c;
  c.put(r);
  return c;
}

pgoutput::Insert insert(int id, std::size_t size = 300) {
  return pgoutput::Insert{
      std::nullopt, kItems,
      Tuple{{TupleValue::text(std::to_string(id)),
             TupleValue::text(std::string(size, static_cast<char>('a' + id % 26)))}}};
}

TransactionHeader header() {
  TransactionHeader h;
  h.begin_lsn = Lsn(0x1000);
  h.xid = kXid;
  return h;
}

BuilderOptions spilling(const TempDir& dir) {
  BuilderOptions o;
  o.spill_dir = dir.path();
  o.spill_threshold = 64 * 1024;
  return o;
}

// What native capture does for a streamed transaction: each change under its xid, and what
// the spill file holds shown after it.
struct Shown {
  TransactionBuilder& builder;
  InProgressWriter& writer;

  void add(int id, std::uint32_t xid, std::size_t size = 300) {
    writer.note_xid(builder.encoded_size(), xid);
    ASSERT_TRUE(builder.add(Lsn(0x1000 + static_cast<std::uint64_t>(id)), insert(id, size)).ok());
    show();
  }
  void show() { ASSERT_TRUE(writer.show(builder).ok()); }
  void rewind(const TransactionBuilder::Mark& mark, std::uint32_t subxid) {
    writer.rewind(mark.size, subxid);
    ASSERT_TRUE(builder.rewind(mark).ok());
    show();
  }
  BuiltEntry finish() {
    auto entry = builder.finish(Lsn(0x900000), Lsn(0x900010));
    EXPECT_TRUE(entry.ok());
    writer.finish({entry->data_size(), Lsn(0x900000), Lsn(0x900010), 5});
    return std::move(*entry);
  }
};

Bytes data_of(const BuiltEntry& entry) {
  Bytes data(entry.spill->size());
  EXPECT_TRUE(entry.spill->read(0, data).ok());
  return data;
}

// Reads everything readable now into `into`, which holds what was read before.
void read_all(InProgressReader& reader, Bytes& into, std::vector<XidRun>* runs = nullptr) {
  for (;;) {
    auto piece = reader.read(100 * 1024);
    ASSERT_TRUE(piece.ok()) << piece.error().to_string();
    if (piece->data.empty()) return;
    ASSERT_EQ(piece->offset, into.size());
    into.insert(into.end(), piece->data.begin(), piece->data.end());
    if (runs == nullptr) continue;
    for (const auto& run : piece->runs) {
      if (runs->empty() || run.offset > runs->back().offset) runs->push_back(run);
    }
  }
}

std::vector<Change> decode_all(ByteView data) {
  EntryMeta meta;
  meta.begin_lsn = Lsn(0x1000);
  meta.xid = kXid;
  meta.change_count = std::numeric_limits<std::uint32_t>::max();
  ChangeReader reader(meta);
  reader.feed(data);
  std::vector<Change> out;
  for (;;) {
    auto change = reader.next();
    EXPECT_TRUE(change.ok());
    if (!change.ok() || !change->has_value()) break;
    out.push_back(std::move(**change));
  }
  EXPECT_EQ(reader.buffered(), 0u);
  return out;
}

TEST(InProgress, AReaderFollowsASpilledTransactionAsItGrowsThenItsCommit) {
  TempDir dir;
  InProgressTransactions registry;
  SchemaCatalog cat = catalog();
  TransactionBuilder builder(cat, spilling(dir));
  ASSERT_TRUE(builder.begin(header()).ok());
  const std::uint64_t generation = registry.generation();
  InProgressWriter writer = registry.open(kXid, Lsn(0x1000));
  EXPECT_NE(registry.generation(), generation);
  auto listed = registry.list();
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].xid(), kXid);
  EXPECT_EQ(listed[0].begin_lsn(), Lsn(0x1000));
  InProgressReader reader(listed[0]);
  Shown shown{builder, writer};

  // Nothing is readable before the transaction spills, nor past the whole records.
  shown.add(0, kXid);
  EXPECT_EQ(reader.available(), 0u);
  Bytes read;
  for (int i = 1; i < 2000; ++i) shown.add(i, kXid);
  EXPECT_TRUE(builder.spilled());
  EXPECT_EQ(reader.available(), builder.spill_readable());
  EXPECT_EQ(builder.spill_readable() % kMaxRecordPayload, 0u);
  read_all(reader, read);
  EXPECT_EQ(read.size(), builder.spill_readable());
  EXPECT_LT(read.size(), builder.encoded_size());
  EXPECT_EQ(reader.phase(), InProgressPhase::kOpen);
  EXPECT_FALSE(reader.commit());

  for (int i = 2000; i < 3000; ++i) shown.add(i, kXid);
  BuiltEntry entry = shown.finish();
  EXPECT_TRUE(registry.list().empty());
  EXPECT_EQ(reader.phase(), InProgressPhase::kFinished);
  ASSERT_TRUE(reader.commit());
  EXPECT_EQ(reader.commit()->commit_lsn, Lsn(0x900000));
  EXPECT_EQ(reader.commit()->size, entry.data_size());
  read_all(reader, read);
  // The reader got exactly the bytes the log takes.
  EXPECT_EQ(read, data_of(entry));
  EXPECT_EQ(decode_all(read).size(), entry.meta.change_count);
}

TEST(InProgress, ARewindCutsReadersThatReadPastItAndNamesTheSubtransaction) {
  TempDir dir;
  InProgressTransactions registry;
  SchemaCatalog cat = catalog();
  TransactionBuilder builder(cat, spilling(dir));
  ASSERT_TRUE(builder.begin(header()).ok());
  InProgressWriter writer = registry.open(kXid, Lsn(0x1000));
  InProgressReader ahead(registry.list()[0]);
  InProgressReader behind(registry.list()[0]);
  Shown shown{builder, writer};
  for (int i = 0; i < 1000; ++i) shown.add(i, kXid);
  const TransactionBuilder::Mark mark = builder.mark();
  for (int i = 1000; i < 2000; ++i) shown.add(i, kXid + 1);  // subtransaction 701
  for (int i = 2000; i < 5000; ++i) shown.add(i, kXid + 2);  // its child 702

  Bytes read;
  std::vector<XidRun> runs;
  read_all(ahead, read, &runs);
  ASSERT_GT(read.size(), mark.size);
  // Where each (sub)transaction's changes begin, as they were noted.
  ASSERT_GE(runs.size(), 3u);
  EXPECT_EQ(runs[0], (XidRun{0, kXid}));
  EXPECT_EQ(runs[1], (XidRun{mark.size, kXid + 1}));
  EXPECT_EQ(runs[2].xid, kXid + 2);

  Bytes behind_read(read.begin(), read.begin() + static_cast<std::ptrdiff_t>(mark.size / 2));
  {
    // `behind` reads only up to half the mark.
    auto piece = behind.read(mark.size / 2);
    ASSERT_TRUE(piece.ok());
    ASSERT_EQ(piece->data.size(), mark.size / 2);
  }

  shown.rewind(mark, kXid + 1);
  auto cut = ahead.take_cut();
  ASSERT_TRUE(cut);
  EXPECT_EQ(cut->offset, mark.size);
  EXPECT_EQ(cut->subxid, kXid + 1);
  EXPECT_EQ(ahead.position(), mark.size);
  EXPECT_FALSE(ahead.take_cut());
  EXPECT_FALSE(behind.take_cut());  // it had not read past the cut
  read.resize(mark.size);

  for (int i = 6000; i < 6500; ++i) shown.add(i, kXid);
  BuiltEntry entry = shown.finish();
  runs.clear();
  read_all(ahead, read, &runs);
  read_all(behind, behind_read);
  EXPECT_EQ(read, data_of(entry));
  EXPECT_EQ(behind_read, data_of(entry));
  // After the cut, the changes are the top-level transaction's again.
  ASSERT_FALSE(runs.empty());
  EXPECT_EQ(runs[0].xid, kXid);
  for (const auto& run : runs) EXPECT_LT(run.xid, kXid + 1);
  EXPECT_EQ(decode_all(read).size(), entry.meta.change_count);
}

TEST(InProgress, AWriterDroppedBeforeItsCommitAbortsTheTransaction) {
  InProgressTransactions registry;
  int changes = 0;
  registry.on_change([&] { ++changes; });
  std::optional<InProgressReader> reader;
  {
    InProgressWriter writer = registry.open(kXid, Lsn(0x1000));
    reader.emplace(registry.list()[0]);
    EXPECT_EQ(reader->phase(), InProgressPhase::kOpen);
    // Never spilled: nothing to read.
    auto piece = reader->read(1024);
    ASSERT_TRUE(piece.ok());
    EXPECT_TRUE(piece->data.empty());
  }
  EXPECT_EQ(reader->phase(), InProgressPhase::kAborted);
  EXPECT_TRUE(registry.list().empty());
  EXPECT_EQ(changes, 2);  // opened, ended

  InProgressWriter aborted = registry.open(kXid + 1, Lsn(0x2000));
  InProgressReader second(registry.list()[0]);
  aborted.abort();
  EXPECT_EQ(second.phase(), InProgressPhase::kAborted);
  EXPECT_FALSE(aborted);
  aborted.abort();  // once is enough
  EXPECT_EQ(changes, 4);
}

// The writer rewinds and writes on while a reader reads on another thread: whatever the
// interleaving, what the reader ends up with (cuts applied) is the transaction's data.
TEST(InProgress, RewindsRacingAReaderNeverGiveItOtherBytes) {
  TempDir dir;
  InProgressTransactions registry;
  SchemaCatalog cat = catalog();
  TransactionBuilder builder(cat, spilling(dir));
  ASSERT_TRUE(builder.begin(header()).ok());
  InProgressWriter writer = registry.open(kXid, Lsn(0x1000));
  InProgressReader reader(registry.list()[0]);
  std::atomic<bool> writer_done = false;
  Bytes read;
  int cuts = 0;
  std::thread reading([&] {
    for (;;) {
      const bool done = writer_done.load();
      if (auto cut = reader.take_cut()) {
        ASSERT_LE(cut->offset, read.size());
        read.resize(cut->offset);
        ++cuts;
      }
      auto piece = reader.read(64 * 1024);
      ASSERT_TRUE(piece.ok()) << piece.error().to_string();
      if (!piece->data.empty()) {
        ASSERT_EQ(piece->offset, read.size());
        read.insert(read.end(), piece->data.begin(), piece->data.end());
      } else if (done && reader.available() == 0 && !reader.take_cut()) {
        return;
      } else {
        std::this_thread::yield();
      }
    }
  });
  Shown shown{builder, writer};
  int id = 0;
  for (int round = 0; round < 60; ++round) {
    for (int i = 0; i < 150; ++i) shown.add(id++, kXid, 200 + round * 13);
    const auto mark = builder.mark();
    for (int i = 0; i < 400 + round * 7; ++i) shown.add(id++, kXid + 1 + round, 250);
    // Odd rounds roll their subtransaction back, even ones keep it.
    if (round % 2 == 1) shown.rewind(mark, kXid + 1 + round);
  }
  BuiltEntry entry = shown.finish();
  writer_done = true;
  reading.join();
  EXPECT_EQ(read, data_of(entry));
  EXPECT_GT(cuts, 0);
}

}  // namespace
}  // namespace pgrelay::log
