// `pgrelay serve`: capture from an upstream, keep the change log, and serve clients.
#include "cli/serve_command.h"

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "base/logger.h"
#include "cli/capture_link.h"
#include "cli/pid_file.h"
#include "log/change_log.h"
#include "log/slots.h"
#include "server/metrics.h"
#include "server/metrics_endpoint.h"
#include "server/server.h"
#include "server/sql_rewrite.h"
#include "server/tls_setup.h"
#include "upstream/embedded_postgres.h"
#include "upstream/virtual_catalog.h"
#include "wire/md5_auth.h"
#include "wire/scram.h"

namespace pgrelay::cli {
namespace {

void print_error(const Error& error) {
  std::fprintf(stderr, "pgrelay: error: %s\n", error.message.c_str());
  if (!error.detail.empty()) std::fprintf(stderr, "pgrelay: detail: %s\n", error.detail.c_str());
  if (!error.hint.empty()) std::fprintf(stderr, "pgrelay: hint: %s\n", error.hint.c_str());
}

// Percent-encodes a URL component (user, password, database name).
std::string url_encode(std::string_view text) {
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      char buffer[4];
      std::snprintf(buffer, sizeof buffer, "%%%02X", c);
      out += buffer;
    }
  }
  return out;
}

Result<std::pair<std::string, int>> parse_listen(const std::string& text) {
  auto colon = text.rfind(':');
  std::string host = colon == std::string::npos ? text : text.substr(0, colon);
  std::string port_text = colon == std::string::npos ? "5433" : text.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  int port = 0;
  try {
    port = std::stoi(port_text);
  } catch (...) {
    port = -1;
  }
  if (host.empty() || port <= 0 || port > 65535) {
    return Error::make(sqlstate::kInvalidParameterValue, "invalid --listen value \"" + text + "\"",
                       "Use HOST:PORT, e.g. 127.0.0.1:5433.");
  }
  return std::make_pair(host, port);
}

