// CatalogWatch against a real PostgreSQL 15: each change the periodic checks must see makes it
// due, what they do not read leaves it quiet.
#include "capture/catalog_watch.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>

#include "capture/trigger/pg_session.h"
#include "pg_server.h"

namespace pgrelay::capture {
namespace {

using namespace std::chrono_literals;
using test::PgServer;

class CatalogWatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static PgServer server;  // one for the process, stopped at its exit
    server_ = &server;
    server_->exec(
        "DROP SCHEMA IF EXISTS w CASCADE; DROP SCHEMA IF EXISTS w2 CASCADE; "
        "DROP PUBLICATION IF EXISTS wp, wp_schema; CREATE SCHEMA w; "
        "CREATE TABLE w.t (id int PRIMARY KEY, a text, b int NOT NULL); "
        "CREATE TABLE w.other (id int); "
        "CREATE TABLE w.parted (id int, k int) PARTITION BY RANGE (k); "
        "CREATE TABLE w.part1 PARTITION OF w.parted FOR VALUES FROM (0) TO (10); "
        "CREATE TABLE w.loose (id int, k int); "
        "CREATE PUBLICATION wp FOR TABLE w.t");
    auto s = PgSession::connect(server_->conninfo());
    ASSERT_TRUE(s.ok()) << s.error().to_string();
    session_ = std::move(*s);
  }

  // due() on the test's session, which must succeed.
  bool due(CatalogWatch& watch) {
    auto r = watch.due(*session_);
    EXPECT_TRUE(r.ok()) << r.error().to_string();
    return r.ok() && *r;
  }

  PgServer* server_ = nullptr;
  std::unique_ptr<PgSession> session_;
};

// Everything trigger capture's sync and native capture's mirror read: layouts (columns, types,
// keys, replica identity, names, schemas), publications and their tables, schemas, row filters
// and column lists, partitions. Each statement alone makes the watch due, once.
TEST_F(CatalogWatchTest, EachChangeTheChecksReadMakesItDue) {
  const char* changes[] = {
      "CREATE TABLE w.n (id int)",
      "ALTER TABLE w.t ADD COLUMN c int",
      "ALTER TABLE w.t RENAME COLUMN a TO aa",
      "ALTER TABLE w.t ALTER COLUMN b TYPE int8",
      "ALTER TABLE w.t ALTER COLUMN b DROP NOT NULL",
      "ALTER TABLE w.t DROP COLUMN c",
      "ALTER TABLE w.t REPLICA IDENTITY FULL",
      "CREATE UNIQUE INDEX t_b ON w.t (b)",
      "ALTER TABLE w.t ALTER COLUMN b SET NOT NULL",
      "ALTER TABLE w.t REPLICA IDENTITY USING INDEX t_b",
      "ALTER TABLE w.other ADD PRIMARY KEY (id)",
      "ALTER TABLE w.t RENAME TO t2",
      "ALTER TABLE w.t2 RENAME TO t",
      "ALTER SCHEMA w RENAME TO w2",
      "ALTER SCHEMA w2 RENAME TO w",
      "CREATE SCHEMA w2",
      "ALTER TABLE w.other SET SCHEMA w2",
      "ALTER PUBLICATION wp ADD TABLE w.loose",
      "ALTER PUBLICATION wp SET (publish = 'insert, update')",
      "ALTER PUBLICATION wp SET TABLE w.t WHERE (id > 5)",
      "ALTER PUBLICATION wp SET TABLE w.t (id, aa)",
      "ALTER PUBLICATION wp DROP TABLE w.t",
      "CREATE PUBLICATION wp_schema FOR TABLES IN SCHEMA w2",
      "ALTER PUBLICATION wp_schema DROP TABLES IN SCHEMA w2",
      "ALTER PUBLICATION wp_schema RENAME TO wp_schema2",
      "DROP PUBLICATION wp_schema2",
      "ALTER TABLE w.parted ATTACH PARTITION w.loose FOR VALUES FROM (10) TO (20)",
      "ALTER TABLE w.parted DETACH PARTITION w.part1",
      "CREATE TABLE w.part3 PARTITION OF w.parted FOR VALUES FROM (20) TO (30)",
      "DROP TABLE w.part1",
      "TRUNCATE w.t",  // a new relfilenode: not needed, but an UPDATE of pg_class all the same
  };
  CatalogWatch watch;
  EXPECT_TRUE(due(watch));  // nothing noted yet
  watch.done();
  for (const char* change : changes) {
    SCOPED_TRACE(change);
    EXPECT_FALSE(due(watch));
    server_->exec(change);
    EXPECT_TRUE(due(watch));
    watch.done();
  }
  EXPECT_FALSE(due(watch));
  EXPECT_EQ(watch.checks(), 1 + std::size(changes));
}

