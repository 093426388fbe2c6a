// `pgrelay recv`: a logical replication consumer in the spirit of pg_recvlogical.
#include "cli/recv_command.h"

#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cmath>
#include <iostream>
#include <memory>

#include "cli/recv_connection.h"
#include "cli/recv_output.h"
#include "cli/recv_stream.h"
#include "wire/lsn.h"

namespace pgrelay::cli {

namespace {

constexpr const char* kDescription =
    "Receive changes from a logical replication slot, as pg_recvlogical does, and write them\n"
    "out: one JSON line per row change and per logical message, or the raw pgoutput messages.\n"
    "\n"
    "pgrelay recv connects to URL as a logical replication client (replication=database is\n"
    "added), optionally creates the slot (CREATE_REPLICATION_SLOT ... LOGICAL pgoutput), and\n"
    "runs START_REPLICATION with the pgoutput plugin for the given publications. It works\n"
    "against pgrelay serve and against any PostgreSQL 15 or later with wal_level = logical.\n"
    "URL is a libpq connection URI or conninfo string (e.g.\n"
    "postgres://app:secret@db.example.com:5432/app?sslmode=verify-full); TLS, sslmode,\n"
    "SCRAM-SHA-256, MD5, password, ~/.pgpass and the PG* environment variables work as in\n"
    "libpq. Without URL, libpq's environment defaults apply.\n";

constexpr const char* kFooter =
    "Output (--format json)\n"
    "  One line per change, in commit order:\n"
    "    {\"op\":\"insert|update|delete|truncate\",\"schema\":...,\"table\":...,\"key\":{...},\n"
    "     \"old\":{...},\"new\":{...},\"lsn\":\"0/16B3748\",\"xid\":750,\"commit_time\":...}\n"
    "  Values are PostgreSQL's text output as JSON strings; NULL is null; an unchanged\n"
    "  TOASTed value is {\"unchanged_toast\":true}; text that is not valid UTF-8 (a database\n"
    "  in another encoding) is {\"hex\":\"\\\\x...\"}. \"key\" holds the replica identity\n"
    "  columns of the row (the old key when an update changed it), or null when the table\n"
    "  has none. \"old\" is the whole old row under REPLICA IDENTITY FULL, else null; \"new\"\n"
    "  is null for delete and truncate. A truncate gives one line per table, with \"cascade\"\n"
    "  and \"restart_identity\". \"lsn\" is the change's own LSN; \"xid\" and \"commit_time\"\n"
    "  (UTC) are its transaction's. A logical message (pg_logical_emit_message) gives\n"
    "    {\"op\":\"message\",\"transactional\":true,\"prefix\":...,\"content\":...,\n"
    "     \"content_encoding\":\"utf8|base64\",\"lsn\":...,\"xid\":...,\"commit_time\":...}\n"
    "  where content is text when it is valid UTF-8 and base64 otherwise; a\n"
    "  non-transactional message has no xid and no commit_time.\n"
    "\n"
    "Output (--format pgoutput)\n"
    "  Every pgoutput message as the server sent it (Begin, Relation, Type, Insert, ...,\n"
    "  Commit), each framed as: the XLogData start LSN (8 bytes, big-endian), the message\n"
    "  length N (4 bytes, big-endian), then the N message bytes. Nothing else.\n"
    "\n"
    "Acknowledgement and restart\n"
    "  Transactions are written whole. pgrelay recv reports as written and flushed (standby\n"
    "  status update) only the end of the last transaction it has written and, for a\n"
    "  regular file, fsynced; it does so every --status-interval seconds, whenever the\n"
    "  server asks, and when it stops. Between transactions it also confirms the server's\n"
    "  keepalive position, so that WAL with nothing published does not pile up. Started\n"
    "  again on the same slot, it continues exactly after the last confirmed transaction.\n"
    "  After a crash or a lost connection (not after SIGINT, SIGTERM or --endpos), the\n"
    "  transactions written since the last confirmation are sent again; their \"lsn\" and\n"
    "  \"xid\" let a reader skip them. The file is appended to, never truncated.\n"
    "\n"
    "Stopping\n"
    "  SIGINT (Ctrl-C) or SIGTERM: the current transaction is completed, the output is\n"
    "  flushed, the final position is confirmed, pgrelay recv waits for the server to end\n"
    "  the stream (so that the slot is free when it exits) and exits with status 0. A\n"
    "  second signal abandons the transaction (it will be sent again) and the wait. A\n"
    "  signal while connecting or before streaming began stops at once, also with 0.\n"
    "  --endpos stops the same way after the first transaction whose commit ends at or\n"
    "  beyond LSN (or as soon as the server reports it has passed LSN between\n"
    "  transactions). If the server ends the stream, pgrelay recv exits with status 1.\n"
    "\n"
    "Slots\n"
    "  --create-slot creates the slot, then streams from it. --drop-slot drops the slot and\n"
    "  exits without streaming (as pg_recvlogical --drop-slot); it cannot be combined with\n"
    "  --create-slot, --start or --endpos.\n"
    "\n"
    "Examples\n"
    "  pgrelay recv --slot app --publication app_pub --create-slot --if-not-exists \\\n"
    "      postgres://app@127.0.0.1:5433/app\n"
    "  pgrelay recv --slot app --publication app_pub --endpos 0/3000060 -f changes.jsonl \\\n"
    "      'host=db.example.com dbname=app user=repl sslmode=require'\n"
    "  pgrelay recv --slot app --drop-slot postgres://app@127.0.0.1:5433/app";

void report(const Error& error) {
  std::cerr << "pgrelay recv: error: " << error.message << "\n";
  if (!error.detail.empty()) std::cerr << "pgrelay recv: detail: " << error.detail << "\n";
  if (!error.hint.empty()) std::cerr << "pgrelay recv: hint: " << error.hint << "\n";
}

int usage_error(const std::string& message, const std::string& hint = {}) {
  report(Error::make(sqlstate::kInvalidParameterValue, message, hint));
  return 1;
}

// "p1","p2" (each an identifier, as pgoutput splits the list), then a string literal.
std::string publication_list(PGconn* conn, const std::vector<std::string>& publications) {
  std::string list;
  for (const auto& name : publications) {
    if (!list.empty()) list += ',';
    list += quote_identifier(conn, name);
  }
  return quote_repl_literal(list);
}

// Blocks SIGINT and SIGTERM and returns a signalfd that reports them, so the streaming loop
// sees them in poll() and no handler or global flag is needed. They stay blocked after it is
// gone: recv is then on its way out, and a signal that came (or comes) must not turn exit
// status 0 into death by that signal.
class SignalWatch {
 public:
  SignalWatch() {
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGTERM);
    if (::sigprocmask(SIG_BLOCK, &mask, nullptr) == 0) {
      fd_ = ::signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
    }
  }
  ~SignalWatch() {
    if (fd_ >= 0) ::close(fd_);
  }
  SignalWatch(const SignalWatch&) = delete;
  SignalWatch& operator=(const SignalWatch&) = delete;
  int fd() const { return fd_; }
  // Whether a signal is waiting to be read (it stays there for the streaming loop).
  bool pending() const { return readable(fd_); }

