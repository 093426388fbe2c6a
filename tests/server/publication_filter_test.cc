// PG15 column lists and row filters: pgrelay's walsender against a native PostgreSQL 15 slot
// for the same workload (identical decoded messages, LSNs excepted), and the refusals.
#include <libpq-fe.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "capture/native/native_capture.h"
#include "capture/trigger/installer.h"
#include "capture/trigger/pg_session.h"
#include "capture/trigger/poller.h"
#include "pgoutput/decoder.h"
#include "replication_recorder.h"
#include "server_fixture.h"
#include "stream_compare.h"
#include "wire/replication_frames.h"

namespace pgrelay::test {
namespace {

using wire::Lsn;

constexpr const char* kSchema = R"sql(
CREATE TABLE cl (id int PRIMARY KEY, a text, b int, c text);
CREATE TABLE rf (id int PRIMARY KEY, qty int, note text);
CREATE TABLE rff (id int PRIMARY KEY, qty int, note text);
ALTER TABLE rff REPLICA IDENTITY FULL;
CREATE TABLE rft (id int PRIMARY KEY, qty int, big text);
ALTER TABLE rft REPLICA IDENTITY FULL;
ALTER TABLE rft ALTER big SET STORAGE EXTERNAL;
CREATE TABLE ins (id int PRIMARY KEY, qty int, note text);
CREATE TABLE ovr (id int PRIMARY KEY, v int);
CREATE TABLE typ (id int PRIMARY KEY, name text COLLATE "C", code char(4), big bigint,
                  n numeric, f float8, fl4 real, flag bool, vc varchar(8));
ALTER TABLE typ REPLICA IDENTITY FULL;
CREATE PUBLICATION pf_cols FOR TABLE cl (id, a, c);
CREATE PUBLICATION pf_rows FOR TABLE rf WHERE (id > 10), rff WHERE (qty >= 100),
  rft WHERE (qty > 10),
  typ WHERE ((name < 'm' AND code = 'ab' AND big > 9000000000 AND n >= 1.5 AND f < 2.5
              AND fl4 <> 0.5 AND flag IS TRUE AND (vc = 'x' OR vc = 'y')
              AND id IN (1, 2, 3, 4, 5, 6, 7, 8, 9, 10))
             OR id BETWEEN 100 AND 200 OR n IS NULL);
CREATE PUBLICATION pf_ins1 FOR TABLE ins (id, qty) WHERE (qty > 100) WITH (publish = 'insert');
CREATE PUBLICATION pf_ins2 FOR TABLE ins (id, qty) WHERE (qty < 0 OR note = 'z')
  WITH (publish = 'insert, truncate');
CREATE PUBLICATION pf_ovr1 FOR TABLE ovr WHERE (id > 100);
CREATE PUBLICATION pf_ovr2 FOR TABLE ovr WITH (publish = 'insert, delete');
CREATE PUBLICATION pf_conf FOR TABLE cl (id, a);
CREATE PUBLICATION pf_bad FOR TABLE ins WHERE (note LIKE 'x%') WITH (publish = 'insert');
)sql";

const char* const kWorkload[] = {
    "INSERT INTO cl VALUES (1, 'a', 1, 'c'), (2, 'b', 2, NULL)",
    "UPDATE cl SET b = 5 WHERE id = 1",
    "UPDATE cl SET id = 3 WHERE id = 2",
    "DELETE FROM cl WHERE id = 1",
    "ALTER TABLE cl ADD COLUMN d text",
    "INSERT INTO cl VALUES (4, 'x', 4, 'y', 'd')",
    "BEGIN; UPDATE cl SET a = 'z' WHERE id = 4; ALTER TABLE cl DROP COLUMN b; "
    "INSERT INTO cl VALUES (5, 'p', 'q', 'r'); COMMIT",
    // Default replica identity: the filter is on the key.
    "INSERT INTO rf VALUES (5, 1, 'a'), (15, 2, 'b')",
    "UPDATE rf SET id = 20 WHERE id = 5",   // moves in: INSERT
    "UPDATE rf SET id = 7 WHERE id = 15",   // moves out: DELETE
    "UPDATE rf SET qty = 3 WHERE id = 20",  // no old tuple: the new one decides
    "UPDATE rf SET qty = 4 WHERE id = 7",
    "DELETE FROM rf",
    // REPLICA IDENTITY FULL: the filter on a non-key column, old and new rows.
    "INSERT INTO rff VALUES (1, 50, 'a'), (2, 150, 'b'), (3, NULL, 'c')",
    "UPDATE rff SET qty = 200 WHERE id = 1",
    "UPDATE rff SET qty = 10 WHERE id = 2",
    "UPDATE rff SET note = 'z' WHERE id = 1",
    "UPDATE rff SET qty = qty + 60",
    "DELETE FROM rff WHERE id <> 3",
    // An unchanged TOAST value of a row moving in comes from the old row.
    "INSERT INTO rft VALUES (1, 5, repeat(md5('x'), 300))",
    "UPDATE rft SET qty = 20",
    "UPDATE rft SET qty = 30",
    "UPDATE rft SET qty = 1",
    // Insert-only publications: filters ORed, one column list.
    "INSERT INTO ins VALUES (1, 500, 'a'), (2, -5, 'b'), (3, 50, 'c'), (4, NULL, 'd'), "
    "(5, 7, 'z')",
    "UPDATE ins SET qty = 1000",
    "DELETE FROM ins WHERE id = 1",
    "TRUNCATE ins",
    // A publication without a filter overrides one with, for the actions it publishes.
    "INSERT INTO ovr VALUES (1, 1), (200, 2)",
    "UPDATE ovr SET v = 3",
    "DELETE FROM ovr WHERE id = 1",
    "DELETE FROM ovr",
    // Types at their edges.
    "INSERT INTO typ VALUES (1, 'abc', 'ab', 9000000001, 1.50, 2.4, 0.25, true, 'x'), "
    "(2, 'm', 'ab', 9000000001, 1.5, 2.4, 0.25, true, 'x'), "
    "(3, 'Z', 'ab  ', 9223372036854775807, 1.5000000000000000001, '-Infinity', 'NaN', true, 'y'), "
    "(4, 'abc', 'ab', 9000000000, 2, 2.4, 0.25, true, 'x'), "
    "(5, 'abc', 'ab', 9000000001, 1.4999999999999999999, 2.4, 0.25, true, 'x'), "
    "(6, 'abc', 'ab', 9000000001, 1.5, 2.5, 0.25, true, 'x'), "
    "(7, 'abc', 'ab', 9000000001, 1.5, 2.4, 0.5, true, 'x'), "
    "(8, 'abc', 'ab', 9000000001, 1.5, 2.4, 0.25, NULL, 'x'), "
    "(9, 'abc', 'ab', 9000000001, 1.5, 2.4, 0.25, true, 'z'), "
    "(150, 'zzz', 'q', 0, 0, 'NaN', 0, false, NULL), (300, NULL, NULL, NULL, NULL, NULL, NULL, "
    "NULL, NULL), (10, 'é', 'ab', 9000000001, 'NaN', 2.4, 0.25, true, 'x')",
    "UPDATE typ SET n = n + 1",
    "UPDATE typ SET flag = NOT flag WHERE id < 5",
    "DELETE FROM typ WHERE id > 2",
    "TRUNCATE rf, rff",
};

class PublicationFilterTest : public ::testing::Test {
 protected:
  static PgServerOptions server_options() {
    PgServerOptions options;
    options.settings["track_commit_timestamp"] = "on";
    return options;
  }
};

struct StreamSpec {
  std::string name;
  std::string publications;
};

TEST_F(PublicationFilterTest, PgrelaySendsWhatANativeSlotSends) {
  PgServer pg(server_options());
  RelayHarness relay(pg, RelayOptions{false, true});
  pg.exec(kSchema);
  pg.exec("GRANT SELECT ON ALL TABLES IN SCHEMA public TO app");

  auto session = capture::PgSession::connect(pg.conninfo());
  ASSERT_TRUE(session.ok()) << session.error().to_string();
  capture::InstallOptions install_options;
  install_options.all_publications = true;
  auto installed = capture::install(**session, install_options);
  ASSERT_TRUE(installed.ok()) << installed.error().to_string();
  ASSERT_TRUE(installed->event_trigger);

  const std::vector<StreamSpec> specs = {
      {"main", "pf_cols,pf_rows,pf_ins1,pf_ins2"},
      {"override", "pf_ovr1,pf_ovr2"},
      {"filtered", "pf_ovr1"},
  };
  const StreamSpec conflict{"conflict", "pf_cols,pf_conf"};
  std::vector<std::unique_ptr<ReplicationRecorder>> native;
  for (const auto& spec : specs) {
    native.push_back(std::make_unique<ReplicationRecorder>(pg, "postgres", "nat_" + spec.name));
    native.back()->start(
        spec.name,
        {{"proto_version", "1"}, {"publication_names", spec.publications}, {"messages", "true"}});
  }
  // The conflicting stream ends with an error: read it with libpq to see its SQLSTATE.
  PGconn* native_conflict =
      PQconnectdb(pg.conninfo("postgres", "postgres", "replication=database").c_str());
  ASSERT_EQ(PQstatus(native_conflict), CONNECTION_OK) << PQerrorMessage(native_conflict);
  PGresult* created =
      PQexec(native_conflict, "CREATE_REPLICATION_SLOT \"nat_conflict\" LOGICAL pgoutput");
  ASSERT_EQ(PQresultStatus(created), PGRES_TUPLES_OK) << PQerrorMessage(native_conflict);
  PQclear(created);
  PGconn* conn = PQconnectdb(relay.conninfo("replication=database").c_str());
  ASSERT_EQ(PQstatus(conn), CONNECTION_OK) << PQerrorMessage(conn);
  std::vector<StreamSpec> relay_specs = specs;
  relay_specs.push_back(conflict);
  for (const auto& spec : relay_specs) {
    std::string sql =
        "CREATE_REPLICATION_SLOT \"relay_" + spec.name + "\" LOGICAL pgoutput NOEXPORT_SNAPSHOT";
    PGresult* res = PQexec(conn, sql.c_str());
    ASSERT_EQ(PQresultStatus(res), PGRES_TUPLES_OK) << PQerrorMessage(conn);
    PQclear(res);
  }
  PQfinish(conn);

  PgConnection writer(pg.conninfo());
  for (const char* sql : kWorkload) writer.exec(sql);

  std::map<std::string, std::vector<pgoutput::Message>> expected;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    pg.exec(ReplicationRecorder::end_marker_sql(specs[i].name));
    expected[specs[i].name] = decode_native(native[i]->finish(specs[i].name));
  }
  {
    std::string sql =
        "START_REPLICATION SLOT \"nat_conflict\" LOGICAL 0/0 (proto_version '1', "
        "publication_names '" +
        conflict.publications + "')";
    PGresult* res = PQexec(native_conflict, sql.c_str());
    ASSERT_EQ(PQresultStatus(res), PGRES_COPY_BOTH) << PQerrorMessage(native_conflict);
    PQclear(res);
  }
  const Streamed native_conflict_stream =
      stream_from(native_conflict, 1000, std::chrono::seconds(10));
  PQfinish(native_conflict);
  const std::string conflict_text =
      "cannot use different column lists for table \"public.cl\" in different publications";
  EXPECT_EQ(native_conflict_stream.sqlstate, "0A000");
  EXPECT_EQ(native_conflict_stream.error, conflict_text);

