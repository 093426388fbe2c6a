// Client authentication: pgrelay's own users, per-address methods, and the SASL/MD5 exchanges.
#pragma once

#include <chrono>

#include <optional>
#include <string>
#include <vector>

#include "base/result.h"
#include "upstream/message_stream.h"
#include "wire/startup.h"

namespace pgrelay::server {

enum class AuthMethod { kScram, kMd5, kPassword, kTrust, kReject };

struct User {
  std::string name;
  // As pg_authid.rolpassword holds it: a SCRAM-SHA-256 secret or an "md5..." hash; empty
  // means no password (only trust can admit the user).
  std::string secret;
  bool replication = false;  // may open replication connections
};

// One pg_hba-like rule: clients whose address falls in `network` use `method`.
struct AuthRule {
  asio::ip::network_v6 network;  // IPv4 addresses are matched as v4-mapped v6
  AuthMethod method = AuthMethod::kScram;
};

struct AuthConfig {
  std::vector<User> users;
  // First match wins; addresses no rule matches use `default_method`. Unix-socket clients count
  // as loopback.
  std::vector<AuthRule> rules;
  AuthMethod default_method = AuthMethod::kScram;
  // Per-server secret for mock SCRAM exchanges with unknown users.
  Bytes mock_secret;
  // Postgres's authentication_timeout: a client that has not completed startup and
  // authentication by then is disconnected, so stalled clients cannot pile up. Zero: never.
  std::chrono::milliseconds timeout{60000};

  const User* find(std::string_view name) const;
  AuthMethod method_for(const std::optional<asio::ip::address>& peer) const;
};

// Parses "trust", "md5", "password", "scram-sha-256", "reject".
Result<AuthMethod> parse_auth_method(std::string_view text);
// Parses "127.0.0.1/32", "::1/128", "10.0.0.0/8", "all" into a rule network.
Result<asio::ip::network_v6> parse_auth_network(std::string_view text);
bool is_loopback(const std::optional<asio::ip::address>& peer);

// Runs the exchange the method asks for. Returns the user on success; on failure the
// ErrorResponse has not been sent yet (the caller sends it and closes).
upstream::awaitable<Result<const User*>> authenticate(upstream::MessageStream& stream,
                                                      const wire::StartupMessage& startup,
                                                      const AuthConfig& config);

}  // namespace pgrelay::server
