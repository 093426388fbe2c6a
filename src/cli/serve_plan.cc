// What `pgrelay serve`'s options ask for, checked before any part starts.
#include "cli/serve_plan.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "base/strings.h"
#include "server/metrics_endpoint.h"
#include "wire/scram.h"
#include "zero/dotenv.h"
#include "zero/zero_environment.h"

namespace pgrelay::cli {

namespace {

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

// One --auth rule, "ADDRESS/PREFIX=METHOD".
Result<server::AuthRule> parse_auth_rule(const std::string& rule) {
  auto eq = rule.find('=');
  if (eq == std::string::npos) {
    return Error::make(sqlstate::kInvalidParameterValue, "invalid --auth rule \"" + rule + "\"",
                       "Use ADDRESS/PREFIX=METHOD.");
  }
  auto network = server::parse_auth_network(rule.substr(0, eq));
  if (!network.ok()) return network.error();
  auto method = server::parse_auth_method(rule.substr(eq + 1));
  if (!method.ok()) return method.error();
  return server::AuthRule{*network, *method};
}

// Whether a rule's network holds only loopback addresses (IPv4 ones are held v4-mapped).
bool loopback_network(const asio::ip::network_v6& network) {
  const asio::ip::address_v6 address = network.address();
  if (address.is_v4_mapped()) {
    return asio::ip::make_address_v4(asio::ip::v4_mapped, address).is_loopback() &&
           network.prefix_length() >= 104;  // within 127.0.0.0/8
  }
  return address.is_loopback() && network.prefix_length() == 128;
}

Status readable_file(const std::string& path, const char* option) {
  if (path.empty() || ::access(path.c_str(), R_OK) == 0) return {};
  return Error::make(sqlstate::kInvalidParameterValue,
                     std::string(option) + ": cannot read " + path + ": " + std::strerror(errno),
                     "Give the path of a file pgrelay's user can read.");
}

// The NATS options --nats and --follow share: the servers (`urls`, from `option`), stream,
// subject prefix, credentials and TLS.
struct NatsPlan {
  nats::ConnectOptions connect;
  std::string stream;
  std::string subject_prefix;
};

Result<NatsPlan> plan_nats(const ServeOptions& options, const std::vector<std::string>& urls,
                           const std::string& option) {
  NatsPlan out;
  for (const auto& url : urls) {
    if (url.empty()) continue;
    const bool scheme = url.find("://") != std::string::npos;
    if (scheme && !url.starts_with("nats://") && !url.starts_with("tls://")) {
      return Error::make(sqlstate::kInvalidParameterValue,
                         option + ": " + nats::redact_url(url) + " is not a NATS URL",
                         "Give nats://HOST:PORT (or tls://HOST:PORT), comma-separated for a "
                         "cluster.");
    }
    out.connect.urls.push_back(scheme ? url : "nats://" + url);
  }
  if (out.connect.urls.empty()) {
    return Error::make(sqlstate::kInvalidParameterValue, option + " names no server",
                       "Give nats://HOST:PORT, comma-separated for a cluster.");
  }
  const std::string& stream = options.nats_stream;
  if (stream.empty() || stream.find_first_of(" \t\r\n.*>/\\") != std::string::npos) {
    return Error::make(sqlstate::kInvalidParameterValue,
                       "--nats-stream: \"" + stream + "\" is not a JetStream stream name",
                       "A stream name may not be empty or hold spaces, '.', '*', '>', '/' or "
                       "'\\'; the default is PGRELAY.");
  }
  if (!nats::valid_subject_prefix(options.nats_subject_prefix)) {
    return Error::make(
        sqlstate::kInvalidParameterValue,
        "--nats-subject-prefix: \"" + options.nats_subject_prefix + "\" is not a subject prefix",
        "Give one or more tokens of letters, digits, '_' and '-', joined by '.', "
        "e.g. pgrelay or acme.cdc.");
  }
  out.stream = stream;
  out.subject_prefix = options.nats_subject_prefix;
  out.connect.user = options.nats_user;
  out.connect.password = options.nats_password;
  out.connect.token = options.nats_token;
  out.connect.creds_file = options.nats_creds;
  out.connect.tls_ca_file = options.nats_tls_ca;
  out.connect.tls_cert_file = options.nats_tls_cert;
  out.connect.tls_key_file = options.nats_tls_key;
  if (!options.nats_nkey.empty()) {
    const auto colon = options.nats_nkey.find(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == options.nats_nkey.size()) {
      return Error::make(sqlstate::kInvalidParameterValue, "--nats-nkey wants PUBLIC_KEY:SEED_FILE",
                         "Give the user's public NKey (U...), a colon, and the file holding "
                         "its seed.");
    }
    out.connect.nkey_public = options.nats_nkey.substr(0, colon);
    out.connect.nkey_seed_file = options.nats_nkey.substr(colon + 1);
  }
  if (!out.connect.tls_cert_file.empty() != !out.connect.tls_key_file.empty()) {
    return Error::make(sqlstate::kInvalidParameterValue,
                       "--nats-tls-cert and --nats-tls-key go together",
                       "Give both, the certificate and its private key, or neither.");
  }
  PGRELAY_TRY(readable_file(out.connect.creds_file, "--nats-creds"));
  PGRELAY_TRY(readable_file(out.connect.nkey_seed_file, "--nats-nkey"));
  PGRELAY_TRY(readable_file(out.connect.tls_ca_file, "--nats-tls-ca"));
  PGRELAY_TRY(readable_file(out.connect.tls_cert_file, "--nats-tls-cert"));
  PGRELAY_TRY(readable_file(out.connect.tls_key_file, "--nats-tls-key"));
  return out;
}

// --follow: a follower of the --upstream URL's database (or, without an upstream, of the one
// --database names), which captures nothing itself.
Result<capture::FollowerOptions> plan_follow(const ServeOptions& options,
                                             const upstream::UpstreamConfig* upstream,
                                             bool own_users) {
  if (!options.nats.empty()) {
    return Error::make(sqlstate::kInvalidParameterValue, "--follow and --nats exclude each other",
                       "A follower serves the stream its primary publishes; publish from the "
                       "primary only (drop --nats here).");
  }
  if (upstream == nullptr && options.databases.size() != 1) {
    return Error::make(
        sqlstate::kInvalidParameterValue, "--follow without --upstream needs --database NAME",
        "Name the database whose stream it follows (the primary's upstream database), once; or "
        "give --upstream URL, whose database it follows and where ordinary sessions go.");
  }
  if (upstream != nullptr && !options.databases.empty()) {
    return Error::make(sqlstate::kInvalidParameterValue,
                       "--database does not apply to a follower with --upstream",
                       "It follows the --upstream URL's database: drop --database.");
  }
  if (upstream == nullptr && !own_users) {
    return Error::make(
        sqlstate::kInvalidParameterValue, "--follow without --upstream needs --users or --user",
        "Clients log in with the upstream URL's user by default, and there is none: name who "
        "may log in (--user \"NAME SECRET replication\", SECRET from `pgrelay hash-password`).");
  }
  if (!options.capture.empty()) {
    return Error::make(sqlstate::kInvalidParameterValue, "--capture does not apply to --follow",
                       "A follower captures nothing: it rebuilds its log from the stream its "
                       "primary publishes. Drop --capture.");
  }
  auto nats = plan_nats(options, options.follow, "--follow");
  if (!nats.ok()) return nats.error();
  capture::FollowerOptions out;
  out.connect = std::move(nats->connect);
  out.connect.name = "pgrelay follower";
  out.stream = std::move(nats->stream);
  out.subject_prefix = std::move(nats->subject_prefix);
  out.database = upstream != nullptr ? upstream->dbname : options.databases.front();
  out.facts_dir = options.data_dir;
  return out;
}

// --admin HOST:PORT; beyond loopback only with --admin-token.
Result<std::pair<std::string, int>> plan_admin(const ServeOptions& options) {
  auto address = server::parse_metrics_address(options.admin);
  if (!address.ok()) {
    return Error::make(sqlstate::kInvalidParameterValue,
                       "invalid --admin value \"" + options.admin + "\"",
                       "Use HOST:PORT, e.g. --admin 127.0.0.1:6477, a port alone, or off.");
  }
  const std::string& host = address->first;
  const bool loopback = host == "localhost" || host == "::1" || host.starts_with("127.");
  if (!loopback && options.admin_token.empty()) {
    return Error::make(sqlstate::kInvalidParameterValue,
                       "--admin " + options.admin + " is beyond loopback and has no token",
                       "Give --admin-token (best as PGRELAY_ADMIN_TOKEN), which every request "
                       "must then carry, or serve the page on 127.0.0.1.");
  }
  return address;
}

// `pgrelay zero`: zero-cache, the Node it runs on and the app's .env, found before anything
// starts.
Result<ServePlan::Zero> plan_zero(const ServeOptions& options, const std::string& cwd,
                                  const std::string& path,
                                  const std::vector<std::string>& environment) {
  if (!options.upstream.empty()) {
    return Error::make(sqlstate::kInvalidParameterValue,
                       "pgrelay zero runs its own PostgreSQL: --upstream does not apply",
                       "Drop --upstream, or run zero-cache yourself against `pgrelay serve "
                       "--upstream URL` (ZERO_UPSTREAM_DB set to pgrelay's URL).");
  }
  if (!options.follow.empty()) {
    return Error::make(sqlstate::kInvalidParameterValue, "--follow does not apply to pgrelay zero",
                       "Run a follower with `pgrelay serve --follow`, and zero-cache against it.");
  }
  ServePlan::Zero out;
  auto package = zero::find_zero_cache(options.zero_cache, cwd);
  if (!package.ok()) return package.error();
  out.package = std::move(*package);
  auto node = zero::find_node(options.node, path);
  if (!node.ok()) return node.error();
  out.node = std::move(*node);
  auto dotenv = zero::read_dotenv(cwd + "/.env");
  if (!dotenv.ok()) return dotenv.error();
  out.dotenv = std::move(*dotenv);
  // Checked before anything starts: zero-cache would fail on it only after PostgreSQL had.
  const std::string port = zero::environment_value(
      zero::zero_cache_environment(environment, out.dotenv, {}), "ZERO_PORT");
  if (!port.empty()) {
    auto parsed = parse_decimal(port);
    if (!parsed || *parsed == 0 || *parsed > 65535) {
      return Error::make(sqlstate::kInvalidParameterValue,
                         "ZERO_PORT=" + port + " is not a port number",
                         "Set ZERO_PORT (in the environment or ./.env) to a free TCP port, or "
                         "leave it unset for zero-cache's default, 4848.");
    }
    out.port = static_cast<int>(*parsed);
  }
  return out;
}

}  // namespace

Result<ServePlan> plan_serve(const ServeOptions& options, const std::string& cwd,
                             const std::string& path, const std::vector<std::string>& environment) {
  ServePlan plan;
  auto listen = parse_listen(options.listen);
  if (!listen.ok()) return listen.error();
  plan.listen = *listen;
  if (!options.upstream.empty() && !options.databases.empty() && options.follow.empty()) {
    return Error::make(sqlstate::kInvalidParameterValue,
                       "--database creates databases in pgrelay's private PostgreSQL only",
                       "Create them on the upstream yourself (CREATE DATABASE), or drop "
                       "--upstream to use the private instance.");
  }
  if (!options.upstream.empty()) {
    auto upstream = upstream::UpstreamConfig::parse(options.upstream);
    if (!upstream.ok()) return upstream.error();
    plan.upstream = std::move(*upstream);
  }
  if (!options.users_file.empty() || !options.users.empty()) {
    auto users = read_users(options);
    if (!users.ok()) return users.error();
    plan.users = std::move(*users);
  }
  for (const auto& text : options.auth_rules) {
    auto rule = parse_auth_rule(text);
    if (!rule.ok()) return rule.error();
    if (rule->method == server::AuthMethod::kTrust && !loopback_network(rule->network)) {
      plan.trusting_rules.push_back(text);
    }
    plan.auth_rules.insert(plan.auth_rules.begin(), *rule);
  }
  if (!options.metrics.empty()) {
    auto address = server::parse_metrics_address(options.metrics);
    if (!address.ok()) return address.error();
    plan.metrics = *address;
  }
  if (!options.admin.empty() && options.admin != "off") {
    auto admin = plan_admin(options);
    if (!admin.ok()) return admin.error();
    plan.admin = *admin;
  }
  if (!options.follow.empty()) {
    auto follow =
        plan_follow(options, plan.upstream ? &*plan.upstream : nullptr, plan.users.has_value());
    if (!follow.ok()) return follow.error();
    plan.follow = std::move(*follow);
  } else if (!options.nats.empty()) {
    auto nats = plan_nats(options, options.nats, "--nats");
    if (!nats.ok()) return nats.error();
    nats::PublisherOptions publisher;
    publisher.connect = std::move(nats->connect);
    publisher.stream = std::move(nats->stream);
    publisher.subject_prefix = std::move(nats->subject_prefix);
    plan.nats = std::move(publisher);
  }
  if (options.zero) {
    auto zero = plan_zero(options, cwd, path, environment);
    if (!zero.ok()) return zero.error();
    plan.zero = std::move(*zero);
  }
  return plan;
}

}  // namespace pgrelay::cli
