// Runs zero-cache as a supervised child: its output shown with a prefix and kept in a file,
// its readiness announced, its exits restarted with backoff, its whole process tree stopped.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <vector>

#include "base/background_thread.h"
#include "base/logger.h"
#include "base/result.h"

namespace pgrelay::zero {

struct ZeroSupervisorOptions {
  std::vector<std::string> argv;         // the node binary, then zero-cache's script
  std::vector<std::string> environment;  // NAME=VALUE (zero_cache_environment)
  std::string log_path;                  // zero-cache's output is appended here
  int port = 4848;                       // ZERO_PORT: it is ready once GET / answers there
  // Each line zero-cache writes, and the ready line; for the terminal. Called on the
  // supervisor's thread.
  std::function<void(const std::string&)> print;
  std::chrono::milliseconds backoff_min{1000};
  std::chrono::milliseconds backoff_max{30000};
  // A run at least this long starts the backoff over.
  std::chrono::milliseconds stable_after{60000};
  // After SIGTERM, how long zero-cache has to stop before its process group gets SIGKILL.
  std::chrono::milliseconds stop_grace{10000};
  std::size_t tail_lines = 20;  // kept for the restart message
};

struct ZeroFigures {
  std::string state;  // "starting", "ready", "restarting", "stopped"
  pid_t pid = 0;      // of the running zero-cache; 0 when none
  std::uint64_t starts = 0;
  std::string url;  // http://127.0.0.1:PORT
  std::vector<std::string> tail;
};

class ZeroSupervisor {
 public:
  // Opens the log file; `logger` must outlive the supervisor.
  static Result<std::unique_ptr<ZeroSupervisor>> make(ZeroSupervisorOptions options,
                                                      Logger& logger);
  ~ZeroSupervisor();
  ZeroSupervisor(const ZeroSupervisor&) = delete;
  ZeroSupervisor& operator=(const ZeroSupervisor&) = delete;

  void start();
  // Stops zero-cache (SIGTERM to its process group, SIGKILL after stop_grace) and the
  // supervision with it.
  void stop();
  ZeroFigures figures() const;
  // Ends the running zero-cache as stop() does, runs `between` while none runs (reset: its
  // slots and replica go), and starts zero-cache again at once, without backoff. Returns what
  // `between` returned (zero-cache starts again either way). Blocks; not on the
  // supervisor's own thread.
  Status restart(std::function<Status()> between = {});

 private:
  struct RestartRequest {
    std::function<Status()> between;
    std::promise<Status> done;
  };
  ZeroSupervisor(ZeroSupervisorOptions options, Logger& logger, int log_fd);
  void run();
  // One life of zero-cache, from its start to its end or to stop(); its wait status.
  Result<int> run_once();
  // Reads what zero-cache wrote; false once the pipe is closed.
  bool read_output(int fd);
  void take_line(const std::string& line);
  void flush_partial_line();
  // Whether zero-cache answers GET / on its port.
  bool answers_http() const;
  // Ends every process of one run of zero-cache (led by `pid`): SIGTERM, then SIGKILL after
  // stop_grace. zero-cache starts its workers detached, in sessions of their own, so they
  // are found by the variable `marker` (NAME=VALUE) each inherits, not by process group or
  // parent. Reaps the leader unless `leader_ended`; its wait status goes to `status`.
  void end_run(pid_t pid, const std::string& marker, bool leader_ended, int& status, int output_fd);
  void set_state(const char* state, pid_t pid);
  // Runs a pending restart's `between`, while no zero-cache runs, and answers it.
  void answer_restart(const Status& instead = {});

  ZeroSupervisorOptions options_;
  Logger& logger_;
  int log_fd_;
  std::string partial_;  // an unfinished line (supervisor thread)
  BackgroundThread thread_;
  std::mutex restart_mu_;  // one restart at a time
  std::atomic<bool> restart_requested_{false};
  std::shared_ptr<RestartRequest> restart_;  // guarded by mu_

  mutable std::mutex mu_;  // what follows
  ZeroFigures figures_;
  std::deque<std::string> tail_;
};

}  // namespace pgrelay::zero
