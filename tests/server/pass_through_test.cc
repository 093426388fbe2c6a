// Pass-through sessions through pgrelay to a real PostgreSQL 15: protocols, COPY, NOTIFY,
// errors, authentication, TLS, cancellation, abuse of the startup path, and backends kept
// between sessions.
#include <arpa/inet.h>
#include <libpq-fe.h>
#include <malloc.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <string>
#include <thread>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
// From the ASan runtime (GCC ships no header for it).
extern "C" std::size_t __sanitizer_get_current_allocated_bytes();
#endif

#include "server_fixture.h"

namespace pgrelay::test {
namespace {

PgServerOptions replica_options() {
  PgServerOptions options;
  options.settings["wal_level"] = "replica";
  return options;
}

// Runs a 30 s sleep on `conn`, cancels it with the key the session was given, and returns the
// SQLSTATE the query ended with (57014 when the cancel reached its backend).
std::string sqlstate_of_cancelled_sleep(PGconn* conn) {
  if (PQsendQuery(conn, "SELECT pg_sleep(30)") != 1) return "not sent";
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  PGcancel* cancel = PQgetCancel(conn);
  char err[256];
  const bool sent = PQcancel(cancel, err, sizeof err) == 1;
  PQfreeCancel(cancel);
  if (!sent) return std::string("cancel not sent: ") + err;
  PGresult* res = PQgetResult(conn);
  const char* state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
  std::string sqlstate = state ? state : "none";
  PQclear(res);
  while ((res = PQgetResult(conn)) != nullptr) PQclear(res);
  return sqlstate;
}

class PassThroughTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    pg_ = new PgServer(replica_options());
    relay_ = new RelayHarness(*pg_);
  }
  static void TearDownTestSuite() {
    delete relay_;
    delete pg_;
  }
  static PgServer* pg_;
  static RelayHarness* relay_;
};
PgServer* PassThroughTest::pg_ = nullptr;
RelayHarness* PassThroughTest::relay_ = nullptr;

TEST_F(PassThroughTest, SimpleAndExtendedQueries) {
  PgConnection conn(relay_->conninfo());
  EXPECT_EQ(conn.scalar("SELECT 40 + 2"), "42");
  // Multi-statement simple query: the rows of the last statement.
  EXPECT_EQ(conn.scalar("SELECT 1; SELECT 'two'"), "two");
  // Extended protocol with parameters and a named prepared statement.
  PGresult* prepared = PQprepare(conn.raw(), "add", "SELECT $1::int + $2::int", 2, nullptr);
  ASSERT_EQ(PQresultStatus(prepared), PGRES_COMMAND_OK) << PQerrorMessage(conn.raw());
  PQclear(prepared);
  for (int i = 0; i < 3; ++i) {
    std::string a = std::to_string(i), b = "10";
    const char* values[2] = {a.c_str(), b.c_str()};
    PGresult* res = PQexecPrepared(conn.raw(), "add", 2, values, nullptr, nullptr, 0);
    ASSERT_EQ(PQresultStatus(res), PGRES_TUPLES_OK) << PQerrorMessage(conn.raw());
    EXPECT_EQ(std::string(PQgetvalue(res, 0, 0)), std::to_string(i + 10));
    PQclear(res);
  }
  // The upstream's real version and pid are reported.
  EXPECT_EQ(std::string(PQparameterStatus(conn.raw(), "server_version")).substr(0, 3), "15.");
  EXPECT_EQ(conn.scalar("SELECT pg_backend_pid()"), std::to_string(PQbackendPID(conn.raw())));
}

TEST_F(PassThroughTest, PipelinedQueriesKeepOrder) {
  PgConnection conn(relay_->conninfo());
  ASSERT_EQ(PQenterPipelineMode(conn.raw()), 1);
  for (int i = 0; i < 50; ++i) {
    std::string v = std::to_string(i);
    const char* values[1] = {v.c_str()};
    ASSERT_EQ(PQsendQueryParams(conn.raw(), "SELECT $1::int * 2", 1, nullptr, values, nullptr,
                                nullptr, 0),
              1);
  }
  ASSERT_EQ(PQpipelineSync(conn.raw()), 1);
  for (int i = 0; i < 50; ++i) {
    PGresult* res = PQgetResult(conn.raw());
    ASSERT_EQ(PQresultStatus(res), PGRES_TUPLES_OK);
    EXPECT_EQ(std::string(PQgetvalue(res, 0, 0)), std::to_string(i * 2));
    PQclear(res);
    EXPECT_EQ(PQgetResult(conn.raw()), nullptr);
  }
  PGresult* sync = PQgetResult(conn.raw());
  EXPECT_EQ(PQresultStatus(sync), PGRES_PIPELINE_SYNC);
  PQclear(sync);
  ASSERT_EQ(PQexitPipelineMode(conn.raw()), 1);
}

