// Keeps one database's virtual catalog in step with pgrelay: the slot and walsender mirror, the
// log head, whether pgrelay captures it, and the requests clients make through it.
#include "cli/catalog_worker.h"

#include <chrono>

#include "base/thread_name.h"

namespace pgrelay::cli {
namespace {

std::string slot_key(const upstream::SlotRow& row) {
  return row.plugin + '|' + row.database + '|' + (row.active ? "t" : "f") + '|' +
         std::to_string(row.active_pid.value_or(0)) + '|' + row.restart_lsn->to_string() + '|' +
         row.confirmed_flush_lsn->to_string() + '|' + row.wal_status + '|' +
         (row.two_phase ? "t" : "f") + (row.temporary ? "t" : "f");
}

}  // namespace

CatalogWorker::CatalogWorker(std::unique_ptr<upstream::VirtualCatalog> catalog,
                             std::string conninfo, std::string database, asio::io_context& io,
                             server::ReplicationHubs& hubs)
    : catalog_(std::move(catalog)),
      conninfo_(std::move(conninfo)),
      database_(std::move(database)),
      io_(io),
      hubs_(hubs) {
  thread_ = start_named_thread("catalog", [this] { loop(); });
}

CatalogWorker::~CatalogWorker() {
  stop();
}

void CatalogWorker::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  written_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  catalog_.reset();
}

void CatalogWorker::refresh() {
  Snapshot snapshot{hubs_.slots().list(), hubs_.walsenders().list()};
  std::lock_guard lock(mu_);
  pending_ = std::move(snapshot);
  ++requested_;
}

void CatalogWorker::set_capture_refusal(std::optional<Error> refusal) {
  std::lock_guard lock(mu_);
  refusal_ = refusal;
  pending_refusal_ = std::move(refusal);
  ++requested_;
}

void CatalogWorker::flush() {
  std::unique_lock lock(mu_);
  auto target = requested_;
  written_cv_.wait_for(lock, std::chrono::seconds(5),
                       [&] { return written_ >= target || stopping_; });
}

void CatalogWorker::loop() {
  wire::Lsn head;
  auto next_refresh = std::chrono::steady_clock::now();
  auto next_take = next_refresh;
  for (;;) {
    std::optional<Snapshot> snapshot;
    std::optional<std::optional<Error>> refusal;
    std::uint64_t generation = 0;
    {
      std::unique_lock lock(mu_);
      if (stopping_) return;
      snapshot = std::move(pending_);
      pending_.reset();
      refusal = std::move(pending_refusal_);
      pending_refusal_.reset();
      generation = requested_;
    }
    if (refusal && !catalog_->set_capture_refusal(*refusal).ok()) {
      std::lock_guard lock(mu_);
      if (!pending_refusal_) pending_refusal_ = std::move(refusal);  // retried next turn
    }
    if (snapshot || refusal) {
      if (snapshot) write_mirror(*snapshot);
      std::lock_guard lock(mu_);
      written_ = std::max(written_, generation);
      written_cv_.notify_all();
    }
    // The log head, slot positions and walsender progress move all the time; the mirror
    // takes them once a second (only rows that differ are written), which keeps pgrelay's
    // own writes to the upstream small. pg_current_wal_lsn() is at least the upstream's own
    // position anyway, so a slightly old head never makes it go backwards.
    if (std::chrono::steady_clock::now() >= next_refresh) {
      next_refresh = std::chrono::steady_clock::now() + std::chrono::seconds(1);
      auto* hub = hubs_.find(database_);
      wire::Lsn now = hub ? hub->log().last_end_lsn() : wire::Lsn();
      if (now != head && catalog_->set_log_head(now).ok()) head = now;
      asio::post(io_, [this] { refresh(); });
    }
    // Short: flush() callers wait for the next turn of this loop. Requests are read when
    // notified, and once a second in case a notification was missed (reconnects).
    auto notified = catalog_->wait_for_requests(std::chrono::milliseconds(20));
    if (!notified.ok()) {
      reconnect();
      continue;
    }
    if (*notified || std::chrono::steady_clock::now() >= next_take) {
      next_take = std::chrono::steady_clock::now() + std::chrono::seconds(1);
      auto requests = catalog_->take_requests();
      if (requests.ok() && !requests->empty()) {
        asio::post(io_, [this, list = std::move(*requests)] { apply(list); });
      }
    }
  }
}

