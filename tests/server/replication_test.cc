// Replication sessions through pgrelay against a log the test feeds directly: slot commands,
// exported snapshots, START_REPLICATION with pgoutput, standby status, resume and errors.
#include <libpq-fe.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "base/logger.h"
#include "log/transaction.h"
#include "pgoutput/decoder.h"
#include "server_fixture.h"
#include "wire/replication_frames.h"

namespace pgrelay::test {
namespace {

using wire::Lsn;

PgServerOptions replica_options() {
  PgServerOptions options;
  options.settings["wal_level"] = "replica";
  return options;
}

pgoutput::Relation relation(pgoutput::Oid oid, const std::string& name) {
  pgoutput::Relation rel;
  rel.oid = oid;
  rel.namespace_name = "public";
  rel.name = name;
  rel.columns.push_back({pgoutput::kColumnIsKey, "id", 23, -1});
  rel.columns.push_back({0, "note", 25, -1});
  return rel;
}

// Appends `count` transactions, each inserting one (id, note) into `table` with ids from
// `first_id` and a note of at least `note_bytes`, in one batch; returns the last end LSN.
Lsn append_inserts(log::ChangeLog& log, pgoutput::Oid oid, const std::string& table, int first_id,
                   std::uint32_t first_xid, int count = 1, std::size_t note_bytes = 0) {
  std::vector<log::EncodedEntry> encoded;
  Lsn base = std::max(log.last_end_lsn(), Lsn(0x1000000));
  for (int i = 0; i < count; ++i) {
    base = base + 0x100 + note_bytes;
    int id = first_id + i;
    log::Transaction txn;
    txn.header.begin_lsn = base;
    txn.header.commit_lsn = base + 0x40;
    txn.header.end_lsn = base + 0x48;
    txn.header.commit_time = 1000000 + id;
    txn.header.xid = first_xid + static_cast<std::uint32_t>(i);
    txn.changes.push_back({base + 8, relation(oid, table)});
    pgoutput::Insert insert;
    insert.relation_oid = oid;
    std::string note = "row " + std::to_string(id);
    note.resize(std::max(note.size(), note_bytes), '.');
    insert.new_tuple.columns = {pgoutput::TupleValue::text(std::to_string(id)),
                                pgoutput::TupleValue::text(note)};
    txn.changes.push_back({base + 16, insert});
    auto one = log::encode_transaction(txn);
    EXPECT_TRUE(one.ok()) << one.error().message;
    encoded.push_back(std::move(*one));
  }
  std::vector<log::PendingEntry> pending;
  for (const auto& e : encoded) pending.push_back(e.pending());
  auto appended = log.append(pending);
  EXPECT_TRUE(appended.ok()) << appended.error().message;
  return log.last_end_lsn();
}

// Appends one transaction inserting `rows` rows with notes of `note_bytes` into `table`.
Lsn append_wide_transaction(log::ChangeLog& log, pgoutput::Oid oid, const std::string& table,
                            int first_id, std::uint32_t xid, int rows, std::size_t note_bytes) {
  Lsn base = std::max(log.last_end_lsn(), Lsn(0x1000000)) + 0x100;
  log::Transaction txn;
  txn.header.begin_lsn = base;
  txn.header.xid = xid;
  txn.header.commit_time = 2000000 + first_id;
  txn.changes.push_back({base + 8, relation(oid, table)});
  Lsn at = base + 16;
  for (int i = 0; i < rows; ++i) {
    pgoutput::Insert insert;
    insert.relation_oid = oid;
    insert.new_tuple.columns = {pgoutput::TupleValue::text(std::to_string(first_id + i)),
                                pgoutput::TupleValue::text(std::string(note_bytes, 'w'))};
    txn.changes.push_back({at, insert});
    at = at + note_bytes + 0x40;
  }
  txn.header.commit_lsn = at;
  txn.header.end_lsn = at + 8;
  auto encoded = log::encode_transaction(txn);
  EXPECT_TRUE(encoded.ok()) << encoded.error().message;
  std::vector<log::PendingEntry> pending{encoded->pending()};
  auto appended = log.append(pending);
  EXPECT_TRUE(appended.ok()) << appended.error().message;
  return log.last_end_lsn();
}

Lsn append_insert(log::ChangeLog& log, pgoutput::Oid oid, const std::string& table, int id,
                  std::uint32_t xid) {
  return append_inserts(log, oid, table, id, xid);
}

class ReplicationTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    pg_ = new PgServer(replica_options());
    relay_ = new RelayHarness(*pg_, RelayOptions{false, true});
    pg_->exec(
        "CREATE TABLE t1 (id int primary key, note text); CREATE TABLE t2 (id int primary "
        "key, note text); CREATE PUBLICATION pub1 FOR TABLE t1; GRANT SELECT ON t1, t2 TO app; "
        "CREATE PUBLICATION pub_rowfilter FOR TABLE t2 WHERE (note LIKE 'x%')");
  }
  static void TearDownTestSuite() {
    delete relay_;
    delete pg_;
  }
  PGconn* replication_connection() {
    PGconn* conn = PQconnectdb(relay_->conninfo("replication=database").c_str());
    EXPECT_EQ(PQstatus(conn), CONNECTION_OK) << PQerrorMessage(conn);
    return conn;
  }
  // Logs hold the upstream's OIDs (both captures record them), so the appended data does too.
  static pgoutput::Oid oid_of(const std::string& table) {
    return static_cast<pgoutput::Oid>(
        std::stoul(pg_->scalar("SELECT '" + table + "'::regclass::oid::int8")));
  }
  static PgServer* pg_;
  static RelayHarness* relay_;
};
PgServer* ReplicationTest::pg_ = nullptr;
RelayHarness* ReplicationTest::relay_ = nullptr;

