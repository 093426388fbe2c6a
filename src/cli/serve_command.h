// `pgrelay serve`: capture from an upstream, keep the change log, and serve clients.
#pragma once

#include <string>
#include <vector>

#include "cli/subcommand.h"

namespace pgrelay::cli {

struct ServeOptions {
  std::string upstream;  // libpq URL or conninfo; empty: pgrelay's private PostgreSQL
  // The private PostgreSQL (no --upstream): databases to create, where its programs are, and
  // the OS user it runs as when pgrelay runs as root.
  std::vector<std::string> databases;
  std::string pg_bin;
  std::string run_as;
  std::string listen = "127.0.0.1:5433";
  std::string data_dir = "./pgrelay-data";
  std::string schema = "_pgrelay";  // upstream schema for capture and the virtual catalog
  // How changes are captured: "trigger" (any upstream), "native" (the upstream's logical
  // decoding: wal_level = logical and the REPLICATION right), or "auto" (native where possible).
  // Empty: see capture_mode().
  std::string capture;
  // Databases whose changes pgrelay captures besides the upstream URL's (always captured);
  // "*" is every database. Capture of one starts when a session first uses it through pgrelay.
  std::vector<std::string> capture_databases{"*"};
  std::string tls_cert;  // empty: DATA_DIR/tls/server.crt, generated on first start
  std::string tls_key;
  bool no_tls = false;
  int wal_sender_timeout_seconds = 60;
  int authentication_timeout_seconds = 60;
  // Seconds an upstream backend is kept for the next pass-through session after its client
  // leaves (server/backend_pool.h); 0: each session's backend ends with it.
  int pool_idle_timeout_seconds = 0;
  int max_replication_slots = 10;
  int max_wal_senders = 10;
  std::vector<std::string> auth_rules;  // "ADDRESS/PREFIX=METHOD"
  std::string users_file;               // empty: the upstream URL's user and password
  std::vector<std::string> users;       // "NAME SECRET [replication]", as lines of users_file
  std::string log_level = "info";
  std::string log_format = "text";
  std::string metrics;  // HOST:PORT of the /metrics endpoint; empty: off
  // A file the stamps of every transaction's hops are written to at shutdown (benchmarks;
  // base/hop_trace.h); empty: off.
  std::string hop_trace;
  // The admin page: HOST:PORT; empty: off ("127.0.0.1:6477" by default with `pgrelay zero`).
  // Anywhere but loopback it needs admin_token, which every request must then carry.
  std::string admin;
  std::string admin_token;  // best from PGRELAY_ADMIN_TOKEN: a command line is visible
  // Publishing the change log to NATS JetStream: the servers' URLs; empty: off.
  std::vector<std::string> nats;
  std::string nats_stream = "PGRELAY";
  std::string nats_subject_prefix = "pgrelay";
  std::string nats_user;
  std::string nats_password;  // best from PGRELAY_NATS_PASSWORD: a command line is visible
  std::string nats_token;     // likewise PGRELAY_NATS_TOKEN
  std::string nats_creds;
  std::string nats_nkey;  // "PUBLIC_KEY:SEED_FILE"
  std::string nats_tls_ca;
  std::string nats_tls_cert;
  std::string nats_tls_key;
  // Following a primary's JetStream stream instead of capturing: the servers' URLs; empty: off.
  // The stream, subject prefix, credentials and TLS are the --nats-* options'.
  std::vector<std::string> follow;
  // `pgrelay zero`: zero-cache runs beside the private PostgreSQL, supervised.
  bool zero = false;
  std::string zero_cache;  // @rocicorp/zero's directory, or an app's; empty: searched upward
  std::string node;        // the node binary; empty: node on PATH
};

// `pgrelay serve` (and `pgrelay` alone: serve a private PostgreSQL) and
// `pgrelay hash-password`.
Subcommand add_serve_command(CLI::App& parent);

// `pgrelay zero`: `pgrelay` with zero-cache's databases, and zero-cache run beside it.
Subcommand add_zero_command(CLI::App& parent);
Subcommand add_hash_password_command(CLI::App& parent);

// `pgrelay hash-password`: reads a password on stdin, prints its SCRAM-SHA-256 secret (or the
// md5 form for `md5_user`), for the users file.
int run_hash_password(const std::string& md5_user);

// Runs until SIGINT or SIGTERM (in front of `upstream`, or of a private PostgreSQL it starts in
// DATA_DIR/pg and stops at the end); returns the process exit status. Prints
// "pgrelay ready: postgres://..." on stdout once clients can connect.
int run_serve(const ServeOptions& options);

}  // namespace pgrelay::cli
