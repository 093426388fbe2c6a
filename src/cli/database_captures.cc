// What `serve` keeps for each captured database of the upstream: its directory, log, capture
// and virtual catalog, started when ReplicationHubs asks.
#include "cli/database_captures.h"

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "base/strings.h"
#include "capture/follower/follower_checkpoint.h"
#include "capture/trigger/pg_session.h"
#include "log/file_util.h"
#include "upstream/virtual_catalog.h"

namespace pgrelay::cli {
namespace {

constexpr const char* kIndexFile = "databases.json";

// Which capture the mode asks for: "auto" keeps the mode an existing log was captured with,
// and otherwise takes native capture where the upstream allows it.
Result<bool> wants_native_capture(const ServeOptions& options,
                                  const upstream::UpstreamConfig& upstream,
                                  const log::ChangeLog& log, Logger& logger) {
  const std::string mode = capture_mode(options);
  if (mode == "native") return true;
  if (mode == "trigger") return false;
  if (auto checkpoint = log.last_checkpoint()) {
    static constexpr std::string_view kNative = "pgrelay-native-checkpoint";
    return std::string_view(reinterpret_cast<const char*>(checkpoint->data()), checkpoint->size())
        .starts_with(kNative);
  }
  auto session = capture::PgSession::connect(upstream.conninfo());
  if (!session.ok()) return session.error();
  if (auto possible = capture::check_native_capture_possible(**session, options.schema);
      !possible.ok()) {
    logger.info("using trigger capture: " + possible.error().message);
    return false;
  }
  return true;
}

Result<std::unique_ptr<ServeCapture>> start_capture(const ServeOptions& options,
                                                    const upstream::UpstreamConfig& upstream,
                                                    const std::string& dir, log::ChangeLog& log,
                                                    log::InProgressTransactions& in_progress,
                                                    Logger& logger,
                                                    std::shared_ptr<capture::ReadingLoop> loop) {
  auto native = wants_native_capture(options, upstream, log, logger);
  if (!native.ok()) return native.error();
  if (*native) {
    logger.info("starting native capture", {{"schema", options.schema},
                                            {"upstream", upstream.describe()},
                                            {"database", upstream.dbname},
                                            {"slot", native_slot_name(log.system_id())}});
    auto link = NativeCaptureLink::start(upstream, options.schema, dir, log, in_progress, &logger,
                                         std::move(loop));
    if (!link.ok()) return link.error();
    const auto& setup = (*link)->setup_report();
    logger.info("native capture streaming",
                {{"captured_tables", setup.captured_tables},
                 {"ddl_tracking", setup.event_trigger ? "event trigger (exact)" : "interval"}});
    return std::unique_ptr<ServeCapture>(std::move(*link));
  }
  logger.info("installing trigger capture", {{"schema", options.schema},
                                             {"upstream", upstream.describe()},
                                             {"database", upstream.dbname}});
  auto link = TriggerCaptureLink::start(upstream, options.schema, dir, log);
  if (!link.ok()) return link.error();
  const auto& installed = (*link)->install_report();
  logger.info("trigger capture installed",
              {{"captured_tables", installed.captured_tables},
               {"ddl_tracking", installed.event_trigger ? "event trigger (exact)" : "interval"}});
  return std::unique_ptr<ServeCapture>(std::move(*link));
}

// 3D000 for a database the upstream does not have (or 55000 for one that takes no
// connections), asked in the upstream URL's database.
Status check_database_exists(const upstream::UpstreamConfig& upstream,
                             const std::string& database) {
  auto session = capture::PgSession::connect(upstream.conninfo());
  if (!session.ok()) return session.error();
  auto rows = (*session)->exec("SELECT datallowconn FROM pg_catalog.pg_database WHERE datname = $1",
                               {database});
  if (!rows.ok()) return rows.error();
  if (rows->rows() == 0) {
    return Error::make(sqlstate::kInvalidCatalogName,
                       "database \"" + database + "\" does not exist");
  }
  if (rows->value(0, 0) != "t") {
    return Error::make(sqlstate::kObjectNotInPrerequisiteState,
                       "database \"" + database + "\" is not currently accepting connections");
  }
  return Status::ok_status();
}

}  // namespace

// The capture mode asked for. By default the private PostgreSQL is captured natively where it
// can be (its WAL is pgrelay's alone), and an upstream given by URL with triggers: a slot there
// would hold the upstream's WAL whenever pgrelay is down, which its owner should choose.
std::string capture_mode(const ServeOptions& options) {
  if (!options.capture.empty()) return options.capture;
  return options.upstream.empty() ? "auto" : "trigger";
}

std::string capture_dir(const std::string& data_dir, const std::string& first_database,
                        const std::string& database) {
  if (database == first_database) return data_dir;
  std::string name;
  for (unsigned char c : database) {
    if (std::isalnum(c) || c == '_' || c == '-') {
      name += static_cast<char>(c);
    } else {
      char escaped[4];
      std::snprintf(escaped, sizeof escaped, "%%%02X", c);
      name += escaped;
    }
  }
  return data_dir + "/databases/" + name;
}

std::vector<CapturedDatabaseEntry> read_captured_databases(const std::string& data_dir) {
  std::vector<CapturedDatabaseEntry> out;
  std::ifstream in(data_dir + "/" + kIndexFile);
  if (!in) return out;
  auto parsed = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_object() || !parsed["databases"].is_array()) return out;
  for (const auto& entry : parsed["databases"]) {
    if (!entry.is_object() || !entry["name"].is_string() || !entry["dir"].is_string()) continue;
    const bool in_scope = !entry.contains("in_scope") || !entry["in_scope"].is_boolean() ||
                          entry["in_scope"].get<bool>();
    out.push_back({entry["name"].get<std::string>(), entry["dir"].get<std::string>(), in_scope});
  }
  return out;
}