// Reads XLogData messages (decoded) until `count` Commits arrived or the timeout passed,
// answering keepalives that ask for a reply.
struct Received {
  std::vector<pgoutput::Message> messages;
  std::vector<Lsn> wal_starts;
  std::vector<std::int64_t> send_times;
};
// The first column of each Insert received, in order.
std::vector<std::string> inserted_ids(const Received& received) {
  std::vector<std::string> ids;
  for (const auto& m : received.messages) {
    if (auto* i = std::get_if<pgoutput::Insert>(&m)) ids.push_back(i->new_tuple.columns[0].bytes);
  }
  return ids;
}

// Reads until `commits` Commits arrived or `timeout` passed. A stream read in several calls
// passes its own `decoder`, which remembers the Relations sent earlier.
Received receive(PGconn* conn, int commits, std::chrono::seconds timeout = std::chrono::seconds(10),
                 pgoutput::Decoder* stream_decoder = nullptr) {
  Received out;
  pgoutput::Decoder own_decoder(pgoutput::DecoderOptions{1, false});
  pgoutput::Decoder& decoder = stream_decoder != nullptr ? *stream_decoder : own_decoder;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  int seen = 0;
  while (seen < commits && std::chrono::steady_clock::now() < deadline) {
    char* buffer = nullptr;
    int n = PQgetCopyData(conn, &buffer, 1);
    if (n == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      PQconsumeInput(conn);
      continue;
    }
    if (n < 0) break;
    ByteView payload(reinterpret_cast<const std::uint8_t*>(buffer), static_cast<std::size_t>(n));
    auto frame = wire::parse_from_server(payload);
    EXPECT_TRUE(frame.ok());
    if (auto* x = std::get_if<wire::XLogData>(&*frame)) {
      auto message = decoder.decode(x->data);
      EXPECT_TRUE(message.ok()) << message.error().message;
      if (std::holds_alternative<pgoutput::Commit>(*message)) ++seen;
      out.messages.push_back(*message);
      out.wal_starts.push_back(x->wal_start);
      out.send_times.push_back(x->send_time);
    }
    PQfreemem(buffer);
  }
  return out;
}

