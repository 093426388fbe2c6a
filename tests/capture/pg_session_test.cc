// PgSession's row streams against a real PostgreSQL: rows before the commit, and the end after.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <stop_token>
#include <string>
#include <thread>

#include "capture/trigger/pg_session.h"
#include "pg_server.h"

namespace pgrelay::capture {
namespace {

using test::PgServer;

class PgSessionTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new PgServer(); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }

  void SetUp() override {
    server_->exec("DROP TABLE IF EXISTS held; CREATE TABLE held (id int)");
    session_ = connect();
  }

  static std::unique_ptr<PgSession> connect() {
    auto s = PgSession::connect(server_->conninfo());
    EXPECT_TRUE(s.ok()) << s.error().to_string();
    return s.ok() ? std::move(*s) : nullptr;
  }

  // The session still runs statements: the stream left nothing unread and no pipeline open.
  static void expect_usable(PgSession& session) {
    auto r = session.exec("SELECT 41 + 1");
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    EXPECT_EQ(r->value(0, 0), "42");
  }

  static PgServer* server_;
  std::unique_ptr<PgSession> session_;
};

PgServer* PgSessionTest::server_ = nullptr;

constexpr const char* kInsertReturning =
    "WITH i AS (INSERT INTO held VALUES (1) RETURNING id) SELECT id::text FROM i";

// A poll's statement deletes what the poll before it captured, and its commit waits for the
// upstream's WAL flush: the rows must not wait for it. Here the commit waits on a lock the test
// holds (a deferred trigger takes it), and the stream reads every row while it does.
TEST_F(PgSessionTest, TheRowsComeBeforeTheStatementsCommit) {
  server_->exec(
      "CREATE OR REPLACE FUNCTION held_commit_waits() RETURNS trigger LANGUAGE plpgsql AS "
      "$$BEGIN PERFORM pg_advisory_xact_lock(4711); RETURN NULL; END$$; "
      "CREATE CONSTRAINT TRIGGER held_commit_waits AFTER INSERT ON held "
      "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION held_commit_waits()");
  auto holder = connect();
  ASSERT_TRUE(holder->run("SELECT pg_advisory_lock(4711)").ok());
  // Should the rows wait for the commit after all, the test fails instead of hanging: after
  // 30 s the watchdog, on a connection of its own, ends the lock holder's session.
  std::atomic<bool> released{false};
  auto killer = connect();
  std::jthread watchdog([&](std::stop_token stop) {  // a failed ASSERT stops and joins it
    for (int i = 0; i < 300 && !released && !stop.stop_requested(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (!stop.stop_requested() && !released.exchange(true)) {
      (void)killer->run(
          "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' "
          "AND objid = 4711 AND granted");
    }
  });

  auto stream = session_->stream_prepared("held_insert", kInsertReturning, {});
  ASSERT_TRUE(stream.ok()) << stream.error().to_string();
  auto row = (*stream)->next();
  ASSERT_TRUE(row.ok()) << row.error().to_string();
  ASSERT_TRUE(*row);
  EXPECT_EQ((*stream)->row().value(0, 0), "1");
  auto end = (*stream)->next();
  ASSERT_TRUE(end.ok()) << end.error().to_string();
  EXPECT_FALSE(*end);
  // The statement's commit goes on to wait for the lock (the server reads the Sync after
  // sending the rows), and its row is not committed.
  const std::string waiting =
      "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 4711 AND NOT granted";
  for (int i = 0; i < 200 && server_->scalar(waiting) != "1"; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(server_->scalar(waiting), "1");
  EXPECT_EQ(server_->scalar("SELECT count(*) FROM held"), "0");
  const bool too_late = released.exchange(true);
  watchdog.join();
  ASSERT_FALSE(too_late) << "the rows came only once the watchdog ended the lock's holder";
  ASSERT_TRUE(holder->run("SELECT pg_advisory_unlock(4711)").ok());

  auto finished = (*stream)->finish();
  EXPECT_TRUE(finished.ok()) << finished.error().to_string();
  EXPECT_EQ(server_->scalar("SELECT count(*) FROM held"), "1");
  stream->reset();
  expect_usable(*session_);
  EXPECT_EQ(session_->cancels_sent(), 0u);
  server_->exec("DROP FUNCTION held_commit_waits() CASCADE");
}

// A commit that fails after the last row (a deferred unique constraint) is finish()'s error,
// with its SQLSTATE, and nothing of the statement stays.
TEST_F(PgSessionTest, ACommitThatFailsIsReportedByFinish) {
  server_->exec(
      "ALTER TABLE held ADD CONSTRAINT held_once UNIQUE (id) DEFERRABLE INITIALLY DEFERRED");
  auto stream = session_->stream_prepared(
      "held_twice",
      "WITH i AS (INSERT INTO held VALUES (1), (1) RETURNING id) SELECT id::text FROM i", {});
  ASSERT_TRUE(stream.ok()) << stream.error().to_string();
  int rows = 0;
  for (;;) {
    auto row = (*stream)->next();
    ASSERT_TRUE(row.ok()) << row.error().to_string();
    if (!*row) break;
    ++rows;
  }
  EXPECT_EQ(rows, 2);
  auto finished = (*stream)->finish();
  ASSERT_FALSE(finished.ok());
  EXPECT_EQ(finished.error().sqlstate, "23505") << finished.error().to_string();
  stream->reset();
  EXPECT_EQ(server_->scalar("SELECT count(*) FROM held"), "0");
  expect_usable(*session_);
}

// Left after its last row without finish(): the destructor reads the end (the statement
// commits) and sends no cancel.
TEST_F(PgSessionTest, AStreamLeftAfterItsLastRowCommitsWithoutACancel) {
  {
    auto stream = session_->stream_prepared("held_insert", kInsertReturning, {});
    ASSERT_TRUE(stream.ok()) << stream.error().to_string();
    ASSERT_TRUE(*(*stream)->next());
    ASSERT_FALSE(*(*stream)->next());
  }
  EXPECT_EQ(session_->cancels_sent(), 0u);
  EXPECT_EQ(server_->scalar("SELECT count(*) FROM held"), "1");
  expect_usable(*session_);
}

// A statement that fails partway reports its error from next(), and the session goes on.
TEST_F(PgSessionTest, AnErrorPartwayComesFromNextAndTheSessionGoesOn) {
  auto stream = session_->stream_prepared(
      "divides", "SELECT (10 / (2 - g))::text FROM generate_series(1, 3) g", {});
  ASSERT_TRUE(stream.ok()) << stream.error().to_string();
  auto first = (*stream)->next();
  Result<bool> failed = first;
  if (first.ok() && *first) failed = (*stream)->next();
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.error().sqlstate, "22012") << failed.error().to_string();
  EXPECT_TRUE((*stream)->finish().ok());  // nothing left to end
  stream->reset();
  expect_usable(*session_);
}

}  // namespace
}  // namespace pgrelay::capture