TEST_F(PassThroughTest, CopyInAndOutInTextAndBinary) {
  PgConnection conn(relay_->conninfo());
  conn.exec("DROP TABLE IF EXISTS copy_t; CREATE TABLE copy_t (id int, note text)");
  PGresult* res = PQexec(conn.raw(), "COPY copy_t FROM STDIN");
  ASSERT_EQ(PQresultStatus(res), PGRES_COPY_IN);
  PQclear(res);
  std::string rows;
  for (int i = 0; i < 1000; ++i) rows += std::to_string(i) + "\tnote " + std::to_string(i) + "\n";
  ASSERT_EQ(PQputCopyData(conn.raw(), rows.data(), static_cast<int>(rows.size())), 1);
  ASSERT_EQ(PQputCopyEnd(conn.raw(), nullptr), 1);
  res = PQgetResult(conn.raw());
  EXPECT_EQ(PQresultStatus(res), PGRES_COMMAND_OK) << PQerrorMessage(conn.raw());
  EXPECT_STREQ(PQcmdTuples(res), "1000");
  PQclear(res);
  EXPECT_EQ(conn.scalar("SELECT sum(id) FROM copy_t"), "499500");

  for (const char* format : {"text", "binary"}) {
    std::string sql = std::string("COPY copy_t TO STDOUT WITH (FORMAT ") + format + ")";
    res = PQexec(conn.raw(), sql.c_str());
    ASSERT_EQ(PQresultStatus(res), PGRES_COPY_OUT);
    PQclear(res);
    std::size_t bytes = 0;
    int lines = 0;
    char* buffer = nullptr;
    int n = 0;
    while ((n = PQgetCopyData(conn.raw(), &buffer, 0)) > 0) {
      bytes += static_cast<std::size_t>(n);
      ++lines;
      PQfreemem(buffer);
    }
    EXPECT_EQ(n, -1);
    res = PQgetResult(conn.raw());
    EXPECT_EQ(PQresultStatus(res), PGRES_COMMAND_OK);
    PQclear(res);
    EXPECT_GT(bytes, 10000u) << format;
    EXPECT_GE(lines, 1000) << format;
  }
}

