// Starts a program as a child process, optionally as another OS user, and waits for it.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "base/result.h"

namespace pgrelay {

// An OS account a child runs as (resolved before fork: nothing after fork may read /etc).
struct OsUser {
  std::string name;
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;
  static Result<OsUser> lookup(const std::string& name);
  static OsUser current();
};

struct ChildSpec {
  std::vector<std::string> argv;  // argv[0] is the program's path
  std::optional<OsUser> run_as;   // switch to this user (needs root); nullopt: stay as we are
  std::string output_path;        // stdout and stderr are appended here; empty: /dev/null
  int output_fd = -1;             // or, when not -1, written here (the caller keeps it open)
  // The child's environment as NAME=VALUE strings; nullopt: pgrelay's own.
  std::optional<std::vector<std::string>> environment;
  bool new_session = true;  // its own session: a terminal's Ctrl-C goes to pgrelay only
  // Signal the child gets if the thread that spawned it ends (Linux PR_SET_PDEATHSIG), so a
  // pgrelay killed with -9 does not leave it running; 0 for none.
  int parent_death_signal = 0;
};

// Starts the child; returns its pid. The signal mask is cleared in the child (pgrelay's
// threads block signals that the child needs).
Result<pid_t> spawn_child(const ChildSpec& spec);

// Waits for the child to end; returns its wait status.
int wait_child(pid_t pid);

// Runs the child to completion; 58000 naming the program and its exit status on failure.
Status run_child(const ChildSpec& spec);

// Runs the child to completion and returns what it wrote (stdout and stderr, at most
// `limit` bytes); 58000 naming the program when it does not exit with status 0, with the end
// of what it wrote as the detail.
Result<std::string> read_child_output(ChildSpec spec, std::size_t limit = 65536);

// Describes a wait status: "exited with status 1", "was terminated by signal 9: Killed".
std::string describe_wait_status(int status);

}  // namespace pgrelay
