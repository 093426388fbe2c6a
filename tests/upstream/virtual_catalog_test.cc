// The virtual catalog in a real PG 15 (wal_level=replica), queried by zero-cache's statements.
#include "upstream/virtual_catalog.h"

#include <gtest/gtest.h>
#include <libpq-fe.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "pg_server.h"
#include "server/sql_rewrite.h"

namespace pgrelay::upstream {
namespace {

using test::PgConnection;
using test::PgServer;
using test::Row;
using test::Rows;
using Params = std::vector<std::optional<std::string>>;
using server::SlotAccess;

constexpr std::int32_t kWalsenderPid = kFirstWalsenderPid + 6;

// zero-cache's statements, byte for byte as it sends them (tools/zero-harness, numbers there).
constexpr const char* kStmt5 = R"(SELECT pg_terminate_backend(active_pid), active_pid as pid
      FROM pg_replication_slots 
      WHERE slot_name = $1 
         OR slot_name LIKE $2)";
constexpr const char* kStmt9 = R"(SELECT current_setting('wal_level') as "walLevel", 
             current_setting('server_version_num') as "version";)";
constexpr const char* kStmt25 = R"(SELECT slot_name as slot, pg_drop_replication_slot(slot_name) 
        FROM pg_replication_slots
        LEFT JOIN "zh_0"."replicas" replica on slot_name = slot
        WHERE slot_name LIKE $1 
          AND NOT active
          AND replica.id IS NULL;)";
constexpr const char* kStmt26 = R"(SELECT slot_name as slot, active_pid as pid, replica.id as id
        FROM pg_replication_slots
        LEFT JOIN "zh_0"."replicas" replica on slot_name = slot
        WHERE slot_name LIKE $1;)";
constexpr const char* kStmt27 = R"(SELECT slot_name as name FROM pg_replication_slots
            WHERE slot_name LIKE $1;)";
constexpr const char* kStmt45 =
    R"(SELECT restart_lsn as "restartLSN", wal_status as "walStatus" FROM pg_replication_slots
      WHERE slot_name = $1)";
constexpr const char* kStmt46 =
    R"(SELECT current_setting('server_version_num')::int as "pgVersion")";
constexpr const char* kStmt47 =
    R"(WITH CTE AS (SELECT extract(epoch from now()) * 1000 as "commitTimeMs")
          SELECT "commitTimeMs", pg_logical_emit_message(
            false,
            $1,
            json_build_object(
              'id', $2::text,
              'sendTimeMs', $3::int8,
              'commitTimeMs', "commitTimeMs"
            )::text
          ) as lsn FROM CTE;)";
constexpr const char* kStmt48 =
    R"(SELECT pg_terminate_backend(active_pid) as terminated, active_pid as pid
        FROM pg_replication_slots
        WHERE slot_name = $1)";
constexpr const char* kStmt51 = R"(SELECT EXTRACT(EPOCH FROM (setting || unit)::interval) * 1000 
        AS "walSenderTimeoutMs" FROM pg_settings
        WHERE name = 'wal_sender_timeout')";
constexpr const char* kStmt54 =
    R"(SELECT pg_drop_replication_slot(slot_name), slot_name as "slotName"
          FROM pg_replication_slots 
          WHERE slot_name = $1 
             OR slot_name LIKE $2)";

// The outcome of one statement: rows, or the error's SQLSTATE and primary message, plus the
// primary messages of notices.
struct Outcome {
  Rows rows;
  std::vector<std::string> columns;
  std::string sqlstate;
  std::string message;
  std::vector<std::string> notices;
  bool ok() const { return sqlstate.empty(); }
};

void collect_notice(void* arg, const PGresult* res) {
  const char* m = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
  static_cast<std::vector<std::string>*>(arg)->push_back(m != nullptr ? m : "");
}

Outcome run(PGconn* conn, const std::string& sql, const Params& params = {}) {
  Outcome out;
  PQsetNoticeReceiver(conn, collect_notice, &out.notices);
  std::vector<const char*> values;
  for (const auto& p : params) values.push_back(p ? p->c_str() : nullptr);
  PGresult* res = PQexecParams(conn, sql.c_str(), static_cast<int>(values.size()), nullptr,
                               values.data(), nullptr, nullptr, 0);
  PQsetNoticeReceiver(
      conn, [](void*, const PGresult*) {}, nullptr);
  const ExecStatusType st = res != nullptr ? PQresultStatus(res) : PGRES_FATAL_ERROR;
  if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
    const char* code = res != nullptr ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : nullptr;
    const char* msg = res != nullptr ? PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) : nullptr;
    out.sqlstate = code != nullptr ? code : "?????";
    out.message = msg != nullptr ? msg : PQerrorMessage(conn);
  } else {
    for (int c = 0; c < PQnfields(res); ++c) out.columns.emplace_back(PQfname(res, c));
    for (int r = 0; r < PQntuples(res); ++r) {
      Row row;
      for (int c = 0; c < PQnfields(res); ++c) {
        if (PQgetisnull(res, r, c)) {
          row.emplace_back(std::nullopt);
        } else {
          row.emplace_back(PQgetvalue(res, r, c));
        }
      }
      out.rows.push_back(std::move(row));
    }
  }
  PQclear(res);
  return out;
}

Row row(std::initializer_list<std::optional<std::string>> values) {
  return Row(values);
}

class VirtualCatalogTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    test::PgServerOptions options;
    options.settings["wal_level"] = "replica";
    server_ = new PgServer(options);
    // pgrelay's upstream role is no superuser: it owns the database, nothing more.
    server_->exec("CREATE ROLE relay LOGIN");
    server_->exec("CREATE ROLE client LOGIN");
    server_->exec("CREATE DATABASE app OWNER relay");
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }

  void SetUp() override {
    auto c = VirtualCatalog::open(server_->conninfo("app", "relay"), "_pgrelay");
    ASSERT_TRUE(c.ok()) << c.error().message;
    catalog_ = std::move(*c);
    Status installed = catalog_->install();
    ASSERT_TRUE(installed.ok()) << installed.error().message;
    Status capturing = catalog_->set_capture_refusal(std::nullopt);
    ASSERT_TRUE(capturing.ok()) << capturing.error().message;
    relay_ = std::make_unique<PgConnection>(server_->conninfo("app", "relay"));
  }

  void TearDown() override {
    relay_.reset();
    if (catalog_) {
      Status s = catalog_->uninstall();
      EXPECT_TRUE(s.ok()) << s.error().message;
    }
    catalog_.reset();
  }

  // The statement as pgrelay forwards it (by default for a user with the REPLICATION right): it
  // must have been rewritten.
  std::string virt(const std::string& sql, SlotAccess access = SlotAccess::kGranted) const {
    EXPECT_TRUE(rewriter_.may_need_rewrite(sql)) << sql;
    auto r = rewriter_.rewrite(sql, access);
    EXPECT_TRUE(r.ok());
    EXPECT_TRUE(r.ok() && r->has_value()) << "not rewritten: " << sql;
    return r.ok() && r->has_value() ? **r : sql;
  }
  Outcome vrun(PgConnection& c, const std::string& sql, const Params& params = {}) {
    return run(c.raw(), virt(sql), params);
  }
  // As a session straight to the upstream that calls pgrelay's Postgres-named functions.
  Outcome direct(PgConnection& c, const std::string& sql) {
    return run(c.raw(), virt(sql, SlotAccess::kChecked));
  }

  SlotRow slot(const std::string& name, std::optional<std::int32_t> active_pid = std::nullopt) {
    SlotRow s;
    s.slot_name = name;
    s.database = "app";
    s.active = active_pid.has_value();
    s.active_pid = active_pid;
    s.catalog_xmin = 750;
    s.restart_lsn = wire::Lsn(0x1000028);
    s.confirmed_flush_lsn = wire::Lsn(0x1000060);
    return s;
  }

  static PgServer* server_;
  std::unique_ptr<VirtualCatalog> catalog_;
  std::unique_ptr<PgConnection> relay_;
  server::SqlRewriter rewriter_{server::RewriteOptions{}};
};

PgServer* VirtualCatalogTest::server_ = nullptr;

TEST_F(VirtualCatalogTest, ViewsHavePostgres15ColumnsNamesOrderAndTypes) {
  ASSERT_TRUE(catalog_->install().ok());  // idempotent
  for (const char* view : {"pg_replication_slots", "pg_stat_replication", "pg_settings"}) {
    const std::string columns =
        "SELECT string_agg(attname || ' ' || atttypid::regtype::text, ', ' ORDER BY attnum) "
        "FROM pg_attribute WHERE attnum > 0 AND attrelid = ";
    const std::string ours = relay_->scalar(columns + "'_pgrelay." + view + "'::regclass");
    const std::string theirs = relay_->scalar(columns + "'pg_catalog." + view + "'::regclass");
    EXPECT_EQ(ours, theirs) << view;
  }
  EXPECT_EQ(relay_->scalar("SELECT count(*) FROM pg_attribute WHERE attnum > 0 AND attrelid = "
                           "'_pgrelay.pg_replication_slots'::regclass"),
            "15");
}

TEST_F(VirtualCatalogTest, SettingsAnswerAsLogicalReplication) {
  Outcome s9 = vrun(*relay_, kStmt9);
  ASSERT_TRUE(s9.ok()) << s9.message;
  EXPECT_EQ(s9.columns, (std::vector<std::string>{"walLevel", "version"}));
  ASSERT_EQ(s9.rows.size(), 1u);
  EXPECT_EQ(s9.rows[0][0], "logical");
  EXPECT_EQ(s9.rows[0][1],
            relay_->scalar("SELECT pg_catalog.current_setting('server_version_num')"));
  // Without the rewrite, the upstream says what it is.
  EXPECT_EQ(relay_->scalar("SELECT current_setting('wal_level')"), "replica");

  Outcome s46 = vrun(*relay_, kStmt46);
  ASSERT_TRUE(s46.ok()) << s46.message;
  EXPECT_GE(std::stoi(*s46.rows.at(0).at(0)), 150000);

  Outcome show = vrun(*relay_, "SHOW wal_level");
  ASSERT_TRUE(show.ok()) << show.message;
  EXPECT_EQ(show.columns, std::vector<std::string>{"wal_level"});
  EXPECT_EQ(show.rows, Rows{row({"logical"})});
  EXPECT_EQ(vrun(*relay_, "SHOW wal_sender_timeout").rows, Rows{row({"1min"})});
  EXPECT_EQ(vrun(*relay_, "show MAX_REPLICATION_SLOTS").rows, Rows{row({"10"})});
  EXPECT_EQ(vrun(*relay_,
                 "SELECT current_setting('WAL_LEVEL', true), "
                 "current_setting('no.such', true), current_setting('work_mem')")
                .rows,
            Rows{row({"logical", std::nullopt, relay_->scalar("SHOW work_mem")})});
  Outcome missing = vrun(*relay_, "SELECT current_setting('no_such_setting')");
  EXPECT_EQ(missing.sqlstate, "42704");
  EXPECT_EQ(missing.message, "unrecognized configuration parameter \"no_such_setting\"");

  Outcome s51 = vrun(*relay_, kStmt51);
  ASSERT_TRUE(s51.ok()) << s51.message;
  EXPECT_EQ(s51.columns, std::vector<std::string>{"walSenderTimeoutMs"});
  EXPECT_EQ(std::stod(*s51.rows.at(0).at(0)), 60000.0);

  CatalogSettings settings;
  settings.max_replication_slots = 7;
  settings.max_wal_senders = 9;
  settings.wal_sender_timeout_ms = 30000;
  ASSERT_TRUE(catalog_->set_settings(settings).ok());
  EXPECT_EQ(std::stod(*vrun(*relay_, kStmt51).rows.at(0).at(0)), 30000.0);
  EXPECT_EQ(vrun(*relay_, "SHOW wal_sender_timeout").rows, Rows{row({"30s"})});

  Outcome rows = vrun(*relay_,
                      "SELECT name, setting, reset_val, unit FROM pg_settings WHERE name IN "
                      "('wal_level', 'max_replication_slots', 'max_wal_senders', "
                      "'wal_sender_timeout', 'work_mem') ORDER BY name");
  ASSERT_TRUE(rows.ok()) << rows.message;
  const std::string work_mem =
      relay_->scalar("SELECT setting FROM pg_catalog.pg_settings WHERE name = 'work_mem'");
  EXPECT_EQ(rows.rows, (Rows{row({"max_replication_slots", "7", "7", std::nullopt}),
                             row({"max_wal_senders", "9", "9", std::nullopt}),
                             row({"wal_level", "logical", "logical", std::nullopt}),
                             row({"wal_sender_timeout", "30000", "30000", "ms"}),
                             row({"work_mem", work_mem, work_mem, "kB"})}));
  // Every other row is Postgres's, in Postgres's order.
  EXPECT_EQ(relay_->scalar("SELECT count(*) FROM _pgrelay.pg_settings"),
            relay_->scalar("SELECT count(*) FROM pg_catalog.pg_settings"));
  EXPECT_EQ(relay_->scalar("SELECT string_agg(name, ',') FROM _pgrelay.pg_settings"),
            relay_->scalar("SELECT string_agg(name, ',') FROM pg_catalog.pg_settings"));
}

