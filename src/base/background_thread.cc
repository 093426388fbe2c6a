// A thread of a part's own: started with its job, asked to stop, and sleeping so that a stop
// wakes it; and which of its errors are news worth a log line.
#include "base/background_thread.h"

#include <string>

#include "base/thread_name.h"

namespace pgrelay {

void BackgroundThread::start(std::string_view name, std::function<void()> job) {
  if (thread_.joinable()) return;
  stopping_ = false;
  thread_ = start_named_thread(name, std::move(job));
}

void BackgroundThread::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void BackgroundThread::pause(std::chrono::milliseconds d) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, d, [this] { return stopping_.load() || woken_; });
  woken_ = false;
}

void BackgroundThread::wake() {
  {
    std::lock_guard lock(mu_);
    woken_ = true;
  }
  cv_.notify_all();
}

bool ErrorNews::is_news(const std::string& message) {
  std::lock_guard lock(mu_);
  if (last_ == message) return false;
  last_ = message;
  return true;
}

void ErrorNews::reset() {
  std::lock_guard lock(mu_);
  last_.clear();
}

bool ErrorNews::any() const {
  std::lock_guard lock(mu_);
  return !last_.empty();
}

}  // namespace pgrelay