// The mirror of slots and walsenders kept in the upstream's virtual catalog, and the requests
// clients make through it, on a thread of its own (libpq blocks).
class CatalogWorker {
 public:
  CatalogWorker(std::unique_ptr<upstream::VirtualCatalog> catalog, std::string conninfo,
                asio::io_context& io, server::ReplicationHub& hub)
      : catalog_(std::move(catalog)), conninfo_(std::move(conninfo)), io_(io), hub_(hub) {
    thread_ = std::thread([this] { loop(); });
  }
  ~CatalogWorker() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    written_cv_.notify_all();
    thread_.join();
  }

  // Called on the io thread after slots or walsenders changed.
  void refresh() {
    Snapshot snapshot{hub_.slots().list(), hub_.walsenders()};
    std::lock_guard lock(mu_);
    pending_ = std::move(snapshot);
    ++requested_;
  }

  // Blocks until every refresh() before the call is written upstream (bounded: a broken
  // upstream connection must not hang a replication command).
  void flush() {
    std::unique_lock lock(mu_);
    auto target = requested_;
    written_cv_.wait_for(lock, std::chrono::seconds(5),
                         [&] { return written_ >= target || stopping_; });
  }

 private:
  struct Snapshot {
    std::vector<log::Slot> slots;
    std::vector<server::WalsenderInfo> walsenders;
  };

  void loop() {
    wire::Lsn head;
    auto next_refresh = std::chrono::steady_clock::now();
    auto next_take = next_refresh;
    for (;;) {
      std::optional<Snapshot> snapshot;
      std::uint64_t generation = 0;
      {
        std::unique_lock lock(mu_);
        if (stopping_) return;
        snapshot = std::move(pending_);
        pending_.reset();
        generation = requested_;
      }
      if (snapshot) {
        write_mirror(*snapshot);
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
        wire::Lsn now = hub_.log().last_end_lsn();
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

  // The upstream went away (restart, network): reopen with backoff, then rewrite the whole
  // mirror, since the state tables may have been recreated or missed updates.
  void reconnect() {
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
        asio::post(io_, [this] { refresh(); });
        return;
      }
      delay = std::min(delay * 2, std::chrono::milliseconds(5000));
    }
  }

  static std::string slot_key(const upstream::SlotRow& row) {
    return row.plugin + '|' + row.database + '|' + (row.active ? "t" : "f") + '|' +
           std::to_string(row.active_pid.value_or(0)) + '|' + row.restart_lsn->to_string() + '|' +
           row.confirmed_flush_lsn->to_string() + '|' + row.wal_status + '|' +
           (row.two_phase ? "t" : "f") + (row.temporary ? "t" : "f");
  }

  void write_mirror(const Snapshot& snapshot) {
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

  // On the io thread: carry out what clients asked through the catalog functions.
  void apply(const std::vector<upstream::CatalogRequest>& requests) {
    for (const auto& request : requests) {
      switch (request.kind) {
        case upstream::CatalogRequest::Kind::kDropSlot:
          (void)hub_.slots().drop(request.slot_name);
          break;
        case upstream::CatalogRequest::Kind::kCreateSlot: {
          log::Slot slot;
          slot.name = request.slot_name;
          slot.plugin = request.plugin;
          slot.database = hub_.upstream().dbname;
          slot.temporary = request.temporary;
          slot.two_phase = request.two_phase;
          slot.confirmed_flush = request.lsn;
          slot.restart_lsn = request.lsn;
          (void)hub_.slots().create(slot);
          break;
        }
        case upstream::CatalogRequest::Kind::kTerminate:
          hub_.terminate(request.pid);
          break;
      }
    }
    refresh();
  }

  std::unique_ptr<upstream::VirtualCatalog> catalog_;
  std::string conninfo_;
  asio::io_context& io_;
  server::ReplicationHub& hub_;
  std::mutex mu_;
  std::condition_variable written_cv_;
  std::optional<Snapshot> pending_;
  std::uint64_t requested_ = 0;  // refresh() calls so far
  std::uint64_t written_ = 0;    // the newest of them written upstream
  bool stopping_ = false;
  // What the upstream mirror holds, to write only what changed (catalog thread only).
  std::map<std::string, std::string> mirrored_slots_;
  std::string mirrored_walsenders_ = "-";
  bool mirror_reconciled_ = false;
  std::thread thread_;
};

// One user, "NAME SECRET [replication]", SECRET as pg_authid holds it (SCRAM-SHA-256$... or
// md5...); `where` names the line for errors. An empty or comment line gives nullopt.
Result<std::optional<server::User>> parse_user_line(std::string line, const std::string& where) {
  if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
  std::istringstream fields(line);
  server::User user;
  std::string flag, extra;
  if (!(fields >> user.name)) return std::optional<server::User>();
  fields >> user.secret >> flag >> extra;
  bool secret_ok = user.secret.rfind("SCRAM-SHA-256$", 0) == 0 || user.secret.rfind("md5", 0) == 0;
  if (user.secret.empty() || !secret_ok || (!flag.empty() && flag != "replication") ||
      !extra.empty()) {
    return Error::make(sqlstate::kInvalidParameterValue,
                       where + ": expected NAME SECRET [replication]",
                       "SECRET is a SCRAM-SHA-256 or md5 secret; make one with "
                       "`pgrelay hash-password`. Passwords never appear in pgrelay's settings.");
  }
  if (user.secret.rfind("SCRAM-SHA-256$", 0) == 0 &&
      !wire::ScramVerifier::parse(user.secret).ok()) {
    return Error::make(sqlstate::kInvalidParameterValue, where + ": invalid SCRAM secret",
                       "Make one with `pgrelay hash-password`.");
  }
  user.replication = flag == "replication";
  return std::optional<server::User>(std::move(user));
}

// pgrelay's own users: the lines of the users file, then --user entries.
Result<std::vector<server::User>> read_users(const ServeOptions& options) {
  std::vector<server::User> users;
  auto add = [&](const std::string& line, const std::string& where) -> Status {
    auto user = parse_user_line(line, where);
    if (!user.ok()) return user.error();
    if (*user) users.push_back(std::move(**user));
    return Status::ok_status();
  };
  if (!options.users_file.empty()) {
    std::ifstream in(options.users_file);
    if (!in) {
      return Error::make(sqlstate::kIoError,
                         "could not open users file \"" + options.users_file + "\"",
                         "Check --users; create lines with `pgrelay hash-password`.");
    }
    std::string line;
    for (int number = 1; std::getline(in, line); ++number) {
      PGRELAY_TRY(add(line, options.users_file + ":" + std::to_string(number)));
    }
  }
  for (const auto& entry : options.users) PGRELAY_TRY(add(entry, "--user"));
  return users;
}

// A startup error as one log line, its detail and hint as fields.
void log_error(Logger& logger, const Error& error) {
  logger.error(error.message,
               {{"sqlstate", error.sqlstate}, {"detail", error.detail}, {"hint", error.hint}});
}

// The capture mode asked for. By default the private PostgreSQL is captured natively where it
// can be (its WAL is pgrelay's alone), and an upstream given by URL with triggers: a slot there
// would hold the upstream's WAL whenever pgrelay is down, which its owner should choose.
std::string capture_mode(const ServeOptions& options) {
  if (!options.capture.empty()) return options.capture;
  return options.upstream.empty() ? "auto" : "trigger";
}

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
                                                    log::ChangeLog& log, Logger& logger) {
  auto native = wants_native_capture(options, upstream, log, logger);
  if (!native.ok()) return native.error();
  if (*native) {
    logger.info("starting native capture", {{"schema", options.schema},
                                            {"upstream", upstream.describe()},
                                            {"database", upstream.dbname},
                                            {"slot", native_slot_name(log.system_id())}});
    auto link = NativeCaptureLink::start(upstream, options.schema, options.data_dir, log, &logger);
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
  auto link = TriggerCaptureLink::start(upstream, options.schema, options.data_dir, log);
  if (!link.ok()) return link.error();
  const auto& installed = (*link)->install_report();
  logger.info("trigger capture installed",
              {{"captured_tables", installed.captured_tables},
               {"ddl_tracking", installed.event_trigger ? "event trigger (exact)" : "interval"}});
  return std::unique_ptr<ServeCapture>(std::move(*link));
}

// The values /metrics reads at scrape time beside the server's own counters.
void publish_metrics(server::MetricWriter& out, const ServeCapture& capture,
                     const log::ChangeLog& log, server::ReplicationHub& hub) {
  auto stats = capture.figures();
  out.counter({"pgrelay_captured_transactions_total", "Transactions captured into the log"}, {},
              static_cast<double>(stats.transactions));
  out.counter({"pgrelay_captured_changes_total", "Row changes captured into the log"}, {},
              static_cast<double>(stats.rows));
  out.counter({"pgrelay_capture_reconnects_total", "Times capture reconnected to the upstream"}, {},
              static_cast<double>(stats.reconnects));
  auto log_stats = log.stats();
  out.gauge({"pgrelay_log_size_bytes", "Bytes of change log on disk"}, {},
            static_cast<double>(log_stats.total_bytes));
  out.gauge({"pgrelay_log_segments", "Segments of the change log"}, {},
            static_cast<double>(log_stats.segments));
  wire::Lsn head = log.last_end_lsn();
  out.gauge({"pgrelay_log_head_lsn", "End of the last logged transaction, as a number"}, {},
            static_cast<double>(head.value()));
  for (const auto& slot : hub.slots().list()) {
    std::uint64_t lag = head.value() > slot.confirmed_flush.value()
                            ? head.value() - slot.confirmed_flush.value()
                            : 0;
    out.gauge({"pgrelay_slot_lag_bytes", "Log bytes past the slot's confirmed_flush_lsn"},
              {{"slot", slot.name}}, static_cast<double>(lag));
    out.gauge({"pgrelay_slot_active", "1 while a walsender streams the slot"},
              {{"slot", slot.name}}, slot.active_pid != 0 ? 1.0 : 0.0);
  }
  out.gauge({"pgrelay_walsenders", "Replication streams being served"}, {},
            static_cast<double>(hub.walsenders().size()));
}

}  // namespace

