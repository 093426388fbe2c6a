// Client authentication: pgrelay's own users, per-address methods, and the SASL/MD5 exchanges.
#include "server/auth.h"

#include "wire/backend_messages.h"
#include "wire/frontend_messages.h"
#include "wire/md5_auth.h"
#include "wire/scram.h"

namespace pgrelay::server {
namespace {

asio::ip::address_v6 as_v6(const asio::ip::address& address) {
  if (address.is_v4()) return asio::ip::make_address_v6(asio::ip::v4_mapped, address.to_v4());
  return address.to_v6();
}

std::string_view as_text(const Bytes& data) {
  return {reinterpret_cast<const char*>(data.data()), data.size()};
}

Error auth_failed(std::string_view user, AuthMethod method) {
  if (method == AuthMethod::kReject) {
    return Error::make(sqlstate::kInvalidAuthorization,
                       "pgrelay's authentication rules reject connections for user \"" +
                           std::string(user) + "\" from this address",
                       "Add an --auth rule for this address range.");
  }
  return wire::password_auth_failed(user);
}

// Reads the client's 'p' message; anything else is a protocol violation.
upstream::awaitable<Result<Bytes>> read_password_packet(upstream::MessageStream& stream) {
  auto frame = co_await stream.read_frame();
  if (!frame.ok()) co_return frame.error();
  if (frame->tag != 'p') {
    co_return Error::protocol("expected password response, got message type " +
                              std::to_string(static_cast<unsigned char>(frame->tag)));
  }
  co_return std::move(frame->body);
}

upstream::awaitable<Status> scram_exchange(upstream::MessageStream& stream,
                                           const wire::StartupMessage& startup, const User* user,
                                           const AuthConfig& config) {
  auto binding = stream.transport().channel_binding(true);
  std::vector<std::string> mechanisms;
  for (auto m : wire::scram_mechanisms(binding.has_value())) mechanisms.emplace_back(m);
  // GCC 12 destroys aggregate temporaries inside co_await expressions twice: build messages
  // in named variables first, here and below.
  Bytes offer = wire::encode(wire::AuthenticationSASL{mechanisms});
  PGRELAY_CO_TRY(co_await stream.write(offer));

  auto packet = co_await read_password_packet(stream);
  if (!packet.ok()) co_return packet.error();
  auto initial = wire::parse_sasl_initial_response(*packet);
  if (!initial.ok()) co_return initial.error();

  wire::ScramServerOptions options;
  if (binding) options.channel_binding_data = *binding;
  options.mock_secret = config.mock_secret;
  std::optional<std::string_view> secret;
  if (user && !user->secret.empty()) secret = user->secret;
  auto server =
      wire::ScramServer::begin_with_secret(startup.user(), initial->mechanism, secret, options);
  if (!server.ok()) co_return server.error();

  std::string client_first;
  if (initial->data) {
    client_first = std::string(as_text(*initial->data));
  } else {
    // No initial response: ask for it with an empty challenge.
    Bytes empty_challenge = wire::encode(wire::AuthenticationSASLContinue{});
    PGRELAY_CO_TRY(co_await stream.write(empty_challenge));
    auto next = co_await read_password_packet(stream);
    if (!next.ok()) co_return next.error();
    auto response = wire::parse_sasl_response(*next);
    if (!response.ok()) co_return response.error();
    client_first = std::string(as_text(response->data));
  }
  auto server_first = server->handle_client_first(client_first);
  if (!server_first.ok()) co_return server_first.error();
  Bytes challenge = wire::encode(
      wire::AuthenticationSASLContinue{Bytes(server_first->begin(), server_first->end())});
  PGRELAY_CO_TRY(co_await stream.write(challenge));

  auto final_packet = co_await read_password_packet(stream);
  if (!final_packet.ok()) co_return final_packet.error();
  auto client_final = wire::parse_sasl_response(*final_packet);
  if (!client_final.ok()) co_return client_final.error();
  auto server_final = server->handle_client_final(as_text(client_final->data));
  if (!server_final.ok()) co_return server_final.error();
  Bytes outcome = wire::encode(
      wire::AuthenticationSASLFinal{Bytes(server_final->begin(), server_final->end())});
  PGRELAY_CO_TRY(co_await stream.write(outcome));
  co_return Status{};
}

// Sends `request` (an MD5 or cleartext password request) and returns the client's answer.
upstream::awaitable<Result<std::string>> ask_password(upstream::MessageStream& stream,
                                                      const Bytes& request) {
  PGRELAY_CO_TRY(co_await stream.write(request));
  auto packet = co_await read_password_packet(stream);
  if (!packet.ok()) co_return packet.error();
  auto response = wire::parse_password_message(*packet);
  if (!response.ok()) co_return response.error();
  co_return std::move(response->password);
}

upstream::awaitable<Status> md5_exchange(upstream::MessageStream& stream,
                                         const wire::StartupMessage& startup, const User* user) {
  auto salt_bytes = wire::random_bytes(4);
  if (!salt_bytes.ok()) co_return salt_bytes.error();
  wire::Md5Salt salt{};
  std::copy(salt_bytes->begin(), salt_bytes->end(), salt.begin());
  Bytes request = wire::encode(wire::AuthenticationMD5Password{salt});
  auto password = co_await ask_password(stream, request);
  if (!password.ok()) co_return password.error();
  if (!user || user->secret.empty()) co_return wire::password_auth_failed(startup.user());
  co_return wire::md5_verify_response(startup.user(), user->secret, *password, salt);
}

upstream::awaitable<Status> password_exchange(upstream::MessageStream& stream,
                                              const wire::StartupMessage& startup,
                                              const User* user) {
  Bytes request = wire::encode(wire::AuthenticationCleartextPassword{});
  auto password = co_await ask_password(stream, request);
  if (!password.ok()) co_return password.error();
  if (!user || user->secret.empty()) co_return wire::password_auth_failed(startup.user());
  co_return wire::plain_password_verify(startup.user(), user->secret, *password);
}

}  // namespace

const User* AuthConfig::find(std::string_view name) const {
  for (const auto& user : users) {
    if (user.name == name) return &user;
  }
  return nullptr;
}

bool is_loopback(const std::optional<asio::ip::address>& peer) {
  if (!peer) return true;  // Unix socket
  if (peer->is_loopback()) return true;
  return peer->is_v6() && peer->to_v6().is_v4_mapped() &&
         asio::ip::make_address_v4(asio::ip::v4_mapped, peer->to_v6()).is_loopback();
}

AuthMethod AuthConfig::method_for(const std::optional<asio::ip::address>& peer) const {
  auto address = peer ? as_v6(*peer) : asio::ip::address_v6::loopback();
  for (const auto& rule : rules) {
    auto network = rule.network.canonical();
    auto host = asio::ip::network_v6(address, network.prefix_length()).canonical();
    if (host == network) return rule.method;
  }
  return default_method;
}

Result<AuthMethod> parse_auth_method(std::string_view text) {
  if (text == "scram-sha-256" || text == "scram") return AuthMethod::kScram;
  if (text == "md5") return AuthMethod::kMd5;
  if (text == "password") return AuthMethod::kPassword;
  if (text == "trust") return AuthMethod::kTrust;
  if (text == "reject") return AuthMethod::kReject;
  return Error::make(sqlstate::kInvalidParameterValue,
                     "invalid authentication method \"" + std::string(text) + "\"",
                     "Use scram-sha-256, md5, password, trust or reject.");
}

Result<asio::ip::network_v6> parse_auth_network(std::string_view text) {
  if (text == "all") return asio::ip::network_v6(asio::ip::address_v6::any(), 0);
  std::string spec(text);
  std::string address_text = spec;
  int prefix = -1;
  if (auto slash = spec.find('/'); slash != std::string::npos) {
    address_text = spec.substr(0, slash);
    try {
      prefix = std::stoi(spec.substr(slash + 1));
    } catch (...) {
      prefix = -2;
    }
  }
  std::error_code ec;
  auto address = asio::ip::make_address(address_text, ec);
  int max_prefix = !ec && address.is_v4() ? 32 : 128;
  if (ec || prefix == -2 || prefix > max_prefix) {
    return Error::make(sqlstate::kInvalidParameterValue, "invalid address range \"" + spec + "\"",
                       "Use an address with a prefix length, e.g. 10.0.0.0/8 or ::1/128, or all.");
  }
  if (prefix < 0) prefix = max_prefix;
  if (address.is_v4()) prefix += 96;
  return asio::ip::network_v6(as_v6(address), static_cast<unsigned short>(prefix));
}

upstream::awaitable<Result<const User*>> authenticate(upstream::MessageStream& stream,
                                                      const wire::StartupMessage& startup,
                                                      const AuthConfig& config) {
  const User* user = config.find(startup.user());
  auto peer = stream.transport().peer_address();
  AuthMethod method = config.method_for(peer);
  Status outcome;
  switch (method) {
    case AuthMethod::kReject:
      co_return auth_failed(startup.user(), method);
    case AuthMethod::kTrust:
      if (!user) co_return auth_failed(startup.user(), method);
      break;
    case AuthMethod::kScram:
      outcome = co_await scram_exchange(stream, startup, user, config);
      break;
    case AuthMethod::kMd5:
      // As Postgres: a SCRAM secret cannot answer MD5, so such users get SCRAM instead.
      if (user && user->secret.rfind("SCRAM-SHA-256$", 0) == 0) {
        outcome = co_await scram_exchange(stream, startup, user, config);
      } else {
        outcome = co_await md5_exchange(stream, startup, user);
      }
      break;
    case AuthMethod::kPassword:
      outcome = co_await password_exchange(stream, startup, user);
      break;
  }
  if (!outcome.ok()) co_return outcome.error();
  if (!user) co_return wire::password_auth_failed(startup.user());
  Bytes ok = wire::encode(wire::AuthenticationOk{});
  PGRELAY_CO_TRY(co_await stream.write(ok));
  co_return user;
}

}  // namespace pgrelay::server
