// Change-log benchmark: append throughput per durability policy and appender count, group
// commit, cold and warm read throughput, peak memory of a reader far behind the head, and what a
// stream that starts there spends looking for publications markers before it reads.
//
// Usage: bench_log [--dir DIR] [--seconds S] [--replay-gb G]
// DIR must be on the file system to measure (default: a new directory under /tmp).
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "log/change_log.h"
#include "log/change_view.h"
#include "log/marks.h"

using namespace pgrelay;
using namespace pgrelay::log;
using Clock = std::chrono::steady_clock;

namespace {

constexpr std::size_t kBytesPerChange = 120;  // a typical encoded row change

struct Settings {
  std::string dir;
  double seconds = 2.0;
  double replay_gb = 5.0;
};

std::string make_payload(std::size_t changes) {
  std::string s(changes * kBytesPerChange, 'x');
  for (std::size_t i = 0; i < s.size(); ++i) s[i] = static_cast<char>('a' + (i * 31) % 26);
  return s;
}

std::string fresh_dir(const Settings& s, const std::string& name) {
  std::string d = s.dir + "/" + name;
  std::filesystem::remove_all(d);
  return d;
}

const char* policy_name(SyncPolicy p) {
  switch (p) {
    case SyncPolicy::kFsyncPerCommit:
      return "fsync";
    case SyncPolicy::kInterval:
      return "interval";
    case SyncPolicy::kNone:
      return "none";
  }
  return "?";
}

struct AppendResult {
  double txn_per_s = 0;
  double mb_per_s = 0;
  double fsyncs_per_txn = 0;
};

AppendResult bench_append(const Settings& s, SyncPolicy policy, std::size_t changes, int threads) {
  LogOptions o;
  o.dir = fresh_dir(s, "append");
  o.sync = policy;
  auto opened = ChangeLog::open(o);
  if (!opened.ok()) {
    std::fprintf(stderr, "%s\n", opened.error().to_string().c_str());
    std::exit(1);
  }
  auto log = std::move(*opened);
  std::string payload = make_payload(changes);
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> count{0};
  std::vector<std::thread> workers;
  auto start = Clock::now();
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&] {
      while (!stop.load(std::memory_order_relaxed)) {
        EntryMeta m;
        m.commit_lsn = Lsn(payload.size());
        m.end_lsn = Lsn(payload.size() + 1);
        m.change_count = static_cast<std::uint32_t>(changes);
        std::vector<PendingEntry> batch{PendingEntry{m, as_bytes(payload)}};
        if (!log->append_assigning(batch, Lsn(0)).ok()) std::abort();
        count.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(s.seconds));
  stop = true;
  for (auto& w : workers) w.join();
  double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  LogStats st = log->stats();
  AppendResult r;
  r.txn_per_s = static_cast<double>(count.load()) / elapsed;
  r.mb_per_s = static_cast<double>(st.bytes_appended) / elapsed / 1e6;
  r.fsyncs_per_txn = static_cast<double>(st.fsyncs) / static_cast<double>(count.load());
  return r;
}

long status_kb(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0)
      return std::strtol(line.c_str() + std::strlen(field), nullptr, 10);
  }
  return -1;
}

