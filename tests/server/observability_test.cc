// Server logs and metrics against a real PostgreSQL 15: session lines, counters, no password ever.
#include <arpa/inet.h>
#include <libpq-fe.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "base/logger.h"
#include "server/metrics.h"
#include "server_fixture.h"

namespace pgrelay::test {
namespace {

using nlohmann::json;
using server::MetricLabels;
namespace names = server::server_metrics;

// Every line the server logs, kept raw (to grep) and parsed (to check fields).
class CapturedLog {
 public:
  Logger& logger() { return logger_; }
  std::vector<std::string> raw() const {
    std::lock_guard lock(mu_);
    return lines_;
  }
  // The parsed lines with this message, waiting up to 5 s for at least `at_least` of them.
  std::vector<json> with_message(const std::string& message, std::size_t at_least = 1) const {
    std::vector<json> found;
    for (int i = 0; i < 250; ++i) {
      found.clear();
      for (const auto& line : raw()) {
        auto parsed = json::parse(line);
        if (parsed["message"] == message) found.push_back(parsed);
      }
      if (found.size() >= at_least) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return found;
  }
  bool contains(std::string_view needle) const {
    for (const auto& line : raw()) {
      if (line.find(needle) != std::string::npos) return true;
    }
    return false;
  }

 private:
  LoggerOptions options() {
    LoggerOptions o;
    o.level = LogLevel::kDebug;
    o.format = LogFormat::kJson;
    o.sink = [this](std::string_view line) {
      std::lock_guard lock(mu_);
      lines_.emplace_back(line);
    };
    return o;
  }
  mutable std::mutex mu_;
  std::vector<std::string> lines_;
  Logger logger_{options()};
};

std::uint64_t counter(server::Metrics& metrics, const server::MetricInfo& info,
                      MetricLabels labels = {}) {
  return metrics.counter(info, std::move(labels)).value();
}

// Waits until `done` holds (the server counts after the client has its answer).
template <typename F>
bool eventually(F done) {
  for (int i = 0; i < 250; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return done();
}

std::string refused_login(int port, const std::string& user, const std::string& password) {
  std::string conninfo = "host=127.0.0.1 port=" + std::to_string(port) +
                         " dbname=postgres user=" + user + " password=" + password;
  PGconn* conn = PQconnectdb(conninfo.c_str());
  std::string message = PQstatus(conn) == CONNECTION_BAD ? PQerrorMessage(conn) : "connected";
  PQfinish(conn);
  return message;
}

TEST(ServerObservability, SessionsAuthFailuresAndProtocolErrorsAreLoggedAndCounted) {
  PgServerOptions pg_options;
  pg_options.settings["wal_level"] = "replica";
  // The log and the registry outlive the harness's io_context, as the context asks.
  CapturedLog log;
  server::Metrics metrics;
  PgServer pg(pg_options);
  auto relay = std::make_unique<RelayHarness>(pg, RelayOptions{false, true});
  // Set before any client connects, so the io thread is not reading them meanwhile.
  relay->context().logger = &log.logger();
  relay->context().metrics = &metrics;

  // 1. A pass-through session: received, authorized, bytes relayed, disconnection.
  {
    PgConnection conn(relay->conninfo("application_name=obs-test"));
    EXPECT_EQ(conn.scalar("SELECT repeat('x', 10000)").size(), 10000u);
    EXPECT_EQ(metrics.gauge(names::kConnections, {{"kind", "pass-through"}}).value(), 1.0);
  }
  auto received = log.with_message("connection received");
  ASSERT_FALSE(received.empty());
  EXPECT_EQ(received[0]["host"], "127.0.0.1");
  EXPECT_EQ(received[0]["level"], "info");
  EXPECT_GT(received[0]["port"].get<int>(), 0);
  auto authorized = log.with_message("connection authorized");
  ASSERT_EQ(authorized.size(), 1u);
  EXPECT_EQ(authorized[0]["user"], "app");
  EXPECT_EQ(authorized[0]["database"], "postgres");
  EXPECT_EQ(authorized[0]["replication"], false);
  EXPECT_EQ(authorized[0]["application_name"], "obs-test");
  auto gone = log.with_message("disconnection");
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone[0]["kind"], "pass-through");
  EXPECT_GE(gone[0]["duration_ms"].get<std::int64_t>(), 0);
  EXPECT_EQ(metrics.gauge(names::kConnections, {{"kind", "pass-through"}}).value(), 0.0);
  EXPECT_EQ(counter(metrics, names::kConnectionsAccepted, {{"kind", "pass-through"}}), 1u);
  EXPECT_GT(counter(metrics, names::kRelayedBytes, {{"direction", "to_client"}}), 10000u);
  EXPECT_GT(counter(metrics, names::kRelayedBytes, {{"direction", "to_upstream"}}), 20u);

  // 2. Wrong password (SCRAM) and an unknown user: counted, logged as warnings with the user.
  const std::string scram_password = "Scram-Wrong-Passw0rd-1729";
  EXPECT_NE(refused_login(relay->port(), "app", scram_password).find("password authentication"),
            std::string::npos);
  EXPECT_NE(refused_login(relay->port(), "nobody", "x" + scram_password).find("password"),
            std::string::npos);
  ASSERT_TRUE(eventually([&] { return counter(metrics, names::kAuthenticationFailures) == 2; }))
      << counter(metrics, names::kAuthenticationFailures);
  auto failures = log.with_message("authentication failed", 2);
  ASSERT_EQ(failures.size(), 2u);
  EXPECT_EQ(failures[0]["level"], "warning");
  EXPECT_EQ(failures[0]["user"], "app");
  EXPECT_EQ(failures[1]["user"], "nobody");
  EXPECT_EQ(failures[0]["host"], "127.0.0.1");
  EXPECT_EQ(counter(metrics, names::kErrorsSent, {{"sqlstate", "28P01"}}), 2u);

  // 3. The cleartext method, where the password itself crosses the wire: a wrong one and the
  // right one, neither of which may reach the log.
  relay->context().auth.rules.push_back(
      {*server::parse_auth_network("127.0.0.1/32"), server::AuthMethod::kPassword});
  const std::string cleartext_password = "Cleartext-Wrong-Passw0rd-4104";
  EXPECT_NE(refused_login(relay->port(), "app", cleartext_password).find("password authentication"),
            std::string::npos);
  ASSERT_TRUE(eventually([&] { return counter(metrics, names::kAuthenticationFailures) == 3; }));
  { PgConnection cleartext_ok(relay->conninfo()); }
  relay->context().auth.rules.clear();

  // 4. A replication session and a bad replication command.
  {
    PGconn* conn = PQconnectdb(relay->conninfo("replication=database").c_str());
    ASSERT_EQ(PQstatus(conn), CONNECTION_OK) << PQerrorMessage(conn);
    PGresult* res = PQexec(conn, "IDENTIFY_SYSTEM");
    EXPECT_EQ(PQresultStatus(res), PGRES_TUPLES_OK);
    PQclear(res);
    res = PQexec(conn, "DROP_REPLICATION_SLOT no_such_slot");
    EXPECT_EQ(PQresultStatus(res), PGRES_FATAL_ERROR);
    PQclear(res);
    PQfinish(conn);
  }
  EXPECT_EQ(counter(metrics, names::kConnectionsAccepted, {{"kind", "replication"}}), 1u);
  EXPECT_EQ(counter(metrics, names::kErrorsSent, {{"sqlstate", "42704"}}), 1u);
  auto ended = log.with_message("disconnection", 3);
  ASSERT_EQ(ended.size(), 3u);
  EXPECT_EQ(std::count_if(ended.begin(), ended.end(),
                          [](const json& line) { return line["kind"] == "replication"; }),
            1);
  auto replication_authorized = log.with_message("connection authorized", 3);
  ASSERT_EQ(replication_authorized.size(), 3u);
  EXPECT_EQ(replication_authorized[2]["replication"], true);

  // 5. A startup packet with an impossible length: the session closes for a protocol violation.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(relay->port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  const std::uint8_t junk[] = {0, 0, 0, 2, 0, 3, 0, 0};
  ASSERT_EQ(::write(fd, junk, sizeof junk), static_cast<ssize_t>(sizeof junk));
  char answer[256];
  EXPECT_GT(::read(fd, answer, sizeof answer), 0);  // the FATAL ErrorResponse
  ::close(fd);
  ASSERT_TRUE(eventually([&] { return counter(metrics, names::kProtocolErrors) == 1; }));
  auto violation = log.with_message("session closed for a protocol violation");
  ASSERT_EQ(violation.size(), 1u);
  EXPECT_EQ(violation[0]["level"], "warning");
  EXPECT_FALSE(violation[0]["error"].get<std::string>().empty());

  // No password of any kind, right or wrong, client's or upstream's, is in the log.
  for (const std::string& secret :
       {scram_password, cleartext_password, std::string("relay-secret"), std::string("app-pw")}) {
    EXPECT_FALSE(log.contains(secret)) << secret;
  }
  // Every line is one JSON object (the parse above would have thrown otherwise), and the
  // rendered metrics carry the counts.
  std::string text = metrics.render();
  EXPECT_NE(text.find("\npgrelay_authentication_failures_total 3\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\npgrelay_errors_sent_total{sqlstate=\"28P01\"} 3\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("\npgrelay_protocol_errors_total 1\n"), std::string::npos) << text;

  // 6. A session still open when the server and its io_context go away: its frame is destroyed
  // with them, and its end is still logged and uncounted (with the context already gone).
  PgConnection lingering(relay->conninfo());
  EXPECT_EQ(lingering.scalar("SELECT 'lingering'"), "lingering");
  EXPECT_EQ(metrics.gauge(names::kConnections, {{"kind", "pass-through"}}).value(), 1.0);
  relay.reset();
  EXPECT_EQ(metrics.gauge(names::kConnections, {{"kind", "pass-through"}}).value(), 0.0);
  EXPECT_EQ(log.with_message("disconnection", 4).size(), 4u);
}

}  // namespace
}  // namespace pgrelay::test
