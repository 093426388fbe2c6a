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
#include "base/strings.h"
#include "cli/database_captures.h"
#include "cli/pid_file.h"
#include "log/file_util.h"
#include "log/slots.h"
#include "server/metrics.h"
#include "server/metrics_endpoint.h"
#include "server/replication_hubs.h"
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

// The values /metrics reads at scrape time beside the server's own counters.
void publish_metrics(server::MetricWriter& out, const DatabaseCaptures& captures,
                     server::ReplicationHubs& hubs) {
  std::map<std::string, wire::Lsn> heads;
  for (const auto& db : captures.figures()) {
    const server::MetricLabels labels = {{"database", db.database}};
    out.counter({"pgrelay_captured_transactions_total", "Transactions captured into the log"},
                labels, static_cast<double>(db.capture.transactions));
    out.counter({"pgrelay_captured_changes_total", "Row changes captured into the log"}, labels,
                static_cast<double>(db.capture.rows));
    out.counter({"pgrelay_capture_reconnects_total", "Times capture reconnected to the upstream"},
                labels, static_cast<double>(db.capture.reconnects));
    out.counter({"pgrelay_captured_streamed_transactions_total",
                 "Transactions native capture took in while they still ran upstream"},
                labels, static_cast<double>(db.capture.streamed));
    out.gauge({"pgrelay_log_size_bytes", "Bytes of change log on disk"}, labels,
              static_cast<double>(db.log.total_bytes));
    out.gauge({"pgrelay_log_segments", "Segments of the change log"}, labels,
              static_cast<double>(db.log.segments));
    out.gauge({"pgrelay_log_head_lsn", "End of the last logged transaction, as a number"}, labels,
              static_cast<double>(db.head.value()));
    heads[db.database] = db.head;
  }
  for (const auto& slot : hubs.slots().list()) {
    const std::uint64_t head = heads[slot.database].value();
    std::uint64_t lag =
        head > slot.confirmed_flush.value() ? head - slot.confirmed_flush.value() : 0;
    out.gauge({"pgrelay_slot_lag_bytes", "Log bytes past the slot's confirmed_flush_lsn"},
              {{"slot", slot.name}, {"database", slot.database}}, static_cast<double>(lag));
    out.gauge({"pgrelay_slot_active", "1 while a walsender streams the slot"},
              {{"slot", slot.name}, {"database", slot.database}}, slot.active_pid != 0 ? 1.0 : 0.0);
  }
  out.gauge({"pgrelay_walsenders", "Replication streams being served"}, {},
            static_cast<double>(hubs.walsenders().list().size()));
}

// The serve loop. After run() it can destroy the work it still holds (the coroutine frames of
// sessions that were mid-wait when it stopped) while the hubs, logs and registries those frames
// point into are still there; left to its own destructor, that would happen after them.
class ServeLoop : public asio::io_context {
 public:
  void drop_pending_work() { shutdown(); }
};

// Stops the catalog workers before the hubs they read go, however run_serve returns.
class WorkersStopFirst {
 public:
  explicit WorkersStopFirst(DatabaseCaptures& captures) : captures_(captures) {}
  ~WorkersStopFirst() { captures_.stop_workers(); }
  WorkersStopFirst(const WorkersStopFirst&) = delete;
  WorkersStopFirst& operator=(const WorkersStopFirst&) = delete;