int run_hash_password(const std::string& md5_user) {
  std::string password;
  if (!std::getline(std::cin, password) || password.empty()) {
    print_error(Error::make(sqlstate::kInvalidParameterValue, "no password on standard input",
                            "Run: printf '%s\\n' 'the password' | pgrelay hash-password"));
    return 2;
  }
  if (!md5_user.empty()) {
    std::printf("%s\n", wire::md5_password_hash(md5_user, password).c_str());
    return 0;
  }
  auto verifier = wire::ScramVerifier::from_password(password);
  if (!verifier.ok()) {
    print_error(verifier.error());
    return 1;
  }
  std::printf("%s\n", verifier->to_string().c_str());
  return 0;
}

int run_serve(const ServeOptions& options) {
  auto level = parse_log_level(options.log_level);
  auto format = parse_log_format(options.log_format);
  if (!level.ok() || !format.ok()) {
    print_error(!level.ok() ? level.error() : format.error());
    return 2;
  }
  // Declared before the io_context: sessions it still holds log their end when it goes.
  LoggerOptions logger_options;
  logger_options.level = *level;
  logger_options.format = *format;
  Logger logger(std::move(logger_options));
  server::Metrics metrics;
  auto report = [&logger](const Error& error) { log_error(logger, error); };

  auto listen = parse_listen(options.listen);
  if (!listen.ok()) {
    report(listen.error());
    return 2;
  }
  if (!options.upstream.empty() && !options.databases.empty()) {
    report(Error::make(sqlstate::kInvalidParameterValue,
                       "--database creates databases in pgrelay's private PostgreSQL only",
                       "Create them on the upstream yourself (CREATE DATABASE), or drop "
                       "--upstream to use the private instance."));
    return 2;
  }
  auto pid_file = PidFile::acquire(options.data_dir);
  if (!pid_file.ok()) {
    report(pid_file.error());
    return 1;
  }

  // Without --upstream, pgrelay serves a private PostgreSQL of its own.
  std::unique_ptr<upstream::EmbeddedPostgres> embedded;
  std::string upstream_url = options.upstream;
  if (upstream_url.empty()) {
    upstream::EmbeddedOptions embedded_options;
    embedded_options.data_dir = options.data_dir;
    embedded_options.bin_dir = options.pg_bin;
    embedded_options.run_as = options.run_as;
    // Native capture decodes the private instance's WAL; trigger capture needs no more than
    // replica.
    embedded_options.logical_decoding = capture_mode(options) != "trigger";
    embedded_options.on_event = [&logger](const std::string& text) { logger.info(text); };
    auto started = upstream::EmbeddedPostgres::start(std::move(embedded_options));
    if (!started.ok()) {
      report(started.error());
      return 1;
    }
    embedded = std::move(*started);
    for (const auto& database : options.databases) {
      if (auto created = embedded->ensure_database(database); !created.ok()) {
        report(created.error());
        return 1;
      }
    }
    upstream_url = embedded->conninfo("postgres");
  }
  auto upstream = upstream::UpstreamConfig::parse(upstream_url);
  if (!upstream.ok()) {
    report(upstream.error());
    return 2;
  }

  log::LogOptions log_options;
  log_options.dir = options.data_dir + "/log";
  auto change_log = log::ChangeLog::open(log_options);
  if (!change_log.ok()) {
    report(change_log.error());
    return 1;
  }
  log::SlotRegistryOptions slot_options;
  slot_options.max_slots = static_cast<std::size_t>(options.max_replication_slots);
  slot_options.persist_every = 0;
  slot_options.persist_interval = std::chrono::milliseconds(1000);
  auto slots = log::SlotRegistry::open(log_options.dir, slot_options);
  if (!slots.ok()) {
    report(slots.error());
    return 1;
  }

  auto capture = start_capture(options, *upstream, **change_log, logger);
  if (!capture.ok()) {
    report(capture.error());
    return 1;
  }

  asio::io_context io;
  asio::thread_pool blocking(4);
  server::ReplicationHub hub(io.get_executor(), blocking, **change_log, **slots, capture->get(),
                             *upstream);

  server::ServerContext context;
  context.logger = &logger;
  context.metrics = &metrics;
  context.upstream = *upstream;
  context.hub = &hub;
  context.settings.wal_sender_timeout = std::chrono::seconds(options.wal_sender_timeout_seconds);
  context.auth.timeout = std::chrono::seconds(options.authentication_timeout_seconds);
  context.settings.max_wal_senders = options.max_wal_senders;
  context.settings.max_replication_slots = options.max_replication_slots;

  // Clients log in as the upstream's user, with its password, unless a users file says who.
  bool own_users = !options.users_file.empty() || !options.users.empty();
  if (own_users) {
    auto users = read_users(options);
    if (!users.ok()) {
      report(users.error());
      return 2;
    }
    context.auth.users = std::move(*users);
  } else {
    server::User user{upstream->user, "", true};
    if (!upstream->password.empty()) {
      auto verifier = wire::ScramVerifier::from_password(upstream->password);
      if (!verifier.ok()) {
        report(verifier.error());
        return 1;
      }
      user.secret = verifier->to_string();
    }
    context.auth.users.push_back(user);
  }
  auto mock = wire::random_bytes(32);
  if (mock.ok()) context.auth.mock_secret = *mock;
  // Without a password only loopback clients may enter (trust); with one, SCRAM everywhere.
  if (upstream->password.empty() && !own_users) {
    context.auth.default_method = server::AuthMethod::kReject;
    for (const char* loopback : {"127.0.0.0/8", "::1/128"}) {
      context.auth.rules.push_back(
          {*server::parse_auth_network(loopback), server::AuthMethod::kTrust});
    }
  }
  for (const auto& rule : options.auth_rules) {
    auto eq = rule.find('=');
    auto network = server::parse_auth_network(rule.substr(0, eq));
    auto method = eq == std::string::npos
                      ? Result<server::AuthMethod>(Error::make(
                            sqlstate::kInvalidParameterValue,
                            "invalid --auth rule \"" + rule + "\"", "Use ADDRESS/PREFIX=METHOD."))
                      : server::parse_auth_method(rule.substr(eq + 1));
    if (!network.ok() || !method.ok()) {
      report(!network.ok() ? network.error() : method.error());
      return 2;
    }
    if (*method == server::AuthMethod::kTrust && !network->address().is_loopback() &&
        !network->address().is_v4_mapped()) {
      logger.warning("trust authentication admits anyone from this network", {{"rule", rule}});
    }
    context.auth.rules.insert(context.auth.rules.begin(), {*network, *method});
  }

  std::unique_ptr<asio::ssl::context> server_tls;
  if (!options.no_tls) {
    std::string cert =
        options.tls_cert.empty() ? options.data_dir + "/tls/server.crt" : options.tls_cert;
    std::string key =
        options.tls_key.empty() ? options.data_dir + "/tls/server.key" : options.tls_key;
    if (options.tls_cert.empty()) {
      auto generated = server::ensure_self_signed_certificate(cert, key, "pgrelay");
      if (!generated.ok()) {
        report(generated.error());
        return 1;
      }
    }
    auto tls = server::make_server_tls(cert, key);
    if (!tls.ok()) {
      report(tls.error());
      return 1;
    }
    server_tls = std::move(*tls);
    context.server_tls = server_tls.get();
  }
  auto upstream_tls = server::make_upstream_tls(*upstream);
  if (!upstream_tls.ok()) {
    report(upstream_tls.error());
    return 1;
  }
  context.upstream_tls = upstream_tls->get();

  server::SqlRewriter rewriter(server::RewriteOptions{options.schema});
  context.rewrite = [&rewriter](
                        std::string_view sql,
                        const server::StatementSource& source) -> std::optional<std::string> {
    if (!rewriter.may_need_rewrite(sql, source)) return std::nullopt;
    auto rewritten = rewriter.rewrite(sql, source);
    if (!rewritten.ok()) return std::nullopt;
    return *rewritten;
  };

  auto catalog = upstream::VirtualCatalog::open(upstream->conninfo(), options.schema);
  if (!catalog.ok()) {
    report(catalog.error());
    return 1;
  }
  if (auto installed = (*catalog)->install(); !installed.ok()) {
    report(installed.error());
    return 1;
  }
  upstream::CatalogSettings catalog_settings;
  catalog_settings.max_replication_slots = options.max_replication_slots;
  catalog_settings.max_wal_senders = options.max_wal_senders;
  catalog_settings.wal_sender_timeout_ms = options.wal_sender_timeout_seconds * 1000;
  (void)(*catalog)->set_settings(catalog_settings);
  CatalogWorker catalog_worker(std::move(*catalog), upstream->conninfo(), io, hub);
  hub.on_change([&catalog_worker] { catalog_worker.refresh(); });
  hub.on_mirror_sync([&catalog_worker] { catalog_worker.flush(); });
  catalog_worker.refresh();

  server::Server server(io, context);
  auto bound = server.listen(listen->first, listen->second);
  if (!bound.ok()) {
    report(bound.error());
    return 1;
  }
  server.start();

  // Scrape-time values for /metrics (on the io thread).
  ServeCapture& capture_link = **capture;
  metrics.add_collector(
      [&](server::MetricWriter& out) { publish_metrics(out, capture_link, **change_log, hub); });
  std::unique_ptr<server::MetricsEndpoint> metrics_endpoint;
  if (!options.metrics.empty()) {
    auto address = server::parse_metrics_address(options.metrics);
    if (!address.ok()) {
      report(address.error());
      return 2;
    }
    metrics_endpoint =
        std::make_unique<server::MetricsEndpoint>(io, [&metrics] { return metrics.render(); });
    auto metrics_bound = metrics_endpoint->listen(address->first, address->second);
    if (!metrics_bound.ok()) {
      report(metrics_bound.error());
      return 1;
    }
    metrics_endpoint->start();
    logger.info("serving metrics", {{"address", options.metrics}, {"path", "/metrics"}});
  }

  // Shutdown: stop accepting, let walsenders end their streams with CopyDone and pass-through
  // sessions finish the reply in flight (then FATAL 57P01, as Postgres), close what is left
  // after a few seconds, and stop.
  asio::signal_set signals(io, SIGINT, SIGTERM);
  asio::steady_timer shutdown_timer(io);
  std::function<void()> wait_for_sessions;
  auto deadline = std::chrono::steady_clock::time_point::max();
  wait_for_sessions = [&] {
    if (server.session_count() == 0 || std::chrono::steady_clock::now() >= deadline) {
      server.stop();
      if (metrics_endpoint) metrics_endpoint->stop();
      io.stop();
      return;
    }
    shutdown_timer.expires_after(std::chrono::milliseconds(50));
    shutdown_timer.async_wait([&](const std::error_code&) { wait_for_sessions(); });
  };
  signals.async_wait([&](const std::error_code& error, int) {
    if (error) return;
    logger.info("shutting down", {{"sessions", server.session_count()}});
    server.stop_accepting();
    hub.stop_all();
    context.shutdown.trigger();
    deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    wait_for_sessions();
  });

  std::string host =
      listen->first == "0.0.0.0" || listen->first == "::" ? "127.0.0.1" : listen->first;
  if (host.find(':') != std::string::npos) host = "[" + host + "]";
  std::string url = "postgres://" + url_encode(upstream->user);
  if (!upstream->password.empty()) url += ":" + url_encode(upstream->password);
  url += "@" + host + ":" + std::to_string(bound->port()) + "/" + url_encode(upstream->dbname);
  (void)pid_file->publish_url(url);
  std::printf("pgrelay ready: %s\n", url.c_str());
  std::fflush(stdout);
  logger.info("ready", {{"listen", host + ":" + std::to_string(bound->port())},
                        {"upstream", upstream->describe()},
                        {"private_postgres", embedded != nullptr}});

  io.run();
  blocking.join();
  capture->reset();
  (void)(*slots)->flush();
  logger.info("stopped");
  // The private PostgreSQL stops last, once nothing of pgrelay uses it (embedded's destructor,
  // after the catalog worker's).
  return 0;
}

}  // namespace pgrelay::cli

