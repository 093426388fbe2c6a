// Runs blocking work (libpq calls, fsyncs) on a thread pool and resumes the coroutine after it.
#pragma once

#include <asio.hpp>

#include <optional>
#include <type_traits>
#include <utility>

namespace pgrelay::server {

// co_await run_blocking(pool, [&] { return work(); }): the calling coroutine is suspended, not
// its thread, so other sessions keep running while `work` blocks a pool thread.
template <typename F>
asio::awaitable<std::invoke_result_t<F>> run_blocking(asio::thread_pool& pool, F work) {
  using R = std::invoke_result_t<F>;
  // co_spawn needs a default-constructible result; optional provides one.
  auto result = co_await asio::co_spawn(
      pool,
      [work = std::move(work)]() mutable -> asio::awaitable<std::optional<R>> {
        co_return std::optional<R>(work());
      },
      asio::use_awaitable);
  co_return std::move(*result);
}

}  // namespace pgrelay::server