 private:
  DatabaseCaptures& captures_;
};

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

  // The slots of every database live beside the first database's log, as they always did.
  const std::string slots_dir = options.data_dir + "/log";
  if (auto made = log::ensure_directory(options.data_dir); !made.ok()) {
    report(made.error());
    return 1;
  }
  if (auto made = log::ensure_directory(slots_dir); !made.ok()) {
    report(made.error());
    return 1;
  }
  log::SlotRegistryOptions slot_options;
  slot_options.max_slots = static_cast<std::size_t>(options.max_replication_slots);
  slot_options.persist_every = 0;
  slot_options.persist_interval = std::chrono::milliseconds(1000);
  auto slots = log::SlotRegistry::open(slots_dir, slot_options);
  if (!slots.ok()) {
    report(slots.error());
    return 1;
  }

  ServeLoop io;
  asio::thread_pool blocking(4);
  DatabaseCaptures captures(options, *upstream, io, logger);
  server::ReplicationHubs hubs(
      io.get_executor(), blocking, **slots, *upstream,
      server::CaptureScope(upstream->dbname, options.capture_databases),
      [&captures](const std::string& database) { return captures.start(database); },
      [&captures](const std::string& database, const std::optional<Error>& refusal) {
        captures.prepare(database, refusal);
      },
      [&captures](const std::string& database) { captures.forget(database); });
  WorkersStopFirst workers_stop_first(captures);
  captures.attach(hubs);
  hubs.walsenders().on_change([&captures] { captures.refresh_all(); });
  hubs.walsenders().on_mirror_sync([&captures] { captures.flush_all(); });

  // The upstream URL's database is captured from the start; a failure there ends the run.
  if (auto first = hubs.open(upstream->dbname); !first.ok()) {
    report(first.error());
    return 1;
  }
  // So is every other database an earlier run captured (its slots must keep streaming). One
  // that cannot be captured now is said and left out: its slots get its capture error.
  if (auto noted = captures.note_scope(hubs.scope()); !noted.ok()) report(noted.error());
  for (const auto& database : captures.captured_before()) {
    if (database == upstream->dbname || !hubs.scope().admits(database)) continue;
    if (auto other = hubs.open(database); !other.ok()) {
      logger.warning(
          "could not capture a database captured before",
          {{"database", database}, {"error", other.error().message}, {"hint", other.error().hint}});
    }
  }

  server::ServerContext context;
  context.logger = &logger;
  context.metrics = &metrics;
  context.upstream = *upstream;
  context.hubs = &hubs;
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

  // The first database's catalog is there before clients come; a failure to install it ends
  // the run (elsewhere it is a warning: pgrelay serves those databases without it).
  auto catalog = upstream::VirtualCatalog::open(upstream->conninfo(), options.schema);
  if (!catalog.ok()) {
    report(catalog.error());
    return 1;
  }
  if (auto installed = (*catalog)->install(); !installed.ok()) {
    report(installed.error());
    return 1;
  }
  catalog->reset();
  for (const auto& database : hubs.captured()) hubs.prepare(database);

  server::Server server(io, context);
  auto bound = server.listen(listen->first, listen->second);
  if (!bound.ok()) {
    report(bound.error());
    return 1;
  }
  server.start();

  // Scrape-time values for /metrics (on the io thread).
  metrics.add_collector([&](server::MetricWriter& out) { publish_metrics(out, captures, hubs); });
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
    hubs.walsenders().stop_all();
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
  const std::string captured = join(hubs.captured());
  logger.info("ready", {{"listen", host + ":" + std::to_string(bound->port())},
                        {"upstream", upstream->describe()},
                        {"private_postgres", embedded != nullptr},
                        {"captured_databases", captured}});

  io.run();
  blocking.join();
  io.drop_pending_work();
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
                      "e.g. for zero-cache's CVR and change databases. Every database is served\n"
                      "and, by default, captured (--capture-database). Several names may be\n"
                      "separated by commas.")
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
  env(cmd->add_option("--capture-database", options->capture_databases,
                      "Databases of the upstream whose changes pgrelay captures, besides the\n"
                      "upstream URL's (always captured): a name (repeatable, or several separated\n"
                      "by commas), or '*' for every database. Default: '*'. Capture of a database\n"
                      "starts when a client first uses it through pgrelay (and again at every\n"
                      "start once it has been), so each has its own log and its slots stream it\n"
                      "alone. Elsewhere slot creation fails with SQLSTATE 55000 naming this\n"
                      "option.")
          ->delimiter(',')
          ->allow_extra_args(false)
          ->capture_default_str(),
      "PGRELAY_CAPTURE_DATABASE");
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
