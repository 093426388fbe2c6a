// Native capture's upstream stream (capture/native/reading_loop.h) watched on an Asio executor.
#include "upstream/asio_reading_loop.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <utility>

#include "base/unique_fd.h"

namespace pgrelay::upstream {
namespace {

using Next = capture::ReadingLoop::Next;

// One watch. At most one readiness wait, one tick and one queued turn are pending at a time;
// each holds the watch, which closes its descriptor when the last of them is gone.
class Watch : public std::enable_shared_from_this<Watch> {
 public:
  // Takes `fd`. Should the reactor refuse it (epoll_ctl: out of memory or watches), the
  // descriptor is closed and turns come at the tick only: slower, never lost.
  Watch(asio::any_io_executor executor, int fd, std::chrono::milliseconds tick,
        std::function<Next()> turn)
      : socket_(executor), timer_(executor), tick_(tick), turn_(std::move(turn)) {
    asio::error_code error;
    socket_.assign(fd, error);
    if (error) ::close(fd);
  }

  void start() {
    arm_tick();
    run_turn();
  }

 private:
  void run_turn() {
    if (stopped_) return;
    switch (turn_()) {
      case Next::kStop:
        stop();
        return;
      case Next::kAgain:
        if (again_queued_) return;
        again_queued_ = true;
        asio::post(socket_.get_executor(), [self = shared_from_this()] {
          self->again_queued_ = false;
          self->run_turn();
        });
        return;
      case Next::kWait:
        wait_readable();
        return;
    }
  }

  void wait_readable() {
    if (waiting_ || stopped_ || !socket_.is_open()) return;
    waiting_ = true;
    socket_.async_wait(asio::posix::descriptor_base::wait_read,
                       [self = shared_from_this()](const asio::error_code& error) {
                         self->waiting_ = false;
                         if (!error) self->run_turn();
                       });
  }

  void arm_tick() {
    timer_.expires_after(tick_);
    timer_.async_wait([self = shared_from_this()](const asio::error_code& error) {
      if (error || self->stopped_) return;
      self->run_turn();
      if (!self->stopped_) self->arm_tick();
    });
  }

  void stop() {
    stopped_ = true;
    asio::error_code ignored;
    timer_.cancel();
    socket_.cancel(ignored);
  }

  asio::posix::stream_descriptor socket_;  // owns the duplicate
  asio::steady_timer timer_;
  const std::chrono::milliseconds tick_;
  std::function<Next()> turn_;
  bool stopped_ = false;
  bool waiting_ = false;
  bool again_queued_ = false;
};

}  // namespace

Status AsioReadingLoop::watch(int fd, std::chrono::milliseconds tick, std::function<Next()> turn) {
  UniqueFd duplicate(::dup(fd));
  if (!duplicate) {
    return Error::make("58000", std::string("could not duplicate the upstream stream's socket: ") +
                                    std::strerror(errno));
  }
  // The duplicate is the loop's: libpq may close its own descriptor whenever it likes.
  asio::post(executor_, [executor = executor_, duplicate = std::make_shared<UniqueFd>(
                                                   std::move(duplicate)),
                         tick, turn = std::move(turn)]() mutable {
    std::make_shared<Watch>(executor, duplicate->release(), tick, std::move(turn))->start();
  });
  return {};
}

}  // namespace pgrelay::upstream
