// What the replication sessions of one captured database share: its log, capture and caches.
#include "server/replication_hub.h"

#include <atomic>

namespace pgrelay::server {

ReplicationHub::ReplicationHub(asio::any_io_executor executor, asio::thread_pool& blocking,
                               log::ChangeLog& log, log::SlotRegistry& slots,
                               WalsenderRegistry& walsenders, CaptureLink* capture,
                               upstream::UpstreamConfig upstream,
                               log::InProgressTransactions* in_progress)
    : executor_(std::move(executor)),
      blocking_(blocking),
      log_(log),
      slots_(slots),
      walsenders_(walsenders),
      capture_(capture),
      upstream_(std::move(upstream)),
      in_progress_(in_progress) {
  // The log calls this from the appending thread; hop to the executor before touching the
  // walsenders (at once when the appender is the executor's own thread: native capture reads
  // there). One wake-up in the executor's queue serves every append before it runs: the flag
  // is cleared before the walsenders are woken, and they read the log after that.
  std::weak_ptr<bool> alive = alive_;
  auto queued = std::make_shared<std::atomic<bool>>(false);
  auto wake = [this, alive, queued, executor = executor_] {
    if (queued->exchange(true)) return;
    asio::dispatch(executor, [this, alive, queued] {
      queued->store(false);
      if (alive.lock()) wake_all();
    });
  };
  log_.on_visible(wake);
  if (in_progress_ != nullptr) in_progress_->on_change(wake);
}

ReplicationHub::~ReplicationHub() {
  alive_.reset();
}

void ReplicationHub::wake_all() {
  ++wake_generation_;
  for (auto* signal : watchers_) signal->wake();
}

std::shared_ptr<asio::steady_timer> ReplicationHub::converting(std::uint64_t view_id,
                                                               Lsn end_lsn) const {
  auto it = converting_.find({view_id, end_lsn.value()});
  return it == converting_.end() ? nullptr : it->second;
}

void ReplicationHub::begin_converting(std::uint64_t view_id, Lsn end_lsn) {
  auto timer = std::make_shared<asio::steady_timer>(executor_);
  timer->expires_at(asio::steady_timer::time_point::max());
  converting_.emplace(std::make_pair(view_id, end_lsn.value()), std::move(timer));
}

void ReplicationHub::end_converting(std::uint64_t view_id, Lsn end_lsn) {
  auto it = converting_.find({view_id, end_lsn.value()});
  if (it == converting_.end()) return;
  it->second->cancel();
  converting_.erase(it);
}

}  // namespace pgrelay::server
