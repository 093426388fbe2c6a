// A thread of a part's own: started with its job, asked to stop, and sleeping so that a stop
// wakes it; and which of its errors are news worth a log line.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

namespace pgrelay {

class BackgroundThread {
 public:
  BackgroundThread() = default;
  ~BackgroundThread() { stop(); }
  BackgroundThread(const BackgroundThread&) = delete;
  BackgroundThread& operator=(const BackgroundThread&) = delete;

  // Runs `job` on a new thread named `name` (see thread_name.h), unless one runs already.
  void start(std::string_view name, std::function<void()> job);
  // Asks the job to stop, wakes it from pause(), and waits for it to return.
  void stop();
  bool stopping() const { return stopping_.load(); }
  // Sleeps up to `d`, or until stop() or wake().
  void pause(std::chrono::milliseconds d);
  // Ends the job's current pause() (or its next one) early, without stopping it.
  void wake();

 private:
  std::atomic<bool> stopping_{false};
  bool woken_ = false;  // guarded by mu_
  std::mutex mu_;
  std::condition_variable cv_;
  std::thread thread_;
};

// Which errors a retrying loop logs: each message the first time it comes since the last
// success, so that an outage is one line, not one per retry. Thread-safe.
class ErrorNews {
 public:
  // True the first time `message` comes since reset() (or since the last other message).
  bool is_news(const std::string& message);
  // The loop got through: the next failure is news again.
  void reset();
  // Whether an error came since reset().
  bool any() const;

 private:
  mutable std::mutex mu_;
  std::string last_;
};

}  // namespace pgrelay
