// Crash-test writer: appends numbered transactions forever and reports each acknowledged one.
//
// Usage: log_crash_writer DIR fsync|interval|none SEGMENT_SIZE
// Continues after the last transaction in the log. After every append() that returns, prints
// "ack N" on stdout (one line per batch, N its highest transaction) and flushes, so the parent
// knows exactly what was acknowledged when it kill -9s this process.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "crash_workload.h"
#include "log/change_log.h"

using namespace pgrelay::log;

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s DIR fsync|interval|none SEGMENT_SIZE\n", argv[0]);
    return 2;
  }
  LogOptions options;
  options.dir = argv[1];
  std::string policy = argv[2];
  options.sync = policy == "fsync"      ? SyncPolicy::kFsyncPerCommit
                 : policy == "interval" ? SyncPolicy::kInterval
                                        : SyncPolicy::kNone;
  options.sync_interval = std::chrono::milliseconds(5);
  options.segment_size = std::strtoull(argv[3], nullptr, 10);
  auto log = ChangeLog::open(options);
  if (!log.ok()) {
    std::fprintf(stderr, "open failed: %s\n", log.error().to_string().c_str());
    return 1;
  }
  std::uint64_t n = (*log)->last_commit_lsn().value() / 1000 + 1;
  std::printf("ready %llu\n", static_cast<unsigned long long>(n));
  std::fflush(stdout);
  while (true) {
    std::size_t batch_size = 1 + n % 4;
    std::vector<std::string> payloads;
    std::vector<PendingEntry> batch;
    payloads.reserve(batch_size);
    for (std::size_t i = 0; i < batch_size; ++i) payloads.push_back(crash::payload(n + i));
    for (std::size_t i = 0; i < batch_size; ++i) {
      batch.push_back(PendingEntry{crash::meta(n + i), pgrelay::as_bytes(payloads[i])});
    }
    auto st = (*log)->append(batch);
    if (!st.ok()) {
      std::fprintf(stderr, "append failed: %s\n", st.error().to_string().c_str());
      return 1;
    }
    n += batch_size;
    std::printf("ack %llu\n", static_cast<unsigned long long>(n - 1));
    std::fflush(stdout);
  }
}
