// Tests the follower's pure parts: entries rebuilt from _tx parts, its checkpoint, parse_decimal.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/strings.h"
#include "capture/follower/entry_assembler.h"
#include "capture/follower/follower_checkpoint.h"
#include "log/transaction.h"
#include "nats/entry_messages.h"
#include "nats/message_id.h"
#include "nats/subjects.h"

namespace pgrelay::capture {
namespace {

using pgoutput::Column;
using pgoutput::Relation;
using pgoutput::TupleValue;
using wire::Lsn;

constexpr std::uint64_t kLogId = 77;

Relation users() {
  Relation r;
  r.oid = 16384;
  r.namespace_name = "public";
  r.name = "users";
  r.columns = {Column{pgoutput::kColumnIsKey, "id", 23, -1}, Column{0, "name", 25, -1}};
  return r;
}

// A transaction committed at `base` + 0x1000 with `rows` inserts (and the publications marker
// when `marker`), encoded as capture would.
log::EncodedEntry sample_entry(std::uint64_t base, int rows, bool marker = false) {
  log::Transaction txn;
  txn.header.begin_lsn = Lsn(base);
  txn.header.commit_lsn = Lsn(base + 0x1000);
  txn.header.end_lsn = Lsn(base + 0x1010);
  txn.header.xid = 731;
  txn.header.commit_time = 123456789;
  txn.changes.push_back({Lsn(base), users()});
  for (int i = 0; i < rows; ++i) {
    txn.changes.push_back(
        {Lsn(base + 0x10 * (i + 1)),
         pgoutput::Insert{std::nullopt,
                          16384,
                          {{TupleValue::text(std::to_string(i)), TupleValue::text("name")}}}});
  }
  if (marker) {
    pgoutput::LogicalMessage m;
    m.transactional = true;
    m.prefix = std::string(log::kPublicationsChangedPrefix);
    txn.changes.push_back({Lsn(base + 0x10 * (rows + 1)), m});
  } else {
    pgoutput::LogicalMessage m;
    m.transactional = true;
    m.prefix = "app";
    m.content = "hi";
    txn.changes.push_back({Lsn(base + 0x10 * (rows + 1)), m});
  }
  auto entry = log::encode_transaction(txn);
  EXPECT_TRUE(entry.ok()) << (entry.ok() ? "" : entry.error().message);
  return std::move(*entry);
}

Bytes entry_bytes(const log::EncodedEntry& entry) {
  ByteWriter w;
  log::encode_entry_meta(entry.meta, w);
  w.raw(entry.data);
  return std::move(w).take();
}

// The _tx messages of one entry, as a follower reads them, their payloads owned here.
class Parts {
 public:
  Parts() = default;
  Parts(const Parts&) = delete;
  Parts& operator=(const Parts&) = delete;
  Parts(Parts&&) = default;

  void add(TxMessage message, std::string payload) {
    payloads_.push_back(std::move(payload));
    messages_.push_back(message);
    for (std::size_t i = 0; i < messages_.size(); ++i)
      messages_[i].payload = as_bytes(payloads_[i]);
  }
  void set_payload(std::size_t i, std::string payload) {
    payloads_[i] = std::move(payload);
    messages_[i].payload = as_bytes(payloads_[i]);
  }
  const std::string& payload(std::size_t i) const { return payloads_[i]; }
  TxMessage& operator[](std::size_t i) { return messages_[i]; }
  std::size_t size() const { return messages_.size(); }

