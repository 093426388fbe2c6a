// WakeSignal: a wake-up ends the wait (or the next one), deadlines end it, lazily armed.
#include "server/wake_signal.h"

#include <gtest/gtest.h>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <chrono>
#include <memory>
#include <optional>

namespace pgrelay::server {
namespace {

using namespace std::chrono_literals;
using Clock = WakeSignal::Clock;

// Runs `body` as a coroutine on `io` until it ends; false if it did not end within `limit`.
template <typename Body>
bool run_coroutine(asio::io_context& io, Body body, std::chrono::milliseconds limit = 10s) {
  bool done = false;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        co_await body();
        done = true;
        io.stop();  // a timer still armed would keep run_for() going
      },
      asio::detached);
  io.restart();
  io.run_for(limit);
  return done;
}

TEST(WakeSignal, AWakeUpBeforeTheWaitEndsItAtOnce) {
  asio::io_context io;
  WakeSignal signal(io.get_executor());
  signal.wake();
  signal.wake();  // two are one
  Clock::duration took{};
  ASSERT_TRUE(run_coroutine(io, [&]() -> asio::awaitable<void> {
    const auto start = Clock::now();
    co_await signal.wait_until(Clock::now() + 1h);
    took = Clock::now() - start;
  }));
  EXPECT_LT(took, 5s);
  // The slot is empty again: the next wait lasts until its deadline.
  ASSERT_TRUE(run_coroutine(io, [&]() -> asio::awaitable<void> {
    const auto start = Clock::now();
    co_await signal.wait_until(Clock::now() + 30ms);
    took = Clock::now() - start;
  }));
  EXPECT_GE(took, 30ms);
}

TEST(WakeSignal, AWakeUpDuringTheWaitEndsIt) {
  asio::io_context io;
  WakeSignal signal(io.get_executor());
  asio::steady_timer later(io);
  later.expires_after(20ms);
  bool woken = false;
  later.async_wait([&](const asio::error_code&) {
    woken = true;
    signal.wake();
  });
  bool woken_when_done = false;
  ASSERT_TRUE(run_coroutine(io, [&]() -> asio::awaitable<void> {
    co_await signal.wait_until(Clock::now() + 1h);
    woken_when_done = woken;
  }));
  EXPECT_TRUE(woken_when_done);
}

TEST(WakeSignal, APassedDeadlineReturnsAtOnce) {
  asio::io_context io;
  WakeSignal signal(io.get_executor());
  EXPECT_TRUE(run_coroutine(
      io, [&]() -> asio::awaitable<void> { co_await signal.wait_until(Clock::now() - 1s); }, 5s));
}

// The armed deadline is kept when a later one is asked for: that wait ends at the earlier
// deadline (its caller waits again), and the wait after it arms its own.
TEST(WakeSignal, ALaterDeadlineLeavesTheEarlierOneArmed) {
  asio::io_context io;
  WakeSignal signal(io.get_executor());
  std::optional<Clock::duration> second, third;
  ASSERT_TRUE(run_coroutine(io, [&]() -> asio::awaitable<void> {
    const auto start = Clock::now();
    signal.wake();
    co_await signal.wait_until(start + 50ms);  // arms 50 ms, ends at once (woken)
    co_await signal.wait_until(start + 1h);    // the 50 ms timer ends it
    second = Clock::now() - start;
    const auto again = Clock::now();
    co_await signal.wait_until(again + 40ms);  // the fired timer is re-armed
    third = Clock::now() - again;
  }));
  ASSERT_TRUE(second && third);
  EXPECT_GE(*second, 50ms);
  EXPECT_LT(*second, 5s);
  EXPECT_GE(*third, 40ms);
  EXPECT_LT(*third, 5s);
}

// A signal gone while its timer is armed: the timer's late handler touches nothing.
TEST(WakeSignal, ASignalGoneWithItsTimerArmedIsSafe) {
  asio::io_context io;
  auto signal = std::make_unique<WakeSignal>(io.get_executor());
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        signal->wake();
        co_await signal->wait_until(Clock::now() + 10ms);
      },
      asio::detached);
  io.run_one();  // the coroutine starts, arms the timer and takes the wake-up
  io.poll();
  signal.reset();
  // The cancelled timer's handler runs now, after the signal: ASan would see a use after free.
  EXPECT_GE(io.run_for(50ms), 1u);
}

}  // namespace
}  // namespace pgrelay::server