// Evicts the log's files from the page cache so the next read comes from the disk.
void drop_cache(const std::string& dir) {
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    int fd = ::open(f.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

struct ReadResult {
  double mb_per_s = 0;
  double txn_per_s = 0;
  std::uint64_t entries = 0;
};

ReadResult read_everything(ChangeLog& log) {
  auto cursor = log.open_cursor(Lsn(0));
  if (!cursor.ok()) std::abort();
  std::uint64_t bytes = 0;
  std::uint64_t entries = 0;
  std::uint64_t checksum = 0;
  auto start = Clock::now();
  while (true) {
    auto meta = (*cursor)->next_entry();
    if (!meta.ok()) {
      std::fprintf(stderr, "%s\n", meta.error().to_string().c_str());
      std::abort();
    }
    if (!*meta) break;
    ++entries;
    while (true) {
      auto piece = (*cursor)->next_data();
      if (!piece.ok()) std::abort();
      if (!*piece) break;
      bytes += (*piece)->size();
      checksum += (*piece)->empty() ? 0 : (**piece)[0];
    }
  }
  double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  if (checksum == 1) std::printf(" ");
  return ReadResult{static_cast<double>(bytes) / elapsed / 1e6,
                    static_cast<double>(entries) / elapsed, entries};
}

// Seconds first_publications_change takes from the log's start (a log without markers: it
// looks through everything it must and finds none).
double time_marker_search(ChangeLog& log) {
  auto start = Clock::now();
  auto found = first_publications_change(log, Lsn(0));
  if (!found.ok() || found->has_value()) std::abort();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--dir")
      s.dir = argv[i + 1];
    else if (flag == "--seconds")
      s.seconds = std::atof(argv[i + 1]);
    else if (flag == "--replay-gb")
      s.replay_gb = std::atof(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: %s [--dir DIR] [--seconds S] [--replay-gb G]\n", argv[0]);
      return 2;
    }
  }
  bool own_dir = s.dir.empty();
  if (own_dir) {
    char tmpl[] = "/tmp/pgrelay-bench-XXXXXX";
    s.dir = ::mkdtemp(tmpl);
  }
  std::printf("change log benchmark in %s (%.1f s per append run)\n\n", s.dir.c_str(), s.seconds);
  std::printf("%-9s %-8s %-8s %12s %10s %13s\n", "policy", "changes", "threads", "txn/s", "MB/s",
              "fsyncs/txn");
  double fsync_one = 0;
  double fsync_eight = 0;
  for (SyncPolicy policy :
       {SyncPolicy::kFsyncPerCommit, SyncPolicy::kInterval, SyncPolicy::kNone}) {
    for (std::size_t changes : {std::size_t{1}, std::size_t{100}}) {
      for (int threads : {1, 8}) {
        AppendResult r = bench_append(s, policy, changes, threads);
        std::printf("%-9s %-8zu %-8d %12.0f %10.1f %13.3f\n", policy_name(policy), changes, threads,
                    r.txn_per_s, r.mb_per_s, r.fsyncs_per_txn);
        if (policy == SyncPolicy::kFsyncPerCommit && changes == 1) {
          (threads == 1 ? fsync_one : fsync_eight) = r.txn_per_s;
        }
      }
    }
  }
  std::printf(
      "\ngroup commit: 8 appenders reach %.1fx the fsync-per-commit rate of one (target >= 4x)\n",
      fsync_eight / fsync_one);

  // Replay: a log of replay_gb gigabytes, read cold and warm by a reader starting at the tail.
  LogOptions o;
  o.dir = fresh_dir(s, "replay");
  o.sync = SyncPolicy::kNone;
  auto opened = ChangeLog::open(o);
  if (!opened.ok()) return 1;
  auto log = std::move(*opened);
  std::string payload = make_payload(100);
  auto total = static_cast<std::uint64_t>(s.replay_gb * 1e9);
  std::uint64_t written = 0;
  auto start = Clock::now();
  while (written < total) {
    EntryMeta m;
    m.commit_lsn = Lsn(payload.size());
    m.end_lsn = Lsn(payload.size() + 1);
    m.change_count = 100;
    std::vector<PendingEntry> batch{PendingEntry{m, as_bytes(payload)}};
    if (!log->append_assigning(batch, Lsn(0)).ok()) return 1;
    written += payload.size();
  }
  double write_s = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf("\nwrote %.2f GB of 100-change transactions in %.1f s (%.0f MB/s, no fsync)\n",
              static_cast<double>(written) / 1e9, write_s,
              static_cast<double>(written) / write_s / 1e6);
  drop_cache(o.dir);
  // Reset the peak-RSS counter so it measures the reader alone.
  { std::ofstream("/proc/self/clear_refs") << "5"; }
  long idle_kb = status_kb("VmRSS:");
  ReadResult cold = read_everything(*log);
  long peak_kb = status_kb("VmHWM:");
  ReadResult warm = read_everything(*log);
  std::printf("cold read: %.0f MB/s, %.0f txn/s (%llu transactions)\n", cold.mb_per_s,
              cold.txn_per_s, static_cast<unsigned long long>(cold.entries));
  std::printf("warm read: %.0f MB/s, %.0f txn/s\n", warm.mb_per_s, warm.txn_per_s);
  std::printf("reader %.2f GB behind the head: peak RSS %.1f MiB above idle (target < 64 MiB)\n",
              static_cast<double>(written) / 1e9, static_cast<double>(peak_kb - idle_kb) / 1024.0);

  // A stream starting at the tail first finds the publications markers ahead of it: in the
  // entries the log lists as marked, or, in a log from before it kept that list, in every
  // entry's data. Beside one warm read of the backlog, which the stream then does anyway.
  const double listed_s = time_marker_search(*log);
  log.reset();
  std::filesystem::remove(o.dir + "/" + kMarksName);
  opened = ChangeLog::open(o);
  if (!opened.ok()) return 1;
  log = std::move(*opened);
  const double searched_s = time_marker_search(*log);
  const double read_s = static_cast<double>(warm.entries) / warm.txn_per_s;
  std::printf(
      "stream start, marker search: %.6f s with the marks list, %.3f s searching the data "
      "(a log from before the list); one warm read of the backlog %.3f s: %.2gx and %.2fx of it\n",
      listed_s, searched_s, read_s, listed_s / read_s, searched_s / read_s);
  log.reset();
  if (own_dir) std::filesystem::remove_all(s.dir);
  return 0;
}