// Runs one replication command; success means the result status `want`.
::testing::AssertionResult command_ok(PGconn* conn, const std::string& sql, ExecStatusType want) {
  PGresult* res = PQexec(conn, sql.c_str());
  const ExecStatusType got = PQresultStatus(res);
  PQclear(res);
  if (got == want) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << sql << ": " << PQresStatus(got) << ": " << PQerrorMessage(conn);
}

void send_flush(PGconn* conn, Lsn lsn) {
  wire::StandbyStatusUpdate status;
  status.write = status.flush = status.apply = lsn;
  status.send_time = wire::to_pg_timestamp(std::chrono::system_clock::now());
  Bytes payload = wire::encode(status);
  ASSERT_EQ(PQputCopyData(conn, reinterpret_cast<const char*>(payload.data()),
                          static_cast<int>(payload.size())),
            1);
  ASSERT_EQ(PQflush(conn), 0);
}

TEST_F(ReplicationTest, IdentifySystemReportsTheLog) {
  PGconn* conn = replication_connection();
  PGresult* res = PQexec(conn, "IDENTIFY_SYSTEM");
  ASSERT_EQ(PQresultStatus(res), PGRES_TUPLES_OK) << PQerrorMessage(conn);
  EXPECT_EQ(std::string(PQgetvalue(res, 0, 0)), std::to_string(relay_->log().system_id()));
  EXPECT_STREQ(PQgetvalue(res, 0, 1), "1");
  EXPECT_STREQ(PQgetvalue(res, 0, 3), "postgres");
  PQclear(res);
  // SQL on a replication connection goes to the upstream; wal_level is pgrelay's.
  res = PQexec(conn, "SHOW wal_level");
  EXPECT_STREQ(PQgetvalue(res, 0, 0), "logical");
  PQclear(res);
  res = PQexec(conn, "SELECT 6 * 7");
  EXPECT_STREQ(PQgetvalue(res, 0, 0), "42");
  PQclear(res);
  PQfinish(conn);
}