DatabaseCaptures::DatabaseCaptures(const ServeOptions& options, upstream::UpstreamConfig upstream,
                                   asio::io_context& io, Logger& logger, HopTrace* hop_trace)
    : options_(options),
      upstream_(std::move(upstream)),
      io_(io),
      logger_(logger),
      hop_trace_(hop_trace) {}

DatabaseCaptures::~DatabaseCaptures() {
  stop_workers();
}

void DatabaseCaptures::stop_workers() {
  std::map<std::string, std::unique_ptr<CatalogWorker>> workers;
  std::vector<std::unique_ptr<CatalogWorker>> retired;
  {
    std::lock_guard lock(mu_);
    workers.swap(workers_);
    retired.swap(retired_);
  }
  workers.clear();
}

void DatabaseCaptures::leave_loop() {
  std::vector<std::shared_ptr<Running>> running;
  {
    std::lock_guard lock(mu_);
    for (const auto& [name, weak] : running_) {
      if (auto strong = weak.lock()) running.push_back(std::move(strong));
    }
  }
  for (const auto& r : running) {
    if (r->capture) r->capture->leave_loop();
  }
}

Status DatabaseCaptures::write_index(const std::vector<CapturedDatabaseEntry>& entries) {
  nlohmann::json index = {{"databases", nlohmann::json::array()}};
  for (const auto& entry : entries) {
    index["databases"].push_back(
        {{"name", entry.name}, {"dir", entry.dir}, {"in_scope", entry.in_scope}});
  }
  const std::string text = index.dump(2) + "\n";
  return log::write_file_atomically(
      options_.data_dir, kIndexFile,
      ByteView(reinterpret_cast<const std::uint8_t*>(text.data()), text.size()));
}

Status DatabaseCaptures::remember(const std::string& database, const std::string& dir) {
  std::lock_guard lock(index_mu_);
  auto known = read_captured_databases(options_.data_dir);
  for (const auto& entry : known) {
    if (entry.name == database && entry.in_scope) return Status::ok_status();
  }
  std::erase_if(known, [&](const auto& entry) { return entry.name == database; });
  known.push_back({database, dir, true});
  return write_index(known);
}

