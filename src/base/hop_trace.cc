// Wall-clock stamps of each transaction's hops through pgrelay, kept for latency benchmarks.
#include "base/hop_trace.h"

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <ctime>

namespace pgrelay {

const char* hop_name(Hop hop) {
  switch (hop) {
    case Hop::kUpstreamSend:
      return "upstream_send";
    case Hop::kCaptureReceipt:
      return "capture_receipt";
    case Hop::kAppendVisible:
      return "append_visible";
    case Hop::kDurable:
      return "durable";
    case Hop::kWalsenderRead:
      return "walsender_read";
    case Hop::kSocketWrite:
      return "socket_write";
  }
  return "unknown";
}

std::int64_t unix_micros() {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  return static_cast<std::int64_t>(now.tv_sec) * 1000000 + now.tv_nsec / 1000;
}

HopTrace::HopTrace(std::size_t capacity) : capacity_(capacity) {
  stamps_.reserve(std::min<std::size_t>(capacity, 1u << 16));
}

void HopTrace::stamp(Hop hop, std::uint64_t through, std::int64_t unix_us, std::uint32_t session) {
  std::lock_guard lock(mu_);
  if (stamps_.size() >= capacity_) {
    ++dropped_;
    return;
  }
  stamps_.push_back(Stamp{through, unix_us, session, hop});
}

std::vector<HopTrace::Stamp> HopTrace::stamps() const {
  std::lock_guard lock(mu_);
  return stamps_;
}

std::size_t HopTrace::size() const {
  std::lock_guard lock(mu_);
  return stamps_.size();
}

std::uint64_t HopTrace::dropped() const {
  std::lock_guard lock(mu_);
  return dropped_;
}

Status HopTrace::write(const std::string& path) const {
  const auto failed = [&path](const char* what) {
    return Error::make(sqlstate::kIoError,
                       std::string("could not ") + what + " the hop trace \"" + path +
                           "\": " + std::strerror(errno),
                       "Give --hop-trace a path in a writable directory.");
  };
  const std::string tmp = path + ".tmp";
  std::FILE* out = std::fopen(tmp.c_str(), "w");
  if (out == nullptr) return failed("create");
  std::lock_guard lock(mu_);
  for (const Stamp& s : stamps_) {
    std::fprintf(out, "%s %X/%X %" PRId64 " %" PRIu32 "\n", hop_name(s.hop),
                 static_cast<unsigned>(s.through >> 32), static_cast<unsigned>(s.through),
                 s.unix_us, s.session);
  }
  std::fprintf(out, "# dropped %" PRIu64 "\n", dropped_);
  const bool written = std::ferror(out) == 0;
  if (std::fclose(out) != 0 || !written) return failed("write");
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return failed("rename");
  return {};
}

}  // namespace pgrelay
