// Trigger capture against Postgres's own pgoutput: the same workload must give the same messages.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

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
)sql";

constexpr const char* kWriterSettings =
    "SET TimeZone = 'America/St_Johns'; SET IntervalStyle = 'sql_standard'; "
    "SET DateStyle = 'German, DMY'; SET extra_float_digits = 0; SET bytea_output = 'escape'";

constexpr const char* kWorkload[] = {
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
};

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
  install_options.publications = {"par_pub", "par_pub_ins"};
  auto installed = install(**session, install_options);
  ASSERT_TRUE(installed.ok()) << installed.error().to_string();
  EXPECT_EQ(installed->captured_tables, 4);

  test::ReplicationRecorder recorder(server, "postgres", "parity");
  recorder.start(
      "parity",
      {{"proto_version", "1"}, {"publication_names", "par_pub,par_pub_ins"}, {"messages", "true"}});
  test::PgConnection writer(server.conninfo());
  writer.exec(kWriterSettings);
  for (const char* sql : kWorkload) writer.exec(sql);
  server.exec(test::ReplicationRecorder::end_marker_sql("parity"));
  const test::RecordedStream stream = recorder.finish("parity");

  pgoutput::Decoder decoder(pgoutput::DecoderOptions{});
  std::vector<pgoutput::Message> expected;
  std::map<pgoutput::Oid, pgoutput::Relation> expected_relations;
  std::map<pgoutput::Oid, pgoutput::Type> expected_types;
  std::vector<pgoutput::Begin> begins;
  for (std::size_t i = 0; i < stream.frames.size(); ++i) {
    auto m = decoder.decode(stream.message(i));
    ASSERT_TRUE(m.ok()) << m.error().message;
    if (auto* rel = std::get_if<pgoutput::Relation>(&*m)) {
      expected_relations[rel->oid] = *rel;
    } else if (auto* type = std::get_if<pgoutput::Type>(&*m)) {
      expected_types[type->oid] = *type;
    } else if (auto* begin = std::get_if<pgoutput::Begin>(&*m)) {
      begins.push_back(*begin);
    } else if (std::holds_alternative<pgoutput::Insert>(*m) ||
               std::holds_alternative<pgoutput::Update>(*m) ||
               std::holds_alternative<pgoutput::Delete>(*m) ||
               std::holds_alternative<pgoutput::Truncate>(*m)) {
      expected.push_back(*m);
    }
  }
  EXPECT_EQ(begins.size(), 14u);
  EXPECT_EQ(expected.size(), 17u);
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
  EXPECT_EQ(polled->transactions, 14u);
  EXPECT_TRUE((*poller)->commit_timestamps());

  std::vector<pgoutput::Message> captured;
  std::map<pgoutput::Oid, pgoutput::Relation> relations;
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
    headers.push_back(t->header);
    for (const auto& c : t->changes) {
      pgoutput::Message m = log::to_message(c.message);
      if (auto* rel = std::get_if<pgoutput::Relation>(&m)) {
        relations[rel->oid] = *rel;
      } else if (auto* type = std::get_if<pgoutput::Type>(&m)) {
        types[type->oid] = *type;
      } else {
        captured.push_back(m);
      }
    }
  }
  // Same transactions, in commit order, with pgoutput's xids and commit times.
  ASSERT_EQ(headers.size(), begins.size());
  for (std::size_t i = 0; i < headers.size(); ++i) {
    EXPECT_EQ(headers[i].xid, begins[i].xid) << i;
    EXPECT_EQ(headers[i].commit_time, begins[i].commit_time) << i;
  }
  EXPECT_EQ(relations, expected_relations);
  EXPECT_EQ(types, expected_types);
  ASSERT_EQ(captured.size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(captured[i], expected[i])
        << "change " << i << "\n captured: " << pgoutput::describe(captured[i])
        << "\n pgoutput: " << pgoutput::describe(expected[i]);
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
}

}  // namespace
}  // namespace pgrelay::capture
