// Tests the walsender's streaming of transactions in progress: blocks, aborts, the commit.
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "base/bytes.h"
#include "log/in_progress.h"
#include "log/transaction_builder.h"
#include "log_test_util.h"
#include "pgoutput/decoder.h"
#include "pgoutput/encoder.h"
#include "server/in_progress_streamer.h"
#include "wire/replication_frames.h"

namespace pgrelay::server {
namespace {

using log::testing::TempDir;
using pgoutput::Column;
using pgoutput::Relation;
using pgoutput::Tuple;
using pgoutput::TupleValue;

constexpr pgoutput::Oid kItems = 16384;
constexpr pgoutput::Oid kOther = 16390;
constexpr std::uint32_t kXid = 900;
constexpr std::size_t kBudget = 256 * 1024;

Relation relation(pgoutput::Oid oid, const char* name) {
  Relation r;
  r.oid = oid;
  r.namespace_name = "public";
  r.name = name;
  r.columns = {Column{pgoutput::kColumnIsKey, "id", 23, -1}, Column{0, "body", 25, -1}};
  return r;
}

pgoutput::Insert insert(pgoutput::Oid oid, int id) {
  return pgoutput::Insert{
      std::nullopt, oid,
      Tuple{{TupleValue::text(std::to_string(id)),
             TupleValue::text(std::string(400, static_cast<char>('a' + id % 26)))}}};
}

pgoutput::PgoutputOptions streaming_options() {
  pgoutput::PgoutputOptions o;
  o.proto_version = 2;
  o.streaming = pgoutput::StreamingMode::kOn;
  o.publication_names = {"p"};
  return o;
}

// A transaction as native capture shows it: every change under its xid, the spill file shown
// after each.
class Capture {
 public:
  Capture(log::InProgressTransactions& registry, const TempDir& dir, std::uint32_t xid = kXid)
      : builder_(catalog_, options(dir)), xid_(xid) {
    catalog_.put(relation(kItems, "items"));
    catalog_.put(relation(kOther, "other"));
    header_.begin_lsn = Lsn(0x10000);
    header_.xid = xid;
    EXPECT_TRUE(builder_.begin(header_).ok());
    writer_ = registry.open(xid, header_.begin_lsn);
  }
  void add(int id, std::uint32_t xid = 0, pgoutput::Oid oid = kItems) {
    writer_.note_xid(builder_.encoded_size(), xid == 0 ? xid_ : xid);
    ASSERT_TRUE(builder_.add(Lsn(0x10000 + static_cast<std::uint64_t>(id)), insert(oid, id)).ok());
    show();
  }
  void add_marker(int at) {
    writer_.note_xid(builder_.encoded_size(), xid_);
    ASSERT_TRUE(builder_
                    .add(Lsn(0x10000 + static_cast<std::uint64_t>(at)),
                         pgoutput::LogicalMessage{std::nullopt, true, Lsn(0x10000 + at),
                                                  std::string(log::kPublicationsChangedPrefix), ""})
                    .ok());
    show();
  }
  log::TransactionBuilder::Mark mark() const { return builder_.mark(); }
  void rewind(const log::TransactionBuilder::Mark& mark, std::uint32_t subxid) {
    writer_.rewind(mark.size, subxid);
    ASSERT_TRUE(builder_.rewind(mark).ok());
    show();
  }
  log::EntryMeta finish() {
    auto entry = builder_.finish(Lsn(0x900000), Lsn(0x900010));
    EXPECT_TRUE(entry.ok());
    entry->meta.commit_time = 77;
    writer_.finish({entry->data_size(), Lsn(0x900000), Lsn(0x900010), 77});
    entry_ = std::move(*entry);
    return entry_.meta;
  }
  void abort() { writer_.abort(); }

 private:
  static log::BuilderOptions options(const TempDir& dir) {
    log::BuilderOptions o;
    o.spill_dir = dir.path();
    o.spill_threshold = 64 * 1024;
    return o;
  }
  void show() { ASSERT_TRUE(writer_.show(builder_).ok()); }

