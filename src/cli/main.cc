// The pgrelay command line: parses arguments and dispatches to subcommands.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "cli/log_commands.h"
#include "cli/serve_command.h"
#include "cli/version.h"

int main(int argc, char** argv) {
  CLI::App app{
      "pgrelay - a PostgreSQL logical-replication server.\n\n"
      "pgrelay stands in front of an upstream PostgreSQL, captures its row changes into a\n"
      "durable, LSN-ordered change log, and serves them to unmodified consumers over the\n"
      "genuine replication protocol (pgoutput v1-v4), while ordinary sessions pass through.",
      "pgrelay"};
  app.set_version_flag("-V,--version", std::string("pgrelay ") + PGRELAY_VERSION);
  app.footer("Report bugs and read the documentation in the project's README.md.");
  app.require_subcommand(0, 1);

  CLI::App* log_cmd = app.add_subcommand("log", "Inspect pgrelay's durable change log.");
  log_cmd->require_subcommand(1);

  pgrelay::cli::LogDumpOptions dump_options;
  dump_options.data_dir = "./pgrelay-data";
  CLI::App* dump_cmd = log_cmd->add_subcommand(
      "dump",
      "Print the change log as JSON lines: for each transaction a \"begin\" line, one line per\n"
      "change (relation, insert, update, delete, truncate, logical_message) and a \"commit\"\n"
      "line; a non-transactional message is one \"message\" line. Values are Postgres's text\n"
      "output; NULL is null; an unchanged TOASTed value is {\"unchanged_toast\": true}.\n"
      "Safe to run while pgrelay serve uses the same directory.");
  dump_cmd
      ->add_option("--data-dir,-D", dump_options.data_dir,
                   "Data directory of pgrelay (its change log is DIR/log)")
      ->capture_default_str();
  auto* from = dump_cmd->add_option(
      "--from", dump_options.from_lsn,
      "Start at this LSN (e.g. 0/16B3748): transactions committed before it are skipped, as "
      "START_REPLICATION does");
  dump_cmd
      ->add_option("--since", dump_options.since,
                   "Start at the first transaction committed at or after this time "
                   "(e.g. 2026-11-29T17:30:00Z; UTC unless a zone is given)")
      ->excludes(from);
  dump_cmd->add_option("--table,-t", dump_options.tables,
                       "Only changes of this table (schema.table, unqualified means public); "
                       "repeatable");

  pgrelay::cli::LogStatOptions stat_options;
  stat_options.data_dir = "./pgrelay-data";
  CLI::App* stat_cmd = log_cmd->add_subcommand(
      "stat",
      "Print the change log's statistics: segments, size, oldest and newest LSN, and "
      "each replication slot's position and lag in bytes and seconds.");
  stat_cmd
      ->add_option("--data-dir,-D", stat_options.data_dir,
                   "Data directory of pgrelay (its change log is DIR/log)")
      ->capture_default_str();
  stat_cmd->add_flag("--json", stat_options.json, "Print one JSON object instead of text");

  pgrelay::cli::ServeOptions serve_options;
  CLI::App* serve_cmd = app.add_subcommand(
      "serve",
      "Serve an upstream PostgreSQL: capture its row changes with triggers into the change log,\n"
      "answer replication connections (replication=database) from that log, and pass every\n"
      "other session through to the upstream. Prints one line\n"
      "  pgrelay ready: postgres://USER:PASSWORD@HOST:PORT/DBNAME\n"
      "on stdout when clients can connect. Stop it with Ctrl-C or SIGTERM.");
  serve_cmd
      ->add_option("--upstream,-u", serve_options.upstream,
                   "The upstream server, as a libpq URL or conninfo string, e.g.\n"
                   "postgres://app:secret@db.example.com:5432/app?sslmode=require. Clients log in\n"
                   "to pgrelay with this user and password.")
      ->required();
  serve_cmd->add_option("--listen,-l", serve_options.listen, "Address and port to listen on")
      ->capture_default_str();
  serve_cmd
      ->add_option("--data-dir,-D", serve_options.data_dir,
                   "Where pgrelay keeps its change log, slots and TLS files")
      ->capture_default_str();
  serve_cmd
      ->add_option("--schema", serve_options.schema,
                   "Upstream schema for pgrelay's capture tables, triggers and catalog views")
      ->capture_default_str();
  serve_cmd->add_option("--tls-cert", serve_options.tls_cert,
                        "PEM certificate chain for TLS (default: DATA_DIR/tls/server.crt, a "
                        "self-signed one generated on first start)");
  serve_cmd->add_option("--tls-key", serve_options.tls_key, "PEM private key for --tls-cert");
  serve_cmd->add_flag("--no-tls", serve_options.no_tls, "Answer SSLRequest with N (no TLS)");
  serve_cmd
      ->add_option("--wal-sender-timeout", serve_options.wal_sender_timeout_seconds,
                   "Seconds of consumer silence before a replication stream is ended (0 = never)")
      ->capture_default_str();
  serve_cmd
      ->add_option("--max-replication-slots", serve_options.max_replication_slots,
                   "Slots pgrelay keeps at most")
      ->capture_default_str();
  serve_cmd->add_option(
      "--auth", serve_options.auth_rules,
      "Authentication rule ADDRESS/PREFIX=METHOD, METHOD one of scram-sha-256, md5,\n"
      "password, trust, reject; first match wins, e.g. --auth 10.0.0.0/8=md5.\n"
      "Default: scram-sha-256 everywhere (trust on loopback when the upstream URL\n"
      "has no password, and no access from elsewhere).");

  serve_cmd->add_option(
      "--users", serve_options.users_file,
      "File of pgrelay's own users, one per line: NAME SECRET [replication],\n"
      "SECRET being a SCRAM-SHA-256 (or md5) secret from `pgrelay hash-password`.\n"
      "Without it, clients log in with the upstream URL's user and password.");

  std::string md5_user;
  CLI::App* hash_cmd = app.add_subcommand(
      "hash-password",
      "Read a password on standard input and print its SCRAM-SHA-256 secret, for --users.");
  hash_cmd->add_option("--md5-user", md5_user,
                       "Print the md5 secret for this user name instead (md5 authentication)");

  CLI11_PARSE(app, argc, argv);
  if (hash_cmd->parsed()) return pgrelay::cli::run_hash_password(md5_user);
  if (serve_cmd->parsed()) return pgrelay::cli::run_serve(serve_options);
  if (dump_cmd->parsed()) return pgrelay::cli::run_log_dump(dump_options);
  if (stat_cmd->parsed()) return pgrelay::cli::run_log_stat(stat_options);
  std::printf("%s", app.help().c_str());
  return 0;
}
