// Kills a log writer with SIGKILL at random moments, hundreds of times, and checks on every
// reopen that each acknowledged transaction is present and intact, nothing partial is visible,
// and appending goes on.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <string>

#include "../unit/log_test_util.h"
#include "crash_workload.h"
#include "log/change_log.h"

namespace pgrelay::log {
namespace {

struct TrialResult {
  std::uint64_t last_ack = 0;
  bool ready = false;
};

// Runs the writer until `run_for` has passed, then kill -9s it; returns the last acknowledged
// transaction it reported.
TrialResult run_and_kill(const std::string& dir, const char* policy,
                         std::chrono::microseconds run_for, bool spill) {
  int fds[2];
  EXPECT_EQ(::pipe(fds), 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fds[1], STDOUT_FILENO);
    ::close(fds[0]);
    ::close(fds[1]);
    ::execl(PGRELAY_CRASH_WRITER, PGRELAY_CRASH_WRITER, dir.c_str(), policy, "262144",
            spill ? "spill" : static_cast<char*>(nullptr), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(fds[1]);
  TrialResult result;
  std::string buffer;
  auto read_some = [&](int timeout_ms) {
    fd_set set;
    FD_ZERO(&set);
    FD_SET(fds[0], &set);
    timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    if (::select(fds[0] + 1, &set, nullptr, nullptr, &tv) <= 0) return false;
    char chunk[4096];
    ssize_t n = ::read(fds[0], chunk, sizeof chunk);
    if (n <= 0) return false;
    buffer.append(chunk, static_cast<std::size_t>(n));
    std::size_t nl;
    while ((nl = buffer.find('\n')) != std::string::npos) {
      std::string line = buffer.substr(0, nl);
      buffer.erase(0, nl + 1);
      if (line.rfind("ready", 0) == 0) result.ready = true;
      if (line.rfind("ack ", 0) == 0) result.last_ack = std::stoull(line.substr(4));
    }
    return true;
  };
  // Wait for the writer to be ready (it recovers the log first), then let it run.
  auto ready_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!result.ready && std::chrono::steady_clock::now() < ready_deadline) read_some(100);
  auto kill_at = std::chrono::steady_clock::now() + run_for;
  while (std::chrono::steady_clock::now() < kill_at) read_some(1);
  ::kill(pid, SIGKILL);
  // Acks written before the kill are still in the pipe: drain them.
  while (read_some(50)) {
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ::close(fds[0]);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
      << "writer exited on its own with status " << status;
  return result;
}

// Reopens the log and checks it holds exactly transactions 1..M, M >= last_ack, each intact
// (from transaction `from` on: the earlier ones were checked after an earlier trial, and are
// checked again every few trials). With spill files, every batch ended with a checkpoint naming
// its last transaction: the recovered checkpoint must name M.
std::uint64_t verify(const std::string& dir, std::uint64_t last_ack, bool spill,
                     std::uint64_t* linked = nullptr, std::uint64_t from = 1) {
  LogOptions o;
  o.dir = dir;
  o.sync = SyncPolicy::kNone;
  auto log = ChangeLog::open(o);
  EXPECT_TRUE(log.ok()) << (log.ok() ? "" : log.error().to_string());
  if (!log.ok()) return 0;
  auto cursor = (*log)->open_cursor(crash::meta(from).begin_lsn);
  EXPECT_TRUE(cursor.ok());
  std::uint64_t expected = from;
  while (true) {
    auto meta = (*cursor)->next_entry();
    EXPECT_TRUE(meta.ok()) << (meta.ok() ? "" : meta.error().to_string());
    if (!meta.ok() || !*meta) break;
    EXPECT_EQ((*meta)->xid, expected);
    EXPECT_EQ(**meta, crash::meta(expected));
    auto data = (*cursor)->read_data();
    EXPECT_TRUE(data.ok());
    EXPECT_TRUE(data.ok() && as_chars(*data) == crash::payload(expected))
        << "payload of transaction " << expected << " damaged";
    ++expected;
  }
  std::uint64_t present = expected - 1;
  EXPECT_GE(present, last_ack) << "an acknowledged transaction was lost";
  if (linked != nullptr) {
    // Segments holding one large transaction alone: the spill files linked in.
    *linked = 0;
    for (const SegmentInfo& seg : (*log)->segments()) {
      const std::uint64_t n = seg.first_lsn.value() / 1000;
      if (seg.sealed && seg.first_lsn.is_valid() && seg.first_lsn == seg.last_lsn &&
          crash::payload(n).size() >= 65536) {
        ++*linked;
      }
    }
  }
  if (spill && present > 0) {
    auto checkpoint = (*log)->last_checkpoint();
    EXPECT_TRUE(checkpoint.has_value());
    if (checkpoint) {
      EXPECT_EQ(std::string(as_chars(*checkpoint)), std::to_string(present))
          << "the checkpoint is not the last batch's";
    }
  }
  return present;
}

void crash_trials(const char* policy, int trials, unsigned seed, bool spill = false) {
  testing::TempDir dir;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> delay_us(5000, 100000);
  std::uint64_t present = 0;
  int progressed = 0;
  // Every trial checks what it appended; every tenth, the whole log again (reading all of it
  // after every trial made the test quadratic: minutes of I/O).
  constexpr int kWholeLogEvery = 10;
  for (int trial = 0; trial < trials; ++trial) {
    TrialResult r =
        run_and_kill(dir.path(), policy, std::chrono::microseconds(delay_us(rng)), spill);
    ASSERT_TRUE(r.ready) << "writer did not start in trial " << trial;
    const std::uint64_t from = trial % kWholeLogEvery == 0 || present == 0 ? 1 : present;
    std::uint64_t now = verify(dir.path(), r.last_ack, spill, nullptr, from);
    ASSERT_GE(now, present) << "transactions disappeared in trial " << trial;
    if (now > present) ++progressed;
    present = now;
    if (::testing::Test::HasFailure()) {
      FAIL() << "policy " << policy << ", trial " << trial;
    }
  }
  // The workload must really have run, or the trials above proved nothing.
  EXPECT_GE(present, static_cast<std::uint64_t>(trials) / 2) << policy;
  EXPECT_GT(progressed, 0) << policy;
  std::uint64_t linked = 0;
  verify(dir.path(), present, spill, &linked);
  if (spill) {
    EXPECT_GT(linked, 0u) << "no spill file was linked in: the trials proved nothing";
    // Spill files have no name until the log links them in: a killed writer leaves none.
    std::size_t left = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir.path() + ".spill")) {
      ADD_FAILURE() << "spill file left behind: " << e.path();
      ++left;
    }
    EXPECT_EQ(left, 0u);
    std::filesystem::remove_all(dir.path() + ".spill");
  }
  std::printf(
      "policy %s%s: %d kill -9 trials, %llu transactions survived and verified, %llu "
      "large ones in linked spill files\n",
      policy, spill ? " with spill files" : "", trials, static_cast<unsigned long long>(present),
      static_cast<unsigned long long>(linked));
}

TEST(LogCrash, KillNineUnderFsyncPerCommit) {
  crash_trials("fsync", 100, 1);
}
TEST(LogCrash, KillNineUnderIntervalSync) {
  crash_trials("interval", 60, 2);
}
TEST(LogCrash, KillNineUnderNoSync) {
  crash_trials("none", 60, 3);
}
// Large transactions come as spill files that the log links in as segments of their own.
TEST(LogCrash, KillNineWhileSpillFilesAreLinkedIn) {
  crash_trials("fsync", 80, 4, true);
}

}  // namespace
}  // namespace pgrelay::log
