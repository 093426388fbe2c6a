// Measures what the kernel alone charges a relay per message on this machine: the floor under
// pgrelay's CPU per transaction.
//
// A writer process sends 200-byte messages over loopback TCP at a steady rate (as pgbench's
// single-row transactions reach a capture, one at a time). The relay, this process, does nothing
// but what any relay must: it waits in epoll for the upstream socket, reads what came, appends
// it to a file and sends it to a reader process. Its CPU time (user and system, getrusage) per
// message is the least a relay that wakes for each message costs here, before any parsing,
// logging or bookkeeping of its own. With --holds it also waits that long after each wake-up
// before reading, so that messages gather: fewer wake-ups per message, each message later.
//
// bench/replication.sh prints pgrelay's own CPU per transaction in its live run (the
// "pgrelay CPU us per transaction" row); this program says how much of it any relay would pay.
//
// Usage: bench_relay_floor [--rate N] [--seconds S] [--holds US,US,...] [--no-file]
//   defaults: --rate 4500 (about pgbench's unthrottled rate on 2 cores) --seconds 5 --holds
//   0,200,500
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "base/unique_fd.h"

namespace {

using pgrelay::UniqueFd;

constexpr std::size_t kMessageBytes = 200;

// Exits 1 with `what`.
[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "bench_relay_floor: %s\n", what.c_str());
  std::exit(1);
}

// Exits 1 with `what` and the reason of the system call that just failed (errno).
[[noreturn]] void die_errno(const std::string& what) {
  die(what + ": " + std::strerror(errno));
}

sockaddr_in loopback(std::uint16_t port) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return address;
}

// A listening socket on a free loopback port; sets `port`.
UniqueFd listen_any(std::uint16_t& port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM, 0));
  sockaddr_in address = loopback(0);
  if (!fd || ::bind(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::listen(fd.get(), 1) != 0) {
    die_errno("listen");
  }
  socklen_t length = sizeof address;
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    die_errno("getsockname");
  }
  port = ntohs(address.sin_port);
  return fd;
}

void no_delay(int fd) {
  int one = 1;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0) die_errno("TCP_NODELAY");
}

UniqueFd dial(std::uint16_t port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM, 0));
  sockaddr_in address = loopback(port);
  if (!fd || ::connect(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    die_errno("connect");
  }
  no_delay(fd.get());
  return fd;
}

// The writer: `count` messages at `rate` per second, paced on absolute times, then EOF.
[[noreturn]] void run_writer(std::uint16_t port, long rate, long count) {
  UniqueFd fd = dial(port);
  char message[kMessageBytes];
  std::memset(message, 'x', sizeof message);
  timespec next{};
  clock_gettime(CLOCK_MONOTONIC, &next);
  const long step_ns = 1'000'000'000L / rate;
  for (long i = 0; i < count; ++i) {
    next.tv_nsec += step_ns;
    if (next.tv_nsec >= 1'000'000'000L) {
      next.tv_nsec -= 1'000'000'000L;
      ++next.tv_sec;
    }
    clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, nullptr);
    if (::send(fd.get(), message, sizeof message, 0) != static_cast<ssize_t>(sizeof message)) {
      die_errno("writer send");
    }
  }
  std::_Exit(0);
}

// The reader: reads to EOF; exits 0 only if exactly `count` messages' bytes arrived.
[[noreturn]] void run_reader(std::uint16_t port, long count) {
  UniqueFd fd = dial(port);
  std::vector<char> buffer(1 << 16);
  long bytes = 0;
  for (;;) {
    const ssize_t n = ::recv(fd.get(), buffer.data(), buffer.size(), 0);
    if (n < 0) die_errno("reader recv");
    if (n == 0) break;
    bytes += n;
  }
  std::_Exit(bytes == count * static_cast<long>(kMessageBytes) ? 0 : 2);
}

double cpu_seconds(const rusage& r) {
  return static_cast<double>(r.ru_utime.tv_sec + r.ru_stime.tv_sec) +
         static_cast<double>(r.ru_utime.tv_usec + r.ru_stime.tv_usec) * 1e-6;
}

struct Figures {
  long messages = 0;
  long wakeups = 0;
  double cpu_seconds = 0;
};