 private:
  std::vector<std::string> payloads_;
  std::vector<TxMessage> messages_;
};

// The _tx parts the publisher sends for `entry`, cut at `part_size`, at stream sequences from
// `first_seq`; each names `previous` as the entry before.
Parts published_parts(const log::EncodedEntry& entry, std::size_t part_size,
                      std::uint64_t first_seq, Lsn previous = Lsn()) {
  nats::Subjects subjects("pgrelay", "app");
  Parts parts;
  auto made = nats::EntryMessages::make(entry.meta, entry.data, subjects, part_size);
  EXPECT_TRUE(made.ok()) << (made.ok() ? "" : made.error().message);
  if (!made.ok()) return parts;
  std::uint64_t seq = first_seq;
  for (;;) {
    auto next = made->next();
    EXPECT_TRUE(next.ok());
    if (!next.ok() || !*next) break;
    const nats::OutMessage& out = **next;
    if (!out.id.tx_part) continue;
    nats::PartHeader header{out.id.number, made->part_count(),
                            static_cast<std::uint64_t>(made->part_size())};
    parts.add(TxMessage{seq++, out.id, header, kLogId, previous, {}}, out.payload);
  }
  EXPECT_EQ(parts.size(), made->part_count());
  return parts;
}

// `bytes` cut into parts by hand (for entries the publisher would not send).
Parts cut(const Bytes& bytes, Lsn commit_lsn, std::size_t part_size, std::uint64_t first_seq) {
  Parts parts;
  const auto count = static_cast<std::uint32_t>((bytes.size() + part_size - 1) / part_size);
  for (std::uint32_t k = 0; k < count; ++k) {
    const std::size_t from = k * part_size;
    const std::size_t n = std::min(part_size, bytes.size() - from);
    parts.add(TxMessage{first_seq + k,
                        nats::MessageId{commit_lsn, true, k},
                        nats::PartHeader{k, count, part_size},
                        kLogId,
                        Lsn(),
                        {}},
              std::string(reinterpret_cast<const char*>(bytes.data()) + from, n));
  }
  return parts;
}

// Feeds all parts; the entry the last one completes (a failure when any part fails).
std::optional<AssembledEntry> feed_all(EntryAssembler& assembler, Parts& parts) {
  std::optional<AssembledEntry> out;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    auto got = assembler.add(parts[i]);
    EXPECT_TRUE(got.ok()) << "part " << i << ": " << (got.ok() ? "" : got.error().message);
    if (!got.ok()) return std::nullopt;
    if (i + 1 < parts.size()) {
      EXPECT_FALSE(got->has_value()) << "part " << i;
      EXPECT_TRUE(assembler.in_entry());
    } else {
      out = std::move(*got);
    }
  }
  return out;
}

void expect_damaged(const Result<std::optional<AssembledEntry>>& got) {
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.error().sqlstate, sqlstate::kDataCorrupted) << got.error().message;
  EXPECT_FALSE(got.error().message.empty());
}

void expect_same_entry(const AssembledEntry& got, const log::EncodedEntry& want) {
  EXPECT_EQ(got.meta, want.meta);
  ASSERT_LE(got.data_offset, got.bytes.size());
  EXPECT_EQ(
      Bytes(got.bytes.begin() + static_cast<std::ptrdiff_t>(got.data_offset), got.bytes.end()),
      want.data);
  EXPECT_EQ(got.bytes, entry_bytes(want));
  const log::PendingEntry pending = got.pending();
  EXPECT_EQ(pending.meta, want.meta);
  EXPECT_EQ(Bytes(pending.data.begin(), pending.data.end()), want.data);
}

TEST(EntryAssembler, AMultiPartEntryIsRebuiltAsThePrimaryStoredIt) {
  const log::EncodedEntry entry = sample_entry(0x10000, 6);
  Parts parts = published_parts(entry, 64, 10, Lsn(0x9000));
  ASSERT_GT(parts.size(), 2u);
  // Only the first part's Pgrelay-Previous-Lsn counts.
  for (std::size_t i = 1; i < parts.size(); ++i) parts[i].previous = Lsn(0x1234);
  EntryAssembler assembler;
  EXPECT_FALSE(assembler.in_entry());
  std::optional<AssembledEntry> got = feed_all(assembler, parts);
  ASSERT_TRUE(got.has_value());
  expect_same_entry(*got, entry);
  EXPECT_EQ(got->stream_seq, 10 + parts.size() - 1);
  EXPECT_EQ(got->previous, Lsn(0x9000));
  EXPECT_FALSE(got->marked);
  EXPECT_FALSE(assembler.in_entry());
  EXPECT_EQ(assembler.skipped_parts(), 0u);
}