// Rows, statistics, vacuum, objects of other kinds and what rolled back are not what the checks
// read: the watch stays quiet, and the checks are skipped.
TEST_F(CatalogWatchTest, WhatTheChecksDoNotReadLeavesItQuiet) {
  auto writer = PgSession::connect(server_->conninfo());
  ASSERT_TRUE(writer.ok()) << writer.error().to_string();
  PgSession& w = **writer;
  // A session's first temporary table creates its temporary schemas, once.
  ASSERT_TRUE(w.run("CREATE TEMP TABLE scratch0 (id int); DROP TABLE scratch0").ok());
  CatalogWatch watch;
  EXPECT_TRUE(due(watch));
  watch.done();
  const char* quiet[] = {
      "INSERT INTO w.t SELECT g, 'x', g FROM generate_series(1, 1000) g",
      "UPDATE w.t SET a = 'y' WHERE id < 500",
      "DELETE FROM w.t WHERE id > 900",
      "ANALYZE w.t",
      "VACUUM w.t",
      "CREATE TEMP TABLE scratch (id int PRIMARY KEY, v text); INSERT INTO scratch VALUES (1, 'a');"
      " ALTER TABLE scratch ADD COLUMN z int; DROP TABLE scratch",
      "CREATE FUNCTION w.f() RETURNS int LANGUAGE sql AS 'SELECT 1'",
      "CREATE SEQUENCE w.s; SELECT nextval('w.s')",
      "CREATE VIEW w.v AS SELECT id FROM w.t",
      "BEGIN; ALTER TABLE w.t ADD COLUMN never int; ALTER PUBLICATION wp ADD TABLE w.other; "
      "ROLLBACK",
  };
  for (const char* statement : quiet) {
    SCOPED_TRACE(statement);
    ASSERT_TRUE(w.run(statement).ok());
    EXPECT_FALSE(due(watch));
  }
  EXPECT_EQ(watch.checks(), 1u);
}

// A check that failed does not call done(): the next call is due again, and so is any call once
// `recheck` has passed, whatever the catalogs say.
TEST_F(CatalogWatchTest, AFailedCheckIsDueAgainAndEveryCheckAfterRecheck) {
  CatalogWatch watch;
  EXPECT_TRUE(due(watch));
  watch.done();
  server_->exec("ALTER TABLE w.t ADD COLUMN c int");
  EXPECT_TRUE(due(watch));  // the check fails: no done()
  EXPECT_TRUE(due(watch));
  watch.done();
  EXPECT_FALSE(due(watch));

  CatalogWatch eager(0s);
  EXPECT_TRUE(due(eager));
  eager.done();
  EXPECT_TRUE(due(eager));
  eager.done();
  EXPECT_EQ(eager.checks(), 2u);
}

// The fingerprint is skipped while the snapshot is the noted one. A DDL that commits after a
// newer transaction leaves xmax where that one put it: it is seen by leaving the running xids.
TEST_F(CatalogWatchTest, ADdlCommittedAfterANewerWriteIsSeen) {
  CatalogWatch watch;
  EXPECT_TRUE(due(watch));
  watch.done();
  EXPECT_FALSE(due(watch));  // nothing ended since: the snapshot alone says so
  auto ddl = PgSession::connect(server_->conninfo());
  ASSERT_TRUE(ddl.ok()) << ddl.error().to_string();
  ASSERT_TRUE((*ddl)->run("BEGIN; ALTER TABLE w.t ADD COLUMN late int").ok());
  server_->exec("INSERT INTO w.other VALUES (1)");  // a newer xid ends first
  EXPECT_FALSE(due(watch));
  EXPECT_FALSE(due(watch));
  ASSERT_TRUE((*ddl)->run("COMMIT").ok());
  EXPECT_TRUE(due(watch));
  watch.done();
  EXPECT_FALSE(due(watch));
  EXPECT_EQ(watch.checks(), 2u);
}

// A watch outlives its session: a new connection reads the same fingerprint.
TEST_F(CatalogWatchTest, TheFingerprintIsTheDatabasesNotTheSessions) {
  CatalogWatch watch;
  EXPECT_TRUE(due(watch));
  watch.done();
  auto other = PgSession::connect(server_->conninfo());
  ASSERT_TRUE(other.ok()) << other.error().to_string();
  auto r = watch.due(**other);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_FALSE(*r);
}

}  // namespace
}  // namespace pgrelay::capture
