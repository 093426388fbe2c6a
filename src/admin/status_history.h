// The admin page's charts: the last ten minutes of capture and slot positions, sampled once a
// second, and each slot's lag in time derived from them.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

namespace pgrelay::admin {

struct StatusSample {
  std::chrono::system_clock::time_point time;
  std::uint64_t captured_transactions = 0;        // all databases, since pgrelay started
  std::map<std::string, std::uint64_t> heads;     // database -> log head LSN
  std::map<std::string, std::uint64_t> slot_lag;  // slot -> bytes behind its database's head
};

// Thread-safe.
class StatusHistory {
 public:
  explicit StatusHistory(std::chrono::seconds span = std::chrono::seconds(600)) : span_(span) {}

  void add(StatusSample sample);
  // {"span_seconds", "samples": [{"time" (ms since 1970), "capture_rate" (transactions/s since
  // the sample before), "slot_lag_bytes": {slot: bytes}}]}
  nlohmann::json to_json() const;
  // Seconds since `database`'s log head first passed `confirmed` within the span (a slot at
  // `confirmed` has had that long to catch up); 0 when the head is not past it; the span when
  // it was past it in every sample.
  double lag_seconds(const std::string& database, std::uint64_t confirmed,
                     std::chrono::system_clock::time_point now) const;

 private:
  const std::chrono::seconds span_;
  mutable std::mutex mu_;
  std::deque<StatusSample> samples_;
};

}  // namespace pgrelay::admin