TEST(EntryAssembler, AOnePartEntryIsWholeAtOnce) {
  const log::EncodedEntry entry = sample_entry(0x10000, 2);
  Parts parts = published_parts(entry, 1 << 20, 5);
  ASSERT_EQ(parts.size(), 1u);
  EXPECT_LT(parts.payload(0).size(), std::size_t{1} << 20);
  EntryAssembler assembler;
  auto got = assembler.add(parts[0]);
  ASSERT_TRUE(got.ok()) << got.error().message;
  ASSERT_TRUE(got->has_value());
  expect_same_entry(**got, entry);
  EXPECT_EQ((*got)->stream_seq, 5u);
  EXPECT_FALSE((*got)->previous.is_valid());
  EXPECT_FALSE(assembler.in_entry());
}

TEST(EntryAssembler, EntriesFollowOneAnother) {
  const log::EncodedEntry first = sample_entry(0x10000, 4);
  const log::EncodedEntry second = sample_entry(0x20000, 3);
  Parts a = published_parts(first, 64, 1);
  Parts b = published_parts(second, 64, 1 + a.size(), first.meta.commit_lsn);
  EntryAssembler assembler;
  auto got_a = feed_all(assembler, a);
  ASSERT_TRUE(got_a.has_value());
  expect_same_entry(*got_a, first);
  auto got_b = feed_all(assembler, b);
  ASSERT_TRUE(got_b.has_value());
  expect_same_entry(*got_b, second);
  EXPECT_EQ(got_b->previous, first.meta.commit_lsn);
  EXPECT_EQ(got_b->stream_seq, a.size() + b.size());
}

TEST(EntryAssembler, ThePublicationsMarkerMarksTheEntry) {
  const log::EncodedEntry marked = sample_entry(0x10000, 3, true);
  ASSERT_TRUE(marked.marked);
  Parts parts = published_parts(marked, 64, 1);
  EntryAssembler assembler;
  auto got = feed_all(assembler, parts);
  ASSERT_TRUE(got.has_value());
  expect_same_entry(*got, marked);
  EXPECT_TRUE(got->marked);
  EXPECT_TRUE(got->pending().marked);

  const log::EncodedEntry plain = sample_entry(0x20000, 3, false);
  Parts plain_parts = published_parts(plain, 64, 1 + parts.size());
  auto plain_got = feed_all(assembler, plain_parts);
  ASSERT_TRUE(plain_got.has_value());
  EXPECT_FALSE(plain_got->marked);
  EXPECT_FALSE(plain_got->pending().marked);
}

TEST(EntryAssembler, PartsOfAnEntryBegunBeforeReadingAreSkipped) {
  const log::EncodedEntry first = sample_entry(0x10000, 6);
  const log::EncodedEntry second = sample_entry(0x20000, 3);
  Parts a = published_parts(first, 64, 1);
  Parts b = published_parts(second, 64, 1 + a.size());
  ASSERT_GT(a.size(), 2u);
  EntryAssembler assembler;
  // Reading began at part 1 of the first entry.
  for (std::size_t i = 1; i < a.size(); ++i) {
    auto got = assembler.add(a[i]);
    ASSERT_TRUE(got.ok()) << got.error().message;
    EXPECT_FALSE(got->has_value());
    EXPECT_FALSE(assembler.in_entry());
  }
  EXPECT_EQ(assembler.skipped_parts(), a.size() - 1);
  auto got = feed_all(assembler, b);
  ASSERT_TRUE(got.has_value());
  expect_same_entry(*got, second);
  EXPECT_EQ(assembler.skipped_parts(), a.size() - 1);
}

TEST(EntryAssembler, AMissingPartIsAnError) {
  const log::EncodedEntry entry = sample_entry(0x10000, 6);
  Parts parts = published_parts(entry, 64, 1);
  ASSERT_GT(parts.size(), 2u);
  EntryAssembler assembler;
  ASSERT_TRUE(assembler.add(parts[0]).ok());
  expect_damaged(assembler.add(parts[2]));
}