TEST_F(PassThroughTest, NotifyReachesListenerThroughPgrelay) {
  PgConnection listener(relay_->conninfo());
  PgConnection sender(relay_->conninfo());
  listener.exec("LISTEN relay_channel");
  sender.exec("NOTIFY relay_channel, 'hello'");
  PGnotify* note = nullptr;
  for (int i = 0; i < 100 && !note; ++i) {
    PQconsumeInput(listener.raw());
    note = PQnotifies(listener.raw());
    if (!note) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_NE(note, nullptr);
  EXPECT_STREQ(note->relname, "relay_channel");
  EXPECT_STREQ(note->extra, "hello");
  PQfreemem(note);
}

TEST_F(PassThroughTest, ErrorsKeepSqlstateAndSessionContinues) {
  PgConnection conn(relay_->conninfo());
  try {
    conn.exec("SELECT * FROM no_such_table");
    FAIL() << "expected an error";
  } catch (const PgError& e) {
    EXPECT_EQ(e.sqlstate(), "42P01");
  }
  EXPECT_EQ(conn.scalar("SELECT 'still here'"), "still here");
}

TEST_F(PassThroughTest, WrongPasswordIsRefusedWith28P01) {
  std::string conninfo = "host=127.0.0.1 port=" + std::to_string(relay_->port()) +
                         " dbname=postgres user=app password=wrong";
  PGconn* conn = PQconnectdb(conninfo.c_str());
  EXPECT_EQ(PQstatus(conn), CONNECTION_BAD);
  EXPECT_NE(
      std::string(PQerrorMessage(conn)).find("password authentication failed for user \"app\""),
      std::string::npos)
      << PQerrorMessage(conn);
  PQfinish(conn);
  // An unknown user gets the same answer (no user enumeration).
  conninfo = "host=127.0.0.1 port=" + std::to_string(relay_->port()) +
             " dbname=postgres user=nobody password=x";
  conn = PQconnectdb(conninfo.c_str());
  EXPECT_NE(
      std::string(PQerrorMessage(conn)).find("password authentication failed for user \"nobody\""),
      std::string::npos);
  PQfinish(conn);
}

TEST_F(PassThroughTest, UnknownDatabaseErrorComesFromUpstream) {
  std::string conninfo = "host=127.0.0.1 port=" + std::to_string(relay_->port()) +
                         " dbname=nosuchdb user=app password=relay-secret";
  PGconn* conn = PQconnectdb(conninfo.c_str());
  EXPECT_EQ(PQstatus(conn), CONNECTION_BAD);
  EXPECT_NE(std::string(PQerrorMessage(conn)).find("database \"nosuchdb\" does not exist"),
            std::string::npos)
      << PQerrorMessage(conn);
  PQfinish(conn);
}

TEST_F(PassThroughTest, CancelRequestReachesTheUpstreamBackend) {
  PgConnection conn(relay_->conninfo());
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(sqlstate_of_cancelled_sleep(conn.raw()), "57014");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

TEST_F(PassThroughTest, SslRequestIsAnsweredNWithoutTls) {
  // sslmode=require must fail cleanly when pgrelay has TLS off; prefer falls back to plain.
  PGconn* conn = PQconnectdb(relay_->conninfo("sslmode=require").c_str());
  EXPECT_EQ(PQstatus(conn), CONNECTION_BAD);
  PQfinish(conn);
  PgConnection plain(relay_->conninfo("sslmode=prefer"));
  EXPECT_EQ(plain.scalar("SELECT 1"), "1");
  PgConnection gss(relay_->conninfo("gssencmode=prefer"));
  EXPECT_EQ(gss.scalar("SELECT 2"), "2");
}

// Opens a raw TCP connection to the relay.
int raw_connect(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Heap bytes in use by the whole process (the server runs in it).
std::size_t allocated_bytes() {
#if defined(__SANITIZE_ADDRESS__)
  return __sanitizer_get_current_allocated_bytes();
#else
  return mallinfo2().uordblks;
#endif
}

TEST_F(PassThroughTest, GarbageAndHalfPacketsCloseOnlyTheirSession) {
  PgConnection survivor(relay_->conninfo());
  EXPECT_EQ(survivor.scalar("SELECT 'warm'"), "warm");
  ASSERT_EQ(relay_->session_count(), 1u);
  std::size_t baseline = allocated_bytes();
  std::mt19937 rng(1234);
  for (int i = 0; i < 1000; ++i) {
    int fd = raw_connect(relay_->port());
    ASSERT_GE(fd, 0);
    std::vector<std::uint8_t> junk(1 + rng() % 64);
    for (auto& b : junk) b = static_cast<std::uint8_t>(rng());
    switch (i % 4) {
      case 0:  // random bytes
        break;
      case 1:  // an oversized length
        junk = {0x7f, 0xff, 0xff, 0xff, 0, 3, 0, 0};
        break;
      case 2:  // half a startup packet, then disconnect
        junk = {0, 0, 0, 40, 0, 3, 0, 0, 'u', 's'};
        break;
      case 3: {  // a valid startup, then vanish mid-authentication
        std::string body = std::string("\0\3\0\0user\0app\0database\0postgres\0\0", 33);
        junk.assign({0, 0, 0, static_cast<std::uint8_t>(body.size() + 4)});
        junk.insert(junk.end(), body.begin(), body.end());
        break;
      }
    }
    (void)!::write(fd, junk.data(), junk.size());
    ::close(fd);
  }
  EXPECT_EQ(survivor.scalar("SELECT 'alive'"), "alive");
  // Every abusive session ends and gives its memory back (a session that leaked its buffers
  // or coroutine frames would keep tens of kilobytes each: 1000 of them, megabytes).
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (relay_->session_count() > 1 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(relay_->session_count(), 1u);
  std::size_t after = allocated_bytes();
  EXPECT_LT(after, baseline + 1024 * 1024) << "baseline " << baseline << " after " << after;
  PgConnection fresh(relay_->conninfo());
  EXPECT_EQ(fresh.scalar("SELECT 'fresh'"), "fresh");
}

// A client that stalls before logging in (nothing sent, half a startup packet, silent in the
// middle of SCRAM) is disconnected after the authentication timeout, as Postgres does, so
// stalled clients cannot pile up; a client that logged in is not affected.
TEST_F(PassThroughTest, StalledClientsAreDisconnectedAfterTheAuthenticationTimeout) {
  for (int i = 0; i < 500 && relay_->session_count() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(relay_->session_count(), 0u);                    // earlier tests' sessions are gone
  relay_->context().auth.timeout = std::chrono::seconds(1);  // read by sessions started later
  PgConnection logged_in(relay_->conninfo());
  const std::string startup = std::string("\0\3\0\0user\0app\0database\0postgres\0\0", 33);
  std::vector<std::vector<std::uint8_t>> openings = {
      {},                                                         // says nothing
      {0, 0, 0, 40, 0, 3, 0, 0, 'u', 's'},                        // half a startup packet
      {0, 0, 0, static_cast<std::uint8_t>(startup.size() + 4)}};  // SCRAM asked, no answer
  openings[2].insert(openings[2].end(), startup.begin(), startup.end());
  std::vector<int> fds;
  for (const auto& opening : openings) {
    int fd = raw_connect(relay_->port());
    ASSERT_GE(fd, 0);
    if (!opening.empty()) {
      ASSERT_EQ(::write(fd, opening.data(), opening.size()), static_cast<ssize_t>(opening.size()));
    }
    fds.push_back(fd);
  }
  auto started = std::chrono::steady_clock::now();
  for (int fd : fds) {
    // Read until the server closes (the SCRAM case first gets its AuthenticationSASL).
    timeval wait{10, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
    char buffer[512];
    ssize_t n;
    while ((n = ::read(fd, buffer, sizeof buffer)) > 0) {
    }
    EXPECT_TRUE(n == 0 || errno == ECONNRESET) << "read: " << n << " errno " << errno;
    ::close(fd);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(8));
  EXPECT_EQ(logged_in.scalar("SELECT 'still here'"), "still here");
  relay_->context().auth.timeout = std::chrono::seconds(60);
}

// Counts the notices a connection receives, by message.
struct NoticeLog {
  std::vector<std::string> messages;
  static void receive(void* self, const PGresult* res) {
    const char* message = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
    static_cast<NoticeLog*>(self)->messages.emplace_back(message ? message : "");
  }
};

// Through pgrelay publications do work, so the upstream's "wal_level is insufficient" warning
// on CREATE PUBLICATION is dropped; other warnings, even with the same SQLSTATE, still pass.
TEST_F(PassThroughTest, FalseWalLevelWarningIsDroppedOtherNoticesPass) {
  const char* setup =
      "CREATE TABLE IF NOT EXISTS warn_t (id int primary key); DROP PUBLICATION IF EXISTS "
      "warn_relayed; DROP PUBLICATION IF EXISTS warn_direct";
  pg_->exec(setup);
  pg_->exec("ALTER TABLE warn_t OWNER TO app");
  auto notices_of = [](const std::string& conninfo, const std::string& sql) {
    NoticeLog log;
    PGconn* conn = PQconnectdb(conninfo.c_str());
    EXPECT_EQ(PQstatus(conn), CONNECTION_OK) << PQerrorMessage(conn);
    PQsetNoticeReceiver(conn, &NoticeLog::receive, &log);
    PGresult* res = PQexec(conn, sql.c_str());
    EXPECT_EQ(PQresultStatus(res), PGRES_COMMAND_OK) << PQerrorMessage(conn);
    PQclear(res);
    PQfinish(conn);
    return log.messages;
  };
  std::string direct = "host=127.0.0.1 port=" + std::to_string(pg_->port()) +
                       " dbname=postgres user=app password=app-pw";
  // The upstream does warn (so the check below can fail)...
  auto native = notices_of(direct, "CREATE PUBLICATION warn_direct FOR TABLE warn_t");
  ASSERT_EQ(native.size(), 1u);
  EXPECT_EQ(native[0], "wal_level is insufficient to publish logical changes");
  // ...but not through pgrelay, in a multi-statement query between two warnings that stay.
  auto relayed =
      notices_of(relay_->conninfo(),
                 "DO $$BEGIN RAISE WARNING USING ERRCODE = '55000', MESSAGE = 'before'; END$$; "
                 "CREATE PUBLICATION warn_relayed FOR TABLE warn_t; "
                 "DO $$BEGIN RAISE WARNING 'after'; END$$");
  EXPECT_EQ(relayed, (std::vector<std::string>{"before", "after"}));
  EXPECT_EQ(pg_->exec("SELECT pubname FROM pg_publication WHERE pubname = 'warn_relayed'").size(),
            1u);
}

// Shutdown: an idle session and one idle in a transaction end at once with FATAL 57P01 (the
// transaction rolled back), a query in flight gets its whole reply first, then the same FATAL.
TEST(PassThroughShutdown, InFlightRepliesFinishThenSessionsEndWithAdminShutdown) {
  PgServer pg(replica_options());
  RelayHarness relay(pg);
  pg.exec("CREATE TABLE shut_t (id int); GRANT ALL ON shut_t TO app");
  PGconn* idle = PQconnectdb(relay.conninfo().c_str());
  PGconn* in_txn = PQconnectdb(relay.conninfo().c_str());
  PGconn* busy = PQconnectdb(relay.conninfo().c_str());
  // libpq reports a FATAL that comes while it waits for nothing as a notice, and one that
  // answers a query as the query's error; which of the two depends on timing.
  NoticeLog notices[3];
  PGconn* conns[3] = {idle, in_txn, busy};
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(PQstatus(conns[i]), CONNECTION_OK);
    PQsetNoticeReceiver(conns[i], &NoticeLog::receive, &notices[i]);
  }
  PQclear(PQexec(in_txn, "BEGIN; INSERT INTO shut_t VALUES (1)"));
  ASSERT_EQ(PQtransactionStatus(in_txn), PQTRANS_INTRANS);
  ASSERT_EQ(PQsendQuery(busy, "SELECT pg_sleep(1.5), 'whole reply'"), 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the query reaches upstream
  auto shutdown_at = std::chrono::steady_clock::now();
  relay.begin_shutdown();

  // The query in flight completes with its row.
  PGresult* res = PQgetResult(busy);
  ASSERT_EQ(PQresultStatus(res), PGRES_TUPLES_OK) << PQerrorMessage(busy);
  EXPECT_STREQ(PQgetvalue(res, 0, 1), "whole reply");
  PQclear(res);
  EXPECT_GE(std::chrono::steady_clock::now() - shutdown_at, std::chrono::milliseconds(900));
  EXPECT_EQ(PQgetResult(busy), nullptr);
  // Then every session is told why it ends, as a Postgres backend does at shutdown.
  const std::string fatal = "terminating connection due to administrator command";
  for (int i = 0; i < 3; ++i) {
    PGresult* after = PQexec(conns[i], "SELECT 1");
    EXPECT_NE(PQresultStatus(after), PGRES_TUPLES_OK) << i;
    PQclear(after);
    const std::string error = PQerrorMessage(conns[i]);
    const auto& seen = notices[i].messages;
    EXPECT_TRUE(error.find(fatal) != std::string::npos ||
                std::find(seen.begin(), seen.end(), fatal) != seen.end())
        << i << ": " << error;
    PQfinish(conns[i]);
  }
  for (int i = 0; i < 200 && relay.session_count() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(relay.session_count(), 0u);
  // The open transaction was rolled back by its upstream backend.
  EXPECT_EQ(pg.exec("SELECT count(*) FROM shut_t")[0][0], "0");
  // No new session is accepted.
  PGconn* late = PQconnectdb(relay.conninfo().c_str());
  EXPECT_EQ(PQstatus(late), CONNECTION_BAD);
  PQfinish(late);
}

// Sessions whose upstream backends are kept between them (--pool-idle-timeout). Each test uses
// its own application_name, so that the backends of one are not those of another.
class PassThroughPool : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    pg_ = new PgServer(replica_options());
    RelayOptions options;
    options.pool_idle_timeout = std::chrono::seconds(3);
    relay_ = new RelayHarness(*pg_, options);
    pg_->exec("CREATE TABLE pool_t (id int); GRANT ALL ON pool_t TO app");
  }
  static void TearDownTestSuite() {
    delete relay_;
    delete pg_;
  }
  static std::string conninfo(const std::string& application, const std::string& extra = {}) {
    return relay_->conninfo("application_name=" + application + " " + extra);
  }
  // The backend pid of a session that ran `sql` as `application`, and left.
  static std::string leave_after(const std::string& application, const std::string& sql = {}) {
    PgConnection conn(conninfo(application));
    if (!sql.empty()) conn.exec(sql);
    return conn.scalar("SELECT pg_backend_pid()");
  }
  // Backends of `application`'s sessions kept now, as the upstream shows them: idle after the
  // DISCARD ALL that reset them. (The pool's own count covers every test's.)
  static std::size_t kept(const std::string& application) {
    return pg_
        ->exec("SELECT 1 FROM pg_stat_activity WHERE application_name = '" + application +
               "' AND state = 'idle' AND query = 'DISCARD ALL'")
        .size();
  }
  static bool kept_becomes(const std::string& application, std::size_t n) {
    for (int i = 0; i < 500; ++i) {
      if (kept(application) == n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
  static bool backend_alive(const std::string& pid) {
    return pg_->exec("SELECT 1 FROM pg_stat_activity WHERE pid = " + pid).size() == 1;
  }
  static PgServer* pg_;
  static RelayHarness* relay_;
};
PgServer* PassThroughPool::pg_ = nullptr;
RelayHarness* PassThroughPool::relay_ = nullptr;

TEST_F(PassThroughPool, AKeptBackendServesTheNextSessionWithItsStateReset) {
  const std::string first = leave_after(
      "reuse",
      "SET search_path TO pg_catalog; SET statement_timeout = '5s'; SET DateStyle = 'SQL, DMY';"
      "CREATE TEMP TABLE reuse_temp (id int); PREPARE reuse_p AS SELECT 1; LISTEN reuse_ch;"
      "SELECT pg_advisory_lock(4242)");
  ASSERT_TRUE(kept_becomes("reuse", 1));
  EXPECT_GE(relay_->kept_backends(), 1u);
  PgConnection conn(conninfo("reuse"));
  EXPECT_EQ(conn.scalar("SELECT pg_backend_pid()"), first);
  EXPECT_EQ(std::to_string(PQbackendPID(conn.raw())), first);
  EXPECT_EQ(kept("reuse"), 0u);
  // What the first session set is gone: settings, temporary table, prepared statement, LISTEN,
  // advisory lock.
  EXPECT_EQ(conn.scalar("SHOW search_path"), "\"$user\", public");
  EXPECT_EQ(conn.scalar("SHOW statement_timeout"), "0");
  EXPECT_EQ(conn.scalar("SELECT count(*) FROM pg_class WHERE relname = 'reuse_temp'"), "0");
  EXPECT_EQ(conn.scalar("SELECT count(*) FROM pg_prepared_statements"), "0");
  EXPECT_EQ(conn.scalar("SELECT count(*) FROM pg_listening_channels()"), "0");
  EXPECT_EQ(pg_->exec("SELECT pg_try_advisory_lock(4242), pg_advisory_unlock(4242)")[0][0], "t");
  // The startup report is the backend's after the reset, not what the last session set.
  EXPECT_STREQ(PQparameterStatus(conn.raw(), "DateStyle"), "ISO, MDY");
  EXPECT_EQ(conn.scalar("SHOW DateStyle"), "ISO, MDY");
  EXPECT_STREQ(PQparameterStatus(conn.raw(), "application_name"), "reuse");
  // Its cancel key is new, and reaches the same backend.
  EXPECT_EQ(sqlstate_of_cancelled_sleep(conn.raw()), "57014");
}

TEST_F(PassThroughPool, ABackendLeftInATransactionEndsAndRollsBack) {
  const std::string first = leave_after("in_txn", "BEGIN; INSERT INTO pool_t VALUES (1)");
  for (int i = 0; i < 500 && backend_alive(first); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_FALSE(backend_alive(first));
  EXPECT_EQ(pg_->exec("SELECT count(*) FROM pool_t")[0][0], "0");
  // So does one whose client leaves with a failed transaction.
  std::string failed;
  {
    PgConnection conn(conninfo("in_txn"));
    failed = conn.scalar("SELECT pg_backend_pid()");
    PQclear(PQexec(conn.raw(), "BEGIN; SELECT 1/0"));
    ASSERT_EQ(PQtransactionStatus(conn.raw()), PQTRANS_INERROR);
  }
  for (int i = 0; i < 500 && backend_alive(failed); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_FALSE(backend_alive(failed));
}

TEST_F(PassThroughPool, OnlySessionsWithTheSameParametersShareABackend) {
  const std::string a = leave_after("params_a");
  ASSERT_TRUE(kept_becomes("params_a", 1));
  const std::string b = leave_after("params_b");
  EXPECT_NE(a, b);
  ASSERT_TRUE(kept_becomes("params_b", 1));
  PgConnection other_options(conninfo("params_a", "options='-c work_mem=8MB'"));
  EXPECT_NE(other_options.scalar("SELECT pg_backend_pid()"), a);
  EXPECT_EQ(other_options.scalar("SHOW work_mem"), "8MB");
  EXPECT_EQ(leave_after("params_a"), a);
  EXPECT_EQ(leave_after("params_b"), b);
}

TEST_F(PassThroughPool, ABackendTheUpstreamEndedIsNotGivenOut) {
  const std::string first = leave_after("terminated");
  ASSERT_TRUE(kept_becomes("terminated", 1));
  pg_->exec("SELECT pg_terminate_backend(" + first + ")");
  for (int i = 0; i < 500 && backend_alive(first); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  PgConnection conn(conninfo("terminated"));
  EXPECT_EQ(conn.scalar("SELECT 'fresh backend'"), "fresh backend");
  EXPECT_NE(conn.scalar("SELECT pg_backend_pid()"), first);
}

TEST_F(PassThroughPool, KeptBackendsCloseAfterTheIdleTimeout) {
  const std::string first = leave_after("idle");
  ASSERT_TRUE(kept_becomes("idle", 1));
  EXPECT_TRUE(backend_alive(first));
  // The timeout is 3 s; the sweep runs every 0.75 s.
  for (int i = 0; i < 1000 && backend_alive(first); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_FALSE(backend_alive(first));
}

// A kept backend's next client is told at login what the server changed by itself during the
// last session (here a configuration reload). DISCARD ALL reports only what it sets back, and a
// value from the configuration file is not among those.
TEST(PassThroughPoolLifecycle, TheNextClientIsToldWhatTheServerChangedDuringTheLastSession) {
  PgServer pg(replica_options());
  RelayOptions options;
  options.pool_idle_timeout = std::chrono::seconds(600);
  RelayHarness relay(pg, options);
  std::string pid;
  {
    PgConnection conn(relay.conninfo());
    EXPECT_STREQ(PQparameterStatus(conn.raw(), "default_transaction_read_only"), "off");
    pid = conn.scalar("SELECT pg_backend_pid()");
    pg.exec("ALTER SYSTEM SET default_transaction_read_only = on");
    pg.exec("SELECT pg_catalog.pg_reload_conf()");
    // The backend rereads its configuration at its next command, and reports the new value
    // before that command's ReadyForQuery.
    for (int i = 0; i < 500 && conn.scalar("SHOW default_transaction_read_only") != "on"; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_STREQ(PQparameterStatus(conn.raw(), "default_transaction_read_only"), "on");
  }
  for (int i = 0; i < 500 && relay.kept_backends() != 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(relay.kept_backends(), 1u);
  PgConnection next(relay.conninfo());
  EXPECT_EQ(next.scalar("SELECT pg_backend_pid()"), pid);
  EXPECT_STREQ(PQparameterStatus(next.raw(), "default_transaction_read_only"), "on");
  EXPECT_EQ(next.scalar("SHOW default_transaction_read_only"), "on");
  pg.exec("ALTER SYSTEM RESET default_transaction_read_only");
  pg.exec("SELECT pg_catalog.pg_reload_conf()");
}

// With a timeout long enough that only pgrelay closes what it keeps: before a statement that
// needs a database to itself, and at shutdown.
TEST(PassThroughPoolLifecycle, KeptBackendsCloseBeforeDatabaseDdlAndAtShutdown) {
  PgServer pg(replica_options());
  RelayOptions options;
  options.pool_idle_timeout = std::chrono::seconds(600);
  RelayHarness relay(pg, options);
  auto alive = [&](const std::string& pid) {
    return pg.exec("SELECT 1 FROM pg_stat_activity WHERE pid = " + pid).size() == 1;
  };
  auto wait_for_kept = [&](std::size_t n) {
    for (int i = 0; i < 500 && relay.kept_backends() != n; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return relay.kept_backends();
  };
  pg.exec("CREATE DATABASE pool_drop OWNER app");
  pg.exec("CREATE DATABASE pool_rename OWNER app");
  std::string in_drop;
  {
    PgConnection conn(relay.conninfo("dbname=pool_drop"));
    in_drop = conn.scalar("SELECT pg_backend_pid()");
  }
  { PgConnection conn(relay.conninfo("dbname=pool_rename")); }
  { PgConnection conn(relay.conninfo("dbname=template1")); }
  ASSERT_EQ(wait_for_kept(3), 3u);
  // The upstream would wait 5 s for the kept backends to leave, then refuse with 55006.
  std::string in_postgres;
  {
    PgConnection conn(relay.conninfo());
    in_postgres = conn.scalar("SELECT pg_backend_pid()");
    conn.exec("DROP DATABASE pool_drop");
    conn.exec("ALTER DATABASE pool_rename RENAME TO pool_renamed");
    conn.exec("CREATE DATABASE pool_copy");  // from template1
    EXPECT_FALSE(alive(in_drop));
    EXPECT_EQ(relay.kept_backends(), 0u);
    conn.exec("DROP DATABASE pool_renamed");
    conn.exec("DROP DATABASE pool_copy");
  }
  ASSERT_EQ(wait_for_kept(1), 1u);
  relay.begin_shutdown();
  for (int i = 0; i < 500 && alive(in_postgres); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_FALSE(alive(in_postgres));
  EXPECT_EQ(relay.kept_backends(), 0u);
}

TEST(PassThroughTls, TlsConnectionsWork) {
  PgServer pg(replica_options());
  RelayOptions options;
  options.tls = true;
  options.pool_idle_timeout = std::chrono::seconds(60);
  RelayHarness relay(pg, options);
  std::string pid;
  {
    PgConnection conn(relay.conninfo("sslmode=require"));
    EXPECT_EQ(conn.scalar("SELECT 7"), "7");
    EXPECT_EQ(PQsslInUse(conn.raw()), 1);
    pid = conn.scalar("SELECT pg_backend_pid()");
  }
  for (int i = 0; i < 500 && relay.kept_backends() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // SCRAM with channel binding over TLS; a TLS session's backend is kept too (TLS sessions
  // stay on the io thread's path).
  PgConnection bound(relay.conninfo("sslmode=require channel_binding=require"));
  EXPECT_EQ(bound.scalar("SELECT 8"), "8");
  EXPECT_EQ(bound.scalar("SELECT pg_backend_pid()"), pid);
}

}  // namespace
}  // namespace pgrelay::test

namespace pgrelay::test {
namespace {

TEST(PassThroughAuth, CleartextPasswordMethodChecksThePassword) {
  PgServer pg(replica_options());
  RelayHarness relay(pg);
  // Set before any client connects, so the io thread is not reading the rules meanwhile.
  relay.context().auth.rules.push_back(
      {*server::parse_auth_network("127.0.0.1/32"), server::AuthMethod::kPassword});
  PgConnection conn(relay.conninfo());
  EXPECT_EQ(conn.scalar("SELECT 'cleartext ok'"), "cleartext ok");
  std::string wrong = "host=127.0.0.1 port=" + std::to_string(relay.port()) +
                      " dbname=postgres user=app password=wrong";
  PGconn* bad = PQconnectdb(wrong.c_str());
  EXPECT_EQ(PQstatus(bad), CONNECTION_BAD);
  EXPECT_NE(std::string(PQerrorMessage(bad)).find("password authentication failed"),
            std::string::npos)
      << PQerrorMessage(bad);
  PQfinish(bad);
}

}  // namespace
}  // namespace pgrelay::test
