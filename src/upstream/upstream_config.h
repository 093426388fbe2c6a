// Where the upstream is and how to log in: parsed once from a libpq URL or conninfo string.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/result.h"

namespace pgrelay::upstream {

enum class SslMode { kDisable, kAllow, kPrefer, kRequire, kVerifyCa, kVerifyFull };

struct UpstreamConfig {
  std::string host;  // a host name, an IP address, or a Unix socket directory (starts with '/')
  int port = 5432;
  std::string user;
  std::string password;  // never logged
  std::string dbname;
  SslMode sslmode = SslMode::kPrefer;
  std::string sslrootcert;  // CA file for verify-ca / verify-full; empty = system store
  // Other parameters of the URL that pgrelay hands on, as given, to its libpq connections
  // (capture, side queries): they change how a connection behaves, not where it goes or how
  // it logs in. Pass-through sessions log in with their client's own startup parameters.
  std::vector<std::pair<std::string, std::string>> libpq_parameters;

  // Parses what libpq accepts (URL or key=value), with libpq's defaults for what is missing
  // (PGHOST, PGUSER, ... and the local user name). 22023 with libpq's message on bad input;
  // 0A000 naming a parameter pgrelay would not honour on every connection it makes (client
  // certificates, for one), rather than dropping it.
  static Result<UpstreamConfig> parse(std::string_view url_or_conninfo);

  bool is_unix_socket() const { return !host.empty() && host.front() == '/'; }
  // A libpq conninfo string for this server and `database` (every value quoted for libpq).
  std::string conninfo(std::string_view database) const;
  std::string conninfo() const { return conninfo(dbname); }
  // host:port or the socket path, for messages (no credentials).
  std::string describe() const;
};

std::string_view to_string(SslMode mode);

}  // namespace pgrelay::upstream
