// The libpq replication connection of `pgrelay recv`: connect, run commands, errors with hints.
#pragma once

#include <libpq-fe.h>

#include <memory>
#include <string>
#include <string_view>

#include "base/result.h"

namespace pgrelay::cli {

struct PgConnCloser {
  void operator()(PGconn* conn) const { PQfinish(conn); }
};
struct PgResultCloser {
  void operator()(PGresult* res) const { PQclear(res); }
};
using PgConn = std::unique_ptr<PGconn, PgConnCloser>;
using PgResult = std::unique_ptr<PGresult, PgResultCloser>;

// Connects with libpq to `target` (a URL, a conninfo string, a database name, or empty for
// libpq's environment defaults) with replication=database added: TLS, sslmode, SCRAM, MD5,
// cleartext, .pgpass and PG* variables all work as libpq does. When the server wants a
// password that none of those gave, asks for it on the terminal unless `may_prompt` is false.
// When `stop_fd` (a signalfd, or -1) becomes readable first, gives up with kQueryCanceled.
Result<PgConn> connect_replication(const std::string& target, bool may_prompt, int stop_fd);

// Whether `fd` (or -1: never) has something to read now, without waiting.
bool readable(int fd);

// Runs one replication command; anything but `expected` becomes an Error carrying the server's
// SQLSTATE, message, detail and hint (or a hint of ours naming the fix).
Result<PgResult> run_command(PGconn* conn, const std::string& command, ExecStatusType expected);

// The error a failed result carries, with our hint when the server gave none.
Error error_of(const PGresult* result, std::string_view fallback);

// Adds a hint naming the usual fix for well-known errors (slot missing or present, wal_level,
// REPLICATION privilege, pg_hba.conf, missing publication) unless the error has one.
void add_fix_hint(Error& error);

// "name" with embedded double quotes doubled (PQescapeIdentifier's form), for replication
// commands, whose grammar accepts it.
std::string quote_identifier(PGconn* conn, std::string_view name);

// 'text' with embedded single quotes doubled: the replication grammar's only string syntax
// (no E'' strings, no backslash escapes), so PQescapeLiteral's E'' form cannot be used.
std::string quote_repl_literal(std::string_view text);

}  // namespace pgrelay::cli