namespace pgrelay::cli {

Subcommand add_serve_command(CLI::App& parent) {
  auto options = std::make_shared<ServeOptions>();
  CLI::App* cmd = parent.add_subcommand(
      "serve",
      "Serve PostgreSQL with logical replication: capture the upstream's row changes (with\n"
      "triggers, or natively from its own slot: --capture) into pgrelay's change log,\n"
      "answer replication connections (replication=database) from that log, and pass every\n"
      "other session through to the upstream. Without --upstream, pgrelay starts a private\n"
      "PostgreSQL in DATA_DIR/pg (the first run creates it with initdb) and serves that;\n"
      "`pgrelay` alone does the same.\n"
      "When clients can connect it prints one line on stdout:\n"
      "  pgrelay ready: postgres://USER[:PASSWORD]@HOST:PORT/DBNAME\n"
      "Ctrl-C or SIGTERM stops it cleanly, with whatever it started.\n\n"
      "Every option can also come from a TOML file given with --config (or PGRELAY_CONFIG), as\n"
      "`name = value` lines under a [serve] table, e.g. listen = \"0.0.0.0:5433\",\n"
      "database = [\"zero_cvr\", \"zero_cdb\"], and from the environment variable named after it\n"
      "(PGRELAY_LISTEN, PGRELAY_DATA_DIR, ...). The command line wins over the file, the file\n"
      "over the environment.");
  auto env = [](CLI::Option* option, const char* name) { option->envname(name); };
  env(cmd->add_option("--upstream,-u", options->upstream,
                      "The upstream server, as a libpq URL or conninfo string, e.g.\n"
                      "postgres://app:secret@db.example.com:5432/app?sslmode=require. Clients\n"
                      "log in to pgrelay with this user and password unless --users/--user\n"
                      "name others. Default: a private PostgreSQL in DATA_DIR/pg."),
      "PGRELAY_UPSTREAM");
  env(cmd->add_option("--database", options->databases,
                      "Private PostgreSQL only: create this database if missing (repeatable),\n"
                      "e.g. for zero-cache's CVR and change databases. Every database is served;\n"
                      "changes are captured from the one in the ready URL (postgres). Several\n"
                      "names may be separated by commas.")
          ->delimiter(','),
      "PGRELAY_DATABASE");
  env(cmd->add_option("--listen,-l", options->listen,
                      "Address and port clients connect to (HOST:PORT; [::1]:PORT for IPv6)")
          ->capture_default_str(),
      "PGRELAY_LISTEN");
  env(cmd->add_option("--data-dir,-D", options->data_dir,
                      "Where pgrelay keeps its change log, slots, TLS files and the private\n"
                      "PostgreSQL; one pgrelay per directory")
          ->capture_default_str(),
      "PGRELAY_DATA_DIR");
  env(cmd->add_option("--capture", options->capture,
                      "How row changes are captured: trigger (triggers pgrelay installs; any\n"
                      "upstream, any wal_level), native (pgrelay streams its own logical slot\n"
                      "from the upstream: needs wal_level = logical and the REPLICATION right;\n"
                      "writers pay nothing extra), or auto (native where the upstream allows it,\n"
                      "else trigger; an existing log keeps the mode it was captured with).\n"
                      "Default: auto for the private PostgreSQL, trigger with --upstream (a slot\n"
                      "holds the upstream's WAL while pgrelay is down; choose it explicitly)")
          ->check(CLI::IsMember({"trigger", "native", "auto"})),
      "PGRELAY_CAPTURE");
  env(cmd->add_option("--schema", options->schema,
                      "Upstream schema for pgrelay's capture tables, triggers and catalog views")
          ->capture_default_str(),
      "PGRELAY_SCHEMA");
  env(cmd->add_option("--tls-cert", options->tls_cert,
                      "PEM certificate chain for TLS (default: DATA_DIR/tls/server.crt, a\n"
                      "self-signed one generated on first start)"),
      "PGRELAY_TLS_CERT");
  env(cmd->add_option("--tls-key", options->tls_key, "PEM private key for --tls-cert"),
      "PGRELAY_TLS_KEY");
  env(cmd->add_flag("--no-tls", options->no_tls, "Answer SSLRequest with N (no TLS)"),
      "PGRELAY_NO_TLS");
  env(cmd->add_option("--wal-sender-timeout", options->wal_sender_timeout_seconds,
                      "Seconds of consumer silence before a replication stream is ended\n"
                      "(0 = never), as Postgres's wal_sender_timeout")
          ->capture_default_str()
          ->check(CLI::NonNegativeNumber),
      "PGRELAY_WAL_SENDER_TIMEOUT");
  env(cmd->add_option("--authentication-timeout", options->authentication_timeout_seconds,
                      "Seconds a client has to complete startup and authentication before\n"
                      "it is disconnected (0 = never), as Postgres's authentication_timeout")
          ->capture_default_str()
          ->check(CLI::NonNegativeNumber),
      "PGRELAY_AUTHENTICATION_TIMEOUT");
  env(cmd->add_option("--max-replication-slots", options->max_replication_slots,
                      "Slots pgrelay keeps at most, as Postgres's max_replication_slots")
          ->capture_default_str()
          ->check(CLI::PositiveNumber),
      "PGRELAY_MAX_REPLICATION_SLOTS");
  env(cmd->add_option(
          "--auth", options->auth_rules,
          "Authentication rule ADDRESS/PREFIX=METHOD, METHOD one of scram-sha-256, md5,\n"
          "password, trust, reject; first match wins, e.g. --auth 10.0.0.0/8=md5.\n"
          "Default: scram-sha-256 everywhere (trust on loopback when the upstream URL\n"
          "has no password and no users are named, and no access from elsewhere)."),
      "PGRELAY_AUTH");
  env(cmd->add_option("--users", options->users_file,
                      "File of pgrelay's own users, one per line: NAME SECRET [replication],\n"
                      "SECRET being a SCRAM-SHA-256 (or md5) secret from `pgrelay hash-password`.\n"
                      "Without it (and --user), clients log in with the upstream URL's user."),
      "PGRELAY_USERS");
  env(cmd->add_option("--user", options->users,
                      "One of pgrelay's own users, \"NAME SECRET [replication]\" as a line of\n"
                      "--users (repeatable; in the config file: user = [\"...\", ...])"),
      "PGRELAY_USER");
  env(cmd->add_option("--pg-bin", options->pg_bin,
                      "Private PostgreSQL only: directory of its server programs (postgres,\n"
                      "initdb). Default: pg_config --bindir, PATH, then the newest\n"
                      "/usr/lib/postgresql/*/bin."),
      "PGRELAY_PG_BIN");
  env(cmd->add_option("--run-as", options->run_as,
                      "Private PostgreSQL only, when pgrelay runs as root: the OS user it runs\n"
                      "as (PostgreSQL refuses root). Default: postgres if it exists, else nobody."),
      "PGRELAY_RUN_AS");
  env(cmd->add_option("--log-level", options->log_level,
                      "debug, info, warning or error: the least severe lines written")
          ->capture_default_str(),
      "PGRELAY_LOG_LEVEL");
  env(cmd->add_option("--log-format", options->log_format,
                      "text (Postgres-like lines) or json (one object per line), on stderr")
          ->capture_default_str(),
      "PGRELAY_LOG_FORMAT");
  env(cmd->add_option("--metrics", options->metrics,
                      "Serve Prometheus metrics on HOST:PORT at /metrics, e.g. 127.0.0.1:9187\n"
                      "(off by default): capture rate, log size, slot lag, connections, errors"),
      "PGRELAY_METRICS");
  return {cmd, [options] { return run_serve(*options); }};
}

Subcommand add_hash_password_command(CLI::App& parent) {
  auto md5_user = std::make_shared<std::string>();
  CLI::App* cmd = parent.add_subcommand(
      "hash-password",
      "Read a password on standard input and print its SCRAM-SHA-256 secret, for --users and\n"
      "--user. The password itself is never stored.");
  cmd->add_option("--md5-user", *md5_user,
                  "Print the md5 secret for this user name instead (md5 authentication)");
  return {cmd, [md5_user] { return run_hash_password(*md5_user); }};
}

}  // namespace pgrelay::cli
