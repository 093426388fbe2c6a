// Runs zero-cache as a supervised child: its output shown with a prefix and kept in a file,
// its readiness announced, its exits restarted with backoff, its whole process tree stopped.
#include "zero/zero_supervisor.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "base/child_process.h"
#include "base/strings.h"

namespace pgrelay::zero {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kMaxLine = 64 * 1024;  // a longer line is shown in pieces
constexpr auto kProbeInterval = std::chrono::milliseconds(250);

void write_all(int fd, std::string_view text) {
  while (!text.empty()) {
    ssize_t n = ::write(fd, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the log is best effort: the terminal still shows the line
    text.remove_prefix(static_cast<std::size_t>(n));
  }
}

// The processes whose environment holds `marker` (NAME=VALUE); those of other users, and
// zombies (their environment reads empty), are not seen.
std::vector<pid_t> processes_marked(const std::string& marker) {
  std::vector<pid_t> out;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return out;
  while (const dirent* entry = ::readdir(proc)) {
    const std::string_view name = entry->d_name;
    if (name.empty() || name.find_first_not_of("0123456789") != std::string_view::npos) continue;
    std::ifstream in("/proc/" + std::string(name) + "/environ", std::ios::binary);
    for (std::string variable; std::getline(in, variable, '\0');) {
      if (variable == marker) {
        out.push_back(static_cast<pid_t>(std::stol(std::string(name))));
        break;
      }
    }
  }
  ::closedir(proc);
  return out;
}

}  // namespace

Result<std::unique_ptr<ZeroSupervisor>> ZeroSupervisor::make(ZeroSupervisorOptions options,
                                                             Logger& logger) {
  int fd = ::open(options.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) {
    return Error::make(sqlstate::kIoError,
                       "could not open " + options.log_path + ": " + std::strerror(errno),
                       "Check that pgrelay may write in its --data-dir.");
  }
  return std::unique_ptr<ZeroSupervisor>(new ZeroSupervisor(std::move(options), logger, fd));
}

ZeroSupervisor::ZeroSupervisor(ZeroSupervisorOptions options, Logger& logger, int log_fd)
    : options_(std::move(options)), logger_(logger), log_fd_(log_fd) {
  figures_.state = "stopped";
  figures_.url = "http://127.0.0.1:" + std::to_string(options_.port);
}

ZeroSupervisor::~ZeroSupervisor() {
  stop();
  ::close(log_fd_);
}

void ZeroSupervisor::start() {
  thread_.start("zero-supervisor", [this] { run(); });
}

void ZeroSupervisor::stop() {
  thread_.stop();
}

ZeroFigures ZeroSupervisor::figures() const {
  std::lock_guard lock(mu_);
  ZeroFigures out = figures_;
  out.tail.assign(tail_.begin(), tail_.end());
  return out;
}

void ZeroSupervisor::set_state(const char* state, pid_t pid) {
  std::lock_guard lock(mu_);
  figures_.state = state;
  figures_.pid = pid;
}

Status ZeroSupervisor::restart(std::function<Status()> between) {
  std::lock_guard one_at_a_time(restart_mu_);
  auto request = std::make_shared<RestartRequest>();
  request->between = std::move(between);
  auto done = request->done.get_future();
  if (thread_.stopping()) {
    return Error::make(sqlstate::kAdminShutdown, "pgrelay is stopping zero-cache");
  }
  {
    std::lock_guard lock(mu_);
    restart_ = request;
  }
  restart_requested_ = true;
  thread_.wake();
  if (done.wait_for(options_.stop_grace + std::chrono::seconds(60)) != std::future_status::ready) {
    return Error::make(sqlstate::kSystemError, "zero-cache did not restart in time",
                       "See pgrelay's log and DATA_DIR/zero/zero-cache.log.");
  }
  return done.get();
}

void ZeroSupervisor::answer_restart(const Status& instead) {
  std::shared_ptr<RestartRequest> request;
  {
    std::lock_guard lock(mu_);
    request = std::exchange(restart_, nullptr);
  }
  restart_requested_ = false;
  if (!request) return;
  if (!instead.ok()) {
    request->done.set_value(instead);
    return;
  }
  request->done.set_value(request->between ? request->between() : Status{});
}

void ZeroSupervisor::run() {
  auto backoff = options_.backoff_min;
  while (!thread_.stopping()) {
    if (restart_requested_) {
      answer_restart();
      backoff = options_.backoff_min;
      // The request's wake() ended no pause (zero-cache was running): used up here, it does
      // not cut the next backoff short.
      thread_.pause(std::chrono::milliseconds(0));
      logger_.info("starting zero-cache again, as asked");
    }
    const auto began = Clock::now();
    auto status = run_once();
    if (thread_.stopping()) break;
    if (restart_requested_) continue;  // answered before the next start
    if (Clock::now() - began >= options_.stable_after) backoff = options_.backoff_min;
    std::vector<std::string> tail;
    {
      std::lock_guard lock(mu_);
      tail.assign(tail_.begin(), tail_.end());
    }
    const std::string how =
        status.ok() ? describe_wait_status(*status) : "could not start: " + status.error().message;
    const auto seconds = std::chrono::duration<double>(backoff).count();
    char delay[32];
    std::snprintf(delay, sizeof delay, "%.0f", seconds);
    logger_.warning("zero-cache exited (it " + how + "); restarting it in " + delay + " s",
                    {{"log", options_.log_path}, {"last_output", join(tail, "\n")}});
    set_state("restarting", 0);
    thread_.pause(backoff);
    backoff = std::min(backoff * 2, options_.backoff_max);
  }
  answer_restart(Error::make(sqlstate::kAdminShutdown, "pgrelay is stopping"));
  set_state("stopped", 0);
}

Result<int> ZeroSupervisor::run_once() {
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
    return Error::make(sqlstate::kInsufficientResources,
                       std::string("could not make a pipe: ") + std::strerror(errno));
  }
  std::uint64_t run = 0;
  {
    std::lock_guard lock(mu_);
    run = figures_.starts + 1;
  }
  const std::string marker =
      "PGRELAY_ZERO_RUN=" + std::to_string(::getpid()) + "." + std::to_string(run);
  ChildSpec spec;
  spec.argv = options_.argv;
  spec.environment = options_.environment;
  spec.environment->push_back(marker);
  spec.output_fd = pipe_fds[1];
  spec.new_session = true;  // Ctrl-C in pgrelay's terminal is pgrelay's to pass on
  // A pgrelay killed with -9 takes zero-cache with it; it stops its workers on SIGTERM.
  spec.parent_death_signal = SIGTERM;
  auto pid = spawn_child(spec);
  ::close(pipe_fds[1]);
  if (!pid.ok()) {
    ::close(pipe_fds[0]);
    return pid.error();
  }
  const int out = pipe_fds[0];
  ::fcntl(out, F_SETFL, ::fcntl(out, F_GETFL) | O_NONBLOCK);
  {
    std::lock_guard lock(mu_);
    ++figures_.starts;
    tail_.clear();
  }
  set_state("starting", *pid);
  write_all(log_fd_, "--- pgrelay: zero-cache started (pid " + std::to_string(*pid) + ")\n");
  logger_.info("zero-cache started", {{"pid", static_cast<std::int64_t>(*pid)},
                                      {"program", join(options_.argv, " ")},
                                      {"log", options_.log_path}});

