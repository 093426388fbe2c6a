// Crash-test writer: appends numbered transactions forever and reports each acknowledged one.
//
// Usage: log_crash_writer DIR fsync|interval|none SEGMENT_SIZE [spill]
// Continues after the last transaction in the log. After every append() that returns, prints
// "ack N" on stdout (one line per batch, N its highest transaction) and flushes, so the parent
// knows exactly what was acknowledged when it kill -9s this process.
// With "spill", the large transactions are written to spill files (in DIR.spill, with a
// rewound stretch in the middle), which the log links in as segments, and every batch ends with
// a checkpoint holding its highest transaction's number.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "crash_workload.h"
#include "log/change_log.h"
#include "log/spill_file.h"

using namespace pgrelay::log;

namespace {

// The payload in a spill file, with 300 kB of other bytes written and rewound half way.
pgrelay::Result<std::unique_ptr<SpillFile>> spill(const std::string& dir, const EntryMeta& meta,
                                                  const std::string& payload) {
  pgrelay::ByteWriter encoded;
  encode_entry_meta(meta, encoded);
  auto writer = SpillWriter::create(dir, "txn-" + std::to_string(meta.xid), encoded.size());
  if (!writer.ok()) return writer.take_error();
  const pgrelay::ByteView data = pgrelay::as_bytes(payload);
  const std::size_t half = data.size() / 2;
  PGRELAY_TRY(writer->write(data.subspan(0, half)));
  const std::string junk(300000, '#');
  PGRELAY_TRY(writer->write(pgrelay::as_bytes(junk)));
  PGRELAY_TRY(writer->rewind(half));
  PGRELAY_TRY(writer->write(data.subspan(half)));
  return writer->finish();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4 && !(argc == 5 && std::strcmp(argv[4], "spill") == 0)) {
    std::fprintf(stderr, "usage: %s DIR fsync|interval|none SEGMENT_SIZE [spill]\n", argv[0]);
    return 2;
  }
  const bool spilling = argc == 5;
  const std::string spill_dir = std::string(argv[1]) + ".spill";
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
    std::vector<std::unique_ptr<SpillFile>> spills;
    std::vector<PendingEntry> batch;
    payloads.reserve(batch_size);
    for (std::size_t i = 0; i < batch_size; ++i) payloads.push_back(crash::payload(n + i));
    for (std::size_t i = 0; i < batch_size; ++i) {
      batch.push_back(PendingEntry{crash::meta(n + i), pgrelay::as_bytes(payloads[i])});
      if (!spilling || payloads[i].size() < 65536) continue;
      if (auto file = spill(spill_dir, batch.back().meta, payloads[i]); file.ok()) {
        batch.back().source = file->get();
        spills.push_back(std::move(*file));
      } else {
        std::fprintf(stderr, "spill failed: %s\n", file.error().to_string().c_str());
        return 1;
      }
    }
    const std::string checkpoint = std::to_string(n + batch_size - 1);
    if (spilling) {
      EntryMeta cp;
      cp.kind = EntryKind::kCheckpoint;
      cp.commit_lsn = batch.back().meta.commit_lsn;
      cp.end_lsn = batch.back().meta.end_lsn;
      batch.push_back(PendingEntry{cp, pgrelay::as_bytes(checkpoint)});
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