TEST_F(VirtualCatalogTest, ZeroCacheSlotStatements) {
  relay_->exec("CREATE SCHEMA zh_0; CREATE TABLE zh_0.replicas (slot text, id int)");
  relay_->exec("INSERT INTO zh_0.replicas VALUES ('zh_0_b', 7)");
  ASSERT_TRUE(catalog_->upsert_slot(slot("zh_0_a", kWalsenderPid)).ok());
  ASSERT_TRUE(catalog_->upsert_slot(slot("zh_0_b")).ok());
  ASSERT_TRUE(catalog_->upsert_slot(slot("zh_0_c")).ok());
  ASSERT_TRUE(catalog_->upsert_slot(slot("other")).ok());
  const std::string pid = std::to_string(kWalsenderPid);

  Outcome s27 = vrun(*relay_, kStmt27, {"zh\\_0\\_%"});
  ASSERT_TRUE(s27.ok()) << s27.message;
  EXPECT_EQ(s27.columns, std::vector<std::string>{"name"});
  std::sort(s27.rows.begin(), s27.rows.end());
  EXPECT_EQ(s27.rows, (Rows{row({"zh_0_a"}), row({"zh_0_b"}), row({"zh_0_c"})}));

  Outcome s26 = vrun(*relay_, kStmt26, {"zh_0_%"});
  ASSERT_TRUE(s26.ok()) << s26.message;
  std::sort(s26.rows.begin(), s26.rows.end());
  EXPECT_EQ(s26.rows, (Rows{row({"zh_0_a", pid, std::nullopt}), row({"zh_0_b", std::nullopt, "7"}),
                            row({"zh_0_c", std::nullopt, std::nullopt})}));

  Outcome s45 = vrun(*relay_, kStmt45, {"zh_0_a"});
  ASSERT_TRUE(s45.ok()) << s45.message;
  EXPECT_EQ(s45.columns, (std::vector<std::string>{"restartLSN", "walStatus"}));
  EXPECT_EQ(s45.rows, Rows{row({"0/1000028", "reserved"})});

  // Drops the inactive slot no replica uses: zh_0_c only.
  Outcome s25 = vrun(*relay_, kStmt25, {"zh_0_%"});
  ASSERT_TRUE(s25.ok()) << s25.message;
  EXPECT_EQ(s25.rows, Rows{row({"zh_0_c", ""})});
  EXPECT_EQ(relay_->scalar("SELECT string_agg(slot_name, ',' ORDER BY slot_name) FROM "
                           "_pgrelay.pg_replication_slots"),
            "other,zh_0_a,zh_0_b");

  // Terminates pgrelay's walsender on zh_0_a.
  Outcome s48 = vrun(*relay_, kStmt48, {"zh_0_a"});
  ASSERT_TRUE(s48.ok()) << s48.message;
  EXPECT_EQ(s48.columns, (std::vector<std::string>{"terminated", "pid"}));
  EXPECT_EQ(s48.rows, Rows{row({"t", pid})});

  // An inactive slot has no pid: pg_terminate_backend(NULL) is NULL, as in Postgres.
  Outcome s5 = vrun(*relay_, kStmt5, {"zh_0_b", "nothing%"});
  ASSERT_TRUE(s5.ok()) << s5.message;
  EXPECT_EQ(s5.rows, Rows{row({std::nullopt, std::nullopt})});

  // Dropping an active slot fails as in Postgres, and changes nothing.
  Outcome active = vrun(*relay_, kStmt54, {"zh_0_a", "nothing%"});
  EXPECT_EQ(active.sqlstate, "55006");
  EXPECT_EQ(active.message, "replication slot \"zh_0_a\" is active for PID " + pid);
  Outcome s54 = vrun(*relay_, kStmt54, {"zh_0_b", "nothing%"});
  ASSERT_TRUE(s54.ok()) << s54.message;
  EXPECT_EQ(s54.columns, (std::vector<std::string>{"pg_drop_replication_slot", "slotName"}));
  EXPECT_EQ(s54.rows, Rows{row({"", "zh_0_b"})});

  auto requests = catalog_->take_requests();
  ASSERT_TRUE(requests.ok()) << requests.error().message;
  ASSERT_EQ(requests->size(), 3u);
  const std::int32_t backend = std::stoi(relay_->scalar("SELECT pg_backend_pid()"));
  EXPECT_EQ((*requests)[0].kind, CatalogRequest::Kind::kDropSlot);
  EXPECT_EQ((*requests)[0].slot_name, "zh_0_c");
  EXPECT_EQ((*requests)[0].backend_pid, backend);
  EXPECT_EQ((*requests)[1].kind, CatalogRequest::Kind::kTerminate);
  EXPECT_EQ((*requests)[1].pid, kWalsenderPid);
  EXPECT_EQ((*requests)[2].kind, CatalogRequest::Kind::kDropSlot);
  EXPECT_EQ((*requests)[2].slot_name, "zh_0_b");
  EXPECT_LT((*requests)[0].id, (*requests)[1].id);
  // Taken means gone.
  auto again = catalog_->take_requests();
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->empty());
}

