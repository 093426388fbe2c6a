// Trigger capture under 8 concurrent pgbench clients for 60 s: replaying the log gives the
// upstream's final state and the log holds exactly the committed writing transactions.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "capture/trigger/capture_service.h"
#include "load_support.h"
#include "log/change_log.h"
#include "pg_server.h"

namespace pgrelay::capture {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

TEST(CaptureLoadTest, ConcurrentWritersReplayToTheSameStateWithExactlyTheCommittedTransactions) {
  test::PgServerOptions options;
  options.settings["max_connections"] = "50";
  test::PgServer server(options);
  server.exec(load::kSchema);
  server.exec(load::kSeed);
  server.exec("CREATE DATABASE replica");
  server.exec(load::kSchema, "replica");
  server.exec(load::kSeed, "replica");

  char tmpl[] = "/tmp/pgrelay-load-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  log::LogOptions log_options;
  log_options.dir = dir + "/log";
  log_options.sync = log::SyncPolicy::kInterval;
  auto log = log::ChangeLog::open(log_options);
  ASSERT_TRUE(log.ok()) << log.error().to_string();

  CaptureServiceOptions o;
  o.poller.conninfo = server.conninfo();
  o.poller.spill_dir = dir + "/spill";
  for (const char* t : load::kTables) o.install.tables.push_back({"public", t});
  auto svc = CaptureService::start(o, **log);
  ASSERT_TRUE(svc.ok()) << svc.error().to_string();

  const std::string rollbacks_before = server.scalar(
      "SELECT xact_rollback FROM pg_stat_database WHERE datname = current_database()");
  const std::string out = load::run_pgbench(server, "postgres", "postgres", dir, 60, 8);
  std::cerr << out.substr(out.find("number of transactions actually processed")) << "\n";
  auto last = (*svc)->sync();
  ASSERT_TRUE(last.ok()) << last.error().to_string();
  const auto stats = (*svc)->stats();
  (*svc)->stop();
  EXPECT_EQ(stats.last_error, "");
  EXPECT_GT(std::stoll(server.scalar(
                "SELECT xact_rollback FROM pg_stat_database WHERE datname = current_database()")),
            std::stoll(rollbacks_before));
  EXPECT_EQ(server.scalar("SELECT count(*) FROM _pgrelay.changes"), "0");

  test::PgConnection replica(server.conninfo("replica"));
  const load::Replayed replayed = load::replay(**log, replica);
  test::PgConnection upstream(server.conninfo());
  for (const char* t : load::kTables) {
    EXPECT_EQ(load::table_digest(replica, t), load::table_digest(upstream, t)) << t;
  }
  // Exactly the committed writing transactions: no rolled-back one, none twice, none missing.
  std::vector<std::uint32_t> logged = replayed.xids;
  std::sort(logged.begin(), logged.end());
  EXPECT_EQ(std::adjacent_find(logged.begin(), logged.end()), logged.end()) << "duplicate xid";
  const std::vector<std::uint32_t> committed = load::committed_xids(upstream);
  EXPECT_EQ(logged.size(), committed.size());
  EXPECT_TRUE(logged == committed);
  EXPECT_GT(replayed.unchanged_values, 0u);
  EXPECT_GT(committed.size(), 1000u);
  std::cerr << "transactions " << replayed.transactions << ", changes " << replayed.changes
            << ", unchanged TOAST values " << replayed.unchanged_values << ", polls " << stats.polls
            << "\n";
  std::error_code ec;
  fs::remove_all(dir, ec);
}

}  // namespace
}  // namespace pgrelay::capture