  char tmpl[] = "/tmp/pgrelay-pubfilter-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  capture::PollerOptions poller_options;
  poller_options.conninfo = pg.conninfo();
  poller_options.spill_dir = std::string(tmpl) + "/spill";
  auto poller = capture::TriggerPoller::open(poller_options, relay.log());
  ASSERT_TRUE(poller.ok()) << poller.error().to_string();
  auto polled = (*poller)->poll();
  if (!polled.ok()) {
    for (const auto& row : pg.exec("SELECT rel::regclass::text, op, left(o, 60), left(n, 60) "
                                   "FROM _pgrelay.changes, ROWS FROM (unnest(old_rows), "
                                   "unnest(new_rows)) u(o, n) WHERE n NOT LIKE '(%' OR "
                                   "o NOT LIKE '(%'")) {
      std::string line;
      for (const auto& v : row) line += (v ? *v : "NULL") + " | ";
      ADD_FAILURE() << line;
    }
  }
  ASSERT_TRUE(polled.ok()) << polled.error().to_string();
  ASSERT_GE(polled->transactions, 30u);
  relay.hub().changed();

  for (const auto& spec : relay_specs) {
    SCOPED_TRACE(spec.name);
    PGconn* c = PQconnectdb(relay.conninfo("replication=database").c_str());
    ASSERT_EQ(PQstatus(c), CONNECTION_OK) << PQerrorMessage(c);
    std::string sql = "START_REPLICATION SLOT \"relay_" + spec.name +
                      "\" LOGICAL 0/0 (proto_version '1', publication_names '" + spec.publications +
                      "')";
    PGresult* res = PQexec(c, sql.c_str());
    ASSERT_EQ(PQresultStatus(res), PGRES_COPY_BOTH) << PQerrorMessage(c);
    PQclear(res);
    if (spec.name == "conflict") {
      // Postgres fails when the first change of the table is decoded, not at START; what it
      // sent before (here nothing: the table's first change is the first change) is equal.
      Streamed got = stream_from(c, 1000, std::chrono::seconds(10));
      EXPECT_EQ(got.sqlstate, native_conflict_stream.sqlstate)
          << got.ended << " " << PQerrorMessage(c);
      EXPECT_EQ(got.error, native_conflict_stream.error);
      EXPECT_EQ(got.messages, native_conflict_stream.messages);
      PQfinish(c);
      continue;
    }
    const auto want = without_repeated_relations(expected[spec.name]);
    Streamed got = stream_from(c, count_commits(want));
    got.messages = without_repeated_relations(std::move(got.messages));
    EXPECT_EQ(got.sqlstate, "") << got.error;
    EXPECT_GT(want.size(), 5u);
    expect_same_messages(got.messages, want);
    PQfinish(c);
  }

