// Runs trigger capture continuously: a thread that polls on NOTIFY or a fallback interval.
//
// NOTIFY is only used where the upstream cannot prepare transactions
// (max_prepared_transactions = 0): a transaction that ran NOTIFY cannot be prepared, so with
// two-phase commit possible the service never arms the triggers' notification and polls at
// most 100 ms apart when idle.
//
// The capture thread owns two upstream connections: the poller's, and one that LISTENs on the
// channel the triggers notify (the install schema's name). It polls when notified, and
// otherwise on an adaptive interval: min_poll while polls find something and for busy_grace
// after the last that did, then doubling up to max_poll while idle (the fallback for a lost
// notification; an idle upstream costs one small read-only poll per max_poll).
//
// Wake-ups are coalesced twice. A capture trigger runs once per statement and calls pg_notify
// with a constant payload, which Postgres queues once per transaction. And it notifies only
// while the service is idle: NOTIFY takes a database-wide lock at commit that serializes the
// commits of every notifying transaction (it halved single-row insert throughput), so the
// service raises a flag (the unlogged table `wakeup`) when it backs off past a few min_poll
// intervals, polls once more, and lowers it as soon as a poll finds work again; while busy it
// polls every min_poll anyway. A writer in a REPEATABLE READ transaction may see the flag late;
// the fallback poll covers it.
//
// A failed poll with a broken connection (upstream restart, network) drops both connections and
// reconnects with exponential backoff (reconnect_min doubling to reconnect_max); the poller
// resumes from the checkpoint persisted in the log, so nothing is lost or appended twice. Other
// errors are kept in stats().last_error and retried after the same backoff.
//
// Every detect_interval a second thread, on a connection of its own, calls sync_tables(): new
// tables of captured publications get their triggers and ALTERed tables a new layout without a
// restart (with an event trigger this happens in the DDL itself; the interval then only catches
// up what it could not do). A sync takes some 10 ms on a loaded upstream, which polls must not
// wait for: on the capture thread it set the p99 of commit-to-log latency. It runs only when
// the catalogs it reads changed (capture/catalog_watch.h), and at least once a minute.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "base/result.h"
#include "capture/trigger/installer.h"
#include "capture/trigger/pg_session.h"
#include "capture/trigger/poller.h"
#include "log/change_log.h"

namespace pgrelay::capture {

struct CaptureServiceOptions {
  PollerOptions poller;
  InstallOptions install;  // with install_on_start, its schema is used for the poller too
  bool install_on_start = true;
  // min_poll bounds commit-to-log latency while writes flow (the notification is off then).
  // At 1000 tx/s (bench/replication.sh, 2 cores) 250 us measured p50 1.8 ms at 650 polls/s;
  // polling again at once after a find and waiting 250 us, 500 us or 1 ms after the first empty
  // poll, 2.1, 2.0 and 2.3 ms at 790, 610 and 610 polls/s; 1 ms with the first idle wait at 2 ms
  // (the old default) 2.9 ms at 340 polls/s. Notifying on every commit instead was worse (p50
  // 5.4 / p99 14.7 ms), and cut unthrottled writes from about 3,000 to 1,300 tx/s.
  std::chrono::microseconds min_poll{250}, max_poll{1'000'000};
  // How long after the last poll that found work the interval stays at min_poll. At 1000 tx/s
  // a poll shorter than the gap between commits often finds nothing; backing off at once made
  // one wait in ten 500 us to 1 ms (p90 0.60-0.98 ms against 0.34 ms with 10 ms of grace).
  std::chrono::microseconds busy_grace{10'000};
  std::chrono::milliseconds detect_interval{1000};
  std::chrono::milliseconds reconnect_min{100}, reconnect_max{5000};
};

struct ExportedSnapshot {
  // The connection whose open REPEATABLE READ transaction exported the snapshot.
  std::unique_ptr<PgSession> holder;
  std::string snapshot_name;  // pg_export_snapshot()
  Lsn consistent_point;
};

class CaptureService {
 public:
  // Connects (and installs, with install_on_start) before returning, so configuration errors
  // come back here; later connection failures are retried by the thread.
  static Result<std::unique_ptr<CaptureService>> start(CaptureServiceOptions options,
                                                       log::ChangeLog& log);
  ~CaptureService();  // stops
  CaptureService(const CaptureService&) = delete;
  CaptureService& operator=(const CaptureService&) = delete;