TEST_F(VirtualCatalogTest, EmitMessageThroughTheCaptureFunction) {
  // Stand-in for the capture's emit_message (not this module's): records what it is given.
  relay_->exec(
      "CREATE TABLE public.emitted (transactional boolean, prefix text, content text);"
      "CREATE FUNCTION _pgrelay.emit_message(boolean, text, text) RETURNS pg_lsn LANGUAGE sql "
      "AS $$ INSERT INTO public.emitted VALUES ($1, $2, $3); "
      "SELECT pg_catalog.pg_current_wal_lsn() $$");
  Outcome s47 = vrun(*relay_, kStmt47, {"zh/0/lag", "abc", "1234"});
  ASSERT_TRUE(s47.ok()) << s47.message;
  EXPECT_EQ(s47.columns, (std::vector<std::string>{"commitTimeMs", "lsn"}));
  ASSERT_EQ(s47.rows.size(), 1u);
  EXPECT_TRUE(wire::Lsn::parse(*s47.rows[0][1]).has_value());
  const Rows emitted = relay_->exec(
      "SELECT transactional, prefix, content::json->>'id', content::json->>'sendTimeMs' FROM "
      "public.emitted");
  EXPECT_EQ(emitted, Rows{row({"f", "zh/0/lag", "abc", "1234"})});

  // A plpgsql function a client creates (as zero-cache's DDL event triggers) calls it too.
  Outcome created = vrun(*relay_,
                         "CREATE FUNCTION public.ddl_hook(event_type text) RETURNS void AS $$\n"
                         "DECLARE message TEXT;\n"
                         "BEGIN\n"
                         "  SELECT json_build_object('type', event_type) INTO message;\n"
                         "  PERFORM pg_logical_emit_message(true, 'zh/0/ddl', message);\n"
                         "END\n"
                         "$$ LANGUAGE plpgsql;");
  ASSERT_TRUE(created.ok()) << created.message;
  relay_->exec("SELECT public.ddl_hook('ddlUpdate')");
  EXPECT_EQ(relay_->scalar("SELECT content FROM public.emitted WHERE prefix = 'zh/0/ddl'"),
            "{\"type\" : \"ddlUpdate\"}");
  relay_->exec(
      "DROP FUNCTION public.ddl_hook(text); DROP FUNCTION _pgrelay.emit_message(boolean, "
      "text, text); DROP TABLE public.emitted");
}