 private:
  int fd_ = -1;
};

Status create_slot(PGconn* conn, const RecvOptions& options) {
  std::string command =
      "CREATE_REPLICATION_SLOT " + quote_identifier(conn, options.slot) + " LOGICAL pgoutput";
  // No snapshot is needed: the stream starts at the slot's consistent point.
  command += PQserverVersion(conn) >= 150000 ? " (SNAPSHOT 'nothing')" : " NOEXPORT_SNAPSHOT";
  auto created = run_command(conn, command, PGRES_TUPLES_OK);
  if (!created.ok()) {
    if (options.if_not_exists && created.error().sqlstate == sqlstate::kDuplicateObject) {
      if (options.verbose) {
        std::cerr << "pgrelay recv: replication slot \"" << options.slot << "\" exists already\n";
      }
      return {};
    }
    return created.error();
  }
  if (options.verbose) {
    const PGresult* res = created->get();
    std::string point = PQntuples(res) > 0 && PQnfields(res) > 1 ? PQgetvalue(res, 0, 1) : "?";
    std::cerr << "pgrelay recv: created replication slot \"" << options.slot
              << "\" at consistent point " << point << "\n";
  }
  return {};
}

}  // namespace

int run_recv(const RecvOptions& options) {
  if (options.slot.empty()) return usage_error("no slot specified", "Name it with --slot.");
  if (options.drop_slot &&
      (options.create_slot || !options.endpos.empty() || options.start != "0/0")) {
    return usage_error("--drop-slot cannot be combined with --create-slot, --start or --endpos");
  }
  if (options.if_not_exists && !options.create_slot) {
    return usage_error("--if-not-exists needs --create-slot");
  }
  auto start = wire::Lsn::parse(options.start);
  if (!start) {
    return usage_error("could not parse start position \"" + options.start + "\"",
                       "An LSN looks like 0/16B3748.");
  }
  StreamOptions stream;
  if (!options.endpos.empty()) {
    stream.endpos = wire::Lsn::parse(options.endpos);
    if (!stream.endpos) {
      return usage_error("could not parse end position \"" + options.endpos + "\"",
                         "An LSN looks like 0/16B3748.");
    }
  }
  if (!options.drop_slot && options.publications.empty()) {
    return usage_error("no publication specified",
                       "Name one with --publication (repeatable); pg_publication lists them.");
  }
  if (options.format == "json") {
    stream.format = RecvFormat::kJson;
  } else if (options.format == "pgoutput") {
    stream.format = RecvFormat::kPgoutput;
  } else {
    return usage_error("invalid output format \"" + options.format + "\"",
                       "Use --format json or --format pgoutput.");
  }
  if (options.protocol_version < 1 || options.protocol_version > 4) {
    return usage_error("--proto-version must be between 1 and 4");
  }
  if (!std::isfinite(options.status_interval_seconds) || options.status_interval_seconds < 0 ||
      options.status_interval_seconds > 86400) {
    return usage_error("--status-interval must be between 0 and 86400 seconds");
  }
  stream.protocol_version = options.protocol_version;
  stream.status_interval = std::chrono::milliseconds(
      static_cast<std::int64_t>(std::llround(options.status_interval_seconds * 1000)));
  stream.verbose = options.verbose;

  std::optional<RecvOutput> output;
  if (!options.drop_slot) {
    auto opened = RecvOutput::open(options.file);
    if (!opened.ok()) {
      report(opened.error());
      return 1;
    }
    output.emplace(std::move(*opened));
  }

  // Signals are watched from before connecting: one that arrives before streaming began stops
  // recv with nothing written and exit 0, as one during streaming does (never a default kill).
  SignalWatch signals;
  if (signals.fd() < 0) {
    report(Error::make(sqlstate::kSystemError, "could not create a signalfd"));
    return 1;
  }
  auto stopped_early = [&] {
    if (options.verbose) std::cerr << "pgrelay recv: stopping on signal before streaming began\n";
    return 0;
  };
  if (options.verbose) std::cerr << "pgrelay recv: connecting to the server\n";
  auto conn = connect_replication(options.target, !options.no_password, signals.fd());
  if (!conn.ok()) {
    if (signals.pending()) return stopped_early();
    report(conn.error());
    return 1;
  }
  PGconn* pg = conn->get();

  if (options.drop_slot) {
    if (options.verbose) {
      std::cerr << "pgrelay recv: dropping replication slot \"" << options.slot << "\"\n";
    }
    auto dropped = run_command(pg, "DROP_REPLICATION_SLOT " + quote_identifier(pg, options.slot),
                               PGRES_COMMAND_OK);
    if (!dropped.ok()) {
      report(dropped.error());
      return 1;
    }
    return 0;
  }
  if (options.create_slot) {
    Status created = create_slot(pg, options);
    if (!created.ok()) {
      report(created.error());
      return 1;
    }
  }

  if (signals.pending()) return stopped_early();
  std::string command = "START_REPLICATION SLOT " + quote_identifier(pg, options.slot) +
                        " LOGICAL " + start->to_string() + " (proto_version '" +
                        std::to_string(options.protocol_version) + "', publication_names " +
                        publication_list(pg, options.publications);
  if (options.messages) command += ", messages 'true'";
  command += ")";
  if (options.verbose) {
    std::cerr << "pgrelay recv: starting log streaming at " << start->to_string() << " (slot "
              << options.slot << ")\n";
  }
  auto started = run_command(pg, command, PGRES_COPY_BOTH);
  if (!started.ok()) {
    report(started.error());
    return 1;
  }
  if (options.verbose) std::cerr << "pgrelay recv: streaming initiated\n";
  auto stopped = stream_changes(pg, signals.fd(), *output, stream, std::cerr);
  if (!stopped.ok()) {
    report(stopped.error());
    return 1;
  }
  return 0;
}