  bool ready = false;
  bool open = true;
  auto next_probe = Clock::now() + kProbeInterval;
  int status = 0;
  for (;;) {
    if (thread_.stopping() || restart_requested_) {
      end_run(*pid, marker, false, status, open ? out : -1);
      break;
    }
    if (open) {
      pollfd p{out, POLLIN, 0};
      ::poll(&p, 1, 100);
      open = read_output(out);
    } else {
      thread_.pause(std::chrono::milliseconds(100));
    }
    if (pid_t done = ::waitpid(*pid, &status, WNOHANG); done == *pid) {
      if (open) read_output(out);
      // Its workers may outlive it, holding its ports: they go with it.
      end_run(*pid, marker, true, status, open ? out : -1);
      break;
    }
    if (!ready && Clock::now() >= next_probe) {
      next_probe = Clock::now() + kProbeInterval;
      if (answers_http()) {
        ready = true;
        set_state("ready", *pid);
        const std::string line = "zero-cache ready: " + figures().url;
        if (options_.print) options_.print(line);
        logger_.info("zero-cache ready", {{"url", figures().url}});
      }
    }
  }
  flush_partial_line();
  ::close(out);
  set_state("stopped", 0);
  return status;
}

void ZeroSupervisor::end_run(pid_t pid, const std::string& marker, bool leader_ended, int& status,
                             int output_fd) {
  auto signal_all = [&](int signal) {
    ::kill(-pid, signal);
    for (pid_t member : processes_marked(marker)) ::kill(member, signal);
  };
  signal_all(SIGTERM);
  const auto deadline = Clock::now() + options_.stop_grace;
  bool leader_reaped = leader_ended;
  while (Clock::now() < deadline) {
    if (!leader_reaped && ::waitpid(pid, &status, WNOHANG) == pid) leader_reaped = true;
    if (leader_reaped && processes_marked(marker).empty()) break;
    if (output_fd >= 0) {
      pollfd p{output_fd, POLLIN, 0};
      ::poll(&p, 1, 50);
      if (!read_output(output_fd)) output_fd = -1;
    } else {
      ::usleep(50 * 1000);
    }
  }
  signal_all(SIGKILL);
  if (!leader_reaped) {
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
}

bool ZeroSupervisor::read_output(int fd) {
  char buffer[8192];
  for (;;) {
    ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK;
    if (n == 0) return false;
    partial_.append(buffer, static_cast<std::size_t>(n));
    std::size_t start = 0;
    for (std::size_t nl; (nl = partial_.find('\n', start)) != std::string::npos; start = nl + 1) {
      take_line(partial_.substr(start, nl - start));
    }
    partial_.erase(0, start);
    if (partial_.size() >= kMaxLine) flush_partial_line();
  }
}

void ZeroSupervisor::flush_partial_line() {
  if (partial_.empty()) return;
  take_line(partial_);
  partial_.clear();
}

void ZeroSupervisor::take_line(const std::string& line) {
  write_all(log_fd_, line + "\n");
  if (options_.print) options_.print("zero-cache | " + line);
  std::lock_guard lock(mu_);
  tail_.push_back(line);
  while (tail_.size() > options_.tail_lines) tail_.pop_front();
}

bool ZeroSupervisor::answers_http() const {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<std::uint16_t>(options_.port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval timeout{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
  bool ok = false;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0) {
    const std::string request = "GET / HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
        static_cast<ssize_t>(request.size())) {
      char reply[64] = {};
      const ssize_t n = ::recv(fd, reply, sizeof reply - 1, 0);
      // "HTTP/1.1 200 OK": the status line is all that matters.
      ok = n >= 12 && std::string_view(reply, static_cast<std::size_t>(n)).substr(8, 4) == " 200";
    }
  }
  ::close(fd);
  return ok;
}

}  // namespace pgrelay::zero
