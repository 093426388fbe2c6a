// Native capture's upstream stream (capture/native/reading_loop.h) watched on an Asio executor.
#pragma once

#include <asio.hpp>

#include "capture/native/reading_loop.h"

namespace pgrelay::upstream {

// Watches on `executor`, which one thread runs (the walsenders' io_context). Each watch is an
// object of its own, owned by its pending handlers: it outlives this and whoever asked for it
// as long as the loop holds work for it, and is gone (its duplicate descriptor closed) after.
class AsioReadingLoop final : public capture::ReadingLoop {
 public:
  explicit AsioReadingLoop(asio::any_io_executor executor) : executor_(std::move(executor)) {}
  Status watch(int fd, std::chrono::milliseconds tick, std::function<Next()> turn) override;

 private:
  asio::any_io_executor executor_;
};

}  // namespace pgrelay::upstream
