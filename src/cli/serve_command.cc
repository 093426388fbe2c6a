// `pgrelay serve`: capture from an upstream, keep the change log, and serve clients.
#include "cli/serve_command.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "base/line_tail.h"
#include "base/logger.h"
#include "cli/relay.h"
#include "cli/serve_plan.h"
#include "wire/md5_auth.h"
#include "wire/scram.h"

namespace pgrelay::cli {
namespace {

void print_error(const Error& error) {
  std::fprintf(stderr, "pgrelay: error: %s\n", error.message.c_str());
  if (!error.detail.empty()) std::fprintf(stderr, "pgrelay: detail: %s\n", error.detail.c_str());
  if (!error.hint.empty()) std::fprintf(stderr, "pgrelay: hint: %s\n", error.hint.c_str());
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
  // Declared before the relay: sessions its loop still holds log their end when it goes.
  // The last lines go to the admin page's log tail as well as to stderr.
  LineTail log_tail(2000);
  LoggerOptions logger_options;
  logger_options.level = *level;
  logger_options.format = *format;
  logger_options.sink = [&log_tail](std::string_view line) {
    for (std::string_view rest = line; !rest.empty();) {
      const ssize_t n = ::write(2, rest.data(), rest.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      rest.remove_prefix(static_cast<std::size_t>(n));
    }
    log_tail.add(line);
  };
  Logger logger(std::move(logger_options));
  std::error_code cwd_error;
  const char* path = std::getenv("PATH");
  std::vector<std::string> environment;
  for (char** entry = environ; *entry != nullptr; ++entry) environment.emplace_back(*entry);
  auto plan = plan_serve(options, std::filesystem::current_path(cwd_error).string(),
                         path ? path : "", environment);
  if (!plan.ok()) {
    logger.error(plan.error());
    return 2;
  }
  auto relay = Relay::start(options, std::move(*plan), logger, &log_tail);
  if (!relay.ok()) {
    logger.error(relay.error());
    return 1;
  }
  return (*relay)->run();
}

}  // namespace pgrelay::cli

namespace pgrelay::cli {

namespace {

// The options of `pgrelay serve`, which `pgrelay zero` takes too.
void add_serve_options(CLI::App* cmd, ServeOptions& options) {
  auto env = [](CLI::Option* option, const char* name) { option->envname(name); };
  env(cmd->add_option("--upstream,-u", options.upstream,
                      "The upstream server, as a libpq URL or conninfo string, e.g.\n"
                      "postgres://app:secret@db.example.com:5432/app?sslmode=require. Clients\n"
                      "log in to pgrelay with this user and password unless --users/--user\n"
                      "name others. Besides sslmode and sslrootcert, pgrelay's own connections\n"
                      "take application_name, connect_timeout, options, keepalives*,\n"
                      "tcp_user_timeout and target_session_attrs from it; a parameter pgrelay\n"
                      "cannot honour (sslcert, for one) is refused, not ignored.\n"
                      "Default: a private PostgreSQL in DATA_DIR/pg."),
      "PGRELAY_UPSTREAM");
  env(cmd->add_option("--database", options.databases,
                      "Private PostgreSQL only: create this database if missing (repeatable),\n"
                      "e.g. for zero-cache's CVR and change databases. Every database is served\n"
                      "and, by default, captured (--capture-database). Several names may be\n"
                      "separated by commas. With --follow and no --upstream: the one database\n"
                      "the follower follows.")
          ->delimiter(','),
      "PGRELAY_DATABASE");
  env(cmd->add_option("--listen,-l", options.listen,
                      "Address and port clients connect to (HOST:PORT; [::1]:PORT for IPv6)")
          ->capture_default_str(),
      "PGRELAY_LISTEN");
  env(cmd->add_option("--data-dir,-D", options.data_dir,
                      "Where pgrelay keeps its change log, slots, TLS files and the private\n"
                      "PostgreSQL; one pgrelay per directory")
          ->capture_default_str(),
      "PGRELAY_DATA_DIR");
  env(cmd->add_option("--capture", options.capture,
                      "How row changes are captured: trigger (triggers pgrelay installs; any\n"
                      "upstream, any wal_level), native (pgrelay streams its own logical slot\n"
                      "from the upstream: needs wal_level = logical and the REPLICATION right;\n"
                      "writers pay nothing extra), or auto (native where the upstream allows it,\n"
                      "else trigger; an existing log keeps the mode it was captured with).\n"
                      "Default: auto for the private PostgreSQL, trigger with --upstream (a slot\n"
                      "holds the upstream's WAL while pgrelay is down; choose it explicitly)")
          ->check(CLI::IsMember({"trigger", "native", "auto"})),
      "PGRELAY_CAPTURE");
  env(cmd->add_option("--capture-database", options.capture_databases,
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
  env(cmd->add_option("--schema", options.schema,
                      "Upstream schema for pgrelay's capture tables, triggers and catalog views")
          ->capture_default_str(),
      "PGRELAY_SCHEMA");
  env(cmd->add_option("--tls-cert", options.tls_cert,
                      "PEM certificate chain for TLS (default: DATA_DIR/tls/server.crt, a\n"
                      "self-signed one generated on first start)"),
      "PGRELAY_TLS_CERT");
  env(cmd->add_option("--tls-key", options.tls_key, "PEM private key for --tls-cert"),
      "PGRELAY_TLS_KEY");
  env(cmd->add_flag("--no-tls", options.no_tls, "Answer SSLRequest with N (no TLS)"),
      "PGRELAY_NO_TLS");
  env(cmd->add_option("--wal-sender-timeout", options.wal_sender_timeout_seconds,
                      "Seconds of consumer silence before a replication stream is ended\n"
                      "(0 = never), as Postgres's wal_sender_timeout")
          ->capture_default_str()
          ->check(CLI::NonNegativeNumber),
      "PGRELAY_WAL_SENDER_TIMEOUT");
  env(cmd->add_option("--authentication-timeout", options.authentication_timeout_seconds,
                      "Seconds a client has to complete startup and authentication before\n"
                      "it is disconnected (0 = never), as Postgres's authentication_timeout")
          ->capture_default_str()
          ->check(CLI::NonNegativeNumber),
      "PGRELAY_AUTHENTICATION_TIMEOUT");
  env(cmd->add_option("--pool-idle-timeout", options.pool_idle_timeout_seconds,
                      "Keep the upstream backend of a pass-through session whose client\n"
                      "leaves cleanly (no transaction open), reset with DISCARD ALL, for\n"
                      "the next session of the same database and startup parameters, as\n"
                      "pgbouncer's session mode does; close it after this many seconds\n"
                      "unused (at most 64 kept). 0 = off: each backend ends with its session")
          ->capture_default_str()
          ->check(CLI::NonNegativeNumber),
      "PGRELAY_POOL_IDLE_TIMEOUT");
  env(cmd->add_option("--max-replication-slots", options.max_replication_slots,
                      "Slots pgrelay keeps at most, as Postgres's max_replication_slots")
          ->capture_default_str()
          ->check(CLI::PositiveNumber),
      "PGRELAY_MAX_REPLICATION_SLOTS");
  env(cmd->add_option(
          "--auth", options.auth_rules,
          "Authentication rule ADDRESS/PREFIX=METHOD, METHOD one of scram-sha-256, md5,\n"
          "password, trust, reject; first match wins, e.g. --auth 10.0.0.0/8=md5.\n"
          "Default: scram-sha-256 everywhere (trust on loopback when the upstream URL\n"
          "has no password and no users are named, and no access from elsewhere)."),
      "PGRELAY_AUTH");
  env(cmd->add_option("--users", options.users_file,
                      "File of pgrelay's own users, one per line: NAME SECRET [replication],\n"
                      "SECRET being a SCRAM-SHA-256 (or md5) secret from `pgrelay hash-password`.\n"
                      "Without it (and --user), clients log in with the upstream URL's user."),
      "PGRELAY_USERS");
  env(cmd->add_option("--user", options.users,
                      "One of pgrelay's own users, \"NAME SECRET [replication]\" as a line of\n"
                      "--users (repeatable; in the config file: user = [\"...\", ...])"),
      "PGRELAY_USER");
  env(cmd->add_option("--pg-bin", options.pg_bin,
                      "Private PostgreSQL only: directory of its server programs (postgres,\n"
                      "initdb). Default: pg_config --bindir, PATH, then the newest\n"
                      "/usr/lib/postgresql/*/bin."),
      "PGRELAY_PG_BIN");
  env(cmd->add_option("--run-as", options.run_as,
                      "Private PostgreSQL only, when pgrelay runs as root: the OS user it runs\n"
                      "as (PostgreSQL refuses root). Default: postgres if it exists, else nobody."),
      "PGRELAY_RUN_AS");
  env(cmd->add_option("--log-level", options.log_level,
                      "debug, info, warning or error: the least severe lines written")
          ->capture_default_str(),
      "PGRELAY_LOG_LEVEL");
  env(cmd->add_option("--log-format", options.log_format,
                      "text (Postgres-like lines) or json (one object per line), on stderr")
          ->capture_default_str(),
      "PGRELAY_LOG_FORMAT");
  env(cmd->add_option("--metrics", options.metrics,
                      "Serve Prometheus metrics on HOST:PORT at /metrics, e.g. 127.0.0.1:9187\n"
                      "(off by default): capture rate, log size, slot lag, connections, errors"),
      "PGRELAY_METRICS");
  cmd->add_option("--hop-trace", options.hop_trace,
                  "For latency benchmarks: stamp each captured transaction's hops (upstream\n"
                  "send, capture receipt, visible in the log, durable, walsender read, socket\n"
                  "write) and write them to FILE at shutdown; keeps up to 8 million stamps,\n"
                  "some 200 MB (off by default)")
      ->option_text("FILE");
  env(cmd->add_option("--admin", options.admin,
                      "Serve the admin page on HOST:PORT (e.g. 127.0.0.1:6477; 'off' for none):\n"
                      "upstream, capture, logs' heads, slots and their lag, charts of the last\n"
                      "10 minutes, the tails of pgrelay's, PostgreSQL's and zero-cache's logs,\n"
                      "and zero-cache's restart and reset; its JSON API is under /api/.\n"
                      "Default: 127.0.0.1:6477 with `pgrelay zero`, off otherwise"),
      "PGRELAY_ADMIN");
  env(cmd->add_option("--admin-token", options.admin_token,
                      "A secret every request to the admin page must carry (?token=TOKEN or\n"
                      "Authorization: Bearer TOKEN); needed for --admin beyond loopback. Best\n"
                      "given as PGRELAY_ADMIN_TOKEN"),
      "PGRELAY_ADMIN_TOKEN");
  const char* nats_group = "NATS JetStream (publishing the change log, or following it)";
  env(cmd->add_option("--nats", options.nats,
                      "Publish every committed transaction of the log to JetStream on these\n"
                      "NATS servers (nats://HOST:PORT or tls://HOST:PORT, comma-separated),\n"
                      "exactly once and in commit order: one JSON message per row change on\n"
                      "PREFIX.DATABASE.SCHEMA.TABLE, and each transaction's log entry on\n"
                      "PREFIX.DATABASE._tx. Off by default. NATS being down never stops capture.")
          ->delimiter(',')
          ->group(nats_group),
      "PGRELAY_NATS");
  env(cmd->add_option("--nats-stream", options.nats_stream,
                      "The JetStream stream; created if missing (file storage, up to 3\n"
                      "replicas, a 2-minute duplicate window)")
          ->capture_default_str()
          ->group(nats_group),
      "PGRELAY_NATS_STREAM");
  env(cmd->add_option("--nats-subject-prefix", options.nats_subject_prefix,
                      "The first token(s) of every subject pgrelay publishes on")
          ->capture_default_str()
          ->group(nats_group),
      "PGRELAY_NATS_SUBJECT_PREFIX");
  env(cmd->add_option("--nats-user", options.nats_user, "NATS user (or in the URL)")
          ->group(nats_group),
      "PGRELAY_NATS_USER");
  env(cmd->add_option("--nats-password", options.nats_password,
                      "NATS password; better in PGRELAY_NATS_PASSWORD, which ps does not show")
          ->group(nats_group),
      "PGRELAY_NATS_PASSWORD");
  env(cmd->add_option("--nats-token", options.nats_token,
                      "NATS authentication token; better in PGRELAY_NATS_TOKEN")
          ->group(nats_group),
      "PGRELAY_NATS_TOKEN");
  env(cmd->add_option("--nats-creds", options.nats_creds,
                      "A NATS .creds file (user JWT and NKey seed)")
          ->group(nats_group),
      "PGRELAY_NATS_CREDS");
  env(cmd->add_option("--nats-nkey", options.nats_nkey, "NKey authentication: PUBLIC_KEY:SEED_FILE")
          ->group(nats_group),
      "PGRELAY_NATS_NKEY");
  env(cmd->add_option("--nats-tls-ca", options.nats_tls_ca,
                      "TLS to NATS, the servers checked against this CA (PEM)")
          ->group(nats_group),
      "PGRELAY_NATS_TLS_CA");
  env(cmd->add_option("--nats-tls-cert", options.nats_tls_cert,
                      "Client certificate (PEM) for NATS servers that ask for one")
          ->group(nats_group),
      "PGRELAY_NATS_TLS_CERT");
  env(cmd->add_option("--nats-tls-key", options.nats_tls_key, "Its private key (PEM)")
          ->group(nats_group),
      "PGRELAY_NATS_TLS_KEY");
  env(cmd->add_option("--follow", options.follow,
                      "Run as a follower: capture nothing, and rebuild the change log from the\n"
                      "JetStream stream a primary pgrelay publishes with --nats, on these NATS\n"
                      "servers (comma-separated): the same transactions at the same LSNs. It\n"
                      "serves replication sessions from that log with slots of its own, and\n"
                      "the primary's server facts (settings, publications) from the stream.\n"
                      "With --upstream (the primary's upstream, or the primary itself) it\n"
                      "follows that URL's database and passes ordinary sessions there; without,\n"
                      "it follows --database NAME, needs --user/--users, and refuses ordinary\n"
                      "sessions (08004). The --nats-* options say how to reach the stream.")
          ->delimiter(',')
          ->group(nats_group),
      "PGRELAY_FOLLOW");
}

}  // namespace

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
  add_serve_options(cmd, *options);
  return {cmd, [options] { return run_serve(*options); }};
}

Subcommand add_zero_command(CLI::App& parent) {
  auto options = std::make_shared<ServeOptions>();
  options->zero = true;
  options->admin = "127.0.0.1:6477";
  CLI::App* cmd = parent.add_subcommand(
      "zero",
      "Everything a Zero app needs in development, in one command: pgrelay on its private\n"
      "PostgreSQL (as `pgrelay` alone), with zero-cache's databases zero_cvr and zero_cdb,\n"
      "and zero-cache itself run beside it, restarted with backoff when it exits.\n"
      "zero-cache is the app's own: node_modules/@rocicorp/zero, looked for in the working\n"
      "directory and the directories above it (--zero-cache chooses another), run on the\n"
      "node found on PATH (--node). It gets ZERO_UPSTREAM_DB, ZERO_CVR_DB and ZERO_CHANGE_DB\n"
      "pointing at pgrelay, and ZERO_REPLICA_FILE=DATA_DIR/zero/replica.db; every ZERO_*\n"
      "variable of the environment or of ./.env is passed on and wins over pgrelay's\n"
      "(ZERO_PORT, default 4848, among them). Its output is shown prefixed with\n"
      "`zero-cache | ` and kept in DATA_DIR/zero/zero-cache.log. On stdout:\n"
      "  pgrelay ready: postgres://postgres@HOST:PORT/postgres\n"
      "  zero-cache ready: http://127.0.0.1:ZERO_PORT   (again after each restart)\n"
      "Ctrl-C or SIGTERM stops zero-cache, then pgrelay and its PostgreSQL.\n"
      "Settings go in a [zero] table of the --config file; the options are serve's, and:");
  add_serve_options(cmd, *options);
  const char* zero_group = "zero-cache";
  cmd->add_option("--zero-cache", options->zero_cache,
                  "@rocicorp/zero's package directory, or an app directory holding\n"
                  "node_modules/@rocicorp/zero (default: looked for from the working\n"
                  "directory upward)")
      ->envname("PGRELAY_ZERO_CACHE")
      ->group(zero_group);
  cmd->add_option("--node", options->node,
                  "The Node.js binary zero-cache runs on (default: node on PATH; zero-cache\n"
                  "asks for Node 22 or later)")
      ->envname("PGRELAY_NODE")
      ->group(zero_group);
  return {cmd, [options] {
            for (const char* database : {"zero_cvr", "zero_cdb"}) {
              auto& list = options->databases;
              if (std::find(list.begin(), list.end(), database) == list.end()) {
                list.emplace_back(database);
              }
            }
            return run_serve(*options);
          }};
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
