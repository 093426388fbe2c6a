// SqlRewriter: which catalog references are redirected, and that every other byte is kept.
#include "server/sql_rewrite.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

namespace pgrelay::server {
namespace {

class SqlRewriteTest : public ::testing::Test {
 protected:
  // The rewritten text; the input itself when rewrite() passes it unchanged.
  std::string rw(const std::string& sql) const {
    auto r = rewriter_.rewrite(sql);
    EXPECT_TRUE(r.ok()) << r.error().message;
    if (!r.ok() || !r->has_value()) return sql;
    return **r;
  }
  bool unchanged(const std::string& sql) const {
    auto r = rewriter_.rewrite(sql);
    return r.ok() && !r->has_value();
  }

  SqlRewriter rewriter_{RewriteOptions{}};
};

TEST_F(SqlRewriteTest, PrefilterIsCaseInsensitiveAndSelective) {
  EXPECT_FALSE(rewriter_.may_need_rewrite("SELECT * FROM users WHERE id = $1"));
  EXPECT_FALSE(rewriter_.may_need_rewrite("INSERT INTO t VALUES (1, 'show')"));
  EXPECT_FALSE(rewriter_.may_need_rewrite(""));
  EXPECT_TRUE(rewriter_.may_need_rewrite("select * from PG_REPLICATION_SLOTS"));
  EXPECT_TRUE(rewriter_.may_need_rewrite("SHOW Wal_Level"));
  EXPECT_TRUE(rewriter_.may_need_rewrite("SELECT Current_Setting('x')"));
  EXPECT_TRUE(rewriter_.may_need_rewrite("select pg_current_wal_flush_lsn()"));
  EXPECT_TRUE(rewriter_.may_need_rewrite("show wal_sender_timeout"));
  EXPECT_TRUE(rewriter_.may_need_rewrite("show max_wal_senders"));
}

TEST_F(SqlRewriteTest, NonMatchingSqlPassesUnchanged) {
  EXPECT_TRUE(unchanged("SELECT 1"));
  EXPECT_TRUE(unchanged("SELECT * FROM pg_class"));
  // Mentions a name, but only in a string or as a column: nothing to redirect.
  EXPECT_TRUE(unchanged("SELECT 'pg_replication_slots', 'SHOW wal_level'"));
  EXPECT_TRUE(unchanged("SELECT x.pg_settings FROM t x"));
  EXPECT_TRUE(unchanged("SHOW work_mem"));
  EXPECT_TRUE(unchanged("SHOW ALL"));
  EXPECT_TRUE(unchanged("SELECT * FROM other.pg_settings"));
  EXPECT_TRUE(unchanged("SELECT other.current_setting('x')"));
  EXPECT_TRUE(unchanged("-- pg_settings\nSELECT 1 /* current_setting() */"));
}

TEST_F(SqlRewriteTest, InvalidSqlPassesUnchanged) {
  EXPECT_TRUE(unchanged("SELEC * FROM pg_replication_slots"));
  EXPECT_TRUE(unchanged("SELECT * FROM pg_settings WHERE"));
  EXPECT_TRUE(unchanged("SELECT 'unterminated pg_settings"));
  EXPECT_TRUE(unchanged(std::string("SELECT * FROM pg_settings\0 x", 29)));
}

TEST_F(SqlRewriteTest, Relations) {
  EXPECT_EQ(rw("SELECT * FROM pg_replication_slots"),
            "SELECT * FROM \"_pgrelay\".pg_replication_slots");
  EXPECT_EQ(rw("SELECT * FROM pg_catalog.pg_replication_slots"),
            "SELECT * FROM \"_pgrelay\".pg_replication_slots");
  EXPECT_EQ(rw("select pid from PG_STAT_REPLICATION"),
            "select pid from \"_pgrelay\".PG_STAT_REPLICATION");
  EXPECT_EQ(rw("SELECT * FROM \"pg_catalog\" . \"pg_settings\" s"),
            "SELECT * FROM \"_pgrelay\" . \"pg_settings\" s");
  EXPECT_EQ(rw("TABLE pg_settings"), "TABLE \"_pgrelay\".pg_settings");
  EXPECT_EQ(rw("SELECT * FROM ONLY pg_settings"), "SELECT * FROM ONLY \"_pgrelay\".pg_settings");
  // A differently spelled quoted name is another relation.
  EXPECT_TRUE(unchanged("SELECT * FROM \"PG_SETTINGS\""));
}

TEST_F(SqlRewriteTest, ThreePartColumnReferenceFollowsTheRelation) {
  EXPECT_EQ(rw("SELECT pg_catalog.pg_settings.name FROM pg_catalog.pg_settings"),
            "SELECT \"_pgrelay\".pg_settings.name FROM \"_pgrelay\".pg_settings");
}

TEST_F(SqlRewriteTest, Functions) {
  EXPECT_EQ(rw("SELECT current_setting('wal_level')"),
            "SELECT \"_pgrelay\".current_setting('wal_level')");
  EXPECT_EQ(rw("SELECT pg_catalog.current_setting('wal_level', true)"),
            "SELECT \"_pgrelay\".current_setting('wal_level', true)");
  EXPECT_EQ(rw("SELECT pg_current_wal_lsn(), pg_current_wal_insert_lsn(), "
               "PG_CURRENT_WAL_FLUSH_LSN()"),
            "SELECT \"_pgrelay\".pg_current_wal_lsn(), \"_pgrelay\".pg_current_wal_insert_lsn(), "
            "\"_pgrelay\".PG_CURRENT_WAL_FLUSH_LSN()");
  EXPECT_EQ(rw("SELECT * FROM pg_create_logical_replication_slot('s', 'pgoutput')"),
            "SELECT * FROM \"_pgrelay\".pg_create_logical_replication_slot('s', 'pgoutput')");
  EXPECT_EQ(rw("SELECT pg_create_logical_replication_slot(slot_name => 's', plugin => 'pgoutput')"),
            "SELECT \"_pgrelay\".pg_create_logical_replication_slot(slot_name => 's', plugin => "
            "'pgoutput')");
  EXPECT_EQ(rw("SELECT pg_catalog.pg_drop_replication_slot('s')"),
            "SELECT \"_pgrelay\".pg_drop_replication_slot('s')");
  EXPECT_EQ(rw("SELECT pg_terminate_backend(1073741825, 10)"),
            "SELECT \"_pgrelay\".pg_terminate_backend(1073741825, 10)");
}

// A renamed function keeps the column name Postgres gives the call.
TEST_F(SqlRewriteTest, EmitMessageIsRenamed) {
  EXPECT_EQ(rw("SELECT pg_logical_emit_message(false, 'p', 'x')"),
            "SELECT \"_pgrelay\".emit_message(false, 'p', 'x') AS \"pg_logical_emit_message\"");
  EXPECT_EQ(
      rw("SELECT pg_catalog.pg_logical_emit_message(true, 'p', 'x'::bytea)"),
      "SELECT \"_pgrelay\".emit_message(true, 'p', 'x'::bytea) AS \"pg_logical_emit_message\"");
  EXPECT_EQ(rw("SELECT \"pg_logical_emit_message\"(true, 'p', 'x') AS lsn"),
            "SELECT \"_pgrelay\".emit_message(true, 'p', 'x') AS lsn");
  EXPECT_EQ(rw("SELECT 1 FROM t WHERE pg_logical_emit_message(true, 'p', 'x') IS NOT NULL"),
            "SELECT 1 FROM t WHERE \"_pgrelay\".emit_message(true, 'p', 'x') IS NOT NULL");
}

// Which slot functions a session reaches depends on its user's REPLICATION right.
TEST_F(SqlRewriteTest, SlotFunctionsFollowTheSessionsAccess) {
  auto as = [this](const std::string& sql, SlotAccess access) {
    auto r = rewriter_.rewrite(sql, access);
    EXPECT_TRUE(r.ok() && r->has_value()) << sql;
    return r.ok() && r->has_value() ? **r : sql;
  };
  EXPECT_EQ(as("SELECT pg_drop_replication_slot('s')", SlotAccess::kChecked),
            "SELECT \"_pgrelay\".pg_drop_replication_slot('s')");
  EXPECT_EQ(as("SELECT pg_drop_replication_slot(f(g('s')))", SlotAccess::kGranted),
            "SELECT \"_pgrelay\".relay_drop_replication_slot(f(g('s'))) AS "
            "\"pg_drop_replication_slot\"");
  EXPECT_EQ(as("SELECT pg_catalog.pg_terminate_backend(1073741825) AS t", SlotAccess::kDenied),
            "SELECT \"_pgrelay\".denied_terminate_backend(1073741825) AS t");
  EXPECT_EQ(
      as("SELECT * FROM pg_create_logical_replication_slot('s', 'pgoutput')", SlotAccess::kGranted),
      "SELECT * FROM \"_pgrelay\".relay_create_logical_replication_slot('s', 'pgoutput')");
  EXPECT_EQ(as("SELECT slot_name, pg_drop_replication_slot(slot_name) FROM pg_replication_slots",
               SlotAccess::kDenied),
            "SELECT slot_name, \"_pgrelay\".denied_drop_replication_slot(slot_name) AS "
            "\"pg_drop_replication_slot\" FROM \"_pgrelay\".pg_replication_slots");
}

// pg_dump's catalog reads go to functions that leave pgrelay out; other sessions read the
// catalogs themselves.
TEST_F(SqlRewriteTest, PgDumpReadsCatalogsWithoutPgrelay) {
  const StatementSource dump(SlotAccess::kGranted, true);
  const std::string namespaces = "SELECT n.tableoid, n.oid, n.nspname FROM pg_namespace n";
  EXPECT_TRUE(unchanged(namespaces));
  EXPECT_FALSE(rewriter_.may_need_rewrite(namespaces));
  EXPECT_TRUE(rewriter_.may_need_rewrite(namespaces, dump));
  auto r = rewriter_.rewrite(namespaces, dump);
  ASSERT_TRUE(r.ok() && r->has_value());
  EXPECT_EQ(**r, "SELECT n.tableoid, n.oid, n.nspname FROM \"_pgrelay\".dump_pg_namespace() n");
  r = rewriter_.rewrite(
      "SELECT tableoid, oid, pnpubid FROM pg_catalog.pg_publication_namespace JOIN "
      "pg_catalog.pg_trigger t ON (src.tbloid = t.tgrelid) LEFT JOIN pg_catalog.pg_trigger u ON "
      "(u.oid = t.tgparentid) WHERE pg_publication_namespace.pnpubid > 0",
      dump);
  ASSERT_TRUE(r.ok() && r->has_value());
  EXPECT_EQ(**r,
            "SELECT tableoid, oid, pnpubid FROM \"_pgrelay\".dump_pg_publication_namespace() "
            "pg_publication_namespace JOIN \"_pgrelay\".dump_pg_trigger() t ON (src.tbloid = "
            "t.tgrelid) LEFT JOIN \"_pgrelay\".dump_pg_trigger() u ON (u.oid = t.tgparentid) WHERE "
            "pg_publication_namespace.pnpubid > 0");
  // A CTE of the same name is the CTE.
  r = rewriter_.rewrite("WITH pg_publication AS (SELECT 1 AS oid) SELECT oid FROM pg_publication",
                        dump);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->has_value());
}

TEST_F(SqlRewriteTest, PublishedTablesLeaveOutPgrelaysOwn) {
  EXPECT_TRUE(rewriter_.may_need_rewrite("select * from PG_PUBLICATION_TABLES"));
  EXPECT_EQ(rw("SELECT DISTINCT t.schemaname, t.tablename FROM pg_catalog.pg_publication_tables t "
               "WHERE t.pubname IN ('p')"),
            "SELECT DISTINCT t.schemaname, t.tablename FROM \"_pgrelay\".pg_publication_tables t "
            "WHERE t.pubname IN ('p')");
  EXPECT_EQ(
      rw("SELECT gpt.relid FROM pg_publication p, LATERAL pg_get_publication_tables(p.pubname) "
         "gpt"),
      "SELECT gpt.relid FROM pg_publication p, LATERAL "
      "\"_pgrelay\".pg_get_publication_tables(p.pubname) gpt");
}

TEST_F(SqlRewriteTest, Show) {
  EXPECT_EQ(rw("SHOW wal_level"), "SELECT \"_pgrelay\".current_setting('wal_level') AS wal_level");
  EXPECT_EQ(rw("show WAL_LEVEL;"),
            "SELECT \"_pgrelay\".current_setting('wal_level') AS wal_level;");
  EXPECT_EQ(rw("  /* c */ SHOW \"max_replication_slots\" -- x\n"),
            "  /* c */ SELECT \"_pgrelay\".current_setting('max_replication_slots') AS "
            "max_replication_slots -- x\n");
  EXPECT_EQ(rw("SHOW max_wal_senders; SHOW wal_sender_timeout"),
            "SELECT \"_pgrelay\".current_setting('max_wal_senders') AS max_wal_senders; "
            "SELECT \"_pgrelay\".current_setting('wal_sender_timeout') AS wal_sender_timeout");
}

TEST_F(SqlRewriteTest, CommentsWhitespaceAndParametersAreKept) {
  const std::string sql =
      "SELECT /* a */ slot_name\t,\n  pg_terminate_backend ( active_pid ) -- b\n"
      "FROM\n\tpg_replication_slots WHERE slot_name = $1 OR slot_name LIKE $2";
  EXPECT_EQ(rw(sql),
            "SELECT /* a */ slot_name\t,\n  \"_pgrelay\".pg_terminate_backend ( active_pid ) -- b\n"
            "FROM\n\t\"_pgrelay\".pg_replication_slots WHERE slot_name = $1 OR slot_name LIKE $2");
  // Comments inside a qualified name stay too.
  EXPECT_EQ(rw("SELECT pg_catalog/*x*/./*y*/pg_current_wal_lsn()"),
            "SELECT \"_pgrelay\"/*x*/./*y*/pg_current_wal_lsn()");
}

TEST_F(SqlRewriteTest, StringsContainingTheNamesAreUntouched) {
  EXPECT_EQ(rw("SELECT 'pg_settings', current_setting('pg_settings'), $$FROM pg_settings$$, "
               "E'pg_current_wal_lsn()' FROM pg_settings"),
            "SELECT 'pg_settings', \"_pgrelay\".current_setting('pg_settings'), $$FROM "
            "pg_settings$$, E'pg_current_wal_lsn()' FROM \"_pgrelay\".pg_settings");
  EXPECT_EQ(rw("SELECT name AS \"pg_settings\" FROM pg_settings WHERE name LIKE 'pg_settings%'"),
            "SELECT name AS \"pg_settings\" FROM \"_pgrelay\".pg_settings WHERE name LIKE "
            "'pg_settings%'");
}

TEST_F(SqlRewriteTest, JoinsSubqueriesAndLike) {
  EXPECT_EQ(rw("SELECT s.slot_name, r.pid FROM pg_replication_slots s JOIN pg_stat_replication r "
               "ON r.pid = s.active_pid LEFT JOIN pg_catalog.pg_settings g ON true"),
            "SELECT s.slot_name, r.pid FROM \"_pgrelay\".pg_replication_slots s JOIN "
            "\"_pgrelay\".pg_stat_replication r ON r.pid = s.active_pid LEFT JOIN "
            "\"_pgrelay\".pg_settings g ON true");
  EXPECT_EQ(rw("SELECT * FROM t WHERE x IN (SELECT slot_name FROM pg_replication_slots WHERE "
               "slot_name LIKE 'a%') AND EXISTS (SELECT 1 FROM (SELECT pg_current_wal_lsn()) q)"),
            "SELECT * FROM t WHERE x IN (SELECT slot_name FROM \"_pgrelay\".pg_replication_slots "
            "WHERE slot_name LIKE 'a%') AND EXISTS (SELECT 1 FROM (SELECT "
            "\"_pgrelay\".pg_current_wal_lsn()) q)");
  EXPECT_EQ(rw("SELECT * FROM t, LATERAL (SELECT * FROM pg_settings WHERE name = t.n) s"),
            "SELECT * FROM t, LATERAL (SELECT * FROM \"_pgrelay\".pg_settings WHERE name = t.n) s");
  EXPECT_EQ(rw("UPDATE t SET x = s.setting FROM pg_settings s WHERE s.name = t.n"),
            "UPDATE t SET x = s.setting FROM \"_pgrelay\".pg_settings s WHERE s.name = t.n");
  EXPECT_EQ(rw("DELETE FROM t USING pg_replication_slots s WHERE s.slot_name = t.n"),
            "DELETE FROM t USING \"_pgrelay\".pg_replication_slots s WHERE s.slot_name = t.n");
  EXPECT_EQ(rw("SELECT 1 UNION ALL SELECT count(*) FROM pg_replication_slots"),
            "SELECT 1 UNION ALL SELECT count(*) FROM \"_pgrelay\".pg_replication_slots");
}

TEST_F(SqlRewriteTest, CteNamedLikeACatalogViewShadowsIt) {
  EXPECT_EQ(rw("WITH pg_settings AS (SELECT 1 AS a) SELECT * FROM pg_settings"),
            "WITH pg_settings AS (SELECT 1 AS a) SELECT * FROM pg_settings");
  // The CTE's own body (not recursive) still sees the catalog view; a qualified name too.
  EXPECT_EQ(rw("WITH pg_settings AS (SELECT * FROM pg_settings) SELECT * FROM pg_settings, "
               "pg_catalog.pg_settings"),
            "WITH pg_settings AS (SELECT * FROM \"_pgrelay\".pg_settings) SELECT * FROM "
            "pg_settings, \"_pgrelay\".pg_settings");
  EXPECT_EQ(rw("WITH RECURSIVE pg_settings(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM "
               "pg_settings WHERE n < 3) SELECT * FROM pg_settings"),
            "WITH RECURSIVE pg_settings(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM "
            "pg_settings WHERE n < 3) SELECT * FROM pg_settings");
  // Scope ends with the statement that declares it.
  EXPECT_EQ(rw("SELECT (WITH pg_settings AS (SELECT 1) SELECT count(*) FROM pg_settings) FROM "
               "pg_settings"),
            "SELECT (WITH pg_settings AS (SELECT 1) SELECT count(*) FROM pg_settings) FROM "
            "\"_pgrelay\".pg_settings");
  // An unrelated CTE.
  EXPECT_EQ(rw("WITH cte AS (SELECT 1) SELECT * FROM cte, pg_settings"),
            "WITH cte AS (SELECT 1) SELECT * FROM cte, \"_pgrelay\".pg_settings");
}

TEST_F(SqlRewriteTest, DdlAndDmlTargetsAreNotRedirected) {
  EXPECT_TRUE(unchanged("CREATE TABLE pg_settings (a int)"));
  EXPECT_TRUE(unchanged("INSERT INTO pg_settings VALUES (1)"));
  EXPECT_TRUE(unchanged("UPDATE pg_settings SET setting = '1' WHERE name = 'work_mem'"));
  EXPECT_TRUE(unchanged("DROP VIEW pg_replication_slots"));
  EXPECT_EQ(rw("CREATE VIEW v AS SELECT * FROM pg_replication_slots"),
            "CREATE VIEW v AS SELECT * FROM \"_pgrelay\".pg_replication_slots");
  EXPECT_EQ(rw("INSERT INTO t SELECT pg_current_wal_lsn()"),
            "INSERT INTO t SELECT \"_pgrelay\".pg_current_wal_lsn()");
}

TEST_F(SqlRewriteTest, MultiStatementStrings) {
  EXPECT_EQ(rw("BEGIN; SELECT 1; SELECT * FROM pg_replication_slots;SHOW wal_level;COMMIT"),
            "BEGIN; SELECT 1; SELECT * FROM \"_pgrelay\".pg_replication_slots;SELECT "
            "\"_pgrelay\".current_setting('wal_level') AS wal_level;COMMIT");
}

TEST_F(SqlRewriteTest, PlpgsqlBodies) {
  const std::string sql =
      "CREATE OR REPLACE FUNCTION f() RETURNS void AS $$\n"
      "DECLARE message text := 'pg_logical_emit_message(';\n"
      "BEGIN\n"
      "  -- pg_logical_emit_message(true, 'a', 'b')\n"
      "  PERFORM pg_logical_emit_message(true, 'zh/0/ddl', message);\n"
      "  PERFORM pg_catalog.pg_logical_emit_message(false, 'x', 'y');\n"
      "  SELECT count(*) FROM pg_replication_slots INTO n;\n"
      "  PERFORM current_setting('wal_level');\n"
      "  PERFORM other.pg_logical_emit_message(1);\n"
      "END\n"
      "$$ LANGUAGE plpgsql;";
  EXPECT_EQ(rw(sql),
            "CREATE OR REPLACE FUNCTION f() RETURNS void AS $$\n"
            "DECLARE message text := 'pg_logical_emit_message(';\n"
            "BEGIN\n"
            "  -- pg_logical_emit_message(true, 'a', 'b')\n"
            "  PERFORM \"_pgrelay\".emit_message(true, 'zh/0/ddl', message);\n"
            "  PERFORM \"_pgrelay\".emit_message(false, 'x', 'y');\n"
            "  SELECT count(*) FROM \"_pgrelay\".pg_replication_slots INTO n;\n"
            "  PERFORM \"_pgrelay\".current_setting('wal_level');\n"
            "  PERFORM other.pg_logical_emit_message(1);\n"
            "END\n"
            "$$ LANGUAGE plpgsql;");
}

TEST_F(SqlRewriteTest, PlpgsqlBodyKeepsItsTagOrGetsAFreshOne) {
  EXPECT_EQ(rw("CREATE FUNCTION f() RETURNS void LANGUAGE plpgsql AS $fn$BEGIN PERFORM "
               "pg_logical_emit_message(true, $$a$$, 'b'); END$fn$"),
            "CREATE FUNCTION f() RETURNS void LANGUAGE plpgsql AS $fn$BEGIN PERFORM "
            "\"_pgrelay\".emit_message(true, $$a$$, 'b'); END$fn$");
  // A single-quoted body becomes dollar-quoted (its '' are single quotes again).
  EXPECT_EQ(rw("CREATE FUNCTION f() RETURNS void LANGUAGE plpgsql AS 'BEGIN PERFORM "
               "pg_logical_emit_message(true, ''a'', ''b''); END'"),
            "CREATE FUNCTION f() RETURNS void LANGUAGE plpgsql AS $$BEGIN PERFORM "
            "\"_pgrelay\".emit_message(true, 'a', 'b'); END$$");
  // The body holds $$, so another tag.
  EXPECT_EQ(rw("CREATE FUNCTION f() RETURNS void LANGUAGE plpgsql AS 'BEGIN PERFORM "
               "pg_logical_emit_message(true, $$a$$, ''b''); END'"),
            "CREATE FUNCTION f() RETURNS void LANGUAGE plpgsql AS $pgrelay$BEGIN PERFORM "
            "\"_pgrelay\".emit_message(true, $$a$$, 'b'); END$pgrelay$");
}

TEST_F(SqlRewriteTest, DollarQuoteNeverGluesToAPrecedingWord) {
  // AS'...' is valid; AS$$...$$ would scan as one identifier.
  EXPECT_EQ(rw("CREATE FUNCTION f() RETURNS void LANGUAGE plpgsql AS'BEGIN PERFORM "
               "pg_current_wal_lsn(); END'"),
            "CREATE FUNCTION f() RETURNS void LANGUAGE plpgsql AS $$BEGIN PERFORM "
            "\"_pgrelay\".pg_current_wal_lsn(); END$$");
  // A body ending in '$' cannot be closed by $$.
  EXPECT_EQ(rw("CREATE FUNCTION f() RETURNS void LANGUAGE plpgsql AS 'BEGIN PERFORM "
               "pg_current_wal_lsn(); END $'"),
            "CREATE FUNCTION f() RETURNS void LANGUAGE plpgsql AS $pgrelay$BEGIN PERFORM "
            "\"_pgrelay\".pg_current_wal_lsn(); END $$pgrelay$");
}

TEST_F(SqlRewriteTest, DoBlocks) {
  EXPECT_EQ(rw("DO $$BEGIN PERFORM pg_logical_emit_message(true, 'p', 'm'); END$$"),
            "DO $$BEGIN PERFORM \"_pgrelay\".emit_message(true, 'p', 'm'); END$$");
  EXPECT_EQ(rw("DO LANGUAGE plpgsql $x$BEGIN PERFORM 1 FROM pg_stat_replication; END$x$"),
            "DO LANGUAGE plpgsql $x$BEGIN PERFORM 1 FROM \"_pgrelay\".pg_stat_replication; END$x$");
  // Other languages are left alone.
  EXPECT_TRUE(unchanged("DO LANGUAGE plperl $$ pg_logical_emit_message(1) $$"));
}

TEST_F(SqlRewriteTest, SqlBodies) {
  EXPECT_EQ(rw("CREATE FUNCTION lag() RETURNS SETOF pg_lsn LANGUAGE sql AS $$ SELECT "
               "restart_lsn FROM pg_replication_slots WHERE slot_name LIKE 'zh%' $$"),
            "CREATE FUNCTION lag() RETURNS SETOF pg_lsn LANGUAGE sql AS $$ SELECT "
            "restart_lsn FROM \"_pgrelay\".pg_replication_slots WHERE slot_name LIKE 'zh%' $$");
  // SQL-standard bodies are part of the statement itself.
  EXPECT_EQ(rw("CREATE FUNCTION w() RETURNS pg_lsn LANGUAGE sql BEGIN ATOMIC SELECT "
               "pg_current_wal_lsn(); END"),
            "CREATE FUNCTION w() RETURNS pg_lsn LANGUAGE sql BEGIN ATOMIC SELECT "
            "\"_pgrelay\".pg_current_wal_lsn(); END");
  // A body that does not parse is left as it is.
  EXPECT_TRUE(unchanged("CREATE FUNCTION b() RETURNS int LANGUAGE sql AS 'SELEC pg_settings'"));
}

TEST_F(SqlRewriteTest, SchemaNameIsQuoted) {
  SqlRewriter other(RewriteOptions{"my \"relay\""});
  auto r = other.rewrite("SELECT pg_current_wal_lsn()");
  ASSERT_TRUE(r.ok() && r->has_value());
  EXPECT_EQ(**r, "SELECT \"my \"\"relay\"\"\".pg_current_wal_lsn()");
}

TEST_F(SqlRewriteTest, ThreadsShareOneRewriter) {
  std::vector<std::thread> threads;
  std::vector<int> good(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([this, t, &good] {
      for (int i = 0; i < 200; ++i) {
        auto r = rewriter_.rewrite("SELECT slot_name FROM pg_replication_slots WHERE n = " +
                                   std::to_string(i));
        if (r.ok() && r->has_value() &&
            **r == "SELECT slot_name FROM \"_pgrelay\".pg_replication_slots WHERE n = " +
                       std::to_string(i))
          ++good[t];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int g : good) EXPECT_EQ(g, 200);
}

// The databases a statement's text names, and those it drops.
std::vector<std::string> names_used_alone(std::string_view sql) {
  std::vector<std::string> out;
  for (const auto& database : databases_used_alone(sql)) out.push_back(database.name);
  return out;
}
std::vector<std::string> dropped_databases(std::string_view sql) {
  std::vector<std::string> out;
  for (const auto& database : databases_used_alone(sql)) {
    if (database.dropped) out.push_back(database.name);
  }
  return out;
}

// DROP DATABASE, found by the parser: pgrelay lets go of the database before it is sent.
TEST(DatabasesUsedAloneTest, FindsEveryDropAndNothingElse) {
  using Names = std::vector<std::string>;
  EXPECT_EQ(dropped_databases("DROP DATABASE app"), Names{"app"});
  EXPECT_EQ(dropped_databases("drop database if exists \"My App\" with (force)"), Names{"My App"});
  EXPECT_EQ(dropped_databases("/* x */ DROP DATABASE a; SELECT 1; DROP DATABASE \"b\"\"c\""),
            (Names{"a", "b\"c"}));
  EXPECT_EQ(dropped_databases("SELECT 'DROP DATABASE app'"), Names{});
  EXPECT_EQ(dropped_databases("CREATE DATABASE app"), Names{});
  EXPECT_EQ(dropped_databases("ALTER DATABASE app RENAME TO b"), Names{});
  EXPECT_EQ(dropped_databases("SELECT current_database()"), Names{});
  EXPECT_EQ(dropped_databases("DROP DATABASE"), Names{});  // a syntax error: the upstream says
  EXPECT_EQ(dropped_databases("SELECT 1"), Names{});
  // One parse says both: the drop is one of the statements that need their database alone.
  EXPECT_EQ(databases_used_alone("ALTER DATABASE b RENAME TO c; DROP DATABASE a"),
            (std::vector<DatabaseUsedAlone>{{"b", false}, {"a", true}}));
}

// The statements the upstream refuses while another backend is connected to the database:
// pgrelay closes the backends it keeps there first.
TEST(DatabasesUsedAloneTest, FindsDropsRenamesMovesAndTemplates) {
  using Names = std::vector<std::string>;
  EXPECT_EQ(names_used_alone("DROP DATABASE app"), Names{"app"});
  EXPECT_EQ(names_used_alone("ALTER DATABASE \"Old\" RENAME TO new"), Names{"Old"});
  EXPECT_EQ(names_used_alone("alter database app set tablespace fast"), Names{"app"});
  EXPECT_EQ(names_used_alone("CREATE DATABASE copy TEMPLATE source"), Names{"source"});
  EXPECT_EQ(names_used_alone("CREATE DATABASE copy WITH TEMPLATE = 'source' OWNER app"),
            Names{"source"});
  EXPECT_EQ(names_used_alone("DROP DATABASE a; ALTER DATABASE b RENAME TO c"), (Names{"a", "b"}));
  EXPECT_EQ(names_used_alone("CREATE DATABASE copy"), Names{"template1"});
  // None of these needs the database to itself.
  EXPECT_EQ(names_used_alone("ALTER DATABASE app SET work_mem = '8MB'"), Names{});
  EXPECT_EQ(names_used_alone("ALTER DATABASE app OWNER TO someone"), Names{});
  EXPECT_EQ(names_used_alone("ALTER TABLE t RENAME TO u"), Names{});
  EXPECT_EQ(names_used_alone("SELECT 'DROP DATABASE app'"), Names{});
}

}  // namespace
}  // namespace pgrelay::server
