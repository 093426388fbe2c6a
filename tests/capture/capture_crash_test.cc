// kill -9 of a capture process during concurrent writes, restarted each time, as a role that
// owns the tables but is neither superuser nor REPLICATION: nothing lost, nothing twice.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "capture/trigger/capture_service.h"
#include "load_support.h"
#include "log/change_log.h"
#include "pg_server.h"

namespace pgrelay::capture {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

pid_t spawn_helper(const std::vector<std::string>& args) {
  const pid_t pid = fork();
  if (pid == 0) {
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(CAPTURE_HELPER));
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(CAPTURE_HELPER, argv.data());
    _exit(127);
  }
  return pid;
}

TEST(CaptureCrashTest, KilledAndRestartedCaptureLosesAndDuplicatesNothing) {
  test::PgServerOptions options;
  options.settings["max_connections"] = "50";
  test::PgServer server(options);
  server.create_role("cap_min", std::nullopt);
  EXPECT_EQ(server.scalar("SELECT rolsuper::text || rolreplication::text FROM pg_roles WHERE "
                          "rolname = 'cap_min'"),
            "falsefalse");
  server.exec("CREATE DATABASE app OWNER cap_min");
  server.exec("CREATE DATABASE replica");
  {
    test::PgConnection owner(server.conninfo("app", "cap_min"));
    owner.exec(load::kSchema);
    owner.exec(load::kSeed);
    owner.exec(std::string("CREATE PUBLICATION crash_pub FOR TABLE ") + load::kTables[0]);
  }
  server.exec(load::kSchema, "replica");
  server.exec(load::kSeed, "replica");

  char tmpl[] = "/tmp/pgrelay-crash-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const std::string conninfo = server.conninfo("app", "cap_min");
  std::vector<std::string> args = {conninfo, dir + "/log", dir + "/spill"};
  for (const char* t : load::kTables) args.push_back(t);

  // Installed before the load, as a deployment does: a restarted capture's install then changes
  // nothing and takes no lock on the tables.
  {
    auto session = PgSession::connect(conninfo);
    ASSERT_TRUE(session.ok()) << session.error().to_string();
    InstallOptions io;
    for (const char* t : load::kTables) io.tables.push_back({"public", t});
    auto installed = install(**session, io);
    ASSERT_TRUE(installed.ok()) << installed.error().to_string();
    EXPECT_FALSE(installed->event_trigger);
  }
  std::atomic<bool> writing{true};
  std::string pgbench_out;
  std::string pgbench_error;
  std::thread writers([&] {
    try {
      pgbench_out = load::run_pgbench(server, "app", "cap_min", dir, 20, 8);
    } catch (const std::exception& e) {
      pgbench_error = e.what();
    }
    writing = false;
  });
  // Publication changes throughout: the capture's periodic sync marks each one it sees in the
  // log (publication_marker.h), in a transaction of its own that a kill must not lose or double.
  std::atomic<int> publication_changes{0};
  std::thread publisher([&] {
    test::PgConnection owner(server.conninfo("app", "cap_min"));
    for (int i = 0; writing; ++i) {
      owner.exec(std::string("ALTER PUBLICATION crash_pub SET (publish = '") +
                 (i % 2 ? "insert, update, delete, truncate" : "insert") + "')");
      ++publication_changes;
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
  });
  std::mt19937 rng(42);
  int kills = 0;
  while (writing) {
    const pid_t pid = spawn_helper(args);
    ASSERT_GT(pid, 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(500 + rng() % 2000));
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFSIGNALED(status)) << "the capture process exited by itself: " << status;
    ++kills;
  }
  writers.join();
  publisher.join();
  ASSERT_EQ(pgbench_error, "");
  EXPECT_GE(kills, 5);

  // A last restart, in process, drains what is left.
  log::LogOptions lo;
  lo.dir = dir + "/log";
  auto log = log::ChangeLog::open(lo);
  ASSERT_TRUE(log.ok()) << log.error().to_string();
  CaptureServiceOptions o;
  o.poller.conninfo = conninfo;
  o.poller.spill_dir = dir + "/spill";
  for (const char* t : load::kTables) o.install.tables.push_back({"public", t});
  auto svc = CaptureService::start(o, **log);
  ASSERT_TRUE(svc.ok()) << svc.error().to_string();
  {
    auto session = PgSession::connect(conninfo);
    ASSERT_TRUE(session.ok()) << session.error().to_string();
    ASSERT_TRUE(sync_tables(**session, "_pgrelay").ok());  // marks the last change, if not yet
  }
  ASSERT_TRUE((*svc)->sync().ok());
  (*svc)->stop();
  EXPECT_EQ(server.scalar("SELECT count(*) FROM _pgrelay.changes", "app"), "0");
  EXPECT_EQ(server.scalar("SELECT count(*) FROM pg_event_trigger", "app"), "0");

  test::PgConnection replica(server.conninfo("replica"));
  const load::Replayed replayed = load::replay(**log, replica);
  test::PgConnection upstream(server.conninfo("app"));
  for (const char* t : load::kTables) {
    EXPECT_EQ(load::table_digest(replica, t), load::table_digest(upstream, t)) << t;
  }
  std::vector<std::uint32_t> logged = replayed.xids;
  std::sort(logged.begin(), logged.end());
  EXPECT_EQ(std::adjacent_find(logged.begin(), logged.end()), logged.end()) << "duplicate xid";
  const std::vector<std::uint32_t> committed = load::committed_xids(upstream);
  EXPECT_EQ(logged.size(), committed.size());
  EXPECT_TRUE(logged == committed);
  EXPECT_GT(committed.size(), 200u);
  // Markers: each once, the last one written upstream among them, for the final publications.
  // Each capture process marks at its start and then every 100 ms, but under load many are
  // killed before that (4 markers in 14 lives under ctest -j3), hence a minimum of 2.
  const std::size_t markers = load::expect_publication_markers(replayed, upstream, 2);
  std::cerr << kills << " kills; " << replayed.transactions << " transactions, " << replayed.changes
            << " changes, " << markers << " publication markers for " << publication_changes
            << " publication changes\n";
  std::error_code ec;
  fs::remove_all(dir, ec);
}

}  // namespace
}  // namespace pgrelay::capture