  // The workload exercised what it is meant to: row filters turned updates into inserts and
  // deletes, and column lists narrowed Relations.
  int inserts_from_updates = 0, narrowed = 0;
  for (const auto& m : expected["main"]) {
    if (auto* r = std::get_if<pgoutput::Relation>(&m))
      narrowed += r->name == "cl" && r->columns.size() == 3;
    if (auto* i = std::get_if<pgoutput::Insert>(&m))
      inserts_from_updates +=
          i->new_tuple.columns.size() == 3 && i->new_tuple.columns[0].bytes == "20";
  }
  EXPECT_GE(narrowed, 1);
  EXPECT_EQ(inserts_from_updates, 1);
  std::error_code ec;
  std::filesystem::remove_all(tmpl, ec);
}

TEST_F(PublicationFilterTest, UnsupportedRowFilterIsRefusedAtStart) {
  PgServer pg(server_options());
  RelayHarness relay(pg, RelayOptions{false, true});
  pg.exec(kSchema);
  PGconn* conn = PQconnectdb(relay.conninfo("replication=database").c_str());
  ASSERT_EQ(PQstatus(conn), CONNECTION_OK) << PQerrorMessage(conn);
  PGresult* res =
      PQexec(conn, "CREATE_REPLICATION_SLOT \"bad\" LOGICAL pgoutput NOEXPORT_SNAPSHOT");
  ASSERT_EQ(PQresultStatus(res), PGRES_TUPLES_OK) << PQerrorMessage(conn);
  PQclear(res);
  res = PQexec(conn,
               "START_REPLICATION SLOT \"bad\" LOGICAL 0/0 (proto_version '1', "
               "publication_names 'pf_ins1,pf_bad')");
  ASSERT_EQ(PQresultStatus(res), PGRES_FATAL_ERROR);
  EXPECT_STREQ(PQresultErrorField(res, PG_DIAG_SQLSTATE), "0A000");
  const std::string message = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
  EXPECT_NE(message.find("publication \"pf_bad\""), std::string::npos) << message;
  EXPECT_NE(message.find("\"public.ins\""), std::string::npos) << message;
  EXPECT_NE(message.find("operator ~~"), std::string::npos) << message;
  const char* hint = PQresultErrorField(res, PG_DIAG_MESSAGE_HINT);
  ASSERT_NE(hint, nullptr);
  EXPECT_EQ(std::string(hint),
            "Simplify the publication's WHERE clause to comparisons of columns with constants, "
            "or filter in the consumer.");
  PQclear(res);
  // A publication without a filter for the same action makes the filter irrelevant: accepted.
  pg.exec("CREATE PUBLICATION pf_all_ins FOR TABLE ins WITH (publish = 'insert')");
  res = PQexec(conn,
               "START_REPLICATION SLOT \"bad\" LOGICAL 0/0 (proto_version '1', "
               "publication_names 'pf_bad,pf_all_ins')");
  EXPECT_EQ(PQresultStatus(res), PGRES_COPY_BOTH) << PQerrorMessage(conn);
  PQclear(res);
  PQfinish(conn);
}

