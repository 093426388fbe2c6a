// pgoutput binary mode: pgrelay's walsender with binary 'true' against a native PostgreSQL 15
// slot with binary 'true' for the same workload, with either capture (identical decoded
// messages, value bytes included, LSNs excepted), and a text stream of the same publication
// beside it.
#include <libpq-fe.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "capture/native/native_capture.h"
#include "capture/trigger/installer.h"
#include "capture/trigger/pg_session.h"
#include "capture/trigger/poller.h"
#include "replication_recorder.h"
#include "server_fixture.h"
#include "stream_compare.h"

namespace pgrelay::test {
namespace {

// A base type made only of input and output functions (borrowed from text): no send function,
// so pgoutput sends it as text even in binary mode, as it does aclitem.
constexpr const char* kSchema = R"sql(
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN posint AS int CHECK (VALUE > 0);
CREATE TYPE pair AS (a int, b text, c float8);
CREATE TYPE nosend;
CREATE FUNCTION nosend_in(cstring) RETURNS nosend LANGUAGE internal IMMUTABLE STRICT AS 'textin';
CREATE FUNCTION nosend_out(nosend) RETURNS cstring LANGUAGE internal IMMUTABLE STRICT
  AS 'textout';
CREATE TYPE nosend (INPUT = nosend_in, OUTPUT = nosend_out, LIKE = text);
CREATE TABLE bin_t (
  id int8 PRIMARY KEY, i2 int2, i4 int4, n numeric, nf numeric(40, 20), f4 float4, f8 float8,
  flag bool, t text, vc varchar(10), ch char(5), b bytea, d date, tm time, tmtz timetz,
  ts timestamp, tstz timestamptz, iv interval, u uuid, js json, jb jsonb, ip inet, net cidr,
  mac macaddr, ia int4[], ta text[], ia2 int4[], m mood, p posint, pr pair, r4 int4range,
  rtz tstzrange, tv tsvector, cash money, bits bit(4), vbits varbit, o oid, acl aclitem,
  ns nosend, x xml);
CREATE TABLE bin_toast (id int PRIMARY KEY, big text, small text, bin bytea);
ALTER TABLE bin_toast ALTER big SET STORAGE EXTERNAL;
ALTER TABLE bin_toast ALTER bin SET STORAGE EXTERNAL;
CREATE TABLE bin_full (id int, v numeric, w timestamptz, s text);
ALTER TABLE bin_full REPLICA IDENTITY FULL;
CREATE PUBLICATION bin_pub FOR TABLE bin_t, bin_toast, bin_full;
)sql";

// The writer's settings differ from every setting text values are printed under.
constexpr const char* kWriterSettings =
    "SET TimeZone = 'America/St_Johns'; SET IntervalStyle = 'sql_standard'; "
    "SET DateStyle = 'German, DMY'; SET extra_float_digits = 0; SET bytea_output = 'escape'";

const char* const kWorkload[] = {
    "INSERT INTO bin_t VALUES (1, -32768, 2147483647, 'NaN', "
    "'123456789012345678.12345678901234567890', 'Infinity', '-Infinity', true, "
    "E'multi\\nline ''q'' \\\\ \\u00e9', 'short', 'ab', '\\xdeadbeef00', '0044-03-15 BC', "
    "'23:59:59.999999', '12:00+05:45', '2000-01-01 00:00:00.000001', '1999-12-31 23:59:59.5+14', "
    "'1 year 2 mons -3 days 04:05:06.789', 'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11', "
    "'{ \"spaces\" : [1, 2] }', '{\"z\": null, \"a\": \"\\u00e9\", \"n\": 1.50}', "
    "'::ffff:1.2.3.4/128', '10.1.0.0/16', '08:00:2b:01:02:03', '{1,NULL,3}', "
    "ARRAY['', NULL, 'NULL', 'a\"b', 'c\\d', ' lead'], '[0:1][1:2]={{1,2},{3,NULL}}', 'happy', "
    "42, ROW(1, 'x \"y\"', 0.1), '[1,10)', '[2024-01-01 00:00+00,infinity)', "
    "'the quick brown fox', 12.34, B'1010', B'101', 4294967295, 'postgres=arwdDxt/postgres', "
    "'no send here', 'a fragment, <a b=\"1\">t&amp;</a> not a document')",
    "INSERT INTO bin_t (id, n, nf, f4, f8, d, tstz, iv, ia2, r4) VALUES (2, '-0.000100', "
    "'-0.00000000000000000001', 'NaN', '-0', 'infinity', '-infinity', '-178000000 years', "
    "'{{1,2,3},{4,5,6}}', 'empty')",
    "INSERT INTO bin_t (id) VALUES (3)",
    "UPDATE bin_t SET t = 'changed', f8 = 2.5, tstz = '2024-06-01 12:00:00.123456+02' WHERE id = 1",
    "UPDATE bin_t SET id = 4 WHERE id = 2",
    "DELETE FROM bin_t WHERE id = 3",
    // TOAST: out-of-line values unchanged by an update are sent as 'u', in binary mode too.
    "INSERT INTO bin_toast VALUES (1, repeat(md5('a'), 200), 's', "
    "decode(repeat(md5('b'), 100), 'hex'))",
    "UPDATE bin_toast SET small = 't'",
    "UPDATE bin_toast SET big = big || 'x', small = 'u'",
    "DELETE FROM bin_toast",
    // REPLICA IDENTITY FULL: old rows in binary.
    "INSERT INTO bin_full VALUES (1, 1.50, '2024-06-01 12:00+02', 'a'), (2, NULL, NULL, NULL)",
    "UPDATE bin_full SET v = v * 2",
    "DELETE FROM bin_full WHERE id = 2",
    // More values than one conversion query takes.
    "INSERT INTO bin_full SELECT g, g / 7.0, '2024-01-01 00:00+00'::timestamptz + g * "
    "interval '1 minute', 'row ' || g FROM generate_series(1, 400) g",
};

// Messages as a consumer of the publication sees them: LSNs, logical messages (pgrelay's own
// marker and native capture's barriers are in the upstream's WAL, and the test's end marker)
// and the transactions left empty without them dropped, repeated Relations dropped.
std::vector<pgoutput::Message> comparable(std::vector<pgoutput::Message> in) {
  std::vector<pgoutput::Message> out;
  for (auto& m : in) {
    if (std::holds_alternative<pgoutput::LogicalMessage>(m)) continue;
    if (std::holds_alternative<pgoutput::Commit>(m) && !out.empty() &&
        std::holds_alternative<pgoutput::Begin>(out.back())) {
      out.pop_back();
      continue;
    }
    out.push_back(std::move(m));
  }
  return without_repeated_relations(std::move(out));
}

const pgoutput::Tuple* new_tuple(const pgoutput::Message& m) {
  if (auto* i = std::get_if<pgoutput::Insert>(&m)) return &i->new_tuple;
  if (auto* u = std::get_if<pgoutput::Update>(&m)) return &u->new_tuple;
  return nullptr;
}

const pgoutput::Tuple* old_tuple(const pgoutput::Message& m) {
  if (auto* u = std::get_if<pgoutput::Update>(&m)) return u->old ? &u->old->tuple : nullptr;
  if (auto* d = std::get_if<pgoutput::Delete>(&m)) return &d->old.tuple;
  return nullptr;
}

// The value kinds of a stream's tuples ('n', 'u', 't', 'b'), and per column name of bin_t the
// kinds its non-NULL values came as.
struct Kinds {
  std::set<char> all;
  std::map<std::string, std::set<char>> bin_t_columns;
};

Kinds kinds_of(const std::vector<pgoutput::Message>& messages) {
  Kinds k;
  std::map<pgoutput::Oid, pgoutput::Relation> relations;
  for (const auto& m : messages) {
    if (auto* r = std::get_if<pgoutput::Relation>(&m)) relations[r->oid] = *r;
    for (const pgoutput::Tuple* t : {new_tuple(m), old_tuple(m)}) {
      if (t == nullptr) continue;
      pgoutput::Oid oid = 0;
      if (auto* i = std::get_if<pgoutput::Insert>(&m)) oid = i->relation_oid;
      if (auto* u = std::get_if<pgoutput::Update>(&m)) oid = u->relation_oid;
      if (auto* d = std::get_if<pgoutput::Delete>(&m)) oid = d->relation_oid;
      const pgoutput::Relation& rel = relations[oid];
      for (std::size_t c = 0; c < t->columns.size(); ++c) {
        const char kind = static_cast<char>(t->columns[c].kind);
        k.all.insert(kind);
        if (rel.name == "bin_t" && kind != 'n' && c < rel.columns.size()) {
          k.bin_t_columns[rel.columns[c].name].insert(kind);
        }
      }
    }
  }
  return k;
}

// Conversion queries a stream's transactions need when each is converted once: one per
// kMaxValuesPerQuery binary values of a transaction.
std::size_t conversions_needed(const std::vector<pgoutput::Message>& messages) {
  std::size_t queries = 0, values = 0;
  for (const auto& m : messages) {
    for (const pgoutput::Tuple* t : {new_tuple(m), old_tuple(m)}) {
      if (t == nullptr) continue;
      for (const auto& v : t->columns) values += v.kind == pgoutput::ValueKind::kBinary;
    }
    if (std::holds_alternative<pgoutput::Commit>(m)) {
      const std::size_t per = server::BinaryConverter::kMaxValuesPerQuery;
      queries += (values + per - 1) / per;
      values = 0;
    }
  }
  return queries;
}

PGconn* start_relay_stream(RelayHarness& relay, const std::string& slot,
                           const std::string& options) {
  PGconn* c = PQconnectdb(relay.conninfo("replication=database").c_str());
  EXPECT_EQ(PQstatus(c), CONNECTION_OK) << PQerrorMessage(c);
  const std::string sql = "START_REPLICATION SLOT \"" + slot + "\" LOGICAL 0/0 (" + options + ")";
  PGresult* res = PQexec(c, sql.c_str());
  EXPECT_EQ(PQresultStatus(res), PGRES_COPY_BOTH) << PQerrorMessage(c);
  PQclear(res);
  return c;
}

class BinaryModeTest : public ::testing::TestWithParam<std::string> {};

TEST_P(BinaryModeTest, BinaryStreamEqualsANativeSlotsAndTextStreamBesideIt) {
  const bool native_capture = GetParam() == "native";
  PgServerOptions options;
  options.settings["track_commit_timestamp"] = "on";
  options.settings["timezone"] = "'Asia/Kathmandu'";
  PgServer pg(options);
  RelayHarness relay(pg, RelayOptions{false, true});
  pg.exec(kSchema);
  pg.exec("GRANT SELECT ON ALL TABLES IN SCHEMA public TO app");
  // The upstream role pgrelay converts values as (the harness's `app`) reads text otherwise
  // than values are printed: the conversion must pin what it needs (an xml fragment is no
  // document).
  pg.exec(
      "ALTER ROLE app SET xmloption = 'document'; ALTER ROLE app SET DateStyle = 'SQL, DMY'; "
      "ALTER ROLE app SET IntervalStyle = 'sql_standard'");

  char tmpl[] = "/tmp/pgrelay-binary-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  std::unique_ptr<capture::TriggerPoller> poller;
  std::unique_ptr<capture::NativeCapture> native;
  if (native_capture) {
    capture::NativeCaptureOptions capture_options;
    capture_options.conninfo = pg.conninfo();
    capture_options.slot = "pgrelay_capture_test";
    capture_options.spill_dir = std::string(tmpl) + "/spill";
    auto started = capture::NativeCapture::start(capture_options, relay.log());
    ASSERT_TRUE(started.ok()) << started.error().to_string();
    native = std::move(*started);
  } else {
    auto session = capture::PgSession::connect(pg.conninfo());
    ASSERT_TRUE(session.ok()) << session.error().to_string();
    capture::InstallOptions install_options;
    install_options.all_publications = true;
    auto installed = capture::install(**session, install_options);
    ASSERT_TRUE(installed.ok()) << installed.error().to_string();
    capture::PollerOptions poller_options;
    poller_options.conninfo = pg.conninfo();
    poller_options.spill_dir = std::string(tmpl) + "/spill";
    auto opened = capture::TriggerPoller::open(poller_options, relay.log());
    ASSERT_TRUE(opened.ok()) << opened.error().to_string();
    poller = std::move(*opened);
  }

  ReplicationRecorder native_binary(pg, "postgres", "nat_binary");
  native_binary.start("binary", {{"proto_version", "1"},
                                 {"publication_names", "bin_pub"},
                                 {"binary", "true"},
                                 {"messages", "true"}});
  ReplicationRecorder native_text(pg, "postgres", "nat_text");
  native_text.start(
      "text", {{"proto_version", "1"}, {"publication_names", "bin_pub"}, {"messages", "true"}});
  {
    PGconn* conn = PQconnectdb(relay.conninfo("replication=database").c_str());
    ASSERT_EQ(PQstatus(conn), CONNECTION_OK) << PQerrorMessage(conn);
    for (const char* slot : {"relay_bin1", "relay_bin4", "relay_text"}) {
      const std::string sql = std::string("CREATE_REPLICATION_SLOT \"") + slot +
                              "\" LOGICAL pgoutput NOEXPORT_SNAPSHOT";
      PGresult* res = PQexec(conn, sql.c_str());
      ASSERT_EQ(PQresultStatus(res), PGRES_TUPLES_OK) << PQerrorMessage(conn);
      PQclear(res);
    }
    PQfinish(conn);
  }

  PgConnection writer(pg.conninfo());
  writer.exec(kWriterSettings);
  for (const char* sql : kWorkload) writer.exec(sql);
  pg.exec(ReplicationRecorder::end_marker_sql("binary"));
  pg.exec(ReplicationRecorder::end_marker_sql("text"));
  const auto want_binary = comparable(decode_native(native_binary.finish("binary")));
  const auto want_text = comparable(decode_native(native_text.finish("text")));

  if (native) {
    auto synced = native->sync();
    ASSERT_TRUE(synced.ok()) << synced.error().to_string();
  } else {
    auto polled = poller->poll();
    ASSERT_TRUE(polled.ok()) << polled.error().to_string();
  }
  relay.hub().changed();

  // Three consumers at once: two binary ones (protocol versions 1 and 4 send the same messages
  // for whole transactions, so they share one view) and a text one of the same publication.
  PGconn* bin1 = start_relay_stream(
      relay, "relay_bin1", "proto_version '1', publication_names 'bin_pub', binary 'true'");
  PGconn* bin4 = start_relay_stream(relay, "relay_bin4",
                                    "proto_version '4', publication_names 'bin_pub', binary 'on'");
  PGconn* text =
      start_relay_stream(relay, "relay_text", "proto_version '1', publication_names 'bin_pub'");
  const std::size_t commits = count_commits(want_binary);
  Streamed got_bin1 = stream_from(bin1, commits);
  Streamed got_bin4 = stream_from(bin4, commits);
  Streamed got_text = stream_from(text, count_commits(want_text));
  PQfinish(bin1);
  PQfinish(bin4);
  PQfinish(text);

  for (auto* got : {&got_bin1, &got_bin4, &got_text}) {
    EXPECT_EQ(got->sqlstate, "") << got->error;
  }
  {
    SCOPED_TRACE("binary, protocol 1");
    expect_same_messages(comparable(std::move(got_bin1.messages)), want_binary);
  }
  {
    SCOPED_TRACE("binary, protocol 4");
    expect_same_messages(comparable(std::move(got_bin4.messages)), want_binary);
  }
  {
    SCOPED_TRACE("text beside binary");
    expect_same_messages(comparable(std::move(got_text.messages)), want_text);
  }

  // The workload is what it means to be: every kind of value, the types without a send
  // function as text and every other type in binary, and no binary in the text stream.
  const Kinds binary_kinds = kinds_of(want_binary);
  EXPECT_EQ(binary_kinds.all, (std::set<char>{'n', 'u', 't', 'b'}));
  for (const auto& [column, kinds] : binary_kinds.bin_t_columns) {
    const bool text_only = column == "acl" || column == "ns";
    EXPECT_EQ(kinds, std::set<char>{text_only ? 't' : 'b'}) << column;
  }
  EXPECT_EQ(binary_kinds.bin_t_columns.size(), 40u);
  EXPECT_EQ(kinds_of(want_text).all, (std::set<char>{'n', 'u', 't'}));
  // Encoded once for both binary consumers: each transaction converted once.
  EXPECT_EQ(relay.hub().binary_converter().conversions(), conversions_needed(want_binary));
  EXPECT_GE(conversions_needed(want_binary), 12u);

  if (native) native->stop();
  std::error_code ec;
  std::filesystem::remove_all(tmpl, ec);
}

INSTANTIATE_TEST_SUITE_P(Capture, BinaryModeTest, ::testing::Values("trigger", "native"),
                         [](const auto& param_info) { return param_info.param; });

}  // namespace
}  // namespace pgrelay::test
