// The admin page's charts: the last ten minutes of capture and slot positions, sampled once a
// second, and each slot's lag in time derived from them.
#include "admin/status_history.h"

namespace pgrelay::admin {

void StatusHistory::add(StatusSample sample) {
  std::lock_guard lock(mu_);
  samples_.push_back(std::move(sample));
  while (!samples_.empty() && samples_.back().time - samples_.front().time > span_) {
    samples_.pop_front();
  }
}

nlohmann::json StatusHistory::to_json() const {
  std::lock_guard lock(mu_);
  nlohmann::json samples = nlohmann::json::array();
  const StatusSample* before = nullptr;
  for (const auto& sample : samples_) {
    double rate = 0;
    if (before != nullptr) {
      const double seconds = std::chrono::duration<double>(sample.time - before->time).count();
      if (seconds > 0 && sample.captured_transactions >= before->captured_transactions) {
        rate = static_cast<double>(sample.captured_transactions - before->captured_transactions) /
               seconds;
      }
    }
    samples.push_back({{"time", std::chrono::duration_cast<std::chrono::milliseconds>(
                                    sample.time.time_since_epoch())
                                    .count()},
                       {"capture_rate", rate},
                       {"slot_lag_bytes", sample.slot_lag}});
    before = &sample;
  }
  return {{"span_seconds", span_.count()}, {"samples", std::move(samples)}};
}

double StatusHistory::lag_seconds(const std::string& database, std::uint64_t confirmed,
                                  std::chrono::system_clock::time_point now) const {
  std::lock_guard lock(mu_);
  if (samples_.empty()) return 0;
  auto head_of = [&](const StatusSample& sample) -> std::uint64_t {
    auto it = sample.heads.find(database);
    return it == sample.heads.end() ? 0 : it->second;
  };
  if (head_of(samples_.back()) <= confirmed) return 0;
  // The oldest sample of the run of samples, ending with the newest, whose head is past it.
  auto first_past = samples_.end();
  for (auto it = samples_.end(); it != samples_.begin();) {
    --it;
    if (head_of(*it) <= confirmed) break;
    first_past = it;
  }
  return std::chrono::duration<double>(now - first_past->time).count();
}

}  // namespace pgrelay::admin
