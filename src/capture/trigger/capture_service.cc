// Runs trigger capture continuously: a thread that polls on NOTIFY or a fallback interval.
#include "capture/trigger/capture_service.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "base/thread_name.h"
#include "wire/replication_frames.h"

namespace pgrelay::capture {
namespace {

using Clock = std::chrono::steady_clock;

Error stopped_error() {
  return Error::make("57P01", "trigger capture is stopping");
}

}  // namespace

CaptureService::CaptureService(CaptureServiceOptions options, log::ChangeLog& log)
    : options_(std::move(options)), log_(log) {}

Result<std::unique_ptr<CaptureService>> CaptureService::start(CaptureServiceOptions options,
                                                              log::ChangeLog& log) {
  InstallReport report;
  if (options.install_on_start) {
    options.poller.schema = options.install.schema;
    auto session = PgSession::connect(options.poller.conninfo);
    if (!session.ok()) return session.error();
    auto installed = install(**session, options.install);
    if (!installed.ok()) return installed.error();
    report = *installed;
  }
  if (options.min_poll.count() <= 0) options.min_poll = std::chrono::microseconds(250);
  options.max_poll = std::max(options.max_poll, options.min_poll);
  options.reconnect_max = std::max(options.reconnect_max, options.reconnect_min);
  std::unique_ptr<CaptureService> svc(new CaptureService(std::move(options), log));
  svc->install_report_ = std::move(report);
  if (pipe2(svc->wake_fds_, O_NONBLOCK | O_CLOEXEC) != 0) {
    return Error::make(sqlstate::kInternalError, "could not create the capture wake-up pipe");
  }
  PGRELAY_TRY(svc->connect());
  svc->thread_ = start_named_thread("trigger-poll", [s = svc.get()] { s->run(); });
  svc->detector_ = start_named_thread("trigger-tables", [s = svc.get()] { s->run_detector(); });
  return svc;
}

CaptureService::~CaptureService() {
  stop();
  for (int fd : wake_fds_) {
    if (fd >= 0) close(fd);
  }
}

void CaptureService::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake();
  detector_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (detector_.joinable()) detector_.join();
  std::lock_guard lock(mu_);
  for (auto& task : tasks_) task->result = Status(stopped_error());
  tasks_.clear();
  done_cv_.notify_all();
}

void CaptureService::wake() {
  if (wake_fds_[1] < 0) return;
  const char byte = 1;
  // A full pipe already holds a wake-up.
  (void)!write(wake_fds_[1], &byte, 1);
}

Status CaptureService::connect() {
  auto poller = TriggerPoller::open(options_.poller, log_);
  if (!poller.ok()) return poller.error();
  auto listener = PgSession::connect(options_.poller.conninfo);
  if (!listener.ok()) return listener.error();
  auto channel = (*listener)->ident(options_.poller.schema);
  if (!channel.ok()) return channel.error();
  PGRELAY_TRY((*listener)->run("LISTEN " + *channel));
  // A transaction that ran NOTIFY cannot be prepared (0A000), so where the upstream allows
  // prepared transactions the triggers must never notify: the service then never raises the
  // wakeup flag (lowering it if an earlier run left it up) and polls instead.
  auto prepared =
      (*listener)->exec("SELECT pg_catalog.current_setting('max_prepared_transactions')::int > 0");
  if (!prepared.ok()) return prepared.error();
  notify_allowed_ = prepared->value(0, 0) != "t";
  poller_ = std::move(*poller);
  listener_ = std::move(*listener);
  if (connected_before_) {
    // Counted here, not where the loss was noticed: a broken connection can be found by a
    // poll, by a task such as sync(), or by the listener's socket, and each path reconnects.
    std::lock_guard lock(mu_);
    ++stats_.reconnects;
  }
  connected_before_ = true;
  if (!notify_allowed_ && !set_armed(false)) {
    return Error::make("08006", "could not lower the capture's wakeup flag");
  }
  return {};
}

void CaptureService::disconnect() {
  poller_.reset();
  listener_.reset();
  armed_.reset();
}

