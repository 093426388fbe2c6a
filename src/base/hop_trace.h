// Wall-clock stamps of each transaction's hops through pgrelay, kept for latency benchmarks.
//
// `pgrelay serve --hop-trace FILE` hands one HopTrace to capture, the log and the walsenders;
// each stamps the hop it owns with the end LSN it has reached, and the trace is written to FILE
// at shutdown. A stamp says "every transaction ending at or before `through` had passed this
// hop by `unix_us`", so a batch or an fdatasync is one stamp. Times are CLOCK_REALTIME, the
// clock PostgreSQL's timestamps and a consumer on the same machine read, so the benchmark can
// line them up with a commit's own time and the consumer's receipt.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "base/result.h"

namespace pgrelay {

enum class Hop : std::uint8_t {
  kUpstreamSend,    // native: the upstream walsender's send time of the commit's XLogData;
                    // trigger: the poll that read the transaction was sent
  kCaptureReceipt,  // native: the commit arrived; trigger: the poll's rows arrived
  kAppendVisible,   // the log shows the entry to readers
  kDurable,         // an fdatasync covered the entry
  kWalsenderRead,   // a walsender read the entry from the log (stamped with its pid)
  kSocketWrite,     // the bytes of its Commit were written to the consumer's socket (pid)
};

const char* hop_name(Hop hop);

// Microseconds since the Unix epoch, CLOCK_REALTIME.
std::int64_t unix_micros();

class HopTrace {
 public:
  struct Stamp {
    std::uint64_t through = 0;  // end LSN reached
    std::int64_t unix_us = 0;
    std::uint32_t session = 0;  // walsender pid for the walsender's hops, else 0
    Hop hop = Hop::kUpstreamSend;
  };

  // Keeps at most `capacity` stamps; later ones are counted as dropped.
  explicit HopTrace(std::size_t capacity = 8u << 20);
  HopTrace(const HopTrace&) = delete;
  HopTrace& operator=(const HopTrace&) = delete;

  // Thread-safe.
  void stamp(Hop hop, std::uint64_t through, std::int64_t unix_us, std::uint32_t session = 0);
  void stamp(Hop hop, std::uint64_t through) { stamp(hop, through, unix_micros()); }

  std::vector<Stamp> stamps() const;
  std::size_t size() const;
  std::uint64_t dropped() const;
  // One line per stamp: "hop through_lsn_hex unix_us session", and a last line
  // "# dropped N". Written to `path` + ".tmp", then renamed.
  Status write(const std::string& path) const;

 private:
  mutable std::mutex mu_;
  std::vector<Stamp> stamps_;
  std::size_t capacity_;
  std::uint64_t dropped_ = 0;
};

}  // namespace pgrelay
