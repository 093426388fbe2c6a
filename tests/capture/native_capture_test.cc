// Native capture against a real PostgreSQL 15: consistent points, restarts, refusals.
#include "capture/native/native_capture.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <future>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "log/change_log.h"
#include "log/transaction.h"
#include "pg_server.h"
#include "upstream/asio_reading_loop.h"

namespace pgrelay::capture {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// A log in a temporary directory, removed afterwards.
class TempLog {
 public:
  TempLog() {
    char tmpl[] = "/tmp/pgrelay-native-XXXXXX";
    dir_ = mkdtemp(tmpl);
    open();
  }
  ~TempLog() {
    log_.reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  void open() {
    log_.reset();
    log::LogOptions options;
    options.dir = dir_ + "/log";
    auto opened = log::ChangeLog::open(options);
    if (!opened.ok()) throw std::runtime_error(opened.error().to_string());
    log_ = std::move(*opened);
  }
  log::ChangeLog& log() { return *log_; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::unique_ptr<log::ChangeLog> log_;
};

NativeCaptureOptions options_for(const test::PgServer& server, const TempLog& log) {
  NativeCaptureOptions options;
  options.conninfo = server.conninfo();
  options.slot = "native_test";
  options.spill_dir = log.dir() + "/spill";
  options.mirror_interval = 100ms;
  return options;
}

// Every logged insert into `table`: (commit LSN, the first column's value), in log order.
std::vector<std::pair<Lsn, std::string>> logged_inserts(log::ChangeLog& log) {
  std::vector<std::pair<Lsn, std::string>> out;
  auto cursor = log.open_cursor(Lsn(0));
  if (!cursor.ok()) throw std::runtime_error(cursor.error().to_string());
  while (true) {
    auto e = (*cursor)->next_entry();
    if (!e.ok()) throw std::runtime_error(e.error().to_string());
    if (!e->has_value()) break;
    auto t = log::read_transaction(**cursor, **e);
    if (!t.ok()) throw std::runtime_error(t.error().to_string());
    for (const auto& c : t->changes) {
      if (auto* insert = std::get_if<pgoutput::Insert>(&c.message)) {
        out.emplace_back(t->header.commit_lsn, insert->new_tuple.columns.at(0).bytes);
      }
    }
  }
  return out;
}

std::vector<std::string> values(const test::Rows& rows) {
  std::vector<std::string> out;
  for (const auto& r : rows) out.push_back(*r.at(0));
  return out;
}

// The snapshot a slot exports sees exactly the transactions the log holds below the consistent
// point; everything after it is in the log at or above it. Writes run throughout.
TEST(NativeCaptureTest, ExportedSnapshotSplitsTheLogAtTheConsistentPoint) {
  test::PgServer server;
  server.exec("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION p FOR TABLE t");
  TempLog log;
  auto capture = NativeCapture::start(options_for(server, log), log.log());
  ASSERT_TRUE(capture.ok()) << capture.error().to_string();

  std::atomic<bool> writing{true};
  std::atomic<int> written{0};
  std::thread writer([&] {
    test::PgConnection c(server.conninfo());
    for (int id = 1; writing || id < 200; ++id) {
      c.exec("INSERT INTO t VALUES (" + std::to_string(id) + ")");
      written = id;
    }
  });
  while (written < 100) std::this_thread::sleep_for(5ms);
  auto exported = (*capture)->export_snapshot();
  ASSERT_TRUE(exported.ok()) << exported.error().to_string();
  test::PgConnection reader(server.conninfo());
  reader.exec("BEGIN ISOLATION LEVEL REPEATABLE READ");
  reader.exec("SET TRANSACTION SNAPSHOT '" + exported->snapshot_name + "'");
  const std::vector<std::string> seen = values(reader.exec("SELECT id::text FROM t ORDER BY id"));
  reader.exec("COMMIT");
  exported->holder.reset();
  writing = false;
  writer.join();
  ASSERT_TRUE((*capture)->sync().ok());

  std::set<int> before, after;
  for (const auto& [commit, id] : logged_inserts(log.log())) {
    (commit < exported->consistent_point ? before : after).insert(std::stoi(id));
  }
  std::set<int> snapshot;
  for (const auto& id : seen) snapshot.insert(std::stoi(id));
  EXPECT_GE(snapshot.size(), 100u);
  EXPECT_EQ(before, snapshot);
  EXPECT_FALSE(after.empty());
  for (int id : after) EXPECT_FALSE(snapshot.contains(id)) << id;
  EXPECT_EQ(static_cast<int>(before.size() + after.size()), written.load());
  // The temporary slot went away with its connection.
  EXPECT_EQ(server.scalar("SELECT count(*) FROM pg_replication_slots"), "1");
}

// Stopped, written to, restarted: the log holds every transaction once and the upstream slot
// follows it; a slot dropped behind pgrelay's back is an error that names the loss instead of a
// silent gap. (That nothing is confirmed before it is durable is native_capture_crash_test's.)
TEST(NativeCaptureTest, RestartsWithoutLossOrDuplicateAndRefusesALostSlot) {
  test::PgServer server;
  server.exec("CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION p FOR TABLE t");
  TempLog log;
  auto options = options_for(server, log);
  {
    auto capture = NativeCapture::start(options, log.log());
    ASSERT_TRUE(capture.ok()) << capture.error().to_string();
    for (int i = 1; i <= 50; ++i) server.exec("INSERT INTO t VALUES (" + std::to_string(i) + ")");
    ASSERT_TRUE((*capture)->sync().ok());
    EXPECT_EQ((*capture)->stats().transactions, 50u);
  }
  for (int i = 51; i <= 100; ++i) server.exec("INSERT INTO t VALUES (" + std::to_string(i) + ")");
  log.open();
  {
    auto capture = NativeCapture::start(options, log.log());
    ASSERT_TRUE(capture.ok()) << capture.error().to_string();
    ASSERT_TRUE((*capture)->sync().ok());
    EXPECT_EQ((*capture)->stats().transactions, 50u);
    EXPECT_EQ((*capture)->stats().reconnects, 0u);
  }
  const auto inserts = logged_inserts(log.log());
  ASSERT_EQ(inserts.size(), 100u);
  for (std::size_t i = 0; i < inserts.size(); ++i) {
    EXPECT_EQ(inserts[i].second, std::to_string(i + 1));
    if (i > 0) {
      EXPECT_LT(inserts[i - 1].first, inserts[i].first);
    }
  }
  // The slot moved on, so the upstream keeps no WAL for what the log holds.
  EXPECT_GE(Lsn::parse(server.scalar("SELECT confirmed_flush_lsn FROM pg_replication_slots "
                                     "WHERE slot_name = 'native_test'"))
                .value(),
            log.log().last_end_lsn());

  server.exec("SELECT pg_drop_replication_slot('native_test')");
  auto lost = NativeCapture::start(options, log.log());
  ASSERT_FALSE(lost.ok());
  EXPECT_EQ(lost.error().sqlstate, "55000");
  EXPECT_NE(lost.error().message.find("no longer exists"), std::string::npos)
      << lost.error().message;
}

// Large transactions arrive while they run (protocol 2 streaming, with a logical_decoding_
// work_mem small enough that each of these is streamed): one that aborts leaves nothing, a
// subtransaction rolled back leaves nothing of itself, two streamed at once land in commit
// order. The log holds exactly what a capture that does not stream holds, at the same LSNs.
TEST(NativeCaptureTest, StreamsLargeTransactionsAsTheyRunAndDropsWhatAborted) {
  test::PgServerOptions server_options;
  server_options.settings["logical_decoding_work_mem"] = "'64kB'";
  test::PgServer server(server_options);
  server.exec("CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION p FOR TABLE t");
  TempLog streamed_log, whole_log;
  auto streamed_options = options_for(server, streamed_log);
  auto whole_options = options_for(server, whole_log);
  whole_options.slot = "native_whole";
  whole_options.stream_in_progress = false;
  auto streaming = NativeCapture::start(streamed_options, streamed_log.log());
  ASSERT_TRUE(streaming.ok()) << streaming.error().to_string();
  auto whole = NativeCapture::start(whole_options, whole_log.log());
  ASSERT_TRUE(whole.ok()) << whole.error().to_string();

  auto rows = [](int from, int to) {
    return "INSERT INTO t SELECT g, repeat('v', 100) FROM generate_series(" + std::to_string(from) +
           ", " + std::to_string(to) + ") g";
  };
  std::vector<std::string> expected;
  auto expect_rows = [&](int from, int to) {
    for (int i = from; i <= to; ++i) expected.push_back(std::to_string(i));
  };
  server.exec(rows(1, 2000));
  expect_rows(1, 2000);
  server.exec("BEGIN; " + rows(3001, 5000) + "; ROLLBACK");
  server.exec("BEGIN; " + rows(6001, 8000) + "; SAVEPOINT a; " + rows(8001, 10000) +
              "; SAVEPOINT a2; " + rows(10001, 10500) + "; ROLLBACK TO a; " + rows(10501, 12000) +
              "; SAVEPOINT b; " + rows(12001, 12500) + "; RELEASE b; SAVEPOINT c; " +
              rows(12501, 13000) + "; ROLLBACK TO c; COMMIT");
  expect_rows(6001, 8000);
  expect_rows(10501, 12500);
  // Two at once: the one that commits first comes first, each whole.
  auto a = server.connect_admin();
  auto b = server.connect_admin();
  a.exec("BEGIN; " + rows(20001, 22000));
  b.exec("BEGIN; " + rows(30001, 32000));
  a.exec(rows(22001, 24000));
  b.exec("COMMIT");
  a.exec("COMMIT");
  expect_rows(30001, 32000);
  expect_rows(20001, 24000);
  server.exec(rows(40001, 40003));  // small: not streamed
  expect_rows(40001, 40003);

  ASSERT_TRUE((*streaming)->sync().ok());
  ASSERT_TRUE((*whole)->sync().ok());
  EXPECT_EQ((*streaming)->stats().transactions, 5u);
  // Postgres streams the largest transaction each time its memory overflows, so which of the
  // two concurrent ones goes streamed may vary; most of them must.
  EXPECT_GE((*streaming)->stats().streamed, 3u);
  EXPECT_EQ((*whole)->stats().streamed, 0u);
  const auto got = logged_inserts(streamed_log.log());
  std::vector<std::string> got_values;
  for (const auto& [lsn, value] : got) got_values.push_back(value);
  EXPECT_EQ(got_values, expected);
  EXPECT_EQ(got, logged_inserts(whole_log.log()));
}

// pgoutput counts a Relation it sent inside a streamed transaction as sent once that commits:
// the next transaction of the table comes without one, and is built with that Relation.
TEST(NativeCaptureTest, ARelationSentOnlyInsideAStreamedTransactionDescribesTheNextOne) {
  test::PgServerOptions server_options;
  server_options.settings["logical_decoding_work_mem"] = "'64kB'";
  test::PgServer server(server_options);
  server.exec("CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION p FOR TABLE t");
  TempLog log;
  auto capture = NativeCapture::start(options_for(server, log), log.log());
  ASSERT_TRUE(capture.ok()) << capture.error().to_string();
  // The slot's first change of t is in a streamed transaction.
  server.exec("INSERT INTO t SELECT g, repeat('v', 100) FROM generate_series(1, 3000) g");
  server.exec("INSERT INTO t VALUES (5001, 'small')");
  ASSERT_TRUE((*capture)->sync().ok());
  const auto stats = (*capture)->stats();
  EXPECT_EQ(stats.streamed, 1u);
  EXPECT_EQ(stats.reconnects, 0u);
  EXPECT_EQ(stats.last_error, "");
  const auto got = logged_inserts(log.log());
  ASSERT_EQ(got.size(), 3001u);
  EXPECT_EQ(got.back().second, "5001");
}

// The upstream connection breaks mid-stream: the capture reconnects and goes on where the log
// ends.
TEST(NativeCaptureTest, ReconnectsAfterTheWalsenderIsTerminated) {
  test::PgServer server;
  server.exec("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION p FOR TABLE t");
  TempLog log;
  auto options = options_for(server, log);
  options.reconnect_min = 10ms;
  auto capture = NativeCapture::start(options, log.log());
  ASSERT_TRUE(capture.ok()) << capture.error().to_string();
  server.exec("INSERT INTO t VALUES (1)");
  ASSERT_TRUE((*capture)->sync().ok());
  server.exec(
      "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
      "WHERE slot_name = 'native_test'");
  server.exec("INSERT INTO t VALUES (2)");
  auto synced = (*capture)->sync();
  ASSERT_TRUE(synced.ok()) << synced.error().to_string();
  EXPECT_GE((*capture)->stats().reconnects, 1u);
  const auto inserts = logged_inserts(log.log());
  ASSERT_EQ(inserts.size(), 2u);
  EXPECT_EQ(inserts[1].second, "2");
}

// An event loop on a thread of its own, as `pgrelay serve` runs the walsenders' io_context.
class LoopThread {
 public:
  LoopThread() : work_(asio::make_work_guard(io_)), thread_([this] { io_.run(); }) {}
  ~LoopThread() { stop(); }
  std::shared_ptr<ReadingLoop> reading_loop() {
    return std::make_shared<upstream::AsioReadingLoop>(io_.get_executor());
  }
  std::thread::id id() const { return thread_.get_id(); }
  // The loop no longer runs: nothing it was asked to do happens any more.
  void stop() {
    work_.reset();
    io_.stop();
    if (thread_.joinable()) thread_.join();
  }

 private:
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::thread thread_;
};

// Read on an event loop, the stream is appended on the loop's thread (one wake-up per batch
// for pgrelay), survives the walsender's end (the capture thread reconnects and hands the new
// stream over), keeps transactions larger than one turn's share whole and in order, and
// stops at once.
TEST(NativeCaptureTest, ReadsOnAnEventLoopAcrossReconnects) {
  test::PgServer server;
  server.exec("CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION p FOR TABLE t");
  TempLog log;
  LoopThread loop;
  auto options = options_for(server, log);
  options.reconnect_min = 10ms;
  options.loop = loop.reading_loop();
  auto capture = NativeCapture::start(options, log.log());
  ASSERT_TRUE(capture.ok()) << capture.error().to_string();
  // (start() appended the log's first checkpoint on this thread.)
  std::atomic<int> appended_on_loop{0}, appended_elsewhere{0};
  log.log().on_visible([&] {
    ++(std::this_thread::get_id() == loop.id() ? appended_on_loop : appended_elsewhere);
  });
  for (int i = 1; i <= 20; ++i) server.exec("INSERT INTO t VALUES (" + std::to_string(i) + ")");
  ASSERT_TRUE((*capture)->sync().ok());
  EXPECT_GT(appended_on_loop.load(), 0);
  EXPECT_EQ(appended_elsewhere.load(), 0);

  server.exec(
      "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
      "WHERE slot_name = 'native_test'");
  // More frames than one turn takes (each row is a frame), in one transaction and in many.
  server.exec("INSERT INTO t SELECT g, 'x' FROM generate_series(21, 3020) g");
  for (int i = 3021; i <= 3040; ++i) {
    server.exec("INSERT INTO t VALUES (" + std::to_string(i) + ")");
  }
  auto synced = (*capture)->sync();
  ASSERT_TRUE(synced.ok()) << synced.error().to_string();
  EXPECT_GE((*capture)->stats().reconnects, 1u);
  EXPECT_EQ(appended_elsewhere.load(), 0);
  const auto inserts = logged_inserts(log.log());
  ASSERT_EQ(inserts.size(), 3040u);
  for (std::size_t i = 0; i < inserts.size(); ++i) {
    EXPECT_EQ(inserts[i].second, std::to_string(i + 1));
  }
  const auto started = std::chrono::steady_clock::now();
  (*capture)->stop();
  EXPECT_LT(std::chrono::steady_clock::now() - started, 5s);
}

// A capture that read on a loop, which then stopped (as `pgrelay serve`'s does before its
// captures go), with row 1 captured before and row 2 written after.
class NativeCaptureOnAStoppedLoop : public ::testing::Test {
 protected:
  void SetUp() override {
    server_.exec("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION p FOR TABLE t");
    options_ = options_for(server_, log_);
    options_.loop = loop_.reading_loop();
    auto started = NativeCapture::start(options_, log_.log());
    ASSERT_TRUE(started.ok()) << started.error().to_string();
    capture_ = std::move(*started);
    server_.exec("INSERT INTO t VALUES (1)");
    ASSERT_TRUE(capture_->sync().ok());
    loop_.stop();
    server_.exec("INSERT INTO t VALUES (2)");
  }

  test::PgServer server_;
  TempLog log_;
  LoopThread loop_;
  NativeCaptureOptions options_;
  std::unique_ptr<NativeCapture> capture_;
};

// stop() takes the stream back without the loop and ends the connection, though the stopped
// loop still holds its duplicate of the socket, so a restarted capture (here on its own thread)
// gets the slot and resumes where the log ends, losing nothing.
TEST_F(NativeCaptureOnAStoppedLoop, StopsWithoutTheLoop) {
  auto stopped = std::async(std::launch::async, [&] { capture_->stop(); });
  ASSERT_EQ(stopped.wait_for(20s), std::future_status::ready) << "stop() waits for the loop";
  options_.loop = nullptr;
  auto capture = NativeCapture::start(options_, log_.log());
  ASSERT_TRUE(capture.ok()) << capture.error().to_string();
  ASSERT_TRUE((*capture)->sync().ok());
  const auto inserts = logged_inserts(log_.log());
  ASSERT_EQ(inserts.size(), 2u);
  EXPECT_EQ(inserts[1].second, "2");
}

// A sync() that waits on the stopped loop (a slot being created while `pgrelay serve` drains
// its blocking work at shutdown) finishes once the capture leaves the loop: its own thread
// reads the stream on from where the loop stopped, the same connection, nothing lost.
TEST_F(NativeCaptureOnAStoppedLoop, LeavesItAndReadsOnItsOwnThread) {
  auto synced = std::async(std::launch::async, [&] { return capture_->sync(); });
  EXPECT_EQ(synced.wait_for(500ms), std::future_status::timeout) << "nobody reads the stream";
  capture_->leave_loop();
  ASSERT_EQ(synced.wait_for(20s), std::future_status::ready);
  auto result = synced.get();
  ASSERT_TRUE(result.ok()) << result.error().to_string();
  EXPECT_EQ(capture_->stats().reconnects, 0u);
  server_.exec("INSERT INTO t VALUES (3)");
  ASSERT_TRUE(capture_->sync().ok());
  const auto inserts = logged_inserts(log_.log());
  ASSERT_EQ(inserts.size(), 3u);
  EXPECT_EQ(inserts[2].second, "3");
}

// Tables reach pgrelay's publications as other publications gain them, in the DDL's own
// transaction (event trigger), and leave when no publication has them any more.
TEST(NativeCaptureTest, PublicationsFollowTheOthers) {
  test::PgServer server;
  server.exec("CREATE TABLE a (id int PRIMARY KEY); CREATE PUBLICATION p FOR TABLE a");
  TempLog log;
  auto capture = NativeCapture::start(options_for(server, log), log.log());
  ASSERT_TRUE(capture.ok()) << capture.error().to_string();
  auto tables = [&] {
    return server.scalar(
        "SELECT coalesce(string_agg(pubname || ':' || tablename, ',' ORDER BY tablename), '') "
        "FROM pg_publication_tables WHERE pubname LIKE '\\_pgrelay%'");
  };
  EXPECT_EQ(tables(), "_pgrelay_capture:a");
  server.exec(
      "BEGIN; CREATE TABLE b (v text); ALTER PUBLICATION p ADD TABLE b; "
      "INSERT INTO b VALUES ('first'); COMMIT");
  EXPECT_EQ(tables(), "_pgrelay_capture:a,_pgrelay_capture_keyless:b");
  server.exec("ALTER TABLE b ADD PRIMARY KEY (v)");
  EXPECT_EQ(tables(), "_pgrelay_capture:a,_pgrelay_capture:b");
  server.exec("ALTER PUBLICATION p DROP TABLE a");
  EXPECT_EQ(tables(), "_pgrelay_capture:b");
  ASSERT_TRUE((*capture)->sync().ok());
  const auto inserts = logged_inserts(log.log());
  ASSERT_EQ(inserts.size(), 1u);
  EXPECT_EQ(inserts[0].second, "first");
}

// Every name pgrelay puts into SQL or replication commands is quoted: a schema (and so the
// publications named after it) with quotes and upper case works like any other.
TEST(NativeCaptureTest, QuotesTheSchemaAndPublicationNames) {
  test::PgServer server;
  server.exec("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION p FOR TABLE t");
  TempLog log;
  auto options = options_for(server, log);
  options.schema = "Odd\"s'chema";
  auto capture = NativeCapture::start(options, log.log());
  ASSERT_TRUE(capture.ok()) << capture.error().to_string();
  EXPECT_EQ(server.scalar("SELECT string_agg(pubname, ',' ORDER BY pubname) FROM pg_publication "
                          "WHERE pubname LIKE 'Odd%'"),
            "Odd\"s'chema_capture,Odd\"s'chema_capture_keyless");
  server.exec("INSERT INTO t VALUES (7)");
  ASSERT_TRUE((*capture)->sync().ok());
  const auto inserts = logged_inserts(log.log());
  ASSERT_EQ(inserts.size(), 1u);
  EXPECT_EQ(inserts[0].second, "7");
}

// Without an event trigger (the role is not superuser) the mirror runs on an interval; sync(),
// which slot creation calls, mirrors first, so a slot created right after its publication gets
// that publication's rows from its consistent point on.
TEST(NativeCaptureTest, SyncCapturesAPublicationCreatedJustBefore) {
  test::PgServer server;
  server.create_role("nat", std::nullopt, "REPLICATION");
  server.exec("CREATE DATABASE app OWNER nat");
  TempLog log;
  auto options = options_for(server, log);
  options.conninfo = server.conninfo("app", "nat");
  options.mirror_interval = std::chrono::hours(1);
  auto capture = NativeCapture::start(options, log.log());
  ASSERT_TRUE(capture.ok()) << capture.error().to_string();
  EXPECT_FALSE((*capture)->setup_report().event_trigger);
  test::PgConnection owner(server.conninfo("app", "nat"));
  owner.exec("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION p FOR TABLE t");
  auto consistent = (*capture)->sync();
  ASSERT_TRUE(consistent.ok()) << consistent.error().to_string();
  owner.exec("INSERT INTO t VALUES (1)");
  ASSERT_TRUE((*capture)->sync().ok());
  const auto inserts = logged_inserts(log.log());
  ASSERT_EQ(inserts.size(), 1u);
  EXPECT_GT(inserts[0].first, *consistent);
}

// The interval's mirror runs only when the catalogs changed (CatalogWatch): once at start, not
// while rows are written, and again for a new publication, whose table it then mirrors.
TEST(NativeCaptureTest, TheIntervalMirrorsOnlyWhenTheCatalogsChanged) {
  test::PgServer server;
  server.create_role("nat", std::nullopt, "REPLICATION");
  server.exec("CREATE DATABASE app OWNER nat");
  test::PgConnection owner(server.conninfo("app", "nat"));
  owner.exec("CREATE TABLE quiet (id int PRIMARY KEY)");
  TempLog log;
  auto options = options_for(server, log);
  options.conninfo = server.conninfo("app", "nat");
  auto capture = NativeCapture::start(options, log.log());
  ASSERT_TRUE(capture.ok()) << capture.error().to_string();
  EXPECT_FALSE((*capture)->setup_report().event_trigger);
  auto mirrors = [&] { return (*capture)->stats().catalog_mirrors; };
  auto eventually = [](const std::function<bool()>& done) {
    for (auto until = std::chrono::steady_clock::now() + 5s;
         !done() && std::chrono::steady_clock::now() < until;) {
      std::this_thread::sleep_for(10ms);
    }
    return done();
  };
  ASSERT_TRUE(eventually([&] { return mirrors() >= 1; }));
  const std::uint64_t settled = mirrors();
  EXPECT_EQ(settled, 1u);
  owner.exec("INSERT INTO quiet SELECT generate_series(1, 100)");
  std::this_thread::sleep_for(500ms);  // five intervals
  EXPECT_EQ(mirrors(), settled);

  owner.exec("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION p FOR TABLE t");
  EXPECT_TRUE(eventually([&] {
    return server.scalar(
               "SELECT count(*) FROM pg_publication_tables WHERE pubname = "
               "'_pgrelay_capture' AND tablename = 't'",
               "app") == "1";
  }));
  EXPECT_TRUE(eventually([&] { return mirrors() > settled; }));
}

TEST(NativeCaptureTest, RefusesWhatItCannotDo) {
  test::PgServerOptions replica_options;
  replica_options.settings["wal_level"] = "replica";
  test::PgServer replica_level(replica_options);
  TempLog log;
  auto refused = NativeCapture::start(options_for(replica_level, log), log.log());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().sqlstate, "55000");
  EXPECT_NE(refused.error().message.find("wal_level = logical"), std::string::npos);
  EXPECT_NE(refused.error().hint.find("--capture trigger"), std::string::npos);

  // A log trigger capture wrote is not continued by native capture.
  const std::string text = "pgrelay-trigger-checkpoint 1\nwhatever";
  Bytes data(text.begin(), text.end());
  log::EntryMeta meta;
  meta.kind = log::EntryKind::kCheckpoint;
  const log::PendingEntry entry{meta, data, nullptr};
  ASSERT_TRUE(log.log().append(std::span<const log::PendingEntry>(&entry, 1)).ok());
  test::PgServer logical;
  auto mixed = NativeCapture::start(options_for(logical, log), log.log());
  ASSERT_FALSE(mixed.ok());
  EXPECT_NE(mixed.error().message.find("captured with triggers"), std::string::npos)
      << mixed.error().message;

  auto bad_name = options_for(logical, log);
  bad_name.slot = "Bad-Name";
  auto invalid = NativeCapture::start(bad_name, log.log());
  ASSERT_FALSE(invalid.ok());
  EXPECT_EQ(invalid.error().sqlstate, "42602");
}

}  // namespace
}  // namespace pgrelay::capture