TEST_F(VirtualCatalogTest, CreateSlotChecksAndRequests) {
  const std::string before = relay_->scalar("SELECT pg_catalog.pg_current_wal_lsn()");
  Outcome created = vrun(*relay_,
                         "SELECT * FROM pg_create_logical_replication_slot('s1', "
                         "'pgoutput')");
  ASSERT_TRUE(created.ok()) << created.message;
  EXPECT_EQ(created.columns, (std::vector<std::string>{"slot_name", "lsn"}));
  ASSERT_EQ(created.rows.size(), 1u);
  EXPECT_EQ(created.rows[0][0], "s1");
  const auto lsn = wire::Lsn::parse(*created.rows[0][1]);
  ASSERT_TRUE(lsn.has_value());
  EXPECT_GE(*lsn, *wire::Lsn::parse(before));

  EXPECT_EQ(relay_->exec("SELECT slot_name, plugin, slot_type, database, temporary, active, "
                         "active_pid, restart_lsn, confirmed_flush_lsn, wal_status, two_phase, "
                         "catalog_xmin IS NOT NULL FROM _pgrelay.pg_replication_slots"),
            Rows{row({"s1", "pgoutput", "logical", "app", "f", "f", std::nullopt, lsn->to_string(),
                      lsn->to_string(), "reserved", "f", "t"})});

  // Named arguments and the temporary/two-phase flags, as Postgres's signature has them.
  Outcome named = vrun(*relay_,
                       "SELECT slot_name FROM pg_catalog.pg_create_logical_replication_slot("
                       "slot_name => 's2', plugin => 'pgoutput', temporary => true, "
                       "twophase => true)");
  ASSERT_TRUE(named.ok()) << named.message;
  EXPECT_EQ(named.rows, Rows{row({"s2"})});

  // Same checks and texts as Postgres (compared with what this Postgres says itself).
  PgConnection admin = server_->connect_admin("app");
  Outcome real_dup_first =
      run(admin.raw(), "SELECT pg_catalog.pg_create_physical_replication_slot('s1')");
  ASSERT_TRUE(real_dup_first.ok()) << real_dup_first.message;
  Outcome real_dup =
      run(admin.raw(), "SELECT pg_catalog.pg_create_physical_replication_slot('s1')");
  Outcome dup = vrun(*relay_, "SELECT pg_create_logical_replication_slot('s1', 'pgoutput')");
  EXPECT_EQ(dup.sqlstate, "42710");
  EXPECT_EQ(dup.sqlstate, real_dup.sqlstate);
  EXPECT_EQ(dup.message, real_dup.message);
  run(admin.raw(), "SELECT pg_catalog.pg_drop_replication_slot('s1')");

  Outcome real_bad =
      run(admin.raw(), "SELECT pg_catalog.pg_create_physical_replication_slot('Bad-Name')");
  Outcome bad = vrun(*relay_, "SELECT pg_create_logical_replication_slot('Bad-Name', 'pgoutput')");
  EXPECT_EQ(bad.sqlstate, "42602");
  EXPECT_EQ(bad.sqlstate, real_bad.sqlstate);
  EXPECT_EQ(bad.message, real_bad.message);

  Outcome plugin = vrun(*relay_, "SELECT pg_create_logical_replication_slot('s3', 'wal2json')");
  EXPECT_EQ(plugin.sqlstate, "58P01");

  relay_->exec("BEGIN; CREATE TEMP TABLE w (a int); INSERT INTO w VALUES (1)");
  Outcome writes = vrun(*relay_, "SELECT pg_create_logical_replication_slot('s4', 'pgoutput')");
  relay_->exec("ROLLBACK");
  EXPECT_EQ(writes.sqlstate, "25001");
  EXPECT_EQ(writes.message,
            "cannot create logical replication slot in transaction that has performed writes");

  CatalogSettings small;
  small.max_replication_slots = 2;
  ASSERT_TRUE(catalog_->set_settings(small).ok());
  Outcome full = vrun(*relay_, "SELECT pg_create_logical_replication_slot('s5', 'pgoutput')");
  EXPECT_EQ(full.sqlstate, "53400");
  EXPECT_EQ(full.message, "all replication slots are in use");

  // A rolled-back drop leaves the slot and no request.
  relay_->exec("BEGIN");
  ASSERT_TRUE(vrun(*relay_, "SELECT pg_drop_replication_slot('s2')").ok());
  relay_->exec("ROLLBACK");
  EXPECT_EQ(relay_->scalar("SELECT count(*) FROM _pgrelay.pg_replication_slots"), "2");

  auto requests = catalog_->take_requests();
  ASSERT_TRUE(requests.ok()) << requests.error().message;
  ASSERT_EQ(requests->size(), 2u);
  const CatalogRequest& r1 = (*requests)[0];
  EXPECT_EQ(r1.kind, CatalogRequest::Kind::kCreateSlot);
  EXPECT_EQ(r1.slot_name, "s1");
  EXPECT_EQ(r1.plugin, "pgoutput");
  EXPECT_FALSE(r1.temporary);
  EXPECT_FALSE(r1.two_phase);
  EXPECT_EQ(r1.lsn, *lsn);
  EXPECT_EQ(r1.backend_pid, std::stoi(relay_->scalar("SELECT pg_backend_pid()")));
  EXPECT_EQ((*requests)[1].slot_name, "s2");
  EXPECT_TRUE((*requests)[1].temporary);
  EXPECT_TRUE((*requests)[1].two_phase);
}

// A database pgrelay does not capture: slot creation is refused there before any other check,
// with the refusal's message and hint, and wal_level says what the upstream has.
TEST_F(VirtualCatalogTest, RefusedDatabaseRefusesSlotsAndReadsTheRealWalLevel) {
  ASSERT_TRUE(catalog_
                  ->set_capture_refusal(Error::make(sqlstate::kObjectNotInPrerequisiteState,
                                                    "database \"x\" is not captured by pgrelay",
                                                    "Start pgrelay with --capture-database x."))
                  .ok());
  for (const char* name : {"s1", "Bad-Name"}) {
    Outcome refused = vrun(*relay_, std::string("SELECT pg_create_logical_replication_slot('") +
                                        name + "', 'pgoutput')");
    EXPECT_EQ(refused.sqlstate, "55000") << name;
    EXPECT_EQ(refused.message, "database \"x\" is not captured by pgrelay");
  }
  PGresult* res = PQexec(relay_->raw(), virt("SELECT pg_create_logical_replication_slot('s1', "
                                             "'pgoutput')")
                                            .c_str());
  const char* hint = PQresultErrorField(res, PG_DIAG_MESSAGE_HINT);
  EXPECT_STREQ(hint != nullptr ? hint : "", "Start pgrelay with --capture-database x.");
  PQclear(res);
  EXPECT_EQ(vrun(*relay_, "SHOW wal_level").rows, Rows{row({"replica"})});
  EXPECT_TRUE(vrun(*relay_, "SELECT slot_name FROM pg_replication_slots").rows.empty());

  ASSERT_TRUE(catalog_->set_capture_refusal(std::nullopt).ok());
  EXPECT_EQ(vrun(*relay_, "SHOW wal_level").rows, Rows{row({"logical"})});
  Outcome made = vrun(*relay_,
                      "SELECT slot_name FROM pg_create_logical_replication_slot('s1', "
                      "'pgoutput')");
  ASSERT_TRUE(made.ok()) << made.message;
  EXPECT_EQ(made.rows, Rows{row({"s1"})});
}