bool CaptureService::set_armed(bool armed) {
  auto table = poller_->session().ident(options_.poller.schema);
  if (!table.ok()) return false;
  auto st = poller_->session().run("UPDATE " + *table + ".wakeup SET armed = $1::bool",
                                   {armed ? "true" : "false"});
  if (!st.ok()) {
    note_error(st.error());
    return false;
  }
  armed_ = armed;
  return true;
}

void CaptureService::note_error(const Error& error) {
  std::lock_guard lock(mu_);
  stats_.last_error = error.to_string();
}

CaptureService::Stats CaptureService::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

Status CaptureService::poll_once(bool* found, Lsn* upstream_lsn) {
  // The rows this appends are deleted upstream by the next poll's statement (or by sync()).
  auto st = poller_->capture();
  if (!st.ok()) return st.error();
  *found = st->transactions + st->messages > 0 || st->rows > 0;
  if (upstream_lsn) *upstream_lsn = st->upstream_lsn;
  std::lock_guard lock(mu_);
  count_poll(*st);
  if (st->end_error) stats_.last_error = st->end_error->to_string();
  if (st->undecodable_rows > 0) {
    stats_.last_error = std::to_string(st->undecodable_rows) +
                        " captured rows fit no recorded column layout and were left out (a table "
                        "was altered twice between layout syncs without an event trigger)";
  }
  return {};
}

void CaptureService::count_poll(const PollStats& poll) {
  ++stats_.polls;
  stats_.transactions += poll.transactions;
  stats_.rows += poll.rows;
  if (stats_.commit_times != poller_->commit_timestamps()) {
    // The upstream restarted with track_commit_timestamp changed: a time kept from before is
    // of the other kind.
    stats_.commit_times = poller_->commit_timestamps();
    stats_.last_commit_time = stats_.last_appended_at = 0;
  }
  if (poll.last_lsn.is_valid()) stats_.last_lsn = poll.last_lsn;
  if (poll.last_commit_time == 0) return;
  stats_.last_commit_time = poll.last_commit_time;
  stats_.last_appended_at = wire::to_pg_timestamp(std::chrono::system_clock::now());
}

void CaptureService::wait(std::chrono::microseconds timeout) {
  pollfd fds[2] = {{wake_fds_[0], POLLIN, 0}, {-1, POLLIN, 0}};
  nfds_t n = 1;
  if (listener_) {
    fds[1].fd = listener_->socket();
    n = 2;
  }
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(timeout);
  const timespec ts{static_cast<time_t>(seconds.count()),
                    static_cast<long>((timeout - seconds).count() * 1000)};
  const int rc = ::ppoll(fds, n, &ts, nullptr);
  if (rc <= 0) return;
  if ((fds[0].revents & POLLIN) != 0) {
    char buf[64];
    while (read(wake_fds_[0], buf, sizeof buf) > 0) {
    }
  }
  if (n == 2 && fds[1].revents != 0 && listener_) {
    auto notes = listener_->drain_notifications();
    if (!notes.ok()) {
      note_error(notes.error());
      disconnect();
    }
  }
}

Status CaptureService::call(std::function<Status()> fn) {
  auto task = std::make_shared<Task>();
  task->fn = std::move(fn);
  {
    std::lock_guard lock(mu_);
    if (stopping_) return stopped_error();
    tasks_.push_back(task);
  }
  wake();
  std::unique_lock lock(mu_);
  done_cv_.wait(lock, [&] { return task->result.has_value(); });
  return *task->result;
}

void CaptureService::run_tasks() {
  std::deque<std::shared_ptr<Task>> tasks;
  {
    std::lock_guard lock(mu_);
    tasks.swap(tasks_);
  }
  for (auto& task : tasks) {
    Status result;
    if (!poller_) result = connect();
    if (result.ok()) result = task->fn();
    if (!result.ok() && poller_ && !poller_->session().connection_ok()) disconnect();
    std::lock_guard lock(mu_);
    task->result = std::move(result);
    done_cv_.notify_all();
  }
}

