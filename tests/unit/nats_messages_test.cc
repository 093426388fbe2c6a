// Tests what the NATS publisher sends for a log entry: subjects, Msg-Ids, resume points, payloads.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "log/transaction.h"
#include "nats/entry_messages.h"
#include "nats/message_id.h"
#include "nats/server_facts.h"
#include "nats/stream_setup.h"
#include "nats/subjects.h"

namespace pgrelay::nats {
namespace {

using pgoutput::Column;
using pgoutput::Relation;
using pgoutput::TupleValue;
using wire::Lsn;

TEST(NatsSubjects, PlainNamesStayAsTheyAre) {
  EXPECT_EQ(escape_token("orders_2024-b"), "orders_2024-b");
  Subjects s("pgrelay", "app");
  EXPECT_EQ(s.table("public", "orders"), "pgrelay.app.public.orders");
  EXPECT_EQ(s.messages(), "pgrelay.app._message");
  EXPECT_EQ(s.transactions(), "pgrelay.app._tx");
  EXPECT_EQ(s.all(), "pgrelay.>");
  EXPECT_EQ(s.database_subjects(), "pgrelay.app.>");
}

TEST(NatsSubjects, ServerFactsLieOutsideEveryDatabasesSubjects) {
  EXPECT_EQ(Subjects("pgrelay", "app").server_facts(), "pgrelay.~server.app");
  EXPECT_EQ(Subjects("pgrelay", "my db").server_facts(), "pgrelay.~server.my~20db");
  // No database's token is "~server" (an escaped name has two hex digits after '~'), so no
  // database's subjects take another's facts.
  EXPECT_FALSE(unescape_token("~server").has_value());
  EXPECT_EQ(escape_token("~server"), "~7Eserver");
  EXPECT_FALSE(subject_covers(Subjects("pgrelay", "~server").database_subjects(),
                              Subjects("pgrelay", "app").server_facts()));
  EXPECT_TRUE(subject_covers(Subjects("pgrelay", "app").all(),
                             Subjects("pgrelay", "app").server_facts()));
}

TEST(NatsServerFacts, RoundTripInTheUpstreamsOrder) {
  ServerFacts facts;
  facts.parameters = {{"server_version", "15.10"}, {"DateStyle", "ISO, MDY"}, {"a\"b", "\n\x01"}};
  facts.catalog = R"({"publications":[]})";
  facts.as_of = Lsn(0x1'0000'00A0);
  auto parsed = parse_server_facts(encode_server_facts(facts));
  ASSERT_TRUE(parsed.ok()) << parsed.error().to_string();
  EXPECT_EQ(parsed->parameters, facts.parameters);
  EXPECT_EQ(parsed->catalog, facts.catalog);
  EXPECT_EQ(parsed->as_of, facts.as_of);
  EXPECT_TRUE(parsed->same_server(facts));

  facts.catalog.reset();  // before PostgreSQL 15
  parsed = parse_server_facts(encode_server_facts(facts));
  ASSERT_TRUE(parsed.ok()) << parsed.error().to_string();
  EXPECT_FALSE(parsed->catalog.has_value());
  ServerFacts later = *parsed;
  later.as_of = Lsn(0x2'0000'0000);
  EXPECT_TRUE(later.same_server(*parsed)) << "where the log stood is not what the server says";
  later.parameters[0].second = "16.1";
  EXPECT_FALSE(later.same_server(*parsed));
}

TEST(NatsServerFacts, PayloadsPgrelayDidNotWriteAreRefused) {
  for (const char* payload :
       {"", "not json", "[]", "{}", R"({"parameters":{},"catalog":null,"as_of":"0/0"})",
        R"({"parameters":[["a"]],"catalog":null,"as_of":"0/0"})",
        R"({"parameters":[["a",1]],"catalog":null,"as_of":"0/0"})",
        R"({"parameters":[],"catalog":7,"as_of":"0/0"})",
        R"({"parameters":[],"catalog":null})", R"({"parameters":[],"catalog":null,"as_of":"x"})",
        R"({"parameters":[],"as_of":"0/0"})"}) {
    auto parsed = parse_server_facts(payload);
    ASSERT_FALSE(parsed.ok()) << payload;
    EXPECT_EQ(parsed.error().sqlstate, sqlstate::kObjectNotInPrerequisiteState) << payload;
    EXPECT_NE(parsed.error().hint.find("stream its primary publishes"), std::string::npos);
  }
}

TEST(NatsSubjects, EveryOtherByteIsEscapedReversibly) {
  EXPECT_EQ(escape_token("my table"), "my~20table");
  EXPECT_EQ(escape_token("a.b"), "a~2Eb");
  EXPECT_EQ(escape_token("*>"), "~2A~3E");
  EXPECT_EQ(escape_token("~"), "~7E");
  EXPECT_EQ(escape_token(""), "~");
  EXPECT_EQ(escape_token("\xc3\xa9t\xc3\xa9"), "~C3~A9t~C3~A9");  // UTF-8 bytes, one by one
  const std::vector<std::string> names = {
      "my table", "a.b", "~7E", "", "Straße", "tab\there", std::string("\0x", 2)};
  for (const std::string& name : names) {
    auto back = unescape_token(escape_token(name));
    ASSERT_TRUE(back.has_value()) << name;
    EXPECT_EQ(*back, name);
  }
}

TEST(NatsSubjects, OnlyEscapedTokensUnescape) {
  EXPECT_FALSE(unescape_token("a~2").has_value());   // cut short
  EXPECT_FALSE(unescape_token("a~2e").has_value());  // lower-case hex is never written
  EXPECT_FALSE(unescape_token("~41").has_value());   // 'A' is never escaped
  EXPECT_FALSE(unescape_token("a.b").has_value());
  EXPECT_FALSE(unescape_token("").has_value());
}

TEST(NatsSubjects, PrefixesAreTokensOfPlainBytes) {
  EXPECT_TRUE(valid_subject_prefix("pgrelay"));
  EXPECT_TRUE(valid_subject_prefix("acme.cdc-1"));
  EXPECT_FALSE(valid_subject_prefix(""));
  EXPECT_FALSE(valid_subject_prefix("a..b"));
  EXPECT_FALSE(valid_subject_prefix(".a"));
  EXPECT_FALSE(valid_subject_prefix("a."));
  EXPECT_FALSE(valid_subject_prefix("a.*"));
  EXPECT_FALSE(valid_subject_prefix("a b"));
}

TEST(NatsSubjects, StreamSubjectsCoverOrNot) {
  EXPECT_TRUE(subject_covers("pgrelay.>", "pgrelay.>"));
  EXPECT_TRUE(subject_covers(">", "pgrelay.>"));
  EXPECT_TRUE(subject_covers("*.>", "pgrelay.>"));
  EXPECT_FALSE(subject_covers("pgrelay.*", "pgrelay.>"));  // one token only
  EXPECT_FALSE(subject_covers("pgrelay.app.>", "pgrelay.>"));
  EXPECT_FALSE(subject_covers("other.>", "pgrelay.>"));
  EXPECT_FALSE(subject_covers("pgrelay", "pgrelay.>"));
}

TEST(NatsMessageId, FormatsAndParses) {
  const Lsn lsn = *Lsn::parse("1/2A0B3C8");
  EXPECT_EQ(format_message_id({lsn, false, 0}), "1/2A0B3C8/0");
  EXPECT_EQ(format_message_id({lsn, true, 12}), "1/2A0B3C8/tx/12");
  EXPECT_EQ(parse_message_id("1/2A0B3C8/7"), (MessageId{lsn, false, 7}));
  EXPECT_EQ(parse_message_id("1/2A0B3C8/tx/0"), (MessageId{lsn, true, 0}));
  for (const char* bad : {"", "1/2A0B3C8", "1/2A0B3C8/", "1/2A0B3C8/x", "1/2A0B3C8/tx/",
                          "1/2A0B3C8/07", "1/2A0B3C8/-1", "zz/1/0", "1/2A0B3C8/tx/1/2"}) {
    EXPECT_FALSE(parse_message_id(bad).has_value()) << bad;
  }
}

TEST(NatsMessageId, PartHeadersFormatAndParse) {
  EXPECT_EQ(format_part_header({2, 5, 1044480}), "2/5/1044480");
  EXPECT_EQ(parse_part_header("2/5/1044480"), (PartHeader{2, 5, 1044480}));
  for (const char* bad :
       {"", "2/5", "2/5/", "5/5/10", "0/0/10", "0/1/0", "a/1/10", "0/1/10/2", "00/1/10"}) {
    EXPECT_FALSE(parse_part_header(bad).has_value()) << bad;
  }
}

TEST(NatsMessageId, ResumesAfterTheLastMessageStored) {
  const Lsn lsn = *Lsn::parse("0/16B3748");
  // The last part of an entry: it is whole, go on with the next.
  ResumePoint whole = resume_after({lsn, true, 2}, 5, 3);
  EXPECT_TRUE(whole.whole);
  EXPECT_EQ(whole.commit_lsn, lsn);
  // Change 3 of 5: the entry again, without its first 4 messages.
  ResumePoint mid = resume_after({lsn, false, 3}, 5, 0);
  EXPECT_FALSE(mid.whole);
  EXPECT_EQ(mid.skip, 4u);
  EXPECT_EQ(mid.changes, 5u);
  // Part 0 of 3 after 5 changes: 6 messages are in.
  ResumePoint part = resume_after({lsn, true, 0}, 5, 3);
  EXPECT_FALSE(part.whole);
  EXPECT_EQ(part.skip, 6u);
}

Relation users() {
  Relation r;
  r.oid = 16384;
  r.namespace_name = "public";
  r.name = "my users";
  r.columns = {Column{pgoutput::kColumnIsKey, "id", 23, -1}, Column{0, "name", 25, -1}};
  return r;
}

Relation settings() {
  Relation r;
  r.oid = 1259;
  r.namespace_name = "";  // pg_catalog, as pgoutput spells it
  r.name = "settings";
  r.columns = {Column{pgoutput::kColumnIsKey, "k", 25, -1}};
  return r;
}

log::EncodedEntry sample_entry() {
  log::Transaction txn;
  txn.header.begin_lsn = *Lsn::parse("0/1000");
  txn.header.commit_lsn = *Lsn::parse("0/2000");
  txn.header.end_lsn = *Lsn::parse("0/2010");
  txn.header.xid = 731;
  txn.header.commit_time = 123456789;
  auto at = [](const char* lsn) { return *Lsn::parse(lsn); };
  txn.changes.push_back({at("0/1000"), users()});
  txn.changes.push_back(
      {at("0/1010"),
       pgoutput::Insert{std::nullopt, 16384, {{TupleValue::text("1"), TupleValue::text("ann")}}}});
  pgoutput::LogicalMessage marker;
  marker.transactional = true;
  marker.prefix = std::string(log::kPublicationsChangedPrefix);
  txn.changes.push_back({at("0/1020"), marker});
  txn.changes.push_back({at("0/1030"), settings()});
  pgoutput::Truncate truncate;
  truncate.relation_oids = {16384, 1259};
  txn.changes.push_back({at("0/1040"), truncate});
  pgoutput::LogicalMessage message;
  message.transactional = true;
  message.prefix = "app";
  message.content = "hi";
  txn.changes.push_back({at("0/1050"), message});
  auto entry = log::encode_transaction(txn);
  EXPECT_TRUE(entry.ok());
  return std::move(*entry);
}

std::vector<OutMessage> all_messages(EntryMessages& m) {
  std::vector<OutMessage> out;
  for (;;) {
    auto next = m.next();
    EXPECT_TRUE(next.ok());
    if (!next.ok() || !*next) return out;
    out.push_back(std::move(**next));
  }
}

TEST(NatsEntryMessages, OneMessagePerChangeThenTheEntryInParts) {
  const log::EncodedEntry entry = sample_entry();
  Subjects subjects("pgrelay", "app");
  auto made = EntryMessages::make(entry.meta, entry.data, subjects, 64);
  ASSERT_TRUE(made.ok()) << made.error().message;
  // The insert, one per truncated table, the message; not the marker nor the Relations.
  EXPECT_EQ(made->change_count(), 4u);
  std::vector<OutMessage> messages = all_messages(*made);
  ASSERT_EQ(messages.size(), made->size());
  const std::vector<std::string> subjects_sent = {
      "pgrelay.app.public.my~20users", "pgrelay.app.public.my~20users",
      "pgrelay.app.pg_catalog.settings", "pgrelay.app._message"};
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(messages[i].subject, subjects_sent[i]);
    EXPECT_EQ(format_message_id(messages[i].id), "0/2000/" + std::to_string(i));
    auto json = nlohmann::json::parse(messages[i].payload);
    EXPECT_EQ(json["commit_lsn"], "0/2000");
    EXPECT_EQ(json["index"], i);
    EXPECT_EQ(json["count"], 4);
    EXPECT_EQ(json["xid"], 731);
    EXPECT_FALSE(messages[i].last);
  }
  EXPECT_EQ(nlohmann::json::parse(messages[0].payload)["new"]["name"], "ann");
  EXPECT_EQ(nlohmann::json::parse(messages[0].payload)["lsn"], "0/1010");
  EXPECT_EQ(nlohmann::json::parse(messages[2].payload)["op"], "truncate");
  EXPECT_EQ(nlohmann::json::parse(messages[2].payload)["schema"], "pg_catalog");
  EXPECT_EQ(nlohmann::json::parse(messages[3].payload)["content"], "hi");
  // The parts put back together are the entry's metadata and data, as the log keeps them.
  std::string joined;
  for (std::size_t i = 4; i < messages.size(); ++i) {
    EXPECT_EQ(messages[i].subject, "pgrelay.app._tx");
    EXPECT_EQ(format_message_id(messages[i].id), "0/2000/tx/" + std::to_string(i - 4));
    EXPECT_LE(messages[i].payload.size(), 64u);
    EXPECT_EQ(messages[i].last, i + 1 == messages.size());
    joined += messages[i].payload;
  }
  ByteWriter want;
  log::encode_entry_meta(entry.meta, want);
  want.raw(entry.data);
  EXPECT_EQ(joined, std::string(want.bytes().begin(), want.bytes().end()));
  EXPECT_EQ(made->part_count(), (want.size() + 63) / 64);
  EXPECT_GT(made->part_count(), 1u);
}

TEST(NatsEntryMessages, SkippingResumesWhereTheStreamEnds) {
  const log::EncodedEntry entry = sample_entry();
  Subjects subjects("pgrelay", "app");
  auto whole = EntryMessages::make(entry.meta, entry.data, subjects, 64);
  ASSERT_TRUE(whole.ok());
  const std::vector<OutMessage> all = all_messages(*whole);
  const std::vector<std::uint64_t> skips = {0, 1, 3, 4, 5, all.size() - 1, all.size()};
  for (std::uint64_t skip : skips) {
    auto resumed = EntryMessages::make(entry.meta, entry.data, subjects, 64);
    ASSERT_TRUE(resumed.ok());
    ASSERT_TRUE(resumed->skip(skip).ok());
    std::vector<OutMessage> rest = all_messages(*resumed);
    ASSERT_EQ(rest.size(), all.size() - skip) << skip;
    for (std::size_t i = 0; i < rest.size(); ++i) {
      EXPECT_EQ(rest[i].id, all[skip + i].id);
      EXPECT_EQ(rest[i].payload, all[skip + i].payload);
    }
  }
}

TEST(NatsEntryMessages, DamagedDataIsRefused) {
  log::EncodedEntry entry = sample_entry();
  Subjects subjects("pgrelay", "app");
  Bytes cut(entry.data.begin(), entry.data.end() - 3);
  auto made = EntryMessages::make(entry.meta, cut, subjects, 64);
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.error().sqlstate, sqlstate::kDataCorrupted);
}

}  // namespace
}  // namespace pgrelay::nats
