// A capture process for the native crash test: runs NativeCapture on a log until it is killed.
// Usage: native_capture_helper CONNINFO LOG_DIR SPILL_DIR SLOT [loop|thread]
// With `loop` (the default, as `pgrelay serve` runs it) the stream is read on an event loop
// thread of the helper's; with `thread`, on the capture's own thread.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "base/logger.h"
#include "capture/native/native_capture.h"
#include "log/change_log.h"
#include "upstream/asio_reading_loop.h"

int main(int argc, char** argv) {
  using namespace pgrelay;
  const std::string mode = argc == 6 ? argv[5] : "loop";
  if ((argc != 5 && argc != 6) || (mode != "loop" && mode != "thread")) {
    std::fprintf(stderr, "usage: %s CONNINFO LOG_DIR SPILL_DIR SLOT [loop|thread]\n", argv[0]);
    return 2;
  }
  log::LogOptions lo;
  lo.dir = argv[2];
  // Native capture confirms the upstream slot as soon as append() returns, so its promise
  // ("durable before released") only holds when append() means fdatasync: this is the policy a
  // native deployment runs with, and the one the test must exercise. (kInterval would also
  // survive kill -9, which loses nothing written(2), but not the OS crash the promise covers.)
  lo.sync = log::SyncPolicy::kFsyncPerCommit;
  auto log = log::ChangeLog::open(lo);
  if (!log.ok()) {
    std::fprintf(stderr, "log: %s\n", log.error().to_string().c_str());
    return 1;
  }
  // Retried errors go to stderr, which the test reads: it counts restarts that found the
  // killed process's walsender still holding the slot.
  LoggerOptions logger_options;
  logger_options.level = LogLevel::kWarning;
  Logger logger(logger_options);
  capture::NativeCaptureOptions o;
  o.conninfo = argv[1];
  o.spill_dir = argv[3];
  o.slot = argv[4];
  o.logger = &logger;
  // Often enough that the periodic publication markers meet the kills.
  o.mirror_interval = std::chrono::milliseconds(100);
  asio::io_context io;
  auto work = asio::make_work_guard(io);
  std::thread loop_thread;
  if (mode == "loop") {
    o.loop = std::make_shared<upstream::AsioReadingLoop>(io.get_executor());
    loop_thread = std::thread([&] { io.run(); });
  }
  auto capture = capture::NativeCapture::start(o, **log);
  if (!capture.ok()) {
    std::fprintf(stderr, "capture: %s\n", capture.error().to_string().c_str());
    return 1;
  }
  std::printf("ready\n");
  std::fflush(stdout);
  while (true) pause();
}
