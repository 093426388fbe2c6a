// The side-query connection pool against a real PostgreSQL 15: reuse, broken connections and
// ones left in a transaction not reused, the idle bound, connection errors.
#include "upstream/libpq_pool.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "pg_server.h"

namespace pgrelay::upstream {
namespace {

using test::PgServer;

class LibpqPoolTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new PgServer(); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  static std::string conninfo() {
    return server_->conninfo("postgres", "postgres") + " application_name=pooltest";
  }
  // Client backends of this test's connections, as the upstream counts them.
  static std::string backends() {
    return server_->scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pooltest'");
  }
  static PgServer* server_;
};

PgServer* LibpqPoolTest::server_ = nullptr;

int backend_pid(const LibpqPool::Lease& lease) {
  return PQbackendPID(lease.get());
}

std::string query(const LibpqPool::Lease& lease, const char* sql) {
  PGresult* r = PQexec(lease.get(), sql);
  std::string out = PQresultStatus(r) == PGRES_TUPLES_OK ? PQgetvalue(r, 0, 0) : "error";
  PQclear(r);
  return out;
}

TEST_F(LibpqPoolTest, ReusesAnIdleConnectionInsteadOfStartingABackend) {
  LibpqPool pool;
  int first_pid = 0;
  {
    auto lease = pool.acquire(conninfo());
    ASSERT_TRUE(lease.ok()) << lease.error().to_string();
    EXPECT_EQ(query(*lease, "SELECT 1"), "1");
    first_pid = backend_pid(*lease);
  }
  EXPECT_EQ(pool.idle(), 1u);
  auto again = pool.acquire(conninfo());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(backend_pid(*again), first_pid);
  EXPECT_EQ(pool.idle(), 0u);
  EXPECT_EQ(backends(), "1");
}

TEST_F(LibpqPoolTest, ATerminatedBackendIsReplacedNotLentOut) {
  LibpqPool pool;
  int old_pid = 0;
  {
    auto lease = pool.acquire(conninfo());
    ASSERT_TRUE(lease.ok());
    old_pid = backend_pid(*lease);
  }
  server_->exec("SELECT pg_terminate_backend(" + std::to_string(old_pid) + ")");
  // The FATAL and the close reach the idle socket shortly after.
  for (int i = 0; i < 100 && backends() != "0"; ++i) usleep(20'000);
  auto lease = pool.acquire(conninfo());
  ASSERT_TRUE(lease.ok()) << lease.error().to_string();
  EXPECT_NE(backend_pid(*lease), old_pid);
  EXPECT_EQ(query(*lease, "SELECT 2"), "2");
}

TEST_F(LibpqPoolTest, AConnectionLeftInATransactionIsClosed) {
  LibpqPool pool;
  {
    auto lease = pool.acquire(conninfo());
    ASSERT_TRUE(lease.ok());
    PQclear(PQexec(lease->get(), "BEGIN"));
  }
  EXPECT_EQ(pool.idle(), 0u);
  for (int i = 0; i < 100 && backends() != "0"; ++i) usleep(20'000);
  EXPECT_EQ(backends(), "0");
}

TEST_F(LibpqPoolTest, KeepsAtMostMaxIdleConnections) {
  LibpqPool pool(2);
  {
    std::vector<LibpqPool::Lease> leases;
    for (int i = 0; i < 5; ++i) {
      auto lease = pool.acquire(conninfo());
      ASSERT_TRUE(lease.ok());
      leases.push_back(std::move(*lease));
    }
    EXPECT_EQ(backends(), "5");
  }
  EXPECT_EQ(pool.idle(), 2u);
  for (int i = 0; i < 100 && backends() != "2"; ++i) usleep(20'000);
  EXPECT_EQ(backends(), "2");
}

TEST_F(LibpqPoolTest, ConnectionFailureIs08006WithLibpqsReason) {
  LibpqPool pool;
  auto lease = pool.acquire(server_->conninfo("no_such_database"));
  ASSERT_FALSE(lease.ok());
  EXPECT_EQ(lease.error().sqlstate, "08006");
  EXPECT_NE(lease.error().message.find("no_such_database"), std::string::npos)
      << lease.error().message;
  EXPECT_EQ(pool.idle(), 0u);
}

}  // namespace
}  // namespace pgrelay::upstream
