// Tells sessions the server is shutting down, so each can end where it is clean for its client.
#pragma once

#include <cstdint>
#include <functional>
#include <map>

namespace pgrelay::server {

// Used on the server's io thread only. A session subscribes for its lifetime; trigger() calls
// every subscriber once, and a session subscribing later is called at once.
class ShutdownSignal {
 public:
  using Listener = std::function<void()>;

  // Returns the token to unsubscribe with.
  std::uint64_t subscribe(Listener listener) {
    if (triggered_) {
      listener();
      return 0;
    }
    listeners_.emplace(++next_token_, std::move(listener));
    return next_token_;
  }
  void unsubscribe(std::uint64_t token) { listeners_.erase(token); }

  void trigger() {
    if (triggered_) return;
    triggered_ = true;
    // One at a time off the map, so that a listener unsubscribing another one takes effect.
    while (!listeners_.empty()) {
      Listener listener = std::move(listeners_.begin()->second);
      listeners_.erase(listeners_.begin());
      listener();
    }
  }
  bool triggered() const { return triggered_; }

 private:
  bool triggered_ = false;
  std::uint64_t next_token_ = 0;
  std::map<std::uint64_t, Listener> listeners_;
};

}  // namespace pgrelay::server
