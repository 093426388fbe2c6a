// The event loop native capture may read its upstream stream on, instead of its own thread.
//
// With the capture thread reading, a transaction cost pgrelay two thread wake-ups: the capture
// thread's (the upstream's bytes arrive) and the walsenders' event loop's (the log grew). On a
// small virtual machine a wake-up costs more than everything else pgrelay does for a small
// transaction. Read on the walsenders' own loop, the bytes are taken in, appended and sent to
// consumers in one wake-up. The loop's owner implements this (over Asio); capture/ stays free of
// any event-loop library.
#pragma once

#include <chrono>
#include <functional>

#include "base/result.h"

namespace pgrelay::capture {

class ReadingLoop {
 public:
  // What a turn asks for next.
  enum class Next {
    kWait,   // a turn when the descriptor is readable (at once if it still is), or at the tick
    kAgain,  // another turn soon, after the loop's other work: more may be waiting
    kStop,   // no more turns
  };
  virtual ~ReadingLoop() = default;
  // Any thread; an error only when it cannot watch `fd` at all. On the loop's thread: calls
  // `turn` once soon, then as it asks, and at least
  // every `tick`, until it returns kStop. The loop watches a duplicate of `fd`, which it closes
  // itself: the caller may close `fd` once `turn` will touch nothing more. Each watch is
  // independent; `turn` may still be called after the caller stopped caring (it must then
  // return kStop without touching anything gone).
  virtual Status watch(int fd, std::chrono::milliseconds tick, std::function<Next()> turn) = 0;
};

}  // namespace pgrelay::capture