TEST(EntryAssembler, ALostLastPartIsAnErrorAtTheNextEntry) {
  const log::EncodedEntry first = sample_entry(0x10000, 6);
  const log::EncodedEntry second = sample_entry(0x20000, 3);
  Parts a = published_parts(first, 64, 1);
  Parts b = published_parts(second, 64, 1 + a.size());
  EntryAssembler assembler;
  for (std::size_t i = 0; i + 1 < a.size(); ++i) ASSERT_TRUE(assembler.add(a[i]).ok());
  expect_damaged(assembler.add(b[0]));
}

TEST(EntryAssembler, PartsOfAnotherCommitInterleavedAreAnError) {
  const log::EncodedEntry entry = sample_entry(0x10000, 6);
  Parts parts = published_parts(entry, 64, 1);
  ASSERT_GT(parts.size(), 2u);
  EntryAssembler assembler;
  ASSERT_TRUE(assembler.add(parts[0]).ok());
  // Part 1, in sequence and of the same shape, but of another transaction.
  TxMessage other = parts[1];
  other.id.commit_lsn = Lsn(0x50000);
  expect_damaged(assembler.add(other));
}

TEST(EntryAssembler, PartHeadersThatDisagreeAreAnError) {
  const log::EncodedEntry entry = sample_entry(0x10000, 6);
  {
    Parts parts = published_parts(entry, 64, 1);
    EntryAssembler assembler;
    ASSERT_TRUE(assembler.add(parts[0]).ok());
    TxMessage recount = parts[1];
    recount.part.count += 1;
    expect_damaged(assembler.add(recount));
  }
  {
    Parts parts = published_parts(entry, 64, 1);
    EntryAssembler assembler;
    ASSERT_TRUE(assembler.add(parts[0]).ok());
    TxMessage resized = parts[1];
    resized.part.size = 128;
    expect_damaged(assembler.add(resized));
  }
}

TEST(EntryAssembler, APartWhoseSizeDisagreesWithItsHeaderIsAnError) {
  const log::EncodedEntry entry = sample_entry(0x10000, 6);
  {
    // A part before the last, one byte short.
    Parts parts = published_parts(entry, 64, 1);
    ASSERT_GT(parts.size(), 2u);
    parts.set_payload(1, parts.payload(1).substr(0, 63));
    EntryAssembler assembler;
    ASSERT_TRUE(assembler.add(parts[0]).ok());
    expect_damaged(assembler.add(parts[1]));
  }
  {
    // The first part, short.
    Parts parts = published_parts(entry, 64, 1);
    parts.set_payload(0, parts.payload(0).substr(0, 10));
    EntryAssembler assembler;
    expect_damaged(assembler.add(parts[0]));
    EXPECT_FALSE(assembler.in_entry());
  }
  {
    // The last part, longer than any part may be.
    Parts parts = published_parts(entry, 64, 1);
    const std::size_t last = parts.size() - 1;
    parts.set_payload(last, parts.payload(last) + std::string(64, 'x'));
    EntryAssembler assembler;
    for (std::size_t i = 0; i < last; ++i) ASSERT_TRUE(assembler.add(parts[i]).ok());
    expect_damaged(assembler.add(parts[last]));
  }
}

