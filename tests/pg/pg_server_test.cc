// Tests of the throwaway PostgreSQL server used by the pg tests: start, SQL, auth setup, cleanup.
#include "pg_server.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>

namespace pgrelay::test {
namespace {

namespace fs = std::filesystem;

int postmaster_pid(const PgServer& server) {
  std::ifstream in(server.data_dir() + "/postmaster.pid");
  int pid = 0;
  in >> pid;
  return pid;
}

// Alive and not a zombie (a container's init may be slow to reap the orphaned postmaster).
bool process_alive(int pid) {
  if (pid <= 0 || kill(pid, 0) != 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const auto close_paren = text.rfind(')');
  return close_paren == std::string::npos || close_paren + 2 >= text.size() ||
         text[close_paren + 2] != 'Z';
}

class PgServerTest : public ::testing::Test {
 protected:
  static void TearDownTestSuite() { server_.reset(); }
  void SetUp() override {
    if (!server_) server_ = std::make_unique<PgServer>();
  }
  static std::unique_ptr<PgServer> server_;
};
std::unique_ptr<PgServer> PgServerTest::server_;

TEST_F(PgServerTest, RunsPostgres15WithLogicalReplicationSettings) {
  PgServer& pg = *server_;
  EXPECT_GT(pg.port(), 0);
  EXPECT_EQ(pg.host(), "127.0.0.1");
  EXPECT_EQ(pg.scalar("SELECT current_setting('server_version_num')::int / 10000"), "15");
  EXPECT_EQ(pg.scalar("SHOW wal_level"), "logical");
  EXPECT_EQ(pg.scalar("SHOW logical_decoding_work_mem"), "64kB");
  EXPECT_EQ(pg.scalar("SHOW max_prepared_transactions"), "10");
  EXPECT_EQ(pg.scalar("SHOW server_encoding"), "UTF8");
  EXPECT_EQ(pg.scalar("SHOW listen_addresses"), "127.0.0.1");
  EXPECT_EQ(pg.scalar("SHOW port"), std::to_string(pg.port()));
}

TEST_F(PgServerTest, ConnectsOverTcpWithConninfoAndUri) {
  PgServer& pg = *server_;
  PgConnection by_conninfo(pg.conninfo());
  EXPECT_EQ(by_conninfo.scalar("SELECT inet_server_addr()::text"), "127.0.0.1/32");
  PgConnection by_uri(pg.uri("template1"));
  EXPECT_EQ(by_uri.scalar("SELECT current_database()"), "template1");
  EXPECT_EQ(pg.conninfo("db", "u", "replication=database"),
            "host=127.0.0.1 port=" + std::to_string(pg.port()) +
                " dbname=db user=u replication=database");
  EXPECT_EQ(pg.uri("db", "u"), "postgresql://u@127.0.0.1:" + std::to_string(pg.port()) + "/db");
}

TEST_F(PgServerTest, ExecReturnsRowsAsTextWithNulls) {
  Rows rows = server_->exec("SELECT 1, NULL::text, 'é' UNION ALL SELECT 2, 'x', ''");
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0], (Row{"1", std::nullopt, "é"}));
  EXPECT_EQ(rows[1], (Row{"2", "x", ""}));
  EXPECT_TRUE(server_->exec("CREATE TEMP TABLE t (a int)").empty());
}

TEST_F(PgServerTest, ExecThrowsWithTheServerMessageAndSqlstate) {
  try {
    server_->exec("SELECT no_such_column");
    FAIL() << "expected PgError";
  } catch (const PgError& e) {
    EXPECT_EQ(e.sqlstate(), "42703");
    EXPECT_NE(std::string(e.what()).find("column \"no_such_column\" does not exist"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(server_->scalar("SELECT 1, 2"), PgError);
  EXPECT_THROW(server_->scalar("SELECT NULL"), PgError);
  // The cached connection is still usable after an error.
  EXPECT_EQ(server_->scalar("SELECT 41 + 1"), "42");
}

TEST_F(PgServerTest, HbaLinesAndRolesEnforcePasswords) {
  PgServer& pg = *server_;
  pg.create_role("golden_alice", std::string("s3cret"), "REPLICATION");
  pg.create_role("golden_bob", std::nullopt);
  pg.add_hba_lines({"host all golden_alice 127.0.0.1/32 scram-sha-256",
                    "host all golden_bob 127.0.0.1/32 reject"});

  EXPECT_THROW(PgConnection(pg.conninfo("postgres", "golden_alice", "password=wrong")), PgError);
  try {
    PgConnection c(pg.conninfo("postgres", "golden_alice", "password=wrong"));
  } catch (const PgError& e) {
    EXPECT_NE(
        std::string(e.what()).find("password authentication failed for user \"golden_alice\""),
        std::string::npos)
        << e.what();
  }
  PgConnection alice(pg.conninfo("postgres", "golden_alice", "password=s3cret"));
  EXPECT_EQ(alice.scalar("SELECT current_user"), "golden_alice");
  EXPECT_EQ(pg.scalar("SELECT rolpassword LIKE 'SCRAM-SHA-256$%' FROM pg_authid WHERE rolname = "
                      "'golden_alice'"),
            "t");
  EXPECT_THROW(PgConnection(pg.conninfo("postgres", "golden_bob")), PgError);
  // The admin path is unaffected by the lines tests add.
  EXPECT_EQ(pg.scalar("SELECT current_user"), "postgres");
}

TEST(PgServerLifecycle, DestructorStopsTheServerAndDeletesItsFiles) {
  std::string dir;
  int pid = 0;
  {
    PgServer pg;
    dir = pg.data_dir();
    pid = postmaster_pid(pg);
    ASSERT_TRUE(process_alive(pid));
    ASSERT_TRUE(fs::exists(dir));
  }
  EXPECT_FALSE(process_alive(pid));
  EXPECT_FALSE(fs::exists(dir));
}

TEST(PgServerLifecycle, SettingsCanBeOverridden) {
  PgServerOptions options;
  options.settings["logical_decoding_work_mem"] = "1MB";
  options.settings["application_name"] = "'golden app'";
  options.hba_lines = {"host all nobody_here 127.0.0.1/32 reject"};
  PgServer pg(options);
  EXPECT_EQ(pg.scalar("SHOW logical_decoding_work_mem"), "1MB");
  EXPECT_EQ(
      pg.scalar("SELECT count(*) FROM pg_hba_file_rules WHERE 'nobody_here' = ANY(user_name)"),
      "1");
}

TEST(PgServerLifecycle, MissingBinariesGiveAClearError) {
  const char* old = std::getenv("PGRELAY_PG_BINDIR");
  const std::string saved = old != nullptr ? old : "";
  setenv("PGRELAY_PG_BINDIR", "/nonexistent/postgresql/15/bin", 1);
  try {
    PgServer pg;
    ADD_FAILURE() << "expected PgError";
  } catch (const PgError& e) {
    EXPECT_NE(
        std::string(e.what()).find("PGRELAY_PG_BINDIR=/nonexistent/postgresql/15/bin does not "
                                   "hold PostgreSQL 15"),
        std::string::npos)
        << e.what();
  }
  if (old != nullptr) {
    setenv("PGRELAY_PG_BINDIR", saved.c_str(), 1);
  } else {
    unsetenv("PGRELAY_PG_BINDIR");
  }
}

TEST(PgServerLifecycle, StartFailureReportsTheServerLog) {
  PgServerOptions options;
  options.settings["shared_buffers"] = "'lots'";
  try {
    PgServer pg(options);
    FAIL() << "expected the server not to start";
  } catch (const PgError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("PostgreSQL failed to start; server log:"), std::string::npos) << what;
    EXPECT_NE(what.find("invalid value for parameter \"shared_buffers\": \"lots\""),
              std::string::npos)
        << what;
  }
}

// A test process that dies without running destructors must not leave a server behind: the
// watchdog notices and cleans up.
TEST(PgServerLifecycle, WatchdogCleansUpAfterACrashedProcess) {
  int report[2];
  ASSERT_EQ(pipe(report), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(report[0]);
    std::string line;
    try {
      auto* pg = new PgServer();  // never deleted: the process "crashes" below
      line = pg->data_dir() + " " + std::to_string(postmaster_pid(*pg)) + "\n";
    } catch (const std::exception& e) {
      line = std::string("error ") + e.what() + "\n";
    }
    (void)!write(report[1], line.data(), line.size());
    _exit(0);
  }
  close(report[1]);
  std::string line;
  char buf[512];
  ssize_t n;
  while ((n = read(report[0], buf, sizeof buf)) > 0) line.append(buf, static_cast<size_t>(n));
  close(report[0]);
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_EQ(line.rfind("error", 0), std::string::npos) << line;
  const std::string dir = line.substr(0, line.find(' '));
  const int pid = std::stoi(line.substr(line.find(' ') + 1));
  ASSERT_GT(pid, 0);

  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while ((process_alive(pid) || fs::exists(dir)) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_FALSE(process_alive(pid)) << "postmaster " << pid << " survived its test process";
  EXPECT_FALSE(fs::exists(dir)) << dir << " was not removed";
}

}  // namespace
}  // namespace pgrelay::test