TEST_F(ReplicationTest, SlotWithExportedSnapshotAndStreaming) {
  PGconn* conn = replication_connection();
  PGresult* res = PQexec(conn, "CREATE_REPLICATION_SLOT \"s_stream\" LOGICAL pgoutput");
  ASSERT_EQ(PQresultStatus(res), PGRES_TUPLES_OK) << PQerrorMessage(conn);
  std::string consistent = PQgetvalue(res, 0, 1);
  std::string snapshot = PQgetvalue(res, 0, 2);
  EXPECT_STREQ(PQgetvalue(res, 0, 0), "s_stream");
  EXPECT_STREQ(PQgetvalue(res, 0, 3), "pgoutput");
  PQclear(res);
  // The exported snapshot is real: another session imports it while the slot's creator waits.
  {
    PgConnection importer(relay_->conninfo());
    importer.exec("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY");
    importer.exec("SET TRANSACTION SNAPSHOT '" + snapshot + "'");
    EXPECT_EQ(importer.scalar("SELECT count(*) FROM t1"), "0");
    importer.exec("COMMIT");
  }
  // A second slot with the same name is refused as Postgres refuses it.
  res = PQexec(conn, "CREATE_REPLICATION_SLOT \"s_stream\" LOGICAL pgoutput");
  EXPECT_STREQ(PQresultErrorField(res, PG_DIAG_SQLSTATE), "42710");
  PQclear(res);

  Lsn first = append_insert(relay_->log(), oid_of("t1"), "t1", 1, 700);
  append_insert(relay_->log(), oid_of("t2"), "t2", 2, 701);  // not in pub1
  Lsn third = append_insert(relay_->log(), oid_of("t1"), "t1", 3, 702);

  res = PQexec(conn,
               "START_REPLICATION SLOT \"s_stream\" LOGICAL 0/0 (proto_version '1', "
               "publication_names 'pub1')");
  ASSERT_EQ(PQresultStatus(res), PGRES_COPY_BOTH) << PQerrorMessage(conn);
  PQclear(res);
  Received got = receive(conn, 2);
  // Begin, Relation, Insert, Commit for id 1; Begin, Insert, Commit for id 3 (Relation known).
  ASSERT_EQ(got.messages.size(), 7u);
  EXPECT_TRUE(std::holds_alternative<pgoutput::Begin>(got.messages[0]));
  EXPECT_TRUE(std::holds_alternative<pgoutput::Relation>(got.messages[1]));
  auto& insert = std::get<pgoutput::Insert>(got.messages[2]);
  EXPECT_EQ(insert.new_tuple.columns[0].bytes, "1");
  auto& commit = std::get<pgoutput::Commit>(got.messages[3]);
  EXPECT_EQ(commit.end_lsn, first);
  EXPECT_EQ(got.wal_starts[3], first);  // Commit's XLogData starts at the end LSN
  EXPECT_TRUE(std::holds_alternative<pgoutput::Begin>(got.messages[4]));
  EXPECT_EQ(std::get<pgoutput::Insert>(got.messages[5]).new_tuple.columns[0].bytes, "3");
  EXPECT_EQ(std::get<pgoutput::Commit>(got.messages[6]).end_lsn, third);

  // A second walsender on the same slot is refused while this one streams.
  {
    PGconn* other = replication_connection();
    PGresult* busy = PQexec(other,
                            "START_REPLICATION SLOT \"s_stream\" LOGICAL 0/0 (proto_version '1', "
                            "publication_names 'pub1')");
    EXPECT_STREQ(PQresultErrorField(busy, PG_DIAG_SQLSTATE), "55006");
    PQclear(busy);
    PQfinish(other);
  }

  // The flush position moves the slot; then CopyDone ends the stream as Postgres does.
  send_flush(conn, first);
  for (int i = 0; i < 200 && relay_->slots().get("s_stream")->confirmed_flush != first; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(relay_->slots().get("s_stream")->confirmed_flush, first);
  ASSERT_EQ(PQputCopyEnd(conn, nullptr), 1);
  char* buffer = nullptr;
  while (PQgetCopyData(conn, &buffer, 0) > 0) PQfreemem(buffer);
  int completed = 0;
  while ((res = PQgetResult(conn)) != nullptr) {
    EXPECT_EQ(PQresultStatus(res), PGRES_COMMAND_OK) << PQresultErrorMessage(res);
    ++completed;
    PQclear(res);
  }
  EXPECT_GE(completed, 1);

  // Resuming from 0/0 starts at confirmed_flush: only the unconfirmed transaction comes again.
  res = PQexec(conn,
               "START_REPLICATION SLOT \"s_stream\" LOGICAL 0/0 (proto_version '1', "
               "publication_names 'pub1')");
  ASSERT_EQ(PQresultStatus(res), PGRES_COPY_BOTH) << PQerrorMessage(conn);
  PQclear(res);
  Received again = receive(conn, 1);
  ASSERT_FALSE(again.messages.empty());
  EXPECT_EQ(inserted_ids(again), std::vector<std::string>{"3"});
  PQfinish(conn);
  (void)consistent;
}

::testing::AssertionResult create_slot(PGconn* conn, const std::string& name) {
  return command_ok(
      conn, "CREATE_REPLICATION_SLOT \"" + name + "\" LOGICAL pgoutput (SNAPSHOT 'nothing')",
      PGRES_TUPLES_OK);
}

::testing::AssertionResult start_pub1(PGconn* conn, const std::string& slot) {
  return command_ok(conn,
                    "START_REPLICATION SLOT \"" + slot +
                        "\" LOGICAL 0/0 (proto_version '1', publication_names 'pub1')",
                    PGRES_COPY_BOTH);
}

// The cache keeps entries only for a view two sessions use: a session on `slot` (made now, so
// at the log's end, and sent nothing) holds pub1's view while the test's consumers take turns.
PGconn* hold_pub1_view(PGconn* conn, const std::string& slot) {
  EXPECT_TRUE(create_slot(conn, slot));
  EXPECT_TRUE(start_pub1(conn, slot));
  return conn;
}

TEST_F(ReplicationTest, ConsumersOfTheSameViewShareEncodedEntries) {
  PGconn* a = replication_connection();
  PGconn* b = replication_connection();
  for (auto [conn, name] : {std::pair{a, "s_share_a"}, std::pair{b, "s_share_b"}}) {
    ASSERT_TRUE(command_ok(conn,
                           "CREATE_REPLICATION_SLOT \"" + std::string(name) +
                               "\" LOGICAL pgoutput (SNAPSHOT 'nothing')",
                           PGRES_TUPLES_OK));
  }
  // More transactions than EntrySource::kReadPastLimit, so that the second consumer's cursor,
  // left behind while it follows the first one's links, is replaced by a seek at the end.
  constexpr int kTransactions = 100;
  for (int i = 0; i < kTransactions; ++i) {
    append_insert(relay_->log(), oid_of("t1"), "t1", 100 + i, 800 + i);
  }
  PGconn* holder = hold_pub1_view(replication_connection(), "s_share_holder");
  const auto& cache = relay_->hub().encoded_cache();
  const std::size_t hits_before = cache.hits();
  const std::size_t follows_before = cache.follows();
  std::vector<Received> got;
  std::vector<pgoutput::Decoder> decoders(2, pgoutput::Decoder(pgoutput::DecoderOptions{1, false}));
  for (auto [conn, name] : {std::pair{a, "s_share_a"}, std::pair{b, "s_share_b"}}) {
    ASSERT_TRUE(command_ok(conn,
                           "START_REPLICATION SLOT \"" + std::string(name) +
                               "\" LOGICAL 0/0 (proto_version '1', publication_names 'pub1')",
                           PGRES_COPY_BOTH));
    got.push_back(receive(conn, kTransactions, std::chrono::seconds(10), &decoders[got.size()]));
  }
  // Same messages for both; the second consumer was served from the first one's encoding,
  // all but its first transaction through links, without reading the log.
  ASSERT_FALSE(got[0].messages.empty());
  EXPECT_EQ(got[0].messages, got[1].messages);
  EXPECT_EQ(got[0].wal_starts, got[1].wal_starts);
  EXPECT_GE(cache.hits(), hits_before + kTransactions);
  EXPECT_GE(cache.follows(), follows_before + kTransactions - 1);
  // What comes next is read from the log again by both, after the second one's cursor seek.
  append_insert(relay_->log(), oid_of("t1"), "t1", 100 + kTransactions, 900);
  for (std::size_t c = 0; c < 2; ++c) {
    Received more = receive(c == 0 ? a : b, 1, std::chrono::seconds(10), &decoders[c]);
    EXPECT_EQ(inserted_ids(more), std::vector<std::string>{std::to_string(100 + kTransactions)});
  }
  PQfinish(a);
  PQfinish(b);
  PQfinish(holder);
}

// Only another session reads a kept entry: a consumer alone on its view keeps nothing, neither
// of a backlog nor live, and what it sends once a second consumer streams the same view is kept
// and shared.
TEST_F(ReplicationTest, AConsumerAloneOnItsViewKeepsNothingForOthers) {
  PGconn* a = replication_connection();
  PGconn* b = replication_connection();
  ASSERT_TRUE(create_slot(a, "s_lone_a"));
  const auto& cache = relay_->hub().encoded_cache();
  const std::size_t bytes_before = cache.bytes();
  for (int i = 0; i < 5; ++i) append_insert(relay_->log(), oid_of("t1"), "t1", 300 + i, 1300 + i);
  ASSERT_TRUE(start_pub1(a, "s_lone_a"));
  pgoutput::Decoder decoder_a(pgoutput::DecoderOptions{1, false});
  Received backlog = receive(a, 5, std::chrono::seconds(10), &decoder_a);
  EXPECT_EQ(inserted_ids(backlog), (std::vector<std::string>{"300", "301", "302", "303", "304"}));
  for (int i = 5; i < 10; ++i) append_insert(relay_->log(), oid_of("t1"), "t1", 300 + i, 1300 + i);
  Received live = receive(a, 5, std::chrono::seconds(10), &decoder_a);
  EXPECT_EQ(inserted_ids(live), (std::vector<std::string>{"305", "306", "307", "308", "309"}));
  EXPECT_EQ(cache.bytes(), bytes_before);

  // A second consumer of the same view: from now on each entry is encoded once and copied.
  ASSERT_TRUE(create_slot(b, "s_lone_b"));
  ASSERT_TRUE(start_pub1(b, "s_lone_b"));
  pgoutput::Decoder decoder_b(pgoutput::DecoderOptions{1, false});
  const std::size_t hits_before = cache.hits();
  for (int i = 10; i < 15; ++i) append_insert(relay_->log(), oid_of("t1"), "t1", 300 + i, 1300 + i);
  const std::vector<std::string> shared_ids{"310", "311", "312", "313", "314"};
  EXPECT_EQ(inserted_ids(receive(a, 5, std::chrono::seconds(10), &decoder_a)), shared_ids);
  EXPECT_EQ(inserted_ids(receive(b, 5, std::chrono::seconds(10), &decoder_b)), shared_ids);
  EXPECT_GT(cache.bytes(), bytes_before);
  EXPECT_GE(cache.hits(), hits_before + 5);
  PQfinish(a);
  PQfinish(b);
}

// A transaction of more than a write chunk is kept and shared, and sent in several writes; one
// larger than the cache keeps (4 MiB) is streamed to each consumer without being kept. Either
// way each consumer gets every message once, in order, stamped when it was sent.
TEST_F(ReplicationTest, LargeTransactionsAreSentWholeFromTheCacheOrStreamed) {
  PGconn* a = replication_connection();
  PGconn* b = replication_connection();
  for (auto [conn, name] : {std::pair{a, "s_large_a"}, std::pair{b, "s_large_b"}}) {
    ASSERT_TRUE(command_ok(conn,
                           "CREATE_REPLICATION_SLOT \"" + std::string(name) +
                               "\" LOGICAL pgoutput (SNAPSHOT 'nothing')",
                           PGRES_TUPLES_OK));
  }
  constexpr std::size_t kNote = 64 * 1024;
  append_wide_transaction(relay_->log(), oid_of("t1"), "t1", 5000, 900, 10, kNote);  // 640 KiB
  append_wide_transaction(relay_->log(), oid_of("t1"), "t1", 6000, 901, 80, kNote);  // 5 MiB
  PGconn* holder = hold_pub1_view(replication_connection(), "s_large_holder");
  const std::size_t hits_before = relay_->hub().encoded_cache().hits();
  const std::int64_t started = wire::to_pg_timestamp(std::chrono::system_clock::now());
  std::vector<Received> got;
  for (auto [conn, name] : {std::pair{a, "s_large_a"}, std::pair{b, "s_large_b"}}) {
    ASSERT_TRUE(command_ok(conn,
                           "START_REPLICATION SLOT \"" + std::string(name) +
                               "\" LOGICAL 0/0 (proto_version '1', publication_names 'pub1')",
                           PGRES_COPY_BOTH));
    got.push_back(receive(conn, 2, std::chrono::seconds(30)));
  }
  const std::int64_t finished = wire::to_pg_timestamp(std::chrono::system_clock::now());
  for (const Received& r : got) {
    // Begin, Relation, 10 Inserts, Commit; then Begin, 80 Inserts, Commit (Relation known).
    ASSERT_EQ(r.messages.size(), 13u + 82u);
    std::vector<int> ids;
    for (const auto& m : r.messages) {
      if (const auto* ins = std::get_if<pgoutput::Insert>(&m)) {
        ids.push_back(std::stoi(ins->new_tuple.columns[0].bytes));
        EXPECT_EQ(ins->new_tuple.columns[1].bytes.size(), kNote);
      }
    }
    ASSERT_EQ(ids.size(), 90u);
    for (int i = 0; i < 10; ++i) EXPECT_EQ(ids[i], 5000 + i);
    for (int i = 0; i < 80; ++i) EXPECT_EQ(ids[10 + i], 6000 + i);
    EXPECT_TRUE(std::holds_alternative<pgoutput::Begin>(r.messages[13]));
    EXPECT_TRUE(std::holds_alternative<pgoutput::Insert>(r.messages[14]));
    for (std::int64_t t : r.send_times) {
      EXPECT_GE(t, started);
      EXPECT_LE(t, finished);
    }
  }
  EXPECT_EQ(got[0].messages, got[1].messages);
  EXPECT_EQ(got[0].wal_starts, got[1].wal_starts);
  // The second consumer had the first transaction from the cache, the second encoded anew.
  EXPECT_EQ(relay_->hub().encoded_cache().hits(), hits_before + 1);
  PQfinish(a);
  PQfinish(b);
  PQfinish(holder);
}

TEST_F(ReplicationTest, BadStartOptionsGetPostgresErrors) {
  PGconn* conn = replication_connection();
  PGresult* res =
      PQexec(conn, "CREATE_REPLICATION_SLOT \"s_bad\" LOGICAL pgoutput NOEXPORT_SNAPSHOT");
  ASSERT_EQ(PQresultStatus(res), PGRES_TUPLES_OK) << PQerrorMessage(conn);
  EXPECT_TRUE(PQgetisnull(res, 0, 2));
  PQclear(res);
  struct Case {
    const char* options;
    const char* sqlstate;
  } cases[] = {
      {"(proto_version '1', publication_names 'nosuchpub')", "42704"},
      {"(proto_version '9', publication_names 'pub1')", "0A000"},
      {"(publication_names 'pub1')", "22023"},
      {"(proto_version '1', publication_names 'pub_rowfilter')", "0A000"},
  };
  for (const auto& c : cases) {
    std::string sql = std::string("START_REPLICATION SLOT \"s_bad\" LOGICAL 0/0 ") + c.options;
    res = PQexec(conn, sql.c_str());
    EXPECT_EQ(PQresultStatus(res), PGRES_FATAL_ERROR) << c.options;
    EXPECT_STREQ(PQresultErrorField(res, PG_DIAG_SQLSTATE), c.sqlstate) << c.options;
    PQclear(res);
  }
  res = PQexec(conn,
               "START_REPLICATION SLOT \"nosuchslot\" LOGICAL 0/0 (proto_version '1', "
               "publication_names 'pub1')");
  EXPECT_STREQ(PQresultErrorField(res, PG_DIAG_SQLSTATE), "42704");
  PQclear(res);
  res = PQexec(conn, "DROP_REPLICATION_SLOT \"s_bad\"");
  EXPECT_EQ(PQresultStatus(res), PGRES_COMMAND_OK) << PQerrorMessage(conn);
  PQclear(res);
  res = PQexec(conn, "DROP_REPLICATION_SLOT \"s_bad\"");
  EXPECT_STREQ(PQresultErrorField(res, PG_DIAG_SQLSTATE), "42704");
  PQclear(res);
  // The session is still usable after every error.
  res = PQexec(conn, "IDENTIFY_SYSTEM");
  EXPECT_EQ(PQresultStatus(res), PGRES_TUPLES_OK);
  PQclear(res);
  PQfinish(conn);
}

TEST_F(ReplicationTest, TemporarySlotDiesWithItsSession) {
  PGconn* conn = replication_connection();
  PGresult* res = PQexec(
      conn, "CREATE_REPLICATION_SLOT \"s_temp\" TEMPORARY LOGICAL pgoutput (SNAPSHOT 'nothing')");
  ASSERT_EQ(PQresultStatus(res), PGRES_TUPLES_OK) << PQerrorMessage(conn);
  PQclear(res);
  EXPECT_TRUE(relay_->slots().get("s_temp").has_value());
  PQfinish(conn);
  for (int i = 0; i < 200 && relay_->slots().get("s_temp"); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_FALSE(relay_->slots().get("s_temp").has_value());
}

// A consumer starting far behind the head is told in the log how far behind it is while it
// catches up, and when it has caught up (here at every chunk sent instead of every 10 s).
TEST_F(ReplicationTest, CatchUpProgressIsLogged) {
  std::mutex mu;
  std::vector<nlohmann::json> lines;
  LoggerOptions log_options;
  log_options.format = LogFormat::kJson;
  log_options.sink = [&](std::string_view line) {
    std::lock_guard lock(mu);
    lines.push_back(nlohmann::json::parse(line));
  };
  Logger logger(log_options);
  auto with_message = [&](const std::string& message) {
    std::lock_guard lock(mu);
    std::vector<nlohmann::json> found;
    for (const auto& line : lines) {
      if (line["message"] == message) found.push_back(line);
    }
    return found;
  };

  PGconn* conn = replication_connection();
  PGresult* res =
      PQexec(conn, "CREATE_REPLICATION_SLOT \"s_catch_up\" LOGICAL pgoutput (SNAPSHOT 'nothing')");
  ASSERT_EQ(PQresultStatus(res), PGRES_TUPLES_OK) << PQerrorMessage(conn);
  PQclear(res);
  // About 1.5 MB of pgoutput: several of the walsender's write chunks.
  constexpr int kTransactions = 3000;
  Lsn head = append_inserts(relay_->log(), oid_of("t1"), "t1", 20000, 20000, kTransactions, 300);
  // Set while nothing streams; the walsender reads both when it starts.
  relay_->context().logger = &logger;
  relay_->context().settings.catch_up_report_interval = std::chrono::milliseconds(0);
  res = PQexec(conn,
               "START_REPLICATION SLOT \"s_catch_up\" LOGICAL 0/0 (proto_version '1', "
               "publication_names 'pub1')");
  ASSERT_EQ(PQresultStatus(res), PGRES_COPY_BOTH) << PQerrorMessage(conn);
  PQclear(res);
  Received got = receive(conn, kTransactions, std::chrono::seconds(60));
  EXPECT_EQ(std::count_if(got.messages.begin(), got.messages.end(),
                          [](const pgoutput::Message& m) {
                            return std::holds_alternative<pgoutput::Commit>(m);
                          }),
            kTransactions);
  for (int i = 0; i < 500 && with_message("consumer caught up").empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  PQfinish(conn);
  for (int i = 0; i < 500 && relay_->session_count() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(relay_->session_count(), 0u);
  relay_->context().logger = nullptr;
  relay_->context().settings.catch_up_report_interval = std::chrono::seconds(10);

  auto behind = with_message("consumer catching up");
  ASSERT_GE(behind.size(), 2u);
  EXPECT_EQ(behind.front()["slot"], "s_catch_up");
  EXPECT_EQ(behind.front()["head_lsn"], head.to_string());
  std::uint64_t previous = UINT64_MAX;
  for (const auto& line : behind) {  // shrinks as the consumer catches up
    auto bytes = line["behind_bytes"].get<std::uint64_t>();
    EXPECT_GT(bytes, 0u);
    EXPECT_LT(bytes, previous);
    previous = bytes;
  }
  auto done = with_message("consumer caught up");
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0]["slot"], "s_catch_up");
  EXPECT_EQ(done[0]["lsn"], head.to_string());
  EXPECT_GE(done[0]["seconds"].get<double>(), 0.0);
}

}  // namespace
}  // namespace pgrelay::test