// One run: the relay between a paced writer and a reader, holding `hold_us` after each wake-up.
Figures relay_once(long rate, long seconds, long hold_us, bool to_file) {
  const long count = rate * seconds;
  std::uint16_t upstream_port = 0, downstream_port = 0;
  UniqueFd upstream_listener = listen_any(upstream_port);
  UniqueFd downstream_listener = listen_any(downstream_port);
  const pid_t writer = ::fork();
  if (writer == 0) run_writer(upstream_port, rate, count);
  const pid_t reader = ::fork();
  if (reader == 0) run_reader(downstream_port, count);
  UniqueFd upstream(::accept(upstream_listener.get(), nullptr, nullptr));
  UniqueFd downstream(::accept(downstream_listener.get(), nullptr, nullptr));
  if (!upstream || !downstream) die_errno("accept");
  no_delay(downstream.get());
  if (::fcntl(upstream.get(), F_SETFL, O_NONBLOCK) != 0) die_errno("O_NONBLOCK");
  char log_path[] = "/tmp/bench_relay_floor.XXXXXX";
  UniqueFd log(::mkstemp(log_path));
  if (!log) die_errno("mkstemp");
  ::unlink(log_path);
  UniqueFd epoll(::epoll_create1(0));
  epoll_event interest{};
  interest.events = EPOLLIN | EPOLLET;
  if (!epoll || ::epoll_ctl(epoll.get(), EPOLL_CTL_ADD, upstream.get(), &interest) != 0) {
    die_errno("epoll");
  }

  Figures figures;
  std::vector<char> buffer(1 << 16);
  rusage before{}, after{};
  ::getrusage(RUSAGE_SELF, &before);
  for (bool open = true; open;) {
    epoll_event ready{};
    if (::epoll_wait(epoll.get(), &ready, 1, -1) < 1) continue;
    ++figures.wakeups;
    if (hold_us > 0) ::usleep(static_cast<useconds_t>(hold_us));
    for (;;) {  // edge-triggered: read until the socket is empty
      const ssize_t n = ::recv(upstream.get(), buffer.data(), buffer.size(), 0);
      if (n == 0) open = false;
      if (n <= 0) break;
      figures.messages += n / static_cast<ssize_t>(kMessageBytes);
      if (to_file && ::write(log.get(), buffer.data(), static_cast<std::size_t>(n)) != n) {
        die_errno("write");
      }
      if (::send(downstream.get(), buffer.data(), static_cast<std::size_t>(n), 0) != n) {
        die_errno("relay send");
      }
    }
  }
  ::getrusage(RUSAGE_SELF, &after);
  figures.cpu_seconds = cpu_seconds(after) - cpu_seconds(before);
  downstream.reset();  // the reader's EOF
  int status = 0;
  if (::waitpid(writer, &status, 0) != writer || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    die("the writer failed");
  }
  if (::waitpid(reader, &status, 0) != reader || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    die("the reader did not receive every message");
  }
  return figures;
}

std::vector<long> parse_list(const char* text) {
  std::vector<long> values;
  for (const char* p = text; *p != '\0';) {
    char* end = nullptr;
    values.push_back(std::strtol(p, &end, 10));
    if (end == p || values.back() < 0) {
      die(std::string("--holds wants microseconds separated by commas, not '") + text + "'");
    }
    p = *end == ',' ? end + 1 : end;
    if (*end != ',' && *end != '\0') {
      die(std::string("--holds: unexpected '") + end + "'");
    }
  }
  return values;
}

long positive(const char* flag, const char* text) {
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || value <= 0) {
    die(std::string(flag) + " wants a positive integer, not '" + text + "'");
  }
  return value;
}

}  // namespace

int main(int argc, char** argv) {
  long rate = 4500, seconds = 5;
  std::vector<long> holds = {0, 200, 500};
  bool to_file = true;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--rate" && has_value) {
      rate = positive("--rate", argv[++i]);
    } else if (arg == "--seconds" && has_value) {
      seconds = positive("--seconds", argv[++i]);
    } else if (arg == "--holds" && has_value) {
      holds = parse_list(argv[++i]);
    } else if (arg == "--no-file") {
      to_file = false;
    } else {
      std::fprintf(stderr,
                   "usage: bench_relay_floor [--rate N] [--seconds S] [--holds US,US,...] "
                   "[--no-file]\n");
      return 2;
    }
  }
  std::printf("relay floor: %ld messages/s of %zu bytes for %ld s; recv, %ssend per wake-up\n",
              rate, kMessageBytes, seconds, to_file ? "append to a file, " : "");
  std::printf("%10s %10s %12s %14s\n", "hold us", "messages", "wakeups/msg", "CPU us/msg");
  for (long hold : holds) {
    const Figures f = relay_once(rate, seconds, hold, to_file);
    std::printf("%10ld %10ld %12.2f %14.1f\n", hold, f.messages,
                static_cast<double>(f.wakeups) / static_cast<double>(f.messages),
                f.cpu_seconds * 1e6 / static_cast<double>(f.messages));
  }
  return 0;
}