// ALTER PUBLICATION while a consumer streams: pgrelay's walsender follows each change from the
// position where it committed, as a native slot's does, with either capture. The consumer keeps
// up step by step (pgrelay reads publications as they are when it meets the change, a native
// slot as they were then: the two agree for a consumer that is not behind).
class PublicationChangeTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PublicationChangeTest, StreamingConsumerFollowsAlterPublicationAsANativeSlotDoes) {
  const bool native_capture = GetParam() == "native";
  PgServerOptions options;
  options.settings["track_commit_timestamp"] = "on";
  PgServer pg(options);
  RelayHarness relay(pg, RelayOptions{false, true});
  pg.exec(
      "CREATE TABLE t1 (id int PRIMARY KEY, a text, b int);"
      "CREATE TABLE t2 (id int PRIMARY KEY, a text, b int);"
      "CREATE TABLE t3 (id int PRIMARY KEY, v text);"
      "CREATE PUBLICATION pub_live FOR TABLE t1;"
      "CREATE PUBLICATION pub_other FOR TABLE t2, t3;");

  std::unique_ptr<capture::TriggerPoller> poller;
  std::unique_ptr<capture::NativeCapture> native;
  char tmpl[] = "/tmp/pgrelay-pubchange-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  if (native_capture) {
    capture::NativeCaptureOptions capture_options;
    capture_options.conninfo = pg.conninfo();
    capture_options.slot = "pgrelay_capture_test";
    capture_options.spill_dir = std::string(tmpl) + "/spill";
    auto started = capture::NativeCapture::start(capture_options, relay.log());
    ASSERT_TRUE(started.ok()) << started.error().to_string();
    ASSERT_TRUE((*started)->setup_report().event_trigger);
    native = std::move(*started);
  } else {
    auto session = capture::PgSession::connect(pg.conninfo());
    ASSERT_TRUE(session.ok()) << session.error().to_string();
    capture::InstallOptions install_options;
    install_options.all_publications = true;
    auto installed = capture::install(**session, install_options);
    ASSERT_TRUE(installed.ok()) << installed.error().to_string();
    ASSERT_TRUE(installed->event_trigger);
    capture::PollerOptions poller_options;
    poller_options.conninfo = pg.conninfo();
    poller_options.spill_dir = std::string(tmpl) + "/spill";
    auto opened = capture::TriggerPoller::open(poller_options, relay.log());
    ASSERT_TRUE(opened.ok()) << opened.error().to_string();
    poller = std::move(*opened);
  }
  auto capture_now = [&] {
    if (native) {
      auto synced = native->sync();
      ASSERT_TRUE(synced.ok()) << synced.error().to_string();
    } else {
      auto polled = poller->poll();
      ASSERT_TRUE(polled.ok()) << polled.error().to_string();
    }
    relay.hub().changed();
  };

  const std::vector<std::pair<std::string, std::string>> stream_options = {
      {"proto_version", "1"}, {"publication_names", "pub_live"}, {"messages", "true"}};
  ReplicationRecorder recorder(pg, "postgres", "nat_live");
  recorder.start("live", stream_options);
  PGconn* conn = PQconnectdb(relay.conninfo("replication=database").c_str());
  ASSERT_EQ(PQstatus(conn), CONNECTION_OK) << PQerrorMessage(conn);
  PGresult* res =
      PQexec(conn, "CREATE_REPLICATION_SLOT \"relay_live\" LOGICAL pgoutput NOEXPORT_SNAPSHOT");
  ASSERT_EQ(PQresultStatus(res), PGRES_TUPLES_OK) << PQerrorMessage(conn);
  PQclear(res);
  res = PQexec(conn,
               "START_REPLICATION SLOT \"relay_live\" LOGICAL 0/0 (proto_version '1', "
               "publication_names 'pub_live', messages 'true')");
  ASSERT_EQ(PQresultStatus(res), PGRES_COPY_BOTH) << PQerrorMessage(conn);
  PQclear(res);
  StreamReader reader(conn);

  const std::vector<std::vector<std::string>> steps = {
      {"INSERT INTO t1 VALUES (1, 'a', 1)", "INSERT INTO t2 VALUES (1, 'a', 1)"},
      // A table added: its rows from then on, its Relation first.
      {"ALTER PUBLICATION pub_live ADD TABLE t2", "INSERT INTO t2 VALUES (2, 'b', 2)",
       "UPDATE t1 SET b = 2"},
      // Actions narrowed: no more updates or deletes.
      {"ALTER PUBLICATION pub_live SET (publish = 'insert')", "UPDATE t1 SET b = 3",
       "INSERT INTO t1 VALUES (3, 'c', 3)", "DELETE FROM t2 WHERE id = 1"},
      // A table dropped from the publication.
      {"ALTER PUBLICATION pub_live SET (publish = 'insert, update, delete, truncate')",
       "ALTER PUBLICATION pub_live DROP TABLE t1", "INSERT INTO t1 VALUES (4, 'd', 4)",
       "UPDATE t2 SET b = 5"},
      // A column list and a row filter set on a published table.
      {"ALTER PUBLICATION pub_live SET TABLE t2 (id, a) WHERE (id > 10)",
       "INSERT INTO t2 VALUES (5, 'e', 5), (15, 'f', 15)", "UPDATE t2 SET a = 'g'"},
      // Another table added, then renamed: still published under its new name.
      {"ALTER PUBLICATION pub_live ADD TABLE t3", "INSERT INTO t3 VALUES (1, 'x')",
       "ALTER TABLE t3 RENAME TO t3r", "INSERT INTO t3r VALUES (2, 'y')"},
      // Within one transaction: the changes after the ALTER follow it, those before do not.
      // (One ALTER: a second one would be read already at the first, see the README.)
      {"BEGIN; INSERT INTO t1 VALUES (6, 'h', 6); UPDATE t3r SET v = 'z';"
       " ALTER PUBLICATION pub_live ADD TABLE t1 (id, b); INSERT INTO t1 VALUES (7, 'i', 7);"
       " UPDATE t1 SET a = 'j'; UPDATE t3r SET v = 'w'; COMMIT"},
  };
  PgConnection writer(pg.conninfo());
  for (std::size_t i = 0; i < steps.size(); ++i) {
    SCOPED_TRACE("step " + std::to_string(i));
    for (const auto& sql : steps[i]) writer.exec(sql);
    // The step's end, a message both streams carry: the upstream's own, and (trigger capture
    // does not see those) the same through the capture's emit_message.
    const std::string step = std::to_string(i);
    writer.exec("SELECT pg_logical_emit_message(true, 'step', '" + step + "')" +
                (native_capture ? "" : ", _pgrelay.emit_message(true, 'step', '" + step + "')"));
    capture_now();
    bool step_seen = false;  // then its Commit ends the step
    ASSERT_TRUE(reader.read_until(
        [&](const pgoutput::Message& m) {
          auto* l = std::get_if<pgoutput::LogicalMessage>(&m);
          if (l != nullptr && l->prefix == "step" && l->content == step) step_seen = true;
          return step_seen && std::holds_alternative<pgoutput::Commit>(m);
        },
        std::chrono::seconds(20)))
        << reader.result.sqlstate << " " << reader.result.error;
  }
  PQfinish(conn);
  pg.exec(ReplicationRecorder::end_marker_sql("live"));
  // pgrelay's own messages (its publication marker, native capture's barriers) are in the
  // upstream's WAL too; a consumer of the upstream sees them, pgrelay's consumers do not.
  // A transaction left with nothing is one pgoutput skips.
  std::vector<pgoutput::Message> native_messages;
  for (auto& m : decode_native(recorder.finish("live"))) {
    auto* l = std::get_if<pgoutput::LogicalMessage>(&m);
    if (l != nullptr && l->prefix.starts_with("pgrelay.")) continue;
    if (std::holds_alternative<pgoutput::Commit>(m) && !native_messages.empty() &&
        std::holds_alternative<pgoutput::Begin>(native_messages.back())) {
      native_messages.pop_back();
      continue;
    }
    native_messages.push_back(std::move(m));
  }
  const auto want = without_repeated_relations(std::move(native_messages));
  const auto got = without_repeated_relations(reader.result.messages);

  // The workload did what it is meant to: t2 and the renamed t3 came in, t1 went out.
  std::set<std::string> tables;
  for (const auto& m : want) {
    if (auto* r = std::get_if<pgoutput::Relation>(&m)) tables.insert(r->name);
  }
  EXPECT_EQ(tables, (std::set<std::string>{"t1", "t2", "t3", "t3r"}));
  expect_same_messages(got, want);
  if (native) native->stop();
  std::error_code ec;
  std::filesystem::remove_all(tmpl, ec);
}

INSTANTIATE_TEST_SUITE_P(Capture, PublicationChangeTest, ::testing::Values("trigger", "native"),
                         [](const auto& param_info) { return param_info.param; });

}  // namespace
}  // namespace pgrelay::test