void CaptureService::run() {
  // This thread's waits are commit-to-log latency: the default timer slack of 50 us made a
  // 250 us wait 336 us at p50 (283 us with 1 ns).
  (void)prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
  // The wait after the next poll that finds nothing, once busy_grace has passed.
  std::chrono::microseconds idle = options_.min_poll;
  Clock::time_point last_found;
  std::chrono::milliseconds backoff = options_.reconnect_min;
  while (!stopping_) {
    run_tasks();
    if (!poller_ || !listener_) {
      disconnect();
      auto connected = connect();
      if (!connected.ok()) {
        note_error(connected.error());
        wait(backoff);
        backoff = std::min(backoff * 2, options_.reconnect_max);
        continue;
      }
    }
    bool found = false;
    auto polled = poll_once(&found);
    if (!polled.ok()) {
      note_error(polled.error());
      if (!poller_->session().connection_ok() || !listener_->connection_ok()) disconnect();
      wait(backoff);
      backoff = std::min(backoff * 2, options_.reconnect_max);
      continue;
    }
    backoff = options_.reconnect_min;
    std::chrono::microseconds interval = options_.min_poll;
    const Clock::time_point now = Clock::now();
    if (found) last_found = now;
    if (found || now - last_found < options_.busy_grace) {
      idle = options_.min_poll;
      if (found && armed_ != false) set_armed(false);
    } else {
      // Without notifications an idle service must look more often to keep latency down.
      const std::chrono::microseconds idle_cap =
          notify_allowed_ ? options_.max_poll
                          : std::min<std::chrono::microseconds>(options_.max_poll,
                                                                std::chrono::milliseconds(100));
      interval = idle;
      idle = std::min(idle * 2, idle_cap);
      const std::chrono::microseconds arm_after = std::min<std::chrono::microseconds>(
          std::max<std::chrono::microseconds>(options_.min_poll * 4, std::chrono::milliseconds(40)),
          options_.max_poll);
      if (notify_allowed_ && interval >= arm_after && armed_ != true) {
        // Writers that committed since the last poll saw the flag down and sent nothing.
        if (set_armed(true)) continue;
      }
    }
    wait(interval);
  }
  disconnect();
}

void CaptureService::run_detector() {
  std::unique_ptr<PgSession> session;
  CatalogWatch watch;
  std::unique_lock lock(mu_);
  while (!detector_cv_.wait_for(lock, options_.detect_interval, [&] { return stopping_.load(); })) {
    lock.unlock();
    if (!session || !session->connection_ok()) {
      auto connected = PgSession::connect(options_.poller.conninfo);
      if (connected.ok()) {
        session = std::move(*connected);
      } else {
        session.reset();
        note_error(connected.error());
      }
    }
    if (session) {
      auto synced = sync_tables(*session, options_.poller.schema, &watch);
      if (!synced.ok()) note_error(synced.error());
    }
    lock.lock();
    stats_.catalog_syncs = watch.checks();
  }
}

Result<ExportedSnapshot> CaptureService::export_snapshot() {
  ExportedSnapshot out;
  Status st = call([&]() -> Status {
    auto holder = PgSession::connect(options_.poller.conninfo);
    if (!holder.ok()) return holder.error();
    PGRELAY_TRY((*holder)->run("BEGIN ISOLATION LEVEL REPEATABLE READ"));
    auto name = (*holder)->exec("SELECT pg_catalog.pg_export_snapshot()");
    if (!name.ok()) return name.error();
    out.snapshot_name = std::string(name->value(0, 0));
    auto polled = poller_->capture_in_snapshot(out.snapshot_name);
    if (!polled.ok()) return polled.error();
    PGRELAY_TRY(poller_->release());
    {
      std::lock_guard lock(mu_);
      count_poll(*polled);
    }
    // Entries of this batch and before end below the log's end; later batches start at or
    // after both it and this poll's WAL position, and their commits come after their begins.
    out.consistent_point = std::max(log_.last_end_lsn(), polled->upstream_lsn);
    out.holder = std::move(*holder);
    return {};
  });
  if (!st.ok()) return st.error();
  return out;
}

Result<Lsn> CaptureService::sync() {
  Lsn last;
  Status st = call([&]() -> Status {
    bool found = false;
    Lsn upstream;
    PGRELAY_TRY(poll_once(&found, &upstream));
    PGRELAY_TRY(poller_->release());
    last = std::max(log_.last_end_lsn(), upstream);
    return {};
  });
  if (!st.ok()) return st.error();
  return last;
}

}  // namespace pgrelay::capture
