// Trigger capture benchmark: upstream write cost with capture on/off, capture throughput, latency.
//
// Starts its own PostgreSQL 15 (tests/support's PgServer: fsync and synchronous_commit off, so
// commits are cheap and the trigger's CPU cost shows undiluted; `durable` turns them on) and
// drives it with pgbench. Plain main: `bench_capture [seconds per phase] [durable]` from a
// release build.
#include <stdlib.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "capture/trigger/capture_service.h"
#include "capture/trigger/installer.h"
#include "log/change_log.h"
#include "log/transaction.h"
#include "pg_server.h"

namespace {

using namespace pgrelay;
using Clock = std::chrono::steady_clock;

constexpr const char* kPgbench = "/usr/lib/postgresql/15/bin/pgbench";

struct Bench {
  test::PgServer& server;
  std::string dir;
  int seconds;

  // Runs pgbench with one script; returns the tps it reports.
  double pgbench(const std::string& script, int clients, const std::string& extra = {}) {
    const std::string file = dir + "/script.sql";
    std::ofstream(file) << script;
    const std::string cmd =
        std::string(kPgbench) + " -n -h " + server.host() + " -p " + std::to_string(server.port()) +
        " -U postgres -c " + std::to_string(clients) + " -j " + std::to_string(clients) + " -T " +
        std::to_string(seconds) + " " + extra + " -f " + file + " postgres 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    std::string out;
    char buf[4096];
    while (std::size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
    pclose(p);
    const auto at = out.find("tps = ");
    if (at == std::string::npos) {
      std::fprintf(stderr, "pgbench failed:\n%s\n", out.c_str());
      std::exit(1);
    }
    return std::stod(out.substr(at + 6));
  }

  double seconds_of(const std::string& sql) {
    const auto t0 = Clock::now();
    server.exec(sql);
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }
};

std::unique_ptr<log::ChangeLog> open_log(const std::string& dir) {
  std::filesystem::remove_all(dir);
  log::LogOptions o;
  o.dir = dir;
  auto l = log::ChangeLog::open(o);  // fsync per commit, the default
  if (!l.ok()) {
    std::fprintf(stderr, "log: %s\n", l.error().to_string().c_str());
    std::exit(1);
  }
  return std::move(*l);
}

std::unique_ptr<capture::CaptureService> start_capture(test::PgServer& server, log::ChangeLog& log,
                                                       const std::string& spill) {
  capture::CaptureServiceOptions o;
  o.poller.conninfo = server.conninfo();
  o.poller.spill_dir = spill;
  o.install.tables = {{"public", "ins"}, {"public", "upd"}, {"public", "bulk"}, {"public", "lat"}};
  o.detect_interval = std::chrono::hours(1);
  auto s = capture::CaptureService::start(o, log);
  if (!s.ok()) {
    std::fprintf(stderr, "capture: %s\n", s.error().to_string().c_str());
    std::exit(1);
  }
  return std::move(*s);
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
}

}  // namespace

int main(int argc, char** argv) {
  // bench_capture [seconds per phase] [durable]: "durable" turns fsync and synchronous_commit
  // on, as production servers run.
  const int seconds = argc > 1 ? std::atoi(argv[1]) : 10;
  const bool durable = argc > 2 && std::string(argv[2]) == "durable";
  test::PgServerOptions options;
  if (durable) {
    options.settings["fsync"] = "on";
    options.settings["synchronous_commit"] = "on";
  }
  options.settings["track_commit_timestamp"] = "on";
  options.settings["shared_buffers"] = "256MB";
  test::PgServer server(options);
  char tmpl[] = "/tmp/pgrelay-bench-capture-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return 1;
  Bench b{server, tmpl, seconds};
  // Each captured table has an uncaptured twin; the phases alternate between them while the
  // capture service runs, so both see the same background load (the machine may be shared).
  server.exec(
      "CREATE TABLE ins (id bigserial PRIMARY KEY, v text, n int);"
      "CREATE TABLE ins_plain (LIKE ins INCLUDING ALL);"
      "CREATE TABLE upd (id int PRIMARY KEY, v text, n int);"
      "INSERT INTO upd SELECT g, md5(g::text), 0 FROM generate_series(1, 100000) g;"
      "CREATE TABLE upd_plain AS SELECT * FROM upd; ALTER TABLE upd_plain ADD PRIMARY KEY (id);"
      "CREATE TABLE bulk (id int PRIMARY KEY, v text, n int);"
      "CREATE TABLE bulk_plain (LIKE bulk INCLUDING ALL);"
      "CREATE TABLE lat (id bigserial PRIMARY KEY, v text)");
  server.exec("VACUUM ANALYZE");
  auto insert_script = [](const std::string& t) {
    return "INSERT INTO " + t + " (v, n) VALUES (md5(random()::text), 1);\n";
  };
  auto update_script = [](const std::string& t) {
    return "\\set id random(1, 100000)\nUPDATE " + t +
           " SET n = n + 1, v = md5(:id::text) WHERE id = :id;\n";
  };
  auto bulk_sql = [](const std::string& t) {
    return "INSERT INTO " + t + " SELECT g, md5(g::text), g FROM generate_series(1, 100000) g";
  };
  std::printf(
      "PostgreSQL 15, fsync=%s synchronous_commit=%s; pgbench 4 clients, 3 rounds of %d s per "
      "table; the log fsyncs every commit\n",
      durable ? "on" : "off", durable ? "on" : "off", seconds);

  // Capture throughput for small transactions: a backlog written while the service is stopped,
  // then captured at once.
  {
    auto session = capture::PgSession::connect(server.conninfo());
    capture::InstallOptions io;
    io.tables = {{"public", "ins"}, {"public", "upd"}, {"public", "bulk"}, {"public", "lat"}};
    if (!session.ok() || !capture::install(**session, io).ok()) {
      std::fprintf(stderr, "install failed\n");
      return 1;
    }
  }
  server.exec("UPDATE _pgrelay.wakeup SET armed = false");  // as a busy service has it
  (void)b.pgbench(insert_script("ins"), 4);
  const std::string pending_rows = server.scalar("SELECT count(*) FROM _pgrelay.changes");
  const std::string pending_txns =
      server.scalar("SELECT count(DISTINCT xid) FROM _pgrelay.changes");
  auto log = open_log(b.dir + "/log");
  auto t0 = Clock::now();
  auto svc = start_capture(server, *log, b.dir + "/spill");
  (void)svc->sync();
  const double backlog_s = std::chrono::duration<double>(Clock::now() - t0).count();

  double ins_off = 0, ins_on = 0, upd_off = 0, upd_on = 0, bulk_off = 0, bulk_on = 0, drain = 0;
  const int rounds = 3;
  for (int r = 0; r < rounds; ++r) {
    ins_off += b.pgbench(insert_script("ins_plain"), 4) / rounds;
    ins_on += b.pgbench(insert_script("ins"), 4) / rounds;
    upd_off += b.pgbench(update_script("upd_plain"), 4) / rounds;
    upd_on += b.pgbench(update_script("upd"), 4) / rounds;
    (void)svc->sync();
    server.exec("TRUNCATE bulk_plain");
    bulk_off += b.seconds_of(bulk_sql("bulk_plain")) / rounds;
    server.exec("TRUNCATE bulk");
    (void)svc->sync();
    bulk_on += b.seconds_of(bulk_sql("bulk")) / rounds;
    // Capture throughput: the 100k-row transaction from change table to durable log.
    t0 = Clock::now();
    (void)svc->sync();
    drain += std::chrono::duration<double>(Clock::now() - t0).count() / rounds;
  }

  // Commit-to-log latency at ~1000 transactions/s: commit timestamps (track_commit_timestamp)
  // against the time each transaction became readable in the log.
  auto cursor = log->open_cursor(log->last_end_lsn() + 1);
  std::vector<double> latencies_ms;
  std::atomic<bool> reading{true};
  std::thread reader([&] {
    while (reading) {
      auto e = (*cursor)->next_entry();
      if (!e.ok()) break;
      if (!e->has_value()) {
        (*cursor)->wait(std::chrono::milliseconds(50));
        continue;
      }
      const auto now = std::chrono::system_clock::now().time_since_epoch();
      const std::int64_t now_us =
          std::chrono::duration_cast<std::chrono::microseconds>(now).count() -
          946684800LL * 1000000;
      if ((*e)->kind == log::EntryKind::kTransaction) {
        latencies_ms.push_back(static_cast<double>(now_us - (*e)->commit_time) / 1000.0);
      }
    }
  });
  const double lat_tps = b.pgbench("INSERT INTO lat (v) VALUES ('x');\n", 4, "-R 1000");
  (void)svc->sync();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  reading = false;
  reader.join();
  const auto stats = svc->stats();
  svc->stop();

  auto row = [](const char* what, double off, double on) {
    std::printf("%s, 4 clients: capture off %.0f tps, on %.0f tps (on/off %.2f, cost %.0f%%)\n",
                what, off, on, on / off, 100 * (1 - on / off));
  };
  row("single-row INSERT", ins_off, ins_on);
  row("single-row UPDATE", upd_off, upd_on);
  std::printf("100k-row INSERT ... SELECT: capture off %.3f s, on %.3f s (x%.2f)\n", bulk_off,
              bulk_on, bulk_on / bulk_off);
  std::printf("capture of the 100k-row transaction: %.3f s (%.0f changes/s)\n", drain,
              100000 / drain);
  std::printf(
      "capture of a backlog of %s single-row transactions (%s rows), service start included: "
      "%.3f s (%.0f transactions/s)\n",
      pending_txns.c_str(), pending_rows.c_str(), backlog_s, std::stod(pending_txns) / backlog_s);
  std::printf(
      "commit-to-log latency at %.0f tps: p50 %.2f ms, p99 %.2f ms, max %.2f ms (%zu "
      "transactions; %llu polls in all)\n",
      lat_tps, percentile(latencies_ms, 0.5), percentile(latencies_ms, 0.99),
      percentile(latencies_ms, 1.0), latencies_ms.size(),
      static_cast<unsigned long long>(stats.polls));
  std::filesystem::remove_all(b.dir);
  return 0;
}