  log::SchemaCatalog catalog_;
  log::TransactionBuilder builder_;
  log::TransactionHeader header_;
  log::InProgressWriter writer_;
  log::BuiltEntry entry_;
  std::uint32_t xid_;
};

// A consumer of protocol 2 with streaming: decodes (and so checks) what was sent.
struct Received {
  pgoutput::Decoder decoder{pgoutput::DecoderOptions{2, false}};
  std::vector<pgoutput::Message> messages;

  void take(Bytes& out) {
    std::size_t at = 0;
    while (at < out.size()) {
      ASSERT_EQ(out[at], 'd');
      ByteReader header(ByteView(out).subspan(at + 1, 4));
      const std::uint32_t len = header.u32();
      ByteView payload(out.data() + at + 5, len - 4);
      auto x = wire::view_xlog_data(payload);
      ASSERT_TRUE(x.ok());
      auto m = decoder.decode(x->data);
      ASSERT_TRUE(m.ok()) << m.error().to_string();
      messages.push_back(std::move(*m));
      at += 1 + len;
    }
    out.clear();
  }
  template <typename T>
  std::vector<T> all() const {
    std::vector<T> out;
    for (const auto& m : messages) {
      if (const auto* t = std::get_if<T>(&m)) out.push_back(*t);
    }
    return out;
  }
  // Inserted ids as a subscriber keeps them: a subtransaction's Stream Abort drops from its
  // first change on.
  std::vector<int> applied() const {
    std::vector<std::pair<std::uint32_t, int>> kept;
    for (const auto& m : messages) {
      if (const auto* i = std::get_if<pgoutput::Insert>(&m)) {
        kept.push_back({i->xid.value_or(0), std::stoi(i->new_tuple.columns[0].bytes)});
      } else if (const auto* a = std::get_if<pgoutput::StreamAbort>(&m)) {
        if (a->xid == a->subxid) {
          kept.clear();
          continue;
        }
        auto first = std::find_if(kept.begin(), kept.end(),
                                  [&](const auto& k) { return k.first == a->subxid; });
        kept.erase(first, kept.end());
      }
    }
    std::vector<int> ids;
    for (const auto& k : kept) ids.push_back(k.second);
    return ids;
  }
};

std::vector<int> range(int from, int to) {
  std::vector<int> out;
  for (int i = from; i < to; ++i) out.push_back(i);
  return out;
}

std::vector<int> concat(std::vector<int> a, const std::vector<int>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Streams until nothing more is ready now.
void stream_all(InProgressStreamer& streamer, Received& got, const log::ViewOptions& view = {},
                std::uint64_t view_id = 0) {
  Bytes out;
  for (;;) {
    auto more = streamer.stream(view, view_id, out, kBudget);
    ASSERT_TRUE(more.ok()) << more.error().to_string();
    got.take(out);
    if (!*more) return;
  }
}

// The log reached the entry: the rest and the Stream Commit.
InProgressStreamer::Finished finish_all(InProgressStreamer& streamer, Received& got,
                                        const log::EntryMeta& meta,
                                        std::unordered_map<pgoutput::Oid, Bytes>& known) {
  Bytes out;
  for (;;) {
    auto finished = streamer.finish(meta, out, kBudget, known);
    EXPECT_TRUE(finished.ok());
    got.take(out);
    if (!finished.ok() || *finished != InProgressStreamer::Finished::kMore) {
      return finished.ok() ? *finished : InProgressStreamer::Finished::kSendWhole;
    }
  }
}

TEST(InProgressStreamer, StreamsBlocksWhileItArrivesThenTheRestAndStreamCommit) {
  TempDir dir;
  log::InProgressTransactions registry;
  InProgressStreamer streamer(&registry, streaming_options());
  ASSERT_TRUE(streamer.enabled());
  Capture capture(registry, dir);
  Received got;
  for (int i = 0; i < 3000; ++i) capture.add(i);  // about 1.2 MB: less than a block
  stream_all(streamer, got);
  EXPECT_TRUE(got.messages.empty());
  for (int i = 3000; i < 12000; ++i) capture.add(i);
  stream_all(streamer, got);
  ASSERT_FALSE(got.messages.empty());
  auto starts = got.all<pgoutput::StreamStart>();
  ASSERT_FALSE(starts.empty());
  EXPECT_EQ(starts[0].xid, kXid);
  EXPECT_TRUE(starts[0].first_segment);
  for (std::size_t i = 1; i < starts.size(); ++i) EXPECT_FALSE(starts[i].first_segment);
  EXPECT_EQ(got.all<pgoutput::StreamStop>().size(), starts.size());  // every block ended
  const auto streamed = got.all<pgoutput::Insert>().size();
  EXPECT_GT(streamed, 5000u);
  for (const auto& i : got.all<pgoutput::Insert>()) EXPECT_EQ(i.xid, kXid);
  ASSERT_EQ(got.all<pgoutput::Relation>().size(), 1u);
  EXPECT_EQ(got.all<pgoutput::Relation>()[0].xid, kXid);

  for (int i = 12000; i < 12500; ++i) capture.add(i);
  const log::EntryMeta meta = capture.finish();
  Bytes out;
  ASSERT_TRUE(streamer.streamed(meta, out));
  EXPECT_TRUE(out.empty());
  std::unordered_map<pgoutput::Oid, Bytes> known;
  EXPECT_EQ(finish_all(streamer, got, meta, known), InProgressStreamer::Finished::kDone);
  auto commits = got.all<pgoutput::StreamCommit>();
  ASSERT_EQ(commits.size(), 1u);
  EXPECT_EQ(commits[0], (pgoutput::StreamCommit{kXid, Lsn(0x900000), Lsn(0x900010), 77}));
  EXPECT_TRUE(std::holds_alternative<pgoutput::StreamCommit>(got.messages.back()));
  EXPECT_EQ(got.applied(), range(0, 12500));
  // After the commit the consumer knows the table, as it was sent outside streams.
  ASSERT_TRUE(known.count(kItems));
  EXPECT_EQ(known[kItems], pgoutput::encode(relation(kItems, "items")));
  EXPECT_FALSE(streamer.streamed(meta, out));  // done with it
}

TEST(InProgressStreamer, ASubtransactionRolledBackAfterItsChangesWentOutIsAbortedAlone) {
  TempDir dir;
  log::InProgressTransactions registry;
  InProgressStreamer streamer(&registry, streaming_options());
  Capture capture(registry, dir);
  Received got;
  for (int i = 0; i < 6000; ++i) capture.add(i);
  const auto mark = capture.mark();
  for (int i = 6000; i < 14000; ++i) capture.add(i, kXid + 1);
  stream_all(streamer, got);
  ASSERT_GT(got.applied().size(), 6000u);  // some of the subtransaction went out
  capture.rewind(mark, kXid + 1);
  for (int i = 20000; i < 26000; ++i) capture.add(i);
  stream_all(streamer, got);
  auto aborts = got.all<pgoutput::StreamAbort>();
  ASSERT_EQ(aborts.size(), 1u);
  EXPECT_EQ(aborts[0].xid, kXid);
  EXPECT_EQ(aborts[0].subxid, kXid + 1);
  const log::EntryMeta meta = capture.finish();
  Bytes out;
  ASSERT_TRUE(streamer.streamed(meta, out));
  std::unordered_map<pgoutput::Oid, Bytes> known;
  EXPECT_EQ(finish_all(streamer, got, meta, known), InProgressStreamer::Finished::kDone);
  EXPECT_EQ(got.applied(), concat(range(0, 6000), range(20000, 26000)));
}

TEST(InProgressStreamer, ATransactionRolledBackIsAbortedAndOneNeverSentIsNot) {
  TempDir dir;
  log::InProgressTransactions registry;
  InProgressStreamer streamer(&registry, streaming_options());
  Received got;
  {
    Capture small(registry, dir, kXid + 5);  // never spills: nothing is sent of it
    small.add(1);
    stream_all(streamer, got);
    small.abort();
    stream_all(streamer, got);
    EXPECT_TRUE(got.messages.empty());
  }
  Capture capture(registry, dir);
  for (int i = 0; i < 10000; ++i) capture.add(i);
  stream_all(streamer, got);
  ASSERT_FALSE(got.all<pgoutput::Insert>().empty());
  capture.abort();
  stream_all(streamer, got);
  auto aborts = got.all<pgoutput::StreamAbort>();
  ASSERT_EQ(aborts.size(), 1u);
  EXPECT_EQ(aborts[0].xid, kXid);
  EXPECT_EQ(aborts[0].subxid, kXid);
  EXPECT_TRUE(got.applied().empty());
}

TEST(InProgressStreamer, APublicationsMarkerInsideEndsTheStreamAndTheLogSendsItWhole) {
  TempDir dir;
  log::InProgressTransactions registry;
  InProgressStreamer streamer(&registry, streaming_options());
  Capture capture(registry, dir);
  Received got;
  for (int i = 0; i < 8000; ++i) capture.add(i);
  stream_all(streamer, got);
  ASSERT_FALSE(got.all<pgoutput::Insert>().empty());
  capture.add_marker(8000);
  for (int i = 8001; i < 16000; ++i) capture.add(i, 0, kOther);
  stream_all(streamer, got);
  auto aborts = got.all<pgoutput::StreamAbort>();
  ASSERT_EQ(aborts.size(), 1u);
  EXPECT_EQ(aborts[0].subxid, kXid);
  const std::size_t before = got.messages.size();
  const log::EntryMeta meta = capture.finish();
  Bytes out;
  EXPECT_FALSE(streamer.streamed(meta, out));  // whole, through the walsender's own view
  stream_all(streamer, got);
  EXPECT_EQ(got.messages.size(), before);
}

TEST(InProgressStreamer, ATransactionTheLogPassedOrCaptureShowsAgainIsAborted) {
  TempDir dir;
  log::InProgressTransactions registry;
  InProgressStreamer streamer(&registry, streaming_options());
  Received got;
  std::optional<Capture> first(std::in_place, registry, dir);
  for (int i = 0; i < 10000; ++i) first->add(i);
  stream_all(streamer, got);
  ASSERT_FALSE(got.all<pgoutput::Insert>().empty());
  // Capture lost it (a reconnect): the upstream streams it again from its start.
  Capture again(registry, dir);
  for (int i = 0; i < 10000; ++i) again.add(i);
  stream_all(streamer, got);
  ASSERT_EQ(got.all<pgoutput::StreamAbort>().size(), 1u);
  auto starts = got.all<pgoutput::StreamStart>();
  EXPECT_TRUE(starts.back().first_segment);
  const log::EntryMeta meta = again.finish();
  // The log went past it (its entry never came): aborted when a later entry is sent.
  log::EntryMeta later = meta;
  later.xid = kXid + 50;
  later.begin_lsn = Lsn(0x900020);
  later.commit_lsn = Lsn(0x900030);
  Bytes out;
  EXPECT_FALSE(streamer.streamed(later, out));
  got.take(out);
  EXPECT_EQ(got.all<pgoutput::StreamAbort>().size(), 2u);
  EXPECT_TRUE(got.applied().empty());
}

TEST(InProgressStreamer, OnlyConsumersThatAskForStreamingInTextModeAreStreamedTo) {
  log::InProgressTransactions registry;
  auto options = streaming_options();
  EXPECT_TRUE(InProgressStreamer(&registry, options).enabled());
  EXPECT_FALSE(InProgressStreamer(nullptr, options).enabled());
  options.binary = true;
  EXPECT_FALSE(InProgressStreamer(&registry, options).enabled());
  options = streaming_options();
  options.streaming = pgoutput::StreamingMode::kOff;
  EXPECT_FALSE(InProgressStreamer(&registry, options).enabled());
  options = streaming_options();
  options.proto_version = 1;
  EXPECT_FALSE(InProgressStreamer(&registry, options).enabled());
}

}  // namespace
}  // namespace pgrelay::server
