// Trigger and native capture against Postgres's own pgoutput: the same workload, the same messages.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "capture/native/native_capture.h"
#include "capture/trigger/installer.h"
#include "capture/trigger/poller.h"
#include "log/change_log.h"
#include "log/transaction.h"
#include "pg_server.h"
#include "pgoutput/decoder.h"
#include "replication_recorder.h"

namespace pgrelay::capture {
namespace {

namespace fs = std::filesystem;

constexpr const char* kSchema = R"sql(
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN posint AS int CHECK (VALUE > 0);
CREATE TABLE par_d (
  id int8 PRIMARY KEY, i2 int2, i4 int4, n numeric, f4 float4, f8 float8, flag bool, t text,
  vc varchar(10), ch char(5), b bytea, d date, tm time, tmtz timetz, ts timestamp,
  tstz timestamptz, iv interval, u uuid, ip inet, net cidr, mac macaddr, js json, jb jsonb,
  ta text[], ia int4[], pt point, tv tsvector, m mood, p posint, bits bit(4), cash money,
  gen int GENERATED ALWAYS AS (i4 * 2) STORED);
ALTER TABLE par_d DROP COLUMN i2;
CREATE TABLE par_f (id int PRIMARY KEY, v text, w float8);
ALTER TABLE par_f REPLICA IDENTITY FULL;
CREATE TABLE par_i (a int NOT NULL, b text NOT NULL, c tstzrange);
CREATE UNIQUE INDEX par_i_b ON par_i (b);
ALTER TABLE par_i REPLICA IDENTITY USING INDEX par_i_b;
CREATE TABLE par_n (id int, v text);
ALTER TABLE par_n REPLICA IDENTITY NOTHING;
CREATE PUBLICATION par_pub FOR TABLE par_d, par_f, par_i;
CREATE PUBLICATION par_pub_ins FOR TABLE par_n WITH (publish = 'insert, truncate');
CREATE TABLE par_t (id int PRIMARY KEY, big text, comp text, small text, bin bytea);
ALTER TABLE par_t ALTER big SET STORAGE EXTERNAL;
ALTER TABLE par_t ALTER bin SET STORAGE EXTERNAL;
CREATE TABLE par_tf (id int PRIMARY KEY, big text, small text);
ALTER TABLE par_tf REPLICA IDENTITY FULL;
ALTER TABLE par_tf ALTER big SET STORAGE EXTERNAL;
CREATE TABLE par_a (id int PRIMARY KEY, a text, b int);
CREATE TABLE par_p (id int PRIMARY KEY);
CREATE TABLE par_c (id int REFERENCES par_p);
CREATE TABLE par_s (id serial PRIMARY KEY, v text);
CREATE PUBLICATION par_pub2 FOR TABLE par_t, par_tf, par_a, par_p, par_c, par_s;
-- Columns named like the aliases in capture's trigger SQL (r, n, o, i, t, c1).
CREATE TABLE par_r (r int PRIMARY KEY, n text, o text, i int, t text, c1 text);
CREATE TABLE par_rf (r int, n text, t text);
ALTER TABLE par_rf REPLICA IDENTITY FULL;
CREATE PUBLICATION par_pub3 FOR TABLE par_r, par_rf;
)sql";

constexpr const char* kWriterSettings =
    "SET TimeZone = 'America/St_Johns'; SET IntervalStyle = 'sql_standard'; "
    "SET DateStyle = 'German, DMY'; SET extra_float_digits = 0; SET bytea_output = 'escape'";

constexpr const char* kWorkload[] = {
    "INSERT INTO par_r VALUES (1, 'n', 'o', 5, 't', 'c'), (2, NULL, NULL, NULL, NULL, NULL)",
    "UPDATE par_r SET r = r + 10, t = 'moved'",
    "DELETE FROM par_r WHERE r = 11",
    "INSERT INTO par_rf VALUES (1, 'n', 't'); UPDATE par_rf SET t = 'u'; DELETE FROM par_rf",
    "INSERT INTO par_d (id, i4, n, f4, f8, flag, t, vc, ch, b, d, tm, tmtz, ts, tstz, iv, u, ip, "
    "net, mac, js, jb, ta, ia, pt, tv, m, p, bits, cash) VALUES (9223372036854775807, -7, "
    "'-0.000100', 1.5e-7, -0.0, false, 'multi\nline ''q'' \\ tab\t', 'short', 'ab', "
    "'\\xdeadbeef00', '0044-03-15 BC', '23:59:59.999999', '12:00+05:45', "
    "'2000-01-01 00:00:00.000001', '1999-12-31 23:59:59.5+14', '-1 day +02:03:04.000005', "
    "'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11', '::ffff:1.2.3.4/128', '10.1.0.0/16', "
    "'08:00:2b:01:02:03', '{ \"spaces\" : [1, 2] }', '{\"z\": null, \"a\": \"\\u00e9\"}', "
    "ARRAY['', NULL, 'NULL', 'a\"b', 'c\\d', ' lead'], '{{1,2},{3,NULL}}', '(1.5,-2)', "
    "'the quick brown fox', 'happy', 42, B'1010', 12.34)",
    "INSERT INTO par_d (id, f8, tstz, n) VALUES (1, 'NaN', 'infinity', 'NaN'), "
    "(2, '1e308', '-infinity', '1e-20')",
    "BEGIN; INSERT INTO par_f VALUES (1, 'x', 0.1), (2, NULL, NULL); "
    "INSERT INTO par_i VALUES (1, 'k1', '[2024-01-01 00:00+00,2024-02-01 00:00+00)'); COMMIT",
    "UPDATE par_d SET t = 'changed', f8 = 2.5 WHERE id = 1",
    "UPDATE par_d SET id = 3 WHERE id = 2",
    "UPDATE par_f SET v = 'y' WHERE id = 1",
    "UPDATE par_i SET c = NULL",
    "UPDATE par_i SET b = 'k2'",
    "DELETE FROM par_f WHERE id = 2",
    "DELETE FROM par_d WHERE id = 3",
    "DELETE FROM par_i",
    "INSERT INTO par_n VALUES (1, 'n')",
    "TRUNCATE par_n",
    "TRUNCATE par_f, par_n",
    // TOAST: out-of-line values (STORAGE EXTERNAL) unchanged by an update are sent as 'u';
    // a compressed inline one is sent in full.
    "INSERT INTO par_t VALUES (1, repeat(md5('a'), 200), repeat('x', 5000), 's', "
    "decode(repeat(md5('b'), 100), 'hex'))",
    "UPDATE par_t SET small = 't' WHERE id = 1",
    "UPDATE par_t SET big = big || 'x', small = 'u' WHERE id = 1",
    "UPDATE par_t SET id = 2",
    "INSERT INTO par_tf VALUES (1, repeat(md5('c'), 200), 's')",
    "UPDATE par_tf SET small = 't'",
    "DELETE FROM par_t",
    // Schema changes between changes and inside one transaction.
    "INSERT INTO par_a VALUES (1, 'a', 1)",
    "ALTER TABLE par_a ADD COLUMN c text",
    "INSERT INTO par_a VALUES (2, 'b', 2, 'c')",
    "BEGIN; UPDATE par_a SET b = 3 WHERE id = 1; ALTER TABLE par_a RENAME COLUMN a TO a2; "
    "UPDATE par_a SET a2 = 'r' WHERE id = 1; ALTER TABLE par_a DROP COLUMN b; "
    "INSERT INTO par_a VALUES (3, 'x', 'y'); COMMIT",
    "ALTER TABLE par_a ALTER COLUMN c TYPE varchar(5)",
    "UPDATE par_a SET c = 'z' WHERE id = 3",
    "ALTER TABLE par_a REPLICA IDENTITY FULL",
    "DELETE FROM par_a WHERE id = 2",
    // Logical messages: each side sees one (pgoutput the real one, capture its own).
    "BEGIN; INSERT INTO par_p VALUES (1); SELECT pg_logical_emit_message(true, 'pfx', 'hello'), "
    "_pgrelay.emit_message(true, 'pfx', 'hello'); INSERT INTO par_p VALUES (3); COMMIT",
    "SELECT pg_logical_emit_message(false, 'lag', '\\x0001ff'::bytea), "
    "_pgrelay.emit_message(false, 'lag', '\\x0001ff'::bytea)",
    // TRUNCATE options, cascaded tables, two TRUNCATE statements in one transaction.
    "INSERT INTO par_c VALUES (1)",
    "TRUNCATE par_p CASCADE",
    "INSERT INTO par_s (v) VALUES ('a')",
    "TRUNCATE par_s RESTART IDENTITY",
    "BEGIN; INSERT INTO par_s (v) VALUES ('b'); TRUNCATE par_s; TRUNCATE par_c, par_s "
    "RESTART IDENTITY; COMMIT",
};

// A data change or message, with the Relations in force for its tables.
struct Observed {
  pgoutput::Message message;
  std::vector<pgoutput::Relation> relations;
  bool operator==(const Observed&) const = default;
};

std::vector<pgoutput::Oid> oids_of(const pgoutput::Message& m) {
  if (auto* i = std::get_if<pgoutput::Insert>(&m)) return {i->relation_oid};
  if (auto* u = std::get_if<pgoutput::Update>(&m)) return {u->relation_oid};
  if (auto* d = std::get_if<pgoutput::Delete>(&m)) return {d->relation_oid};
  if (auto* t = std::get_if<pgoutput::Truncate>(&m)) return t->relation_oids;
  return {};
}

// Folds a message into the sequence: Relations and Types update the state, data changes and
// logical messages (their LSNs differ by design) are recorded.
void observe(pgoutput::Message m, std::map<pgoutput::Oid, pgoutput::Relation>& relations,
             std::map<pgoutput::Oid, pgoutput::Type>& types, std::vector<Observed>& out) {
  if (auto* rel = std::get_if<pgoutput::Relation>(&m)) {
    relations[rel->oid] = *rel;
  } else if (auto* type = std::get_if<pgoutput::Type>(&m)) {
    types[type->oid] = *type;
  } else if (auto* msg = std::get_if<pgoutput::LogicalMessage>(&m)) {
    msg->lsn = Lsn();
    msg->xid.reset();
    out.push_back({m, {}});
  } else if (std::holds_alternative<pgoutput::Insert>(m) ||
             std::holds_alternative<pgoutput::Update>(m) ||
             std::holds_alternative<pgoutput::Delete>(m) ||
             std::holds_alternative<pgoutput::Truncate>(m)) {
    Observed o{m, {}};
    for (auto oid : oids_of(m)) o.relations.push_back(relations[oid]);
    out.push_back(std::move(o));
  }
}

TEST(PgoutputParityTest, CapturedMessagesEqualPgoutputsForTheSameWorkload) {
  test::PgServerOptions options;
  options.settings["timezone"] = "'Asia/Kathmandu'";
  options.settings["track_commit_timestamp"] = "on";
  test::PgServer server(options);
  server.exec(kSchema);

  char tmpl[] = "/tmp/pgrelay-parity-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  auto session = PgSession::connect(server.conninfo());
  ASSERT_TRUE(session.ok());
  InstallOptions install_options;
  install_options.publications = {"par_pub", "par_pub_ins", "par_pub2", "par_pub3"};
  auto installed = install(**session, install_options);
  ASSERT_TRUE(installed.ok()) << installed.error().to_string();
  EXPECT_EQ(installed->captured_tables, 12);
  EXPECT_TRUE(installed->event_trigger);

  test::ReplicationRecorder recorder(server, "postgres", "parity");
  recorder.start("parity", {{"proto_version", "1"},
                            {"publication_names", "par_pub,par_pub_ins,par_pub2,par_pub3"},
                            {"messages", "true"}});
  test::PgConnection writer(server.conninfo());
  writer.exec(kWriterSettings);
  for (const char* sql : kWorkload) writer.exec(sql);
  server.exec(test::ReplicationRecorder::end_marker_sql("parity"));
  const test::RecordedStream stream = recorder.finish("parity");

  pgoutput::Decoder decoder(pgoutput::DecoderOptions{});
  std::vector<Observed> expected;
  std::map<pgoutput::Oid, pgoutput::Relation> expected_relations;
  std::map<pgoutput::Oid, pgoutput::Type> expected_types;
  std::vector<pgoutput::Begin> begins;
  for (std::size_t i = 0; i < stream.frames.size(); ++i) {
    auto m = decoder.decode(stream.message(i));
    ASSERT_TRUE(m.ok()) << m.error().message;
    if (auto* begin = std::get_if<pgoutput::Begin>(&*m)) begins.push_back(*begin);
    if (auto* msg = std::get_if<pgoutput::LogicalMessage>(&*m)) {
      if (msg->prefix == "pgrelay-golden-end") continue;  // the recorder's own end marker
    }
    observe(std::move(*m), expected_relations, expected_types, expected);
  }
  EXPECT_GE(begins.size(), 30u);
  EXPECT_EQ(expected_types.size(), 2u);  // mood and posint

  log::LogOptions log_options;
  log_options.dir = dir + "/log";
  auto log = log::ChangeLog::open(log_options);
  ASSERT_TRUE(log.ok());
  PollerOptions poller_options;
  poller_options.conninfo = server.conninfo();
  poller_options.spill_dir = dir + "/spill";
  auto poller = TriggerPoller::open(poller_options, **log);
  ASSERT_TRUE(poller.ok()) << poller.error().to_string();
  auto polled = (*poller)->poll();
  ASSERT_TRUE(polled.ok()) << polled.error().to_string();
  EXPECT_EQ(polled->transactions, begins.size());
  EXPECT_EQ(polled->messages, 1u);
  EXPECT_TRUE((*poller)->commit_timestamps());

  std::vector<Observed> captured;
  std::map<pgoutput::Oid, pgoutput::Type> types;
  std::vector<log::TransactionHeader> headers;
  auto cursor = (*log)->open_cursor(Lsn(0));
  ASSERT_TRUE(cursor.ok());
  while (true) {
    auto e = (*cursor)->next_entry();
    ASSERT_TRUE(e.ok());
    if (!e->has_value()) break;
    auto t = log::read_transaction(**cursor, **e);
    ASSERT_TRUE(t.ok()) << t.error().to_string();
    if (t->kind == log::EntryKind::kTransaction) headers.push_back(t->header);
    // Each transaction carries the Relations it needs: the state starts over, as a reader
    // starting at any transaction would.
    std::map<pgoutput::Oid, pgoutput::Relation> relations;
    for (const auto& c : t->changes)
      observe(log::to_message(c.message), relations, types, captured);
  }
  // Same transactions, in commit order, with pgoutput's xids and commit times.
  ASSERT_EQ(headers.size(), begins.size());
  for (std::size_t i = 0; i < headers.size(); ++i) {
    EXPECT_EQ(headers[i].xid, begins[i].xid) << i;
    EXPECT_EQ(headers[i].commit_time, begins[i].commit_time) << i;
  }
  EXPECT_EQ(types, expected_types);
  if (captured.size() != expected.size()) {
    for (const auto& o : expected) ADD_FAILURE() << "pgoutput: " << pgoutput::describe(o.message);
    for (const auto& o : captured) ADD_FAILURE() << "captured: " << pgoutput::describe(o.message);
  }
  ASSERT_EQ(captured.size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(captured[i].message, expected[i].message)
        << "change " << i << "\n captured: " << pgoutput::describe(captured[i].message)
        << "\n pgoutput: " << pgoutput::describe(expected[i].message);
    EXPECT_EQ(captured[i].relations, expected[i].relations)
        << "Relation in force for change " << i << ": " << pgoutput::describe(expected[i].message);
  }

  // The workload exercised what it is meant to: unchanged TOAST, TRUNCATE options, messages.
  int unchanged = 0, cascade = 0, restart = 0, messages = 0;
  for (const auto& o : expected) {
    if (auto* u = std::get_if<pgoutput::Update>(&o.message)) {
      for (const auto& v : u->new_tuple.columns)
        unchanged += v.kind == pgoutput::ValueKind::kUnchanged;
    }
    if (auto* t = std::get_if<pgoutput::Truncate>(&o.message)) {
      cascade += t->cascade;
      restart += t->restart_identity;
    }
    messages += std::holds_alternative<pgoutput::LogicalMessage>(o.message);
  }
  EXPECT_GE(unchanged, 3);
  EXPECT_EQ(cascade, 1);
  EXPECT_EQ(restart, 2);
  EXPECT_EQ(messages, 2);
  std::error_code ec;
  fs::remove_all(dir, ec);
}

// Native capture stores what the upstream's pgoutput sent, at the upstream's own LSNs: the log
// read back gives the messages a real slot streams for the same workload, transaction for
// transaction, with the same xids, commit times, commit and end LSNs and change positions.
TEST(PgoutputParityTest, NativeCaptureLogsPgoutputsMessagesAtTheUpstreamsLsns) {
  test::PgServer server;
  server.exec(kSchema);
  char tmpl[] = "/tmp/pgrelay-native-parity-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  log::LogOptions log_options;
  log_options.dir = dir + "/log";
  auto log = log::ChangeLog::open(log_options);
  ASSERT_TRUE(log.ok());
  NativeCaptureOptions options;
  options.conninfo = server.conninfo();
  options.slot = "parity_native";
  options.spill_dir = dir + "/spill";
  auto capture = NativeCapture::start(options, **log);
  ASSERT_TRUE(capture.ok()) << capture.error().to_string();
  EXPECT_EQ((*capture)->setup_report().captured_tables, 12);
  EXPECT_TRUE((*capture)->setup_report().event_trigger);
  // The table without a replica identity is in the insert-only publication, so the upstream
  // still lets writers update and delete it (the workload's TRUNCATE would work either way).
  EXPECT_EQ(server.scalar("SELECT string_agg(pubname, ',') FROM pg_publication_tables "
                          "WHERE tablename = 'par_n'"),
            "par_pub_ins,_pgrelay_capture_keyless");

  test::ReplicationRecorder recorder(server, "postgres", "parity_real");
  recorder.start("parity", {{"proto_version", "1"},
                            {"publication_names", "par_pub,par_pub_ins,par_pub2,par_pub3"},
                            {"messages", "true"}});
  test::PgConnection writer(server.conninfo());
  writer.exec(kWriterSettings);
  for (const char* sql : kWorkload) writer.exec(sql);
  writer.exec("UPDATE par_n SET v = 'still allowed'");
  server.exec(test::ReplicationRecorder::end_marker_sql("parity"));
  const test::RecordedStream stream = recorder.finish("parity");
  auto synced = (*capture)->sync();
  ASSERT_TRUE(synced.ok()) << synced.error().to_string();
  (*capture)->stop();

  struct Positions {
    std::vector<log::TransactionHeader> transactions;  // begin, commit, end, time, xid
    std::vector<Lsn> changes;                          // data changes and messages
    bool operator==(const Positions&) const = default;
  };
  pgoutput::Decoder decoder(pgoutput::DecoderOptions{});
  std::vector<Observed> expected;
  Positions expected_at;
  std::map<pgoutput::Oid, pgoutput::Relation> expected_relations;
  std::map<pgoutput::Oid, pgoutput::Type> expected_types;
  for (std::size_t i = 0; i < stream.frames.size(); ++i) {
    auto m = decoder.decode(stream.message(i));
    ASSERT_TRUE(m.ok()) << m.error().message;
    // The XLogData header's walStart: where Postgres says the message is.
    const Lsn at(ByteReader(ByteView(stream.frames[i]).subspan(1, 8)).u64());
    if (auto* begin = std::get_if<pgoutput::Begin>(&*m)) {
      log::TransactionHeader h;
      h.begin_lsn = at;
      h.commit_lsn = begin->final_lsn;
      h.commit_time = begin->commit_time;
      h.xid = begin->xid;
      expected_at.transactions.push_back(h);
    } else if (auto* commit = std::get_if<pgoutput::Commit>(&*m)) {
      expected_at.transactions.back().end_lsn = commit->end_lsn;
    } else if (!std::holds_alternative<pgoutput::Relation>(*m) &&
               !std::holds_alternative<pgoutput::Type>(*m)) {
      expected_at.changes.push_back(at);
    }
    observe(std::move(*m), expected_relations, expected_types, expected);
  }
  EXPECT_GE(expected_at.transactions.size(), 30u);

  std::vector<Observed> captured;
  Positions captured_at;
  std::map<pgoutput::Oid, pgoutput::Type> types;
  auto cursor = (*log)->open_cursor(Lsn(0));
  ASSERT_TRUE(cursor.ok());
  while (true) {
    auto e = (*cursor)->next_entry();
    ASSERT_TRUE(e.ok());
    if (!e->has_value()) break;
    auto t = log::read_transaction(**cursor, **e);
    ASSERT_TRUE(t.ok()) << t.error().to_string();
    if (t->kind == log::EntryKind::kTransaction) {
      log::TransactionHeader h = t->header;
      h.origin.clear();
      h.origin_lsn = Lsn();
      captured_at.transactions.push_back(h);
    }
    std::map<pgoutput::Oid, pgoutput::Relation> relations;
    for (const auto& c : t->changes) {
      if (!std::holds_alternative<pgoutput::Relation>(c.message) &&
          !std::holds_alternative<pgoutput::Type>(c.message)) {
        captured_at.changes.push_back(c.lsn);
      }
      observe(log::to_message(c.message), relations, types, captured);
    }
  }
  EXPECT_EQ(types, expected_types);
  ASSERT_EQ(captured_at.transactions.size(), expected_at.transactions.size());
  for (std::size_t i = 0; i < expected_at.transactions.size(); ++i) {
    EXPECT_EQ(captured_at.transactions[i], expected_at.transactions[i]) << "transaction " << i;
  }
  EXPECT_EQ(captured_at.changes, expected_at.changes);
  ASSERT_EQ(captured.size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(captured[i].message, expected[i].message)
        << "change " << i << "\n captured: " << pgoutput::describe(captured[i].message)
        << "\n pgoutput: " << pgoutput::describe(expected[i].message);
    EXPECT_EQ(captured[i].relations, expected[i].relations) << "change " << i;
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
}

}  // namespace
}  // namespace pgrelay::capture