TEST_F(VirtualCatalogTest, DropAndTerminateMatchPostgres) {
  PgConnection admin = server_->connect_admin("app");
  Outcome real_missing = run(admin.raw(), "SELECT pg_catalog.pg_drop_replication_slot('nope')");
  Outcome missing = vrun(*relay_, "SELECT pg_drop_replication_slot('nope')");
  EXPECT_EQ(missing.sqlstate, "42704");
  EXPECT_EQ(missing.sqlstate, real_missing.sqlstate);
  EXPECT_EQ(missing.message, real_missing.message);

  // A pgrelay pid with no walsender: the same warning and false as Postgres for a non-backend.
  const std::string unknown = std::to_string(kFirstWalsenderPid + 999);
  Outcome real_unknown =
      run(admin.raw(), "SELECT pg_catalog.pg_terminate_backend(" + unknown + ")");
  Outcome mine = vrun(*relay_, "SELECT pg_terminate_backend(" + unknown + ")");
  ASSERT_TRUE(mine.ok()) << mine.message;
  EXPECT_EQ(mine.rows, Rows{row({"f"})});
  EXPECT_EQ(mine.rows, real_unknown.rows);
  EXPECT_EQ(mine.notices, real_unknown.notices);
  EXPECT_EQ(mine.notices,
            std::vector<std::string>{"PID " + unknown + " is not a PostgreSQL backend process"});

  // A walsender pgrelay reports.
  WalsenderRow w;
  w.pid = kWalsenderPid;
  w.usename = "relay";
  w.application_name = "zero-replicator";
  w.client_addr = "127.0.0.1";
  w.client_port = 40000;
  w.backend_start = std::chrono::system_clock::time_point(std::chrono::seconds(1700000000)) +
                    std::chrono::microseconds(123456);
  w.sent_lsn = wire::Lsn(0x2000000);
  w.flush_lsn = wire::Lsn(0x1000000);
  w.flush_lag = std::chrono::microseconds(1500);
  w.slot_name = "zh_0_a";
  ASSERT_TRUE(catalog_->set_walsenders({w}).ok());
  const std::string stat_sql =
      "SELECT pid, usename, usesysid = (SELECT oid FROM pg_roles WHERE rolname = "
      "'relay'), application_name, client_addr, client_port, "
      "extract(epoch from backend_start), state, sent_lsn, write_lsn, flush_lsn, "
      "flush_lag, sync_priority, sync_state FROM pg_stat_replication";
  // As in Postgres 15: the replication columns need pg_read_all_stats, even for the
  // walsender's own role; the connection columns need the privileges of its role.
  Outcome own = vrun(*relay_, stat_sql);
  ASSERT_TRUE(own.ok()) << own.message;
  EXPECT_EQ(own.rows,
            Rows{row({std::to_string(kWalsenderPid), "relay", "t", "zero-replicator", "127.0.0.1",
                      "40000", "1700000000.123456", std::nullopt, std::nullopt, std::nullopt,
                      std::nullopt, std::nullopt, std::nullopt, std::nullopt})});
  PgConnection other(server_->conninfo("app", "client"));
  EXPECT_EQ(vrun(other, stat_sql).rows,
            Rows{row({std::to_string(kWalsenderPid), "relay", "t", "zero-replicator", std::nullopt,
                      std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                      std::nullopt, std::nullopt, std::nullopt, std::nullopt})});
  admin.exec("GRANT pg_read_all_stats TO relay");
  Outcome stat = vrun(*relay_, stat_sql);
  admin.exec("REVOKE pg_read_all_stats FROM relay");
  ASSERT_TRUE(stat.ok()) << stat.message;
  EXPECT_EQ(stat.rows,
            Rows{row({std::to_string(kWalsenderPid), "relay", "t", "zero-replicator", "127.0.0.1",
                      "40000", "1700000000.123456", "streaming", "0/2000000", std::nullopt,
                      "0/1000000", "00:00:00.0015", "0", "async"})});
  Outcome terminated =
      vrun(*relay_, "SELECT pg_terminate_backend(" + std::to_string(kWalsenderPid) + ")");
  EXPECT_EQ(terminated.rows, Rows{row({"t"})});
  EXPECT_TRUE(terminated.notices.empty());
  Outcome negative =
      vrun(*relay_, "SELECT pg_terminate_backend(" + std::to_string(kWalsenderPid) + ", -1)");
  EXPECT_EQ(negative.sqlstate, "22023");

  // An ordinary backend is Postgres's business.
  PgConnection victim(server_->conninfo("app", "relay"));
  const std::string victim_pid = victim.scalar("SELECT pg_backend_pid()");
  EXPECT_EQ(vrun(*relay_, "SELECT pg_terminate_backend(" + victim_pid + ", 5000)").rows,
            Rows{row({"t"})});
  EXPECT_THROW(victim.exec("SELECT 1"), test::PgError);

  ASSERT_TRUE(catalog_->set_walsenders({}).ok());
  EXPECT_EQ(relay_->scalar("SELECT count(*) FROM _pgrelay.pg_stat_replication"), "0");
  auto requests = catalog_->take_requests();
  ASSERT_TRUE(requests.ok());
  ASSERT_EQ(requests->size(), 1u);
  EXPECT_EQ((*requests)[0].kind, CatalogRequest::Kind::kTerminate);
  EXPECT_EQ((*requests)[0].pid, kWalsenderPid);
}

