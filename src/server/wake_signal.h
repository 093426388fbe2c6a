// A coroutine's sleep until it is woken or a deadline passes, costing no system call per wake.
//
// A walsender sleeps after every batch it sends and is woken by the log (through its hub), by
// its consumer's reader and by pg_terminate_backend. Sleeping on a steady_timer re-queued the
// timer each time, and the reactor re-armed its timerfd for it: one timerfd_settime per
// transaction delivered. Here a wake-up goes through a one-slot channel (a handler posted on
// the executor, no system call) and the deadline's timer is armed lazily: it is moved only when
// a wait asks for an earlier deadline than the one armed, or after it fired. A later deadline
// leaves it armed; it then fires early, ends that wait, and the caller, seeing its deadline
// not reached, simply waits again.
#pragma once

#include <asio.hpp>
#include <asio/experimental/channel.hpp>

#include <chrono>
#include <memory>

namespace pgrelay::server {

class WakeSignal {
 public:
  using Clock = std::chrono::steady_clock;

  explicit WakeSignal(asio::any_io_executor executor);
  WakeSignal(const WakeSignal&) = delete;
  WakeSignal& operator=(const WakeSignal&) = delete;

  // Ends the current wait, or the next one if nobody waits now. Executor thread only.
  void wake();
  // Waits until wake() is called (or was, since the last wait) or `deadline` passes; may also
  // end early at a deadline an earlier wait asked for. Executor thread only, one waiter.
  asio::awaitable<void> wait_until(Clock::time_point deadline);

 private:
  void arm(Clock::time_point deadline);

  // (The payload is unused; asio 1.22 cannot instantiate a channel of void(error_code).)
  asio::experimental::channel<void(asio::error_code, bool)> bell_;
  asio::steady_timer timer_;
  Clock::time_point armed_ = Clock::time_point::max();  // max: not armed
  // Lets the timer's handler, which may run after this is gone, tell.
  std::shared_ptr<WakeSignal*> self_ = std::make_shared<WakeSignal*>(this);
};

}  // namespace pgrelay::server