Status DatabaseCaptures::note_scope(const server::CaptureScope& scope) {
  std::lock_guard lock(index_mu_);
  auto known = read_captured_databases(options_.data_dir);
  bool changed = false;
  for (auto& entry : known) {
    const bool admitted = scope.admits(entry.name);
    changed = changed || admitted != entry.in_scope;
    entry.in_scope = admitted;
  }
  return changed ? write_index(known) : Status::ok_status();
}

Result<server::CapturedParts> DatabaseCaptures::start(const std::string& database) {
  auto started = start_capture_of(database);
  if (!started.ok() && started.error().sqlstate != sqlstate::kInvalidCatalogName) {
    logger_.warning("could not start capturing a database: its slots are refused until it can",
                    {{"database", database},
                     {"sqlstate", started.error().sqlstate},
                     {"error", started.error().message},
                     {"hint", started.error().hint}});
  }
  return started;
}

Result<server::CapturedParts> DatabaseCaptures::start_capture_of(const std::string& database) {
  auto upstream = upstream_;
  upstream.dbname = database;
  if (database != upstream_.dbname) PGRELAY_TRY(check_database_exists(upstream_, database));
  const std::string dir = capture_dir(options_.data_dir, upstream_.dbname, database);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  log::LogOptions log_options;
  log_options.dir = dir + "/log";
  log_options.hop_trace = hop_trace_;
  auto change_log = log::ChangeLog::open(log_options);
  if (!change_log.ok()) return change_log.error();
  if (auto checkpoint = (*change_log)->last_checkpoint()) {
    if (auto followed = capture::decode_follower_checkpoint(*checkpoint);
        !followed.ok() || followed->has_value()) {
      return Error::make(
          sqlstate::kObjectNotInPrerequisiteState,
          "the log in " + log_options.dir + " is a follower's, rebuilt from a NATS stream",
          "Run this data directory with --follow, or give the capturing pgrelay "
          "a --data-dir of its own.");
    }
  }
  auto running = std::make_shared<Running>();
  running->log = std::move(*change_log);
  auto capture = start_capture(options_, upstream, dir, *running->log, running->in_progress,
                               logger_, reading_loop_);
  if (!capture.ok()) return capture.error();
  running->capture = std::move(*capture);
  const std::string relative =
      dir == options_.data_dir ? std::string() : dir.substr(options_.data_dir.size() + 1);
  if (auto saved = remember(database, relative); !saved.ok()) logger_.error(saved.error());
  {
    std::lock_guard lock(mu_);
    running_[database] = running;
    log_ids_[database] = running->log->system_id();
  }
  logger_.info("capturing database", {{"database", database}, {"dir", dir}});
  server::CapturedParts parts;
  parts.log = running->log.get();
  parts.capture = running->capture.get();
  parts.in_progress = &running->in_progress;
  parts.owner = std::move(running);
  return parts;
}

void DatabaseCaptures::prepare(const std::string& database, const std::optional<Error>& refusal) {
  if (refusal) {
    // Said once per database and run: where pgrelay does not capture, and why.
    logger_.info(
        "not capturing database",
        {{"database", database}, {"sqlstate", refusal->sqlstate}, {"reason", refusal->message}});
  }
  CatalogWorker* worker = nullptr;
  {
    std::lock_guard lock(mu_);
    if (auto it = workers_.find(database); it != workers_.end()) worker = it->second.get();
  }
  if (!worker) {
    const std::string conninfo = upstream_.conninfo(database);
    auto catalog = upstream::VirtualCatalog::open(conninfo, options_.schema);
    Status installed = catalog.ok() ? (*catalog)->install() : Status(catalog.error());
    if (!installed.ok()) {
      logger_.warning(
          "could not install pgrelay's catalog in this database: replication "
          "views there show the upstream's own",
          {{"database", database},
           {"error", installed.error().message},
           {"hint", "Grant CREATE on the database to pgrelay's upstream role."}});
      return;
    }
    upstream::CatalogSettings settings;
    settings.max_replication_slots = options_.max_replication_slots;
    settings.max_wal_senders = options_.max_wal_senders;
    settings.wal_sender_timeout_ms = options_.wal_sender_timeout_seconds * 1000;
    (void)(*catalog)->set_settings(settings);
    auto made =
        std::make_unique<CatalogWorker>(std::move(*catalog), conninfo, database, io_, *hubs_);
    worker = made.get();
    std::lock_guard lock(mu_);
    workers_[database] = std::move(made);
  }
  worker->set_capture_refusal(refusal);
  worker->refresh();
  worker->flush();
}