TEST_F(VirtualCatalogTest, WalPositionIsAtLeastTheLogHead) {
  const auto upstream = *wire::Lsn::parse(relay_->scalar("SELECT pg_catalog.pg_current_wal_lsn()"));
  Outcome now = vrun(*relay_, "SELECT pg_current_wal_lsn()");
  ASSERT_TRUE(now.ok()) << now.message;
  EXPECT_GE(*wire::Lsn::parse(*now.rows.at(0).at(0)), upstream);

  ASSERT_TRUE(catalog_->set_log_head(wire::Lsn(0x500000000)).ok());
  EXPECT_EQ(vrun(*relay_,
                 "SELECT pg_current_wal_lsn(), pg_catalog.pg_current_wal_insert_lsn(), "
                 "pg_current_wal_flush_lsn()")
                .rows,
            Rows{row({"5/0", "5/0", "5/0"})});
}

TEST_F(VirtualCatalogTest, WaitForRequestsWakesOnNotify) {
  auto started = std::chrono::steady_clock::now();
  auto waited = catalog_->wait_for_requests(std::chrono::milliseconds(200));
  ASSERT_TRUE(waited.ok());
  EXPECT_FALSE(*waited);
  const auto idle = std::chrono::steady_clock::now() - started;
  EXPECT_GE(idle, std::chrono::milliseconds(190));

  ASSERT_TRUE(catalog_->upsert_slot(slot("w1")).ok());
  std::thread dropper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    PgConnection c(server_->conninfo("app", "relay"));
    (void)run(c.raw(), virt("SELECT pg_drop_replication_slot('w1')"));
  });
  started = std::chrono::steady_clock::now();
  auto notified = catalog_->wait_for_requests(std::chrono::seconds(20));
  ASSERT_TRUE(notified.ok());
  EXPECT_TRUE(*notified);
  const auto woke = std::chrono::steady_clock::now() - started;
  dropper.join();
  EXPECT_LT(woke, std::chrono::seconds(10));
  auto requests = catalog_->take_requests();
  ASSERT_TRUE(requests.ok());
  ASSERT_EQ(requests->size(), 1u);
  EXPECT_EQ((*requests)[0].slot_name, "w1");
}

// Straight to the upstream, pgrelay's functions give every role what Postgres's give it: a
// plain role reads, and is refused slots, walsenders and pgrelay's state; a REPLICATION role
// manages slots. Through pgrelay, a user without the REPLICATION right is refused the same way.
TEST_F(VirtualCatalogTest, DirectCallersGetPostgresRights) {
  PgConnection admin = server_->connect_admin("app");
  admin.exec(
      "DO $$ BEGIN CREATE ROLE repl LOGIN REPLICATION; EXCEPTION WHEN duplicate_object "
      "THEN NULL; END $$");
  ASSERT_TRUE(catalog_->upsert_slot(slot("mine")).ok());
  WalsenderRow w;
  w.pid = kWalsenderPid;
  w.usename = "relay";
  ASSERT_TRUE(catalog_->set_walsenders({w}).ok());
  const std::string terminate =
      "SELECT pg_terminate_backend(" + std::to_string(kWalsenderPid) + ")";

  PgConnection client(server_->conninfo("app", "client"));
  EXPECT_EQ(direct(client, "SELECT slot_name FROM pg_replication_slots").rows, Rows{row({"mine"})});
  EXPECT_EQ(direct(client, "SELECT current_setting('wal_level')").rows, Rows{row({"logical"})});
  EXPECT_TRUE(direct(client, "SELECT pg_current_wal_lsn()").ok());
  for (const std::string& sql :
       {std::string("SELECT * FROM pg_create_logical_replication_slot('theirs', 'pgoutput')"),
        std::string("SELECT pg_drop_replication_slot('mine')")}) {
    Outcome refused = direct(client, sql);
    EXPECT_EQ(refused.sqlstate, "42501") << sql;
    EXPECT_EQ(refused.message, "must be superuser or replication role to use replication slots");
  }
  EXPECT_EQ(direct(client, terminate).sqlstate, "42501");
  // Naming another role as the caller does not help: the session's role could not become it.
  EXPECT_EQ(
      run(client.raw(), "SELECT _pgrelay.catalog_drop_slot_checked('mine', 'postgres')").sqlstate,
      "42501");
  // The workers, the relay_ entry points and the state are the owner's.
  for (const std::string& sql :
       {std::string("SELECT _pgrelay.catalog_drop_slot('mine')"),
        std::string("SELECT _pgrelay.relay_drop_replication_slot('mine')"),
        std::string("SELECT _pgrelay.catalog_terminate_walsender(") +
            std::to_string(kWalsenderPid) + ")",
        std::string("SELECT * FROM _pgrelay.catalog_settings"),
        std::string("SELECT * FROM _pgrelay.catalog_server"),
        std::string("DELETE FROM _pgrelay.catalog_slots"),
        std::string("INSERT INTO _pgrelay.catalog_requests (kind) VALUES ('terminate')")}) {
    EXPECT_EQ(run(client.raw(), sql).sqlstate, "42501") << sql;
  }

  PgConnection replicator(server_->conninfo("app", "repl"));
  EXPECT_TRUE(
      direct(replicator, "SELECT * FROM pg_create_logical_replication_slot('theirs', 'pgoutput')")
          .ok());
  EXPECT_TRUE(direct(replicator, "SELECT pg_drop_replication_slot('mine')").ok());
  // A REPLICATION role is no member of relay: Postgres refuses to end relay's walsender.
  EXPECT_EQ(direct(replicator, terminate).sqlstate, "42501");

  // The owner itself, straight to the upstream, has no REPLICATION attribute: refused too.
  EXPECT_EQ(direct(*relay_, "SELECT pg_drop_replication_slot('theirs')").sqlstate, "42501");
  // Through pgrelay, for a user without the REPLICATION right.
  EXPECT_EQ(
      run(relay_->raw(), virt("SELECT pg_drop_replication_slot('theirs')", SlotAccess::kDenied))
          .sqlstate,
      "42501");
  EXPECT_EQ(run(relay_->raw(), virt(terminate, SlotAccess::kDenied)).sqlstate, "42501");

  auto requests = catalog_->take_requests();
  ASSERT_TRUE(requests.ok());
  ASSERT_EQ(requests->size(), 2u);
  EXPECT_EQ((*requests)[0].kind, CatalogRequest::Kind::kCreateSlot);
  EXPECT_EQ((*requests)[1].kind, CatalogRequest::Kind::kDropSlot);
  ASSERT_TRUE(catalog_->set_walsenders({}).ok());
}

