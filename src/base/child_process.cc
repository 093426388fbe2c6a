// Starts a program as a child process, optionally as another OS user, and waits for it.
#include "base/child_process.h"

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace pgrelay {

Result<OsUser> OsUser::lookup(const std::string& name) {
  struct passwd entry;
  struct passwd* found = nullptr;
  std::vector<char> buffer(16384);
  if (::getpwnam_r(name.c_str(), &entry, buffer.data(), buffer.size(), &found) != 0 || !found) {
    return Error::make(
        sqlstate::kInvalidParameterValue, "OS user \"" + name + "\" does not exist",
        "Create it (adduser --system " + name + ") or choose another with --run-as.");
  }
  OsUser user{found->pw_name, found->pw_uid, found->pw_gid, {}};
  int count = 64;
  user.groups.resize(static_cast<std::size_t>(count));
  if (::getgrouplist(found->pw_name, found->pw_gid, user.groups.data(), &count) < 0) {
    user.groups.resize(static_cast<std::size_t>(count));
    ::getgrouplist(found->pw_name, found->pw_gid, user.groups.data(), &count);
  }
  user.groups.resize(static_cast<std::size_t>(std::max(count, 0)));
  return user;
}

OsUser OsUser::current() {
  OsUser user;
  user.uid = ::geteuid();
  user.gid = ::getegid();
  if (struct passwd* entry = ::getpwuid(user.uid)) user.name = entry->pw_name;
  return user;
}

Result<pid_t> spawn_child(const ChildSpec& spec) {
  if (spec.argv.empty()) {
    return Error::make(sqlstate::kInternalError, "spawn_child: no program given");
  }
  // Everything the child needs is prepared here: between fork and exec only async-signal-safe
  // calls are allowed (another thread may hold malloc's or stdio's locks at fork time).
  std::vector<char*> argv;
  for (const auto& arg : spec.argv) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  if (spec.environment) {
    for (const auto& entry : *spec.environment) envp.push_back(const_cast<char*>(entry.c_str()));
    envp.push_back(nullptr);
  }
  int output = spec.output_fd >= 0
                   ? ::fcntl(spec.output_fd, F_DUPFD_CLOEXEC, 0)
                   : ::open(spec.output_path.empty() ? "/dev/null" : spec.output_path.c_str(),
                            O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (output < 0) {
    return Error::make(sqlstate::kIoError,
                       "could not open \"" + spec.output_path + "\": " + std::strerror(errno));
  }
  if (spec.run_as && ::fchown(output, spec.run_as->uid, spec.run_as->gid) != 0 &&
      ::geteuid() == 0) {
    ::close(output);
    return Error::make(sqlstate::kIoError, "could not hand \"" + spec.output_path + "\" to user " +
                                               spec.run_as->name + ": " + std::strerror(errno));
  }
  int input = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) {
    int saved = errno;
    ::close(output);
    if (input >= 0) ::close(input);
    return Error::make(sqlstate::kInsufficientResources,
                       std::string("could not fork: ") + std::strerror(saved));
  }
  if (pid == 0) {
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    if (spec.new_session) ::setsid();
    if (spec.run_as) {
      const OsUser& user = *spec.run_as;
      if (::setgroups(user.groups.size(), user.groups.data()) != 0 || ::setgid(user.gid) != 0 ||
          ::setuid(user.uid) != 0) {
        ::_exit(126);
      }
    }
    // After the user switch: changing credentials clears the parent-death signal.
    if (spec.parent_death_signal != 0) {
      ::prctl(PR_SET_PDEATHSIG, spec.parent_death_signal);
      if (::getppid() != parent) ::_exit(125);  // the parent is already gone
    }
    if (input >= 0) ::dup2(input, STDIN_FILENO);
    ::dup2(output, STDOUT_FILENO);
    ::dup2(output, STDERR_FILENO);
    if (spec.environment) {
      ::execve(argv[0], argv.data(), envp.data());
    } else {
      ::execv(argv[0], argv.data());
    }
    ::_exit(127);
  }
  ::close(output);
  if (input >= 0) ::close(input);
  return pid;
}

int wait_child(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  return status;
}

Result<std::string> read_child_output(ChildSpec spec, std::size_t limit) {
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
    return Error::make(sqlstate::kInsufficientResources,
                       std::string("could not make a pipe: ") + std::strerror(errno));
  }
  spec.output_fd = pipe_fds[1];
  auto pid = spawn_child(spec);
  ::close(pipe_fds[1]);
  if (!pid.ok()) {
    ::close(pipe_fds[0]);
    return pid.error();
  }
  std::string out;
  char buffer[4096];
  for (;;) {
    ssize_t n = ::read(pipe_fds[0], buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buffer, std::min(static_cast<std::size_t>(n), limit - std::min(limit, out.size())));
  }
  ::close(pipe_fds[0]);
  int status = wait_child(*pid);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return out;
  // What it said last is why.
  constexpr std::size_t kDetailBytes = 2000;
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  std::string said = out.size() > kDetailBytes ? out.substr(out.size() - kDetailBytes) : out;
  return Error::make(sqlstate::kSystemError, spec.argv[0] + " " + describe_wait_status(status),
                     {}, said);
}

std::string describe_wait_status(int status) {
  if (status == -1) return "could not be waited for";
  if (WIFEXITED(status)) {
    int code = WEXITSTATUS(status);
    if (code == 127) return "could not be executed (exit status 127)";
    if (code == 126) return "could not switch to its OS user (exit status 126)";
    return "exited with status " + std::to_string(code);
  }
  if (WIFSIGNALED(status)) {
    return "was terminated by signal " + std::to_string(WTERMSIG(status)) + ": " +
           ::strsignal(WTERMSIG(status));
  }
  return "ended with wait status " + std::to_string(status);
}

Status run_child(const ChildSpec& spec) {
  auto pid = spawn_child(spec);
  if (!pid.ok()) return pid.error();
  int status = wait_child(*pid);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return Status::ok_status();
  std::string detail = spec.output_path.empty() ? "" : "See " + spec.output_path + ".";
  return Error::make(sqlstate::kSystemError, spec.argv[0] + " " + describe_wait_status(status), "",
                     detail);
}

}  // namespace pgrelay