TEST(EntryAssembler, BytesThatAreNoEntryAreAnError) {
  const log::EncodedEntry entry = sample_entry(0x10000, 6);
  {
    // The metadata's kind byte.
    Parts parts = published_parts(entry, 64, 1);
    std::string damaged = parts.payload(0);
    damaged[0] = '\x7f';
    parts.set_payload(0, damaged);
    EntryAssembler assembler;
    for (std::size_t i = 0; i + 1 < parts.size(); ++i) ASSERT_TRUE(assembler.add(parts[i]).ok());
    expect_damaged(assembler.add(parts[parts.size() - 1]));
    EXPECT_FALSE(assembler.in_entry());
  }
  {
    // The length of the first change record, far past the data's end.
    ByteWriter meta;
    log::encode_entry_meta(entry.meta, meta);
    const std::size_t at = meta.size();
    Parts parts = published_parts(entry, 64, 1);
    std::string damaged = parts.payload(at / 64);
    for (std::size_t i = 0; i < 4; ++i) damaged[at % 64 + i] = '\x3f';
    parts.set_payload(at / 64, damaged);
    EntryAssembler assembler;
    for (std::size_t i = 0; i + 1 < parts.size(); ++i) ASSERT_TRUE(assembler.add(parts[i]).ok());
    expect_damaged(assembler.add(parts[parts.size() - 1]));
  }
  {
    // The data cut short at its end (a last part may be shorter).
    Parts parts = published_parts(entry, 64, 1);
    const std::size_t last = parts.size() - 1;
    ASSERT_GT(parts.payload(last).size(), 1u);
    parts.set_payload(last, parts.payload(last).substr(0, parts.payload(last).size() - 1));
    EntryAssembler assembler;
    for (std::size_t i = 0; i < last; ++i) ASSERT_TRUE(assembler.add(parts[i]).ok());
    expect_damaged(assembler.add(parts[last]));
  }
  {
    // A damaged entry leaves nothing behind: the next one assembles.
    Parts parts = published_parts(entry, 64, 1);
    parts.set_payload(0, std::string(64, '\xff'));
    EntryAssembler assembler;
    for (std::size_t i = 0; i + 1 < parts.size(); ++i) ASSERT_TRUE(assembler.add(parts[i]).ok());
    expect_damaged(assembler.add(parts[parts.size() - 1]));
    const log::EncodedEntry next = sample_entry(0x20000, 2);
    Parts more = published_parts(next, 64, 100);
    auto got = feed_all(assembler, more);
    ASSERT_TRUE(got.has_value());
    expect_same_entry(*got, next);
  }
}

TEST(EntryAssembler, AnEntryCommittedElsewhereThanItsMsgIdSaysIsAnError) {
  const log::EncodedEntry entry = sample_entry(0x10000, 6);
  Parts parts = published_parts(entry, 64, 1);
  for (std::size_t i = 0; i < parts.size(); ++i) parts[i].id.commit_lsn = Lsn(0x70000);
  EntryAssembler assembler;
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) ASSERT_TRUE(assembler.add(parts[i]).ok());
  expect_damaged(assembler.add(parts[parts.size() - 1]));
}

TEST(EntryAssembler, ACheckpointEntryIsRefused) {
  log::EntryMeta meta;
  meta.kind = log::EntryKind::kCheckpoint;
  meta.begin_lsn = Lsn(0x10000);
  meta.commit_lsn = Lsn(0x10000);
  meta.end_lsn = Lsn(0x10000);
  ByteWriter w;
  log::encode_entry_meta(meta, w);
  w.raw(std::string_view("pgrelay-trigger-checkpoint 1\nsnap\n0/10000\n"));
  Parts parts = cut(w.bytes(), meta.commit_lsn, 64, 1);
  ASSERT_GT(parts.size(), 1u);
  EntryAssembler assembler;
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) ASSERT_TRUE(assembler.add(parts[i]).ok());
  expect_damaged(assembler.add(parts[parts.size() - 1]));
}

TEST(EntryAssembler, PartsCutByHandAssembleLikeThePublishers) {
  const log::EncodedEntry entry = sample_entry(0x10000, 5);
  Parts published = published_parts(entry, 64, 1);
  Parts by_hand = cut(entry_bytes(entry), entry.meta.commit_lsn, 64, 1);
  ASSERT_EQ(by_hand.size(), published.size());
  for (std::size_t i = 0; i < published.size(); ++i) {
    EXPECT_EQ(by_hand.payload(i), published.payload(i));
    EXPECT_EQ(by_hand[i].id, published[i].id);
    EXPECT_EQ(by_hand[i].part, published[i].part);
  }
}

