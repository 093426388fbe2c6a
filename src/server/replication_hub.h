// What the replication sessions of one captured database share: its log, capture and caches.
#pragma once

#include <asio.hpp>

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "base/result.h"
#include "log/change_log.h"
#include "log/in_progress.h"
#include "log/slots.h"
#include "server/binary_values.h"
#include "server/entry_encoder.h"
#include "server/wake_signal.h"
#include "server/walsender_registry.h"
#include "upstream/libpq_pool.h"
#include "upstream/upstream_config.h"

namespace pgrelay::server {

using wire::Lsn;

// A snapshot exported by an upstream transaction that stays open while `holder` lives.
struct ExportedSnapshot {
  std::shared_ptr<void> holder;
  std::string name;      // for SET TRANSACTION SNAPSHOT
  Lsn consistent_point;  // everything the snapshot sees is at or before it in the log
};

// The capture as replication sessions see it; the command line wires the real one in.
class CaptureLink {
 public:
  virtual ~CaptureLink() = default;
  // Blocking: exports an upstream snapshot at a capture batch boundary.
  virtual Result<ExportedSnapshot> export_snapshot() = 0;
  // Blocking: returns once everything committed upstream before the call is in the log.
  virtual Result<Lsn> sync() = 0;
};

// One per captured database. The slot registry and the walsender registry are the server's,
// shared by every database's hub.
class ReplicationHub {
 public:
  ReplicationHub(asio::any_io_executor executor, asio::thread_pool& blocking, log::ChangeLog& log,
                 log::SlotRegistry& slots, WalsenderRegistry& walsenders, CaptureLink* capture,
                 upstream::UpstreamConfig upstream,
                 log::InProgressTransactions* in_progress = nullptr);
  ~ReplicationHub();
  ReplicationHub(const ReplicationHub&) = delete;
  ReplicationHub& operator=(const ReplicationHub&) = delete;

  log::ChangeLog& log() { return log_; }
  log::SlotRegistry& slots() { return slots_; }
  CaptureLink* capture() { return capture_; }
  // Transactions capture shows while they arrive (null: none are); their growth wakes the
  // watchers as the log's does.
  log::InProgressTransactions* in_progress() { return in_progress_; }
  asio::thread_pool& blocking() { return blocking_; }
  // The upstream, its database this hub's.
  const upstream::UpstreamConfig& upstream() const { return upstream_; }
  WalsenderRegistry& walsenders() { return walsenders_; }
  // libpq connections for side queries made on the blocking pool (publications at
  // START_REPLICATION).
  upstream::LibpqPool& side_connections() { return side_connections_; }

  // Encoded entries shared by walsenders with the same view (executor thread only).
  EncodedEntryCache& encoded_cache() { return encoded_cache_; }
  // The highest consistent point a slot was created at (capture's sync or snapshot export):
  // every transaction committed before it is in the log, and every later one lands at or past
  // it. A caught-up walsender's keepalives may report it, as Postgres's report the WAL they
  // have read: a subscriber's table sync ends at its slot's consistent point, and the apply
  // worker takes the table into use only once its stream reaches that far, writes or not.
  // Executor thread only.
  void note_consistent_point(Lsn lsn) {
    if (lsn <= quiet_position_) return;
    quiet_position_ = lsn;
    wake_all();  // caught-up walsenders tell their consumers
  }
  Lsn quiet_position() const { return quiet_position_; }
  // Binary mode's conversions through the upstream (blocking pool; thread-safe).
  BinaryConverter& binary_converter() { return binary_converter_; }
  // An entry a walsender is encoding while it waits for the upstream (binary mode): others
  // with the same view wait for it to reach the cache instead of converting it again.
  // converting() gives the timer to wait on (its wait ends when the encoding does), or null
  // when nobody encodes that entry; begin_converting() registers one, end_converting() wakes
  // its waiters. Executor thread only.
  std::shared_ptr<asio::steady_timer> converting(std::uint64_t view_id, Lsn end_lsn) const;
  void begin_converting(std::uint64_t view_id, Lsn end_lsn);
  void end_converting(std::uint64_t view_id, Lsn end_lsn);

  // Walsenders sleep on their own WakeSignal; the hub wakes every registered one when the log
  // grows. Call from the executor's thread.
  void watch(WakeSignal* signal) { watchers_.insert(signal); }
  void unwatch(WakeSignal* signal) { watchers_.erase(signal); }
  // How often the watchers were woken: a walsender that was busy when it happened (a cancel
  // finds no wait then) sees it changed before it sleeps.
  std::uint64_t wake_generation() const { return wake_generation_; }

  // The walsenders of this database join the server's registry.
  void add_walsender(const WalsenderInfo& info, std::function<void()> terminate,
                     std::function<void()> stop) {
    walsenders_.add(info, std::move(terminate), std::move(stop));
  }
  void update_walsender(const WalsenderInfo& info) { walsenders_.update(info); }
  void remove_walsender(int pid) { walsenders_.remove(pid); }
  // Slots or walsenders changed (WalsenderRegistry::changed).
  void changed() { walsenders_.changed(); }

 private:
  void wake_all();

  asio::any_io_executor executor_;
  asio::thread_pool& blocking_;
  log::ChangeLog& log_;
  log::SlotRegistry& slots_;
  WalsenderRegistry& walsenders_;
  CaptureLink* capture_;
  upstream::UpstreamConfig upstream_;
  log::InProgressTransactions* in_progress_;
  upstream::LibpqPool side_connections_;
  EncodedEntryCache encoded_cache_{64u << 20};
  Lsn quiet_position_;
  BinaryConverter binary_converter_;
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::shared_ptr<asio::steady_timer>>
      converting_;
  std::set<WakeSignal*> watchers_;
  std::uint64_t wake_generation_ = 0;
  // Keeps log callbacks from touching a destroyed hub.
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace pgrelay::server