void CatalogWorker::reconnect() {
  auto delay = std::chrono::milliseconds(100);
  for (;;) {
    {
      std::unique_lock lock(mu_);
      if (stopping_ || written_cv_.wait_for(lock, delay, [&] { return stopping_; })) return;
    }
    auto reopened = upstream::VirtualCatalog::open(conninfo_, catalog_->schema());
    if (reopened.ok()) {
      catalog_ = std::move(*reopened);
      mirrored_slots_.clear();
      mirrored_walsenders_ = "-";
      mirror_reconciled_ = false;
      {
        std::lock_guard lock(mu_);
        if (!pending_refusal_) pending_refusal_.emplace(refusal_);
      }
      asio::post(io_, [this] { refresh(); });
      return;
    }
    delay = std::min(delay * 2, std::chrono::milliseconds(5000));
  }
}

void CatalogWorker::write_mirror(const Snapshot& snapshot) {
  std::map<std::string, std::string> current;
  for (const auto& slot : snapshot.slots) {
    upstream::SlotRow row;
    row.slot_name = slot.name;
    row.plugin = slot.plugin;
    row.database = slot.database;
    row.temporary = slot.temporary;
    row.active = slot.active_pid != 0;
    if (slot.active_pid) row.active_pid = slot.active_pid;
    row.restart_lsn = slot.restart_lsn;
    row.confirmed_flush_lsn = slot.confirmed_flush;
    row.wal_status = slot.is_lost() ? "lost" : "reserved";
    row.two_phase = slot.two_phase;
    std::string key = slot_key(row);
    auto known = mirrored_slots_.find(slot.name);
    if (known == mirrored_slots_.end() || known->second != key) {
      if (!catalog_->upsert_slot(row).ok()) key.clear();  // retried next time
    }
    current[slot.name] = key;
  }
  for (const auto& [name, key] : mirrored_slots_) {
    if (!current.count(name)) (void)catalog_->remove_slot(name);
  }
  // The first write after (re)connecting also removes rows of slots this run never knew.
  if (!mirror_reconciled_) {
    std::vector<std::string> names;
    for (const auto& slot : snapshot.slots) names.push_back(slot.name);
    mirror_reconciled_ = catalog_->retain_slots(names).ok();
  }
  mirrored_slots_ = std::move(current);

  std::vector<upstream::WalsenderRow> rows;
  std::string walsender_key;
  for (const auto& w : snapshot.walsenders) {
    upstream::WalsenderRow row;
    row.pid = w.pid;
    row.usename = w.user;
    row.application_name = w.application_name;
    if (!w.client_addr.empty()) row.client_addr = w.client_addr;
    row.client_port = w.client_port;
    row.state = w.state;
    row.sent_lsn = w.sent;
    row.write_lsn = w.write;
    row.flush_lsn = w.flush;
    row.replay_lsn = w.replay;
    row.slot_name = w.slot;
    walsender_key +=
        std::to_string(w.pid) + w.state + w.sent.to_string() + w.flush.to_string() + ';';
    rows.push_back(std::move(row));
  }
  if (walsender_key != mirrored_walsenders_ && catalog_->set_walsenders(rows).ok()) {
    mirrored_walsenders_ = walsender_key;
  }
}

void CatalogWorker::apply(const std::vector<upstream::CatalogRequest>& requests) {
  for (const auto& request : requests) {
    switch (request.kind) {
      case upstream::CatalogRequest::Kind::kDropSlot:
        (void)hubs_.slots().drop(request.slot_name);
        break;
      case upstream::CatalogRequest::Kind::kCreateSlot: {
        log::Slot slot;
        slot.name = request.slot_name;
        slot.plugin = request.plugin;
        slot.database = database_;
        slot.temporary = request.temporary;
        slot.two_phase = request.two_phase;
        slot.confirmed_flush = request.lsn;
        slot.restart_lsn = request.lsn;
        (void)hubs_.slots().create(slot);
        break;
      }
      case upstream::CatalogRequest::Kind::kTerminate:
        hubs_.walsenders().terminate(request.pid);
        break;
    }
  }
  refresh();
}

}  // namespace pgrelay::cli
