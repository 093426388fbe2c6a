// A capture process for the crash test: runs CaptureService on a log until it is killed.
// Usage: capture_helper CONNINFO LOG_DIR SPILL_DIR TABLE...
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "capture/trigger/capture_service.h"
#include "log/change_log.h"

int main(int argc, char** argv) {
  using namespace pgrelay;
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s CONNINFO LOG_DIR SPILL_DIR TABLE...\n", argv[0]);
    return 2;
  }
  log::LogOptions lo;
  lo.dir = argv[2];
  // As `pgrelay serve` runs: each poll returns once its batch is written, the sync thread makes
  // it durable and shows it, and rows are released only after. A kill loses nothing written(2).
  lo.sync = log::SyncPolicy::kFsyncPerCommit;
  auto log = log::ChangeLog::open(lo);
  if (!log.ok()) {
    std::fprintf(stderr, "log: %s\n", log.error().to_string().c_str());
    return 1;
  }
  capture::CaptureServiceOptions o;
  o.poller.conninfo = argv[1];
  o.poller.spill_dir = argv[3];
  for (int i = 4; i < argc; ++i) o.install.tables.push_back({"public", argv[i]});
  // Small parts: the backlog each restart finds is appended in many, so kills land between
  // them (a snapshot partly in the log, finished by the next life).
  o.poller.batch_entries = 8;
  // Often enough that the periodic sync's publication markers meet the kills.
  o.detect_interval = std::chrono::milliseconds(100);
  auto svc = capture::CaptureService::start(o, **log);
  if (!svc.ok()) {
    std::fprintf(stderr, "capture: %s\n", svc.error().to_string().c_str());
    return 1;
  }
  // Mark a publication change made since the last process at once, as native capture's start
  // does (it mirrors and marks): each life of this process then writes a marker for the test's
  // kills to land around, however briefly the periodic sync gets to run under load.
  {
    auto session = capture::PgSession::connect(o.poller.conninfo);
    if (!session.ok() || !capture::sync_tables(**session, o.poller.schema).ok()) {
      std::fprintf(stderr, "could not sync the captured tables\n");
      return 1;
    }
  }
  std::printf("ready\n");
  std::fflush(stdout);
  while (true) pause();
}
