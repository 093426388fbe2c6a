// The walsenders running for every database: their pids, pg_stat_replication rows and controls.
#include "server/walsender_registry.h"

namespace pgrelay::server {

void WalsenderRegistry::add(const WalsenderInfo& info, std::function<void()> terminate,
                            std::function<void()> stop) {
  std::function<void()> stop_now;
  {
    std::lock_guard lock(mu_);
    if (stopping_) stop_now = stop;
    running_[info.pid] = Running{info, std::move(terminate), std::move(stop)};
  }
  changed();
  if (stop_now) stop_now();
}

void WalsenderRegistry::update(const WalsenderInfo& info) {
  std::lock_guard lock(mu_);
  auto it = running_.find(info.pid);
  if (it != running_.end()) it->second.info = info;
}

void WalsenderRegistry::remove(int pid) {
  bool removed = false;
  {
    std::lock_guard lock(mu_);
    removed = running_.erase(pid) > 0;
  }
  if (removed) changed();
}

std::vector<WalsenderInfo> WalsenderRegistry::list() const {
  std::lock_guard lock(mu_);
  std::vector<WalsenderInfo> out;
  for (const auto& [pid, running] : running_) out.push_back(running.info);
  return out;
}

bool WalsenderRegistry::terminate(int pid) {
  std::function<void()> terminate;
  {
    std::lock_guard lock(mu_);
    auto it = running_.find(pid);
    if (it == running_.end()) return false;
    terminate = it->second.terminate;
  }
  if (terminate) terminate();
  return true;
}

void WalsenderRegistry::stop_all() {
  std::vector<std::function<void()>> stops;
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    for (auto& [pid, running] : running_) stops.push_back(running.stop);
  }
  for (auto& stop : stops) {
    if (stop) stop();
  }
}

}  // namespace pgrelay::server
