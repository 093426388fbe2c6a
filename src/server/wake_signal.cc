// A coroutine's sleep until it is woken or a deadline passes, costing no system call per wake.
#include "server/wake_signal.h"

#include "upstream/transport.h"

namespace pgrelay::server {

WakeSignal::WakeSignal(asio::any_io_executor executor)
    : bell_(executor, 1), timer_(executor) {}

void WakeSignal::wake() {
  // A full slot already holds a wake-up nobody took: one is as good as two.
  (void)bell_.try_send(asio::error_code{}, true);
}

void WakeSignal::arm(Clock::time_point deadline) {
  if (deadline >= armed_) return;  // the armed timer fires first; the caller waits again then
  armed_ = deadline;
  timer_.expires_at(deadline);  // a wait already pending ends as aborted, which is ignored
  timer_.async_wait([self = std::weak_ptr<WakeSignal*>(self_)](const asio::error_code& error) {
    if (error) return;
    auto signal = self.lock();
    if (!signal) return;
    (*signal)->armed_ = Clock::time_point::max();
    (*signal)->wake();
  });
}

asio::awaitable<void> WakeSignal::wait_until(Clock::time_point deadline) {
  if (deadline <= Clock::now()) co_return;
  arm(deadline);
  (void)co_await bell_.async_receive(upstream::kAsTuple);
}

}  // namespace pgrelay::server
