// kill -9 of a native capture process during concurrent writes, restarted each time, as a role
// with REPLICATION that owns the tables but is not superuser: nothing lost, nothing twice, and
// the upstream slot never released past what the log holds. The processes alternate between
// reading the stream on an event loop and on the capture thread.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "capture/native/native_capture.h"
#include "load_support.h"
#include "log/change_log.h"
#include "log/transaction.h"
#include "pg_server.h"

namespace pgrelay::capture {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr const char* kSlot = "pgrelay_crash";

// Runs the helper with its stdout and stderr in files (it prints "ready" once started, and the
// errors its capture retries).
pid_t spawn_helper(const std::vector<std::string>& args, const std::string& out,
                   const std::string& err) {
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(NATIVE_CAPTURE_HELPER));
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    const int out_fd = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int err_fd = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (out_fd < 0 || err_fd < 0 || dup2(out_fd, 1) < 0 || dup2(err_fd, 2) < 0) _exit(126);
    execv(NATIVE_CAPTURE_HELPER, argv.data());
    _exit(127);
  }
  return pid;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

bool slot_active(test::PgServer& server) {
  return server.scalar(std::string("SELECT active::text FROM pg_replication_slots WHERE "
                                   "slot_name = '") +
                       kSlot + "'") == "true";
}