Subcommand add_recv_command(CLI::App& parent) {
  auto options = std::make_shared<RecvOptions>();
  CLI::App* cmd = parent.add_subcommand("recv", kDescription);
  cmd->footer(kFooter);
  cmd->add_option("URL", options->target,
                  "The server: a libpq URI or conninfo string (replication=database is added)");
  cmd->add_option("--slot,-S", options->slot, "Name of the logical replication slot")->required();
  cmd->add_option("--publication,-P", options->publications,
                  "Publication whose changes to receive (repeatable; required unless "
                  "--drop-slot)")
      ->allow_extra_args(false);  // one name per occurrence, so that URL may follow it
  cmd->add_flag("--create-slot", options->create_slot,
                "Create the slot (plugin pgoutput) before streaming from it");
  cmd->add_flag("--if-not-exists", options->if_not_exists,
                "With --create-slot: use the slot if it exists already instead of failing");
  cmd->add_flag("--drop-slot", options->drop_slot, "Drop the slot and exit");
  cmd->add_option("--start,-I", options->start,
                  "Start at this LSN; transactions committed before it, or before the "
                  "slot's confirmed position, are skipped")
      ->capture_default_str();
  cmd->add_option("--endpos,-E", options->endpos,
                  "Stop after the first transaction committed at or beyond this LSN");
  cmd->add_option("--format", options->format, "Output format: json or pgoutput")
      ->capture_default_str();
  cmd->add_option("--file,-f", options->file,
                  "Append the output to this file (- for standard output)")
      ->capture_default_str();
  cmd->add_option("--proto-version", options->protocol_version,
                  "pgoutput protocol version to request (1-4; PostgreSQL 15 knows 1-3)")
      ->capture_default_str();
  cmd->add_flag_callback(
      "--messages", [options] { options->messages = true; },
      "Receive logical messages (pgoutput option messages 'true'; the default)");
  cmd->add_flag_callback(
      "--no-messages", [options] { options->messages = false; },
      "Do not request logical messages (for servers older than PostgreSQL 14)");
  cmd->add_option("--status-interval,-s", options->status_interval_seconds,
                  "Seconds between status updates to the server (0 = only when it asks)")
      ->capture_default_str();
  cmd->add_flag("--no-password,-w", options->no_password,
                "Never prompt for a password (fail if the server wants one)");
  cmd->add_flag("--verbose,-v", options->verbose, "Report progress on standard error");
  return Subcommand{cmd, [options] { return run_recv(*options); }};
}

}  // namespace pgrelay::cli