  // Stops the thread and closes its connections; idempotent.
  void stop();
  // Poll soon.
  void wake();

  // Runs on the capture thread between polls: opens a connection, BEGIN ISOLATION LEVEL
  // REPEATABLE READ, pg_export_snapshot(), then captures exactly the transactions visible in
  // that snapshot. Every transaction visible in it is in the log with a commit LSN below
  // consistent_point, every other one is appended later with a commit LSN above it. Returns
  // once that batch is durable. The caller keeps `holder` open while clients may import the
  // snapshot.
  Result<ExportedSnapshot> export_snapshot();
  // Polls once now and waits until everything committed upstream before the call is durable in
  // the log; returns the log's last LSN, or the upstream's WAL insert position at the poll when
  // that is further (an empty or idle log): a consistent point that LSNs the client gets from
  // the upstream compare correctly with, and below every entry appended later.
  Result<Lsn> sync();

  struct Stats {
    // reconnects: connections re-established after one was lost, however it was noticed.
    std::uint64_t transactions = 0, rows = 0, polls = 0, reconnects = 0;
    // Periodic syncs that ran: the others found the catalogs unchanged (see the top).
    std::uint64_t catalog_syncs = 0;
    Lsn last_lsn;
    // Of the last transaction appended, in microseconds since 2000-01-01: its commit time (the
    // upstream's when commit_times, otherwise its poll's) and when it was appended.
    std::int64_t last_commit_time = 0, last_appended_at = 0;
    bool commit_times = false;  // the upstream has track_commit_timestamp on
    std::string last_error;
  };
  Stats stats() const;
  // What install_on_start installed (default-constructed without it).
  const InstallReport& install_report() const { return install_report_; }

 private:
  CaptureService(CaptureServiceOptions options, log::ChangeLog& log);
  Status connect();
  void disconnect();
  void run();
  // The detect_interval loop of sync_tables() (see the top of this file).
  void run_detector();
  // Runs `task` on the capture thread and waits for it.
  Status call(std::function<Status()> task);
  void run_tasks();
  // `upstream_lsn` (optional) receives the upstream's WAL insert position at the poll.
  Status poll_once(bool* found, Lsn* upstream_lsn = nullptr);
  // Counts a poll's figures in stats_; the caller holds mu_.
  void count_poll(const PollStats& poll);
  void note_error(const Error& error);
  void wait(std::chrono::microseconds timeout);
  // Raises or lowers the flag that makes writers notify; false (error noted) when it failed.
  bool set_armed(bool armed);

  CaptureServiceOptions options_;
  log::ChangeLog& log_;
  InstallReport install_report_;
  std::unique_ptr<TriggerPoller> poller_;
  std::unique_ptr<PgSession> listener_;
  bool notify_allowed_ = true;     // false where prepared transactions are possible (see connect)
  std::optional<bool> armed_;      // the wakeup flag as last set; unknown after (re)connecting
  bool connected_before_ = false;  // a later connect() is a reconnect (stats_.reconnects)
  int wake_fds_[2] = {-1, -1};     // self-pipe: wake(), stop() and tasks write a byte
  std::thread thread_;
  std::thread detector_;
  std::condition_variable detector_cv_;  // wakes the detector to stop (with mu_)
  std::atomic<bool> stopping_{false};

  mutable std::mutex mu_;
  std::condition_variable done_cv_;
  struct Task {
    std::function<Status()> fn;
    std::optional<Status> result;
  };
  std::deque<std::shared_ptr<Task>> tasks_;
  Stats stats_;
};

}  // namespace pgrelay::capture
