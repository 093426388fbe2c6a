// The replication hubs of the upstream's databases: which may be captured, which are, and
// starting capture of one when a session first needs it.
#include "server/replication_hubs.h"

#include <cctype>

namespace pgrelay::server {

CaptureScope::CaptureScope(std::string always, std::vector<std::string> names)
    : always_(std::move(always)) {
  for (auto& name : names) {
    if (name == "*") {
      all_ = true;
    } else if (!name.empty()) {
      names_.insert(std::move(name));
    }
  }
}

bool CaptureScope::admits(const std::string& database) const {
  return all_ || database == always_ || names_.count(database) > 0;
}

Error CaptureScope::refusal(const std::string& database) const {
  std::string captured = "\"" + always_ + "\"";
  for (const auto& name : names_) {
    if (name != always_) captured += ", \"" + name + "\"";
  }
  // The name as a shell word: bare when it can be, else in single quotes.
  bool bare = !database.empty();
  for (unsigned char c : database) bare = bare && (std::isalnum(c) || c == '_' || c == '-');
  std::string quoted = bare ? database : "'";
  if (!bare) {
    for (char c : database) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
    quoted += "'";
  }
  return Error::make(sqlstate::kObjectNotInPrerequisiteState,
                     "database \"" + database + "\" is not captured by pgrelay",
                     "Start pgrelay with --capture-database " + quoted +
                         " (or capture-database in its config file), or with "
                         "--capture-database '*' to capture every database.",
                     "pgrelay captures " + captured + "; a slot here would stream nothing.");
}

ReplicationHubs::ReplicationHubs(asio::any_io_executor executor, asio::thread_pool& blocking,
                                 log::SlotRegistry& slots, upstream::UpstreamConfig upstream,
                                 CaptureScope scope, CaptureStarter start, DatabasePreparer prepare,
                                 DatabaseForgetter forget)
    : executor_(std::move(executor)),
      blocking_(blocking),
      slots_(slots),
      upstream_(std::move(upstream)),
      scope_(std::move(scope)),
      start_(std::move(start)),
      prepare_(std::move(prepare)),
      forget_(std::move(forget)) {}

ReplicationHubs::~ReplicationHubs() {
  std::lock_guard lock(mu_);
  for (auto& [name, captured] : captured_) captured.hub.reset();
  captured_.clear();
}

Result<ReplicationHub*> ReplicationHubs::open(const std::string& database) {
  if (auto* hub = find(database)) return hub;
  if (!scope_.admits(database)) return scope_.refusal(database);
  std::lock_guard starting(start_mu_);
  if (auto* hub = find(database)) return hub;  // started while this one waited
  auto parts = start_(database);
  if (!parts.ok()) return parts.error();
  auto config = upstream_;
  config.dbname = database;
  auto hub = std::make_unique<ReplicationHub>(executor_, blocking_, *parts->log, slots_,
                                              walsenders_, parts->capture, std::move(config),
                                              parts->in_progress);
  ReplicationHub* opened = hub.get();
  bool was_prepared = false;
  {
    std::lock_guard lock(mu_);
    captured_[database] = Captured{std::move(*parts), std::move(hub)};
    was_prepared = prepared_.count(database) > 0;
  }
  // A database readied while it could not be captured learns that it is now.
  if (was_prepared && prepare_) prepare_(database, std::nullopt);
  return opened;
}

void ReplicationHubs::prepare(const std::string& database) {
  {
    std::lock_guard lock(mu_);
    if (prepared_.count(database)) return;
  }
  std::optional<Error> refusal;
  if (scope_.admits(database)) {
    auto hub = open(database);
    // No such database: the session's own login says so; nothing to remember.
    if (!hub.ok() && hub.error().sqlstate == sqlstate::kInvalidCatalogName) return;
    if (!hub.ok()) refusal = hub.error();
  } else {
    refusal = scope_.refusal(database);
  }
  std::lock_guard starting(start_mu_);
  {
    std::lock_guard lock(mu_);
    if (prepared_.count(database)) return;
  }
  if (prepare_) prepare_(database, refusal);
  std::lock_guard lock(mu_);
  prepared_.insert(database);
}

bool ReplicationHubs::release(const std::string& database) {
  if (database == upstream_.dbname) return false;
  for (const auto& slot : slots_.list()) {
    if (slot.database == database) return false;
  }
  std::lock_guard starting(start_mu_);
  std::optional<Captured> released;
  bool was_prepared = false;
  {
    std::lock_guard lock(mu_);
    {
      std::lock_guard users(users_->mu);
      if (users_->count.count(database)) return false;
    }
    was_prepared = prepared_.erase(database) > 0;
    if (auto it = captured_.find(database); it != captured_.end()) {
      released = std::move(it->second);
      captured_.erase(it);
    }
  }
  if (!released && !was_prepared) return false;
  // No walsender or replication session holds the hub (no slot, no user): it goes, then the
  // capture and log it used.
  if (released) released->hub.reset();
  released.reset();
  if (forget_) forget_(database);
  return true;
}

std::shared_ptr<void> ReplicationHubs::use(const std::string& database) {
  {
    std::lock_guard lock(users_->mu);
    ++users_->count[database];
  }
  return std::shared_ptr<void>(nullptr, [users = users_, database](void*) {
    std::lock_guard lock(users->mu);
    if (auto it = users->count.find(database); it != users->count.end() && --it->second <= 0) {
      users->count.erase(it);
    }
  });
}

bool ReplicationHubs::prepared(const std::string& database) const {
  std::lock_guard lock(mu_);
  return prepared_.count(database) > 0;
}

ReplicationHub* ReplicationHubs::find(const std::string& database) const {
  std::lock_guard lock(mu_);
  auto it = captured_.find(database);
  return it == captured_.end() ? nullptr : it->second.hub.get();
}

std::vector<std::string> ReplicationHubs::captured() const {
  std::lock_guard lock(mu_);
  std::vector<std::string> names;
  for (const auto& [name, captured] : captured_) names.push_back(name);
  return names;
}

}  // namespace pgrelay::server