// FOR ALL TABLES holds pgrelay's own tables too: the lists clients and subscribers read leave
// them out, and pgrelay's capture publications with them.
TEST_F(VirtualCatalogTest, PublishedTablesLeaveOutPgrelaysOwn) {
  PgConnection admin = server_->connect_admin("app");
  admin.exec("CREATE TABLE public.shown (id int PRIMARY KEY)");
  admin.exec("CREATE PUBLICATION allpub FOR ALL TABLES");
  admin.exec("CREATE PUBLICATION _pgrelay_capture FOR TABLE public.shown");
  const std::string direct_count = admin.scalar(
      "SELECT count(*) FROM pg_catalog.pg_publication_tables WHERE pubname = "
      "'allpub' AND schemaname = '_pgrelay'");
  EXPECT_NE(direct_count, "0");  // what Postgres itself lists
  PgConnection client(server_->conninfo("app", "client"));
  for (PgConnection* c : {relay_.get(), &client}) {
    Outcome tables = vrun(*c,
                          "SELECT pubname, schemaname, tablename FROM pg_publication_tables "
                          "WHERE schemaname IN ('public', '_pgrelay') ORDER BY 1, 2, 3");
    ASSERT_TRUE(tables.ok()) << tables.message;
    EXPECT_EQ(tables.rows, Rows{row({"allpub", "public", "shown"})});
    Outcome listed = vrun(*c,
                          "SELECT p.pubname, gpt.relid::regclass::text FROM pg_publication p, "
                          "LATERAL pg_get_publication_tables(p.pubname) gpt JOIN pg_class c ON "
                          "c.oid = gpt.relid WHERE c.relnamespace::regnamespace::text IN "
                          "('public', '_pgrelay') ORDER BY 1, 2");
    ASSERT_TRUE(listed.ok()) << listed.message;
    EXPECT_EQ(listed.rows, Rows{row({"allpub", "shown"})});
  }
  admin.exec("DROP PUBLICATION allpub, _pgrelay_capture");
  admin.exec("DROP TABLE public.shown");
}

TEST_F(VirtualCatalogTest, VersionsAndUninstall) {
  ASSERT_TRUE(catalog_->upsert_slot(slot("kept")).ok());
  ASSERT_TRUE(catalog_->install().ok());
  EXPECT_EQ(relay_->scalar("SELECT count(*) FROM _pgrelay.pg_replication_slots"), "1");

  // An older version is replaced (pgrelay refills the state), a newer one refused.
  relay_->exec("UPDATE _pgrelay.catalog_meta SET value = '0'");
  ASSERT_TRUE(catalog_->install().ok());
  EXPECT_EQ(relay_->scalar("SELECT value FROM _pgrelay.catalog_meta"),
            std::to_string(VirtualCatalog::kVersion));
  EXPECT_EQ(relay_->scalar("SELECT count(*) FROM _pgrelay.pg_replication_slots"), "0");
  relay_->exec("UPDATE _pgrelay.catalog_meta SET value = '99'");
  Status newer = catalog_->install();
  ASSERT_FALSE(newer.ok());
  EXPECT_EQ(newer.error().sqlstate, "55000");
  relay_->exec("UPDATE _pgrelay.catalog_meta SET value = '" +
               std::to_string(VirtualCatalog::kVersion) + "'");

  // The schema stays while something else lives in it.
  relay_->exec("CREATE TABLE _pgrelay.other (a int)");
  ASSERT_TRUE(catalog_->uninstall().ok());
  EXPECT_EQ(relay_->scalar("SELECT count(*) FROM pg_class WHERE relnamespace = "
                           "'_pgrelay'::regnamespace"),
            "1");
  EXPECT_EQ(relay_->scalar("SELECT count(*) FROM pg_proc WHERE pronamespace = "
                           "'_pgrelay'::regnamespace"),
            "0");
  relay_->exec("DROP TABLE _pgrelay.other");
  ASSERT_TRUE(catalog_->install().ok());
  ASSERT_TRUE(catalog_->uninstall().ok());
  EXPECT_EQ(relay_->scalar("SELECT count(*) FROM pg_namespace WHERE nspname = '_pgrelay'"), "0");
  ASSERT_TRUE(catalog_->uninstall().ok());  // nothing left: still fine
  ASSERT_TRUE(catalog_->install().ok());    // TearDown uninstalls again
}

TEST_F(VirtualCatalogTest, OpenReportsConnectionErrors) {
  auto bad = VirtualCatalog::open("host=127.0.0.1 port=1 dbname=x connect_timeout=2", "_pgrelay");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().sqlstate, "08000");
  auto long_name = VirtualCatalog::open(server_->conninfo("app", "relay"), std::string(60, 'x'));
  ASSERT_FALSE(long_name.ok());
  EXPECT_EQ(long_name.error().sqlstate, "42602");
}

}  // namespace
}  // namespace pgrelay::upstream