TEST(FollowerCheckpoint, RoundTrips) {
  const FollowerCheckpoint checkpoint{"PGRELAY", 18446744073709551615ull, 4242};
  Bytes encoded = encode_follower_checkpoint(checkpoint);
  auto decoded = decode_follower_checkpoint(encoded);
  ASSERT_TRUE(decoded.ok()) << decoded.error().message;
  ASSERT_TRUE(decoded->has_value());
  EXPECT_EQ(**decoded, checkpoint);

  const FollowerCheckpoint zero{"CDC-1", 0, 0};
  auto back = decode_follower_checkpoint(encode_follower_checkpoint(zero));
  ASSERT_TRUE(back.ok());
  ASSERT_TRUE(back->has_value());
  EXPECT_EQ(**back, zero);
}

TEST(FollowerCheckpoint, ACheckpointOfAnotherCaptureIsNoFollowers) {
  for (std::string_view text : {"pgrelay-trigger-checkpoint 1\nsnap\n0/16B3748\n",
                                "pgrelay-native-checkpoint 1\n0/1\n", ""}) {
    auto decoded = decode_follower_checkpoint(as_bytes(text));
    ASSERT_TRUE(decoded.ok()) << text;
    EXPECT_FALSE(decoded->has_value()) << text;
  }
}

TEST(FollowerCheckpoint, OneOfAnotherFormatIsRefused) {
  auto decoded = decode_follower_checkpoint(
      as_bytes("pgrelay-follower-checkpoint 2\nstream S\nlog-id 1\nseq 2\n"));
  ASSERT_FALSE(decoded.ok());
  EXPECT_NE(decoded.error().message.find("format"), std::string::npos) << decoded.error().message;
}

TEST(FollowerCheckpoint, ADamagedOneIsAnError) {
  const std::string magic = "pgrelay-follower-checkpoint 1\n";
  const std::vector<std::string> damaged = {
      magic,
      magic + "stream S\nlog-id 1\n",                            // no seq
      magic + "stream S\nlog-id 1\nseq 2",                       // no final newline
      magic + "stream S\nlog-id 1\nseq 2\njunk\n",               // trailing junk
      magic + "stream S\nlog-id 1\nseq 2\n\n",                   // an empty line after
      magic + "stream S\nlog-id 1\nseq x2\n",                    // a seq that is no number
      magic + "stream S\nlog-id 1\nseq -2\n",                    // a signed one
      magic + "stream S\nlog-id 1\nseq 2 \n",                    // a space after it
      magic + "stream S\nlog-id one\nseq 2\n",                   // a log id that is no number
      magic + "stream S\nseq 2\nlog-id 1\n",                     // lines out of order
      magic + "streams S\nlog-id 1\nseq 2\n",                    // a wrong key
      magic + "stream S\nlog-id 1\nseq 18446744073709551616\n",  // too large
  };
  for (const std::string& text : damaged) {
    auto decoded = decode_follower_checkpoint(as_bytes(text));
    ASSERT_FALSE(decoded.ok()) << text;
    EXPECT_EQ(decoded.error().sqlstate, sqlstate::kDataCorrupted);
    EXPECT_FALSE(decoded.error().hint.empty());
  }
}

TEST(ParseDecimal, TakesWholeUnsignedNumbersOnly) {
  EXPECT_EQ(parse_decimal("0"), std::optional<std::uint64_t>(0));
  EXPECT_EQ(parse_decimal("42"), std::optional<std::uint64_t>(42));
  EXPECT_EQ(parse_decimal("18446744073709551615"),
            std::optional<std::uint64_t>(18446744073709551615ull));
  for (std::string_view bad : {"", "-1", "+1", " 1", "1 ", "18446744073709551616",
                               "99999999999999999999999", "1x", "x1", "0x10", "1.5"}) {
    EXPECT_FALSE(parse_decimal(bad).has_value()) << '"' << bad << '"';
  }
}

}  // namespace
}  // namespace pgrelay::capture
