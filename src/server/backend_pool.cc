// Upstream backends whose clients left, reset and kept for the next session that asks the same.
#include "server/backend_pool.h"

#include <algorithm>
#include <asio/experimental/awaitable_operators.hpp>

#include "upstream/message_stream.h"
#include "wire/backend_messages.h"
#include "wire/frontend_messages.h"

namespace pgrelay::server {
namespace {

using namespace asio::experimental::awaitable_operators;

constexpr MetricInfo kKeptBackends{
    "pgrelay_kept_backends",
    "Upstream backends kept after their client left, for the next session (--pool-idle-timeout)."};
constexpr MetricInfo kReusedBackends{
    "pgrelay_reused_backends_total",
    "Pass-through sessions given a kept upstream backend instead of a new one."};

// DISCARD ALL, then its reply: true once it completed and the backend is idle outside a
// transaction. ParameterStatus messages on the way (RESET ALL reports what it set back) update
// `link.parameters`; notices and notifications are passed over. Anything else, an error
// included, means the backend is not known to be clean.
upstream::awaitable<bool> discard_all(upstream::UpstreamLink& link) {
  // Encoded outside the co_await: GCC 12 destroys a temporary aggregate in a co_await
  // expression twice.
  const Bytes discard = wire::encode(wire::Query{"DISCARD ALL"});
  if (!(co_await link.stream.write(discard)).ok()) co_return false;
  bool discarded = false;
  for (;;) {
    auto frame = co_await link.stream.read_frame();
    if (!frame.ok()) co_return false;
    switch (frame->tag) {
      case wire::ParameterStatus::kTag: {
        auto status = wire::parse_parameter_status(frame->body);
        if (!status.ok()) co_return false;
        wire::record_parameter(link.parameters, std::move(*status));
        break;
      }
      case wire::NoticeResponse::kTag:
      case wire::NotificationResponse::kTag:
        break;
      case wire::CommandComplete::kTag: {
        auto complete = wire::parse_command_complete(frame->body);
        discarded = complete.ok() && complete->command_tag == "DISCARD ALL";
        if (!discarded) co_return false;
        break;
      }
      case wire::ReadyForQuery::kTag: {
        auto ready = wire::parse_ready_for_query(frame->body);
        co_return (discarded && ready.ok() && ready->status == wire::TransactionStatus::kIdle);
      }
      default:
        co_return false;
    }
  }
}

upstream::awaitable<bool> discard_all_within(upstream::UpstreamLink& link,
                                             std::chrono::milliseconds timeout) {
  asio::steady_timer timer(co_await asio::this_coro::executor, timeout);
  auto outcome = co_await (discard_all(link) || timer.async_wait(upstream::kAsTuple));
  co_return outcome.index() == 0 && std::get<0>(outcome);
}

}  // namespace

BackendPool::BackendPool(asio::any_io_executor executor, Settings settings, Metrics* metrics)
    : settings_(settings), sweep_(std::move(executor)) {
  if (metrics) {
    kept_gauge_ = &metrics->gauge(kKeptBackends);
    reused_counter_ = &metrics->counter(kReusedBackends);
  }
}

BackendPool::~BackendPool() {
  stop();
}

void BackendPool::start() {
  schedule_sweep();
}

void BackendPool::stop() {
  stopped_ = true;
  sweep_.cancel();
  for (auto& [key, backends] : kept_) {
    for (Kept& kept : backends) close(kept.link);
  }
  kept_.clear();
  count_size();
}

BackendPool::Key BackendPool::key_of(std::string database, StartupParameters parameters) {
  std::sort(parameters.begin(), parameters.end());
  return Key{std::move(database), std::move(parameters)};
}

std::optional<upstream::UpstreamLink> BackendPool::take(const std::string& database,
                                                        const StartupParameters& parameters) {
  auto it = kept_.find(key_of(database, parameters));
  if (it == kept_.end()) return std::nullopt;
  std::optional<upstream::UpstreamLink> found;
  auto& backends = it->second;
  while (!backends.empty() && !found) {
    Kept kept = std::move(backends.back());
    backends.pop_back();
    if (kept.link.stream.transport().untouched()) {
      found = std::move(kept.link);
    } else {
      close(kept.link);
    }
  }
  if (backends.empty()) kept_.erase(it);
  count_size();
  if (found) {
    ++reused_;
    if (reused_counter_) reused_counter_->inc();
  }
  return found;
}

upstream::awaitable<void> BackendPool::give_back(std::string database, StartupParameters parameters,
                                                 upstream::UpstreamLink link) {
  auto has_room = [this] { return !stopped_ && size_ < settings_.capacity; };
  // Asked again after the reset: the pool may have stopped or filled meanwhile.
  if (!has_room() || !co_await discard_all_within(link, settings_.reset_timeout) || !has_room()) {
    close(link);
    co_return;
  }
  kept_[key_of(std::move(database), std::move(parameters))].push_back(
      Kept{std::move(link), std::chrono::steady_clock::now()});
  count_size();
}

void BackendPool::close_database(const std::string& database) {
  for (auto it = kept_.begin(); it != kept_.end();) {
    if (it->first.database != database) {
      ++it;
      continue;
    }
    for (Kept& kept : it->second) close(kept.link);
    it = kept_.erase(it);
  }
  count_size();
}

void BackendPool::close(upstream::UpstreamLink& link) {
  // With a Terminate, as a client that leaves sends one.
  link.stream.transport().send_and_close(upstream::encode_frame('X', {}));
}

void BackendPool::close_idle() {
  const auto oldest_allowed = std::chrono::steady_clock::now() - settings_.idle_timeout;
  for (auto it = kept_.begin(); it != kept_.end();) {
    auto& backends = it->second;
    // Oldest first: the idle ones are a prefix.
    auto fresh = std::find_if(backends.begin(), backends.end(),
                              [&](const Kept& kept) { return kept.since > oldest_allowed; });
    for (auto idle = backends.begin(); idle != fresh; ++idle) close(idle->link);
    backends.erase(backends.begin(), fresh);
    it = backends.empty() ? kept_.erase(it) : std::next(it);
  }
  count_size();
}

void BackendPool::schedule_sweep() {
  if (stopped_) return;
  // A backend outlives its timeout by at most a quarter of it.
  sweep_.expires_after(std::max(settings_.idle_timeout / 4, std::chrono::milliseconds(10)));
  sweep_.async_wait([this](const std::error_code& ec) {
    if (ec) return;
    close_idle();
    schedule_sweep();
  });
}

void BackendPool::count_size() {
  size_ = 0;
  for (const auto& [key, backends] : kept_) size_ += backends.size();
  if (kept_gauge_) kept_gauge_->set(static_cast<double>(size_));
}

}  // namespace pgrelay::server