void DatabaseCaptures::forget(const std::string& database) {
  std::unique_ptr<CatalogWorker> worker;
  {
    std::lock_guard lock(mu_);
    if (auto it = workers_.find(database); it != workers_.end()) {
      worker = std::move(it->second);
      workers_.erase(it);
    }
  }
  if (worker) worker->stop();
  std::optional<std::uint64_t> log_id;
  {
    std::lock_guard lock(mu_);
    if (worker) retired_.push_back(std::move(worker));
    if (auto it = log_ids_.find(database); it != log_ids_.end()) log_id = it->second;
    log_ids_.erase(database);
  }
  if (log_id && database != upstream_.dbname) {
    // Native capture's slot there, if it has one (an inactive one: the capture has stopped).
    auto session = capture::PgSession::connect(upstream_.conninfo());
    Status dropped = session.ok() ? Status::ok_status() : Status(session.error());
    if (session.ok()) {
      auto result = (*session)->exec(
          "SELECT pg_catalog.pg_drop_replication_slot(slot_name) FROM "
          "pg_catalog.pg_replication_slots "
          "WHERE slot_name = $1 AND database = $2 AND NOT active",
          {native_slot_name(*log_id), database});
      if (!result.ok()) dropped = result.error();
    }
    if (!dropped.ok()) {
      logger_.warning("could not drop native capture's slot in a database being dropped",
                      {{"database", database},
                       {"slot", native_slot_name(*log_id)},
                       {"error", dropped.error().message}});
    }
    std::error_code ec;
    std::filesystem::remove_all(capture_dir(options_.data_dir, upstream_.dbname, database), ec);
  }
  {
    std::lock_guard lock(index_mu_);
    auto known = read_captured_databases(options_.data_dir);
    const auto before = known.size();
    std::erase_if(known, [&](const auto& entry) { return entry.name == database; });
    if (known.size() != before) {
      if (auto saved = write_index(known); !saved.ok()) logger_.error(saved.error());
    }
  }
  logger_.info("no longer capturing database: it is being dropped", {{"database", database}});
}

void DatabaseCaptures::refresh_all() {
  std::lock_guard lock(mu_);
  for (auto& [name, worker] : workers_) worker->refresh();
}

void DatabaseCaptures::flush_all() {
  std::vector<CatalogWorker*> workers;
  {
    std::lock_guard lock(mu_);
    for (auto& [name, worker] : workers_) workers.push_back(worker.get());
  }
  for (auto* worker : workers) worker->flush();
}

std::vector<std::string> DatabaseCaptures::captured_before() const {
  std::vector<std::string> names;
  for (const auto& entry : read_captured_databases(options_.data_dir)) {
    names.push_back(entry.name);
  }
  return names;
}

std::vector<DatabaseFigures> DatabaseCaptures::figures() const {
  std::vector<DatabaseFigures> out;
  std::lock_guard lock(mu_);
  for (const auto& [name, weak] : running_) {
    auto running = weak.lock();
    if (!running) continue;
    out.push_back({name, running->capture->mode(), running->capture->figures(),
                   running->log->stats(), running->log->last_end_lsn()});
  }
  return out;
}

}  // namespace pgrelay::cli