// A killed capture's walsender lets the slot go once it notices its client is gone.
bool wait_slot_released(test::PgServer& server) {
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (slot_active(server)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

wire::Lsn confirmed_flush(test::PgServer& server) {
  const auto text = server.scalar(std::string("SELECT confirmed_flush_lsn::text FROM "
                                              "pg_replication_slots WHERE slot_name = '") +
                                  kSlot + "'");
  const auto lsn = wire::Lsn::parse(text);
  if (!lsn) throw test::PgError("bad confirmed_flush_lsn " + text);
  return *lsn;
}

struct ReleaseChecks {
  int checks = 0;
  int past_log_end = 0;  // the slot was confirmed past the log's end (no load commit between)
  // The slot was confirmed short of the log's end: the restart is sent transactions the log
  // already holds, and must skip them by commit LSN.
  int behind_log_end = 0;
};

// Transactions of the log ending after `from` that hold only a publications-changed marker.
std::size_t markers_after(log::ChangeLog& log, wire::Lsn from) {
  std::size_t n = 0;
  auto cursor = log.open_cursor(from);
  if (!cursor.ok()) throw std::runtime_error(cursor.error().to_string());
  while (true) {
    auto e = (*cursor)->next_entry();
    if (!e.ok()) throw std::runtime_error(e.error().to_string());
    if (!e->has_value()) return n;
    if ((**e).end_lsn <= from) continue;
    auto t = log::read_transaction(**cursor, **e);
    if (!t.ok()) throw std::runtime_error(t.error().to_string());
    n += load::marker_only(*t);
  }
}

// The commit records of load transactions (each inserts a txlog row) that start in [from, to),
// as "LSN xid".
std::vector<std::string> load_commits_between(test::PgServer& server, wire::Lsn from,
                                              wire::Lsn to) {
  const std::string f = test::sql_literal(from.to_string());
  const std::string t = test::sql_literal(to.to_string());
  std::vector<std::string> out;
  for (const auto& row : server.exec(
           "SELECT r.start_lsn::text || ' xid ' || r.xid::text FROM pg_get_wal_records_info(" + f +
               ", " + t +
               ") r WHERE r.resource_manager = 'Transaction' AND r.record_type LIKE 'COMMIT%' "
               "AND r.start_lsn >= " +
               f + " AND r.start_lsn < " + t +
               " AND r.xid::text IN (SELECT (xid::text::numeric % 4294967296)::text FROM txlog)",
           "app")) {
    out.push_back(*row[0]);
  }
  return out;
}

// Durable before released: Postgres never sends a commit that starts before the slot's
// confirmed position again, so every load transaction committed before it must be in the log.
// The slot may lie past the log's end (native capture confirms a keepalive's position when
// nothing is open), but then no load transaction may commit between.
void check_released_is_durable(test::PgServer& server, wire::Lsn log_end, ReleaseChecks& checks) {
  const wire::Lsn confirmed = confirmed_flush(server);
  ++checks.checks;
  if (confirmed < log_end) ++checks.behind_log_end;
  if (confirmed <= log_end) return;
  ++checks.past_log_end;
  std::string listed;
  for (const auto& c : load_commits_between(server, log_end, confirmed)) listed += " " + c;
  EXPECT_EQ(listed, "") << "slot confirmed at " << confirmed.to_string() << " but the log ends at "
                        << log_end.to_string() << "; released and not logged:";
}

TEST(NativeCaptureCrashTest, KilledAndRestartedCaptureLosesAndDuplicatesNothing) {
  const auto started = std::chrono::steady_clock::now();
  test::PgServerOptions options;
  options.settings["max_connections"] = "50";
  test::PgServer server(options);
  server.create_role("cap_nat", std::nullopt, "REPLICATION");
  EXPECT_EQ(server.scalar("SELECT rolsuper::text || rolreplication::text FROM pg_roles WHERE "
                          "rolname = 'cap_nat'"),
            "falsetrue");
  server.exec("CREATE DATABASE app OWNER cap_nat");
  server.exec("CREATE DATABASE replica");
  std::string tables;
  for (const char* t : load::kTables) tables += (tables.empty() ? "" : ", ") + std::string(t);
  {
    test::PgConnection owner(server.conninfo("app", "cap_nat"));
    owner.exec(load::kSchema);
    owner.exec(load::kSeed);
    // A consumer's publication: native capture mirrors its tables into its own.
    owner.exec("CREATE PUBLICATION load FOR TABLE " + tables);
  }
  server.exec(load::kSchema, "replica");
  server.exec(load::kSeed, "replica");
  // For the release check only (superuser).
  server.exec("CREATE EXTENSION pg_walinspect", "app");

  char tmpl[] = "/tmp/pgrelay-ncrash-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const std::string conninfo = server.conninfo("app", "cap_nat");
  const std::vector<std::string> args = {conninfo, dir + "/log", dir + "/spill", kSlot};
  log::LogOptions lo;
  lo.dir = dir + "/log";
  NativeCaptureOptions co;
  co.conninfo = conninfo;
  co.slot = kSlot;
  co.spill_dir = dir + "/spill";

  // Started once before the load, as a deployment does: the slot exists from then on, so every
  // load transaction is decoded, and a restarted capture's install changes nothing.
  {
    auto log = log::ChangeLog::open(lo);
    ASSERT_TRUE(log.ok()) << log.error().to_string();
    auto capture = NativeCapture::start(co, **log);
    ASSERT_TRUE(capture.ok()) << capture.error().to_string();
    EXPECT_EQ((*capture)->setup_report().captured_tables, 5);
    EXPECT_FALSE((*capture)->setup_report().event_trigger);
    auto synced = (*capture)->sync();
    ASSERT_TRUE(synced.ok()) << synced.error().to_string();
    (*capture)->stop();
  }
  ASSERT_TRUE(wait_slot_released(server));

  std::atomic<bool> writing{true};
  std::string pgbench_error;
  std::thread writers([&] {
    try {
      load::run_pgbench(server, "app", "cap_nat", dir, 20, 8);
    } catch (const std::exception& e) {
      pgbench_error = e.what();
    }
    writing = false;
  });
  // Publication changes throughout: the mirror's periodic check marks each one it sees in the
  // log (publication_marker.h), in a transaction of its own that a kill must not lose or double.
  std::atomic<int> publication_changes{0};
  std::string publisher_error;
  std::thread publisher([&] {
    try {
      test::PgConnection owner(server.conninfo("app", "cap_nat"));
      for (int i = 0; writing; ++i) {
        owner.exec(std::string("ALTER PUBLICATION load SET (publish = '") +
                   (i % 2 ? "insert, update, delete, truncate" : "insert") + "')");
        ++publication_changes;
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
      }
    } catch (const std::exception& e) {
      publisher_error = e.what();
    }
  });
  std::mt19937 rng(42);
  int kills = 0, ready = 0, found_held = 0, torn_tails = 0, handovers = 0;
  ReleaseChecks checks;
  const std::string out = dir + "/helper.out", err = dir + "/helper.err";
  // Nothing may leave this loop by exception or ASSERT while the writers run: destroying a
  // joinable thread would abort the test binary.
  try {
    while (writing) {
      // Every fourth start finds the slot held, as when the host of a killed pgrelay vanished and
      // its walsender waits for wal_sender_timeout: a replication connection of the test's streams
      // the slot, never confirming anything, until a second into the new process's life. (A
      // process killed outright loses its walsender within milliseconds, before a new one has
      // started.)
      const bool hand_over = (kills + 1) % 4 == 0;
      std::optional<test::PgConnection> holder;
      if (hand_over) {
        if (!wait_slot_released(server)) {
          ADD_FAILURE() << "the killed capture's walsender kept the slot";
          break;
        }
        holder.emplace(server.conninfo("app", "cap_nat", "replication=database"));
        PGresult* res =
            PQexec(holder->raw(), (std::string("START_REPLICATION SLOT ") + kSlot +
                                   " LOGICAL 0/0 (proto_version '1', publication_names '\"" +
                                   capture_publication("_pgrelay") + "\"')")
                                      .c_str());
        const bool streaming = PQresultStatus(res) == PGRES_COPY_BOTH;
        PQclear(res);
        if (!streaming) {
          ADD_FAILURE() << "could not hold the slot: " << PQerrorMessage(holder->raw());
          break;
        }
      }
      // Half the processes read the stream on an event loop, as `pgrelay serve` does, half on
      // the capture thread.
      std::vector<std::string> helper_args = args;
      helper_args.push_back(kills % 2 == 0 ? "loop" : "thread");
      const pid_t pid = spawn_helper(helper_args, out, err);
      if (pid <= 0) {
        ADD_FAILURE() << "fork failed";
        break;
      }
      if (hand_over) {
        std::this_thread::sleep_for(1s);
        const std::string holder_pid = std::to_string(PQbackendPID(holder->raw()));
        holder.reset();
        // The capture thread's retries take the slot once the holder's walsender lets go.
        bool taken = false;
        for (auto until = std::chrono::steady_clock::now() + 10s;
             !taken && std::chrono::steady_clock::now() < until;
             std::this_thread::sleep_for(20ms)) {
          taken =
              server.scalar(std::string("SELECT (coalesce(active_pid, ") + holder_pid + ") <> " +
                            holder_pid + ")::text FROM pg_replication_slots WHERE slot_name = '" +
                            kSlot + "'") == "true";
        }
        EXPECT_TRUE(taken) << "the capture never took the slot back";
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(500 + rng() % 2000));
      kill(pid, SIGKILL);
      int status = 0;
      waitpid(pid, &status, 0);
      const std::string errors = read_text(err);
      EXPECT_TRUE(WIFSIGNALED(status)) << "the capture process exited by itself: " << status << "\n"
                                       << errors;
      ++kills;
      if (read_text(out).find("ready") != std::string::npos) ++ready;
      // The previous process's walsender still held the slot (the capture thread retried).
      const bool held = errors.find("is active for PID") != std::string::npos;
      if (held) ++found_held;
      if (hand_over) {
        ++handovers;
        EXPECT_TRUE(held) << "the capture did not meet the held slot:\n" << errors;
      }
      // Every other kill: once the walsender lets go, the slot's position is final until the next
      // start; compare it with what the killed process left in the log. The other kills restart at
      // once, racing the walsender for the slot.
      if (kills % 2 == 0) {
        if (!wait_slot_released(server)) {
          ADD_FAILURE() << "the killed capture's walsender kept the slot";
          break;
        }
        log::LogOptions ro = lo;
        ro.read_only = true;
        auto log = log::ChangeLog::open(ro);
        if (!log.ok()) {
          ADD_FAILURE() << log.error().to_string();
          break;
        }
        if ((*log)->stats().recovered_truncated_bytes > 0) ++torn_tails;
        check_released_is_durable(server, (*log)->last_end_lsn(), checks);
      }
    }
  } catch (const std::exception& e) {
    ADD_FAILURE() << e.what();
  }
  writers.join();
  publisher.join();
  ASSERT_EQ(pgbench_error, "");
  ASSERT_EQ(publisher_error, "");
  EXPECT_GE(kills, 5);
  EXPECT_GE(ready, kills / 2) << "most capture processes were killed before they streamed";

  // Writes while no capture runs, so that the last restart resumes with a backlog.
  ASSERT_NO_THROW(load::run_pgbench(server, "app", "cap_nat", dir, 2, 4));

  // A last restart, in process, drains what is left (the last kill may still hold the slot).
  auto log = log::ChangeLog::open(lo);
  ASSERT_TRUE(log.ok()) << log.error().to_string();
  const wire::Lsn backlog_from = (*log)->last_end_lsn();
  auto capture = NativeCapture::start(co, **log);
  ASSERT_TRUE(capture.ok()) << capture.error().to_string();
  auto synced = (*capture)->sync();
  ASSERT_TRUE(synced.ok()) << synced.error().to_string();
  const NativeCapture::Stats stats = (*capture)->stats();
  EXPECT_GT(stats.transactions, 0u);
  (*capture)->stop();
  ASSERT_TRUE(wait_slot_released(server));
  const wire::Lsn log_end = (*log)->last_end_lsn();
  const wire::Lsn confirmed = confirmed_flush(server);
  check_released_is_durable(server, log_end, checks);
  // The WAL query above sees what it should: the last restart appended exactly the load
  // commits between the log's end before it and after it (and perhaps a publication marker).
  EXPECT_EQ(load_commits_between(server, backlog_from, log_end).size() +
                markers_after(**log, backlog_from),
            stats.transactions);

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
  const std::size_t markers = load::expect_publication_markers(replayed, upstream, 3);
  std::cerr << markers << " publication markers for " << publication_changes
            << " publication changes; ";
  std::cerr << kills << " kills (" << ready << " after ready, " << found_held
            << " restarts found the slot held (" << handovers << " held by the test), "
            << torn_tails << " torn log tails); " << replayed.transactions << " transactions, "
            << replayed.changes << " changes; "
            << "release checks " << checks.checks << ", slot past log end " << checks.past_log_end
            << ", behind it " << checks.behind_log_end << "; final: log end " << log_end.to_string()
            << ", slot confirmed " << confirmed.to_string() << ", last restart appended "
            << stats.transactions << " (reconnects " << stats.reconnects << ", last error '"
            << stats.last_error << "'); "
            << std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() -
                                                                started)
                   .count()
            << " s\n";
  std::error_code ec;
  fs::remove_all(dir, ec);
}

}  // namespace
}  // namespace pgrelay::capture
