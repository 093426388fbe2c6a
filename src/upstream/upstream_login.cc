// Opens a raw protocol connection to the upstream and logs in with the configured credentials.
#include "upstream/upstream_login.h"

#include "wire/frontend_messages.h"
#include "wire/md5_auth.h"
#include "wire/scram.h"
#include "wire/startup.h"

namespace pgrelay::upstream {
namespace {

Error upstream_unreachable(const UpstreamConfig& config, std::string_view why) {
  return Error::make(
      "08006",
      "could not connect to the upstream at " + config.describe() + ": " + std::string(why),
      "Check that the upstream server is running and that the --upstream URL "
      "names the right host and port.");
}

awaitable<Result<Transport>> open_transport(const UpstreamConfig& config) {
  auto executor = co_await asio::this_coro::executor;
  if (config.is_unix_socket()) {
    unix_socket::socket socket(executor);
    std::string path = config.host + "/.s.PGSQL." + std::to_string(config.port);
    auto [ec] = co_await socket.async_connect(unix_socket::endpoint(path), kAsTuple);
    if (ec) co_return upstream_unreachable(config, ec.message());
    co_return Transport(std::move(socket));
  }
  tcp::resolver resolver(executor);
  auto [rec, endpoints] =
      co_await resolver.async_resolve(config.host, std::to_string(config.port), kAsTuple);
  if (rec) co_return upstream_unreachable(config, rec.message());
  tcp::socket socket(executor);
  auto [cec, endpoint] = co_await asio::async_connect(socket, endpoints, kAsTuple);
  (void)endpoint;
  if (cec) co_return upstream_unreachable(config, cec.message());
  socket.set_option(tcp::no_delay(true));
  co_return Transport(std::move(socket));
}

// SSLRequest and, if the upstream agrees, the TLS handshake.
awaitable<Status> negotiate_tls(const UpstreamConfig& config, Transport& transport,
                                asio::ssl::context* tls) {
  if (config.is_unix_socket() || config.sslmode == SslMode::kDisable ||
      config.sslmode == SslMode::kAllow) {
    co_return Status{};
  }
  bool required = config.sslmode >= SslMode::kRequire;
  if (!tls) {
    if (required) {
      co_return Error::make("08006", "sslmode=" + std::string(to_string(config.sslmode)) +
                                         " needs TLS, but pgrelay has no TLS client context");
    }
    co_return Status{};
  }
  Bytes request = wire::encode(wire::SSLRequest{});
  PGRELAY_CO_TRY(co_await transport.write_all(request));
  std::uint8_t answer = 0;
  auto n = co_await transport.read_some(asio::buffer(&answer, 1));
  if (!n.ok()) co_return n.error();
  if (answer == 'S') {
    std::string verify_host = config.sslmode == SslMode::kVerifyFull ? config.host : "";
    co_return co_await transport.start_tls(*tls, asio::ssl::stream_base::client, verify_host);
  }
  if (answer == 'N') {
    if (required) {
      co_return Error::make("08006",
                            "the upstream does not support TLS, but sslmode=" +
                                std::string(to_string(config.sslmode)) + " requires it",
                            "Enable ssl on the upstream, or use sslmode=prefer in the URL.");
    }
    co_return Status{};
  }
  co_return Error::make(sqlstate::kProtocolViolation,
                        "the upstream sent an invalid answer to SSLRequest");
}

Error no_password(const UpstreamConfig& config) {
  return Error::make(
      sqlstate::kInvalidPassword,
      "the upstream asks for a password for user \"" + config.user + "\", but none was given",
      "Put the password in the upstream URL (postgres://user:password@host/db) "
      "or in PGPASSWORD.");
}

}  // namespace

awaitable<Result<UpstreamLink>> connect_upstream(
    const UpstreamConfig& config, std::string database,
    std::vector<std::pair<std::string, std::string>> parameters, asio::ssl::context* tls) {
  auto transport = co_await open_transport(config);
  if (!transport.ok()) co_return transport.error();
  PGRELAY_CO_TRY(co_await negotiate_tls(config, *transport, tls));

  wire::StartupMessage startup;
  startup.version = wire::kEarliestProtocol;
  startup.parameters.emplace_back("user", config.user);
  startup.parameters.emplace_back("database", std::move(database));
  for (auto& [name, value] : parameters) {
    if (name == "user" || name == "database") continue;
    startup.parameters.emplace_back(std::move(name), std::move(value));
  }
  UpstreamLink link{
      MessageStream(std::move(*transport), wire::FrameReader::Phase::kRegular), {}, {}};
  Bytes startup_packet = wire::encode(startup);
  PGRELAY_CO_TRY(co_await link.stream.write(startup_packet));

  std::optional<wire::ScramClient> scram;
  for (;;) {
    auto frame = co_await link.stream.read_frame();
    if (!frame.ok()) co_return frame.error();
    switch (frame->tag) {
      case 'R': {
        auto auth = wire::parse_authentication(frame->body);
        if (!auth.ok()) co_return auth.error();
        if (std::holds_alternative<wire::AuthenticationOk>(*auth)) break;
        if (std::holds_alternative<wire::AuthenticationCleartextPassword>(*auth)) {
          if (config.password.empty()) co_return no_password(config);
          Bytes message = wire::encode(wire::PasswordMessage{config.password});
          PGRELAY_CO_TRY(co_await link.stream.write(message));
        } else if (auto* md5 = std::get_if<wire::AuthenticationMD5Password>(&*auth)) {
          if (config.password.empty()) co_return no_password(config);
          std::string response = wire::md5_client_response(config.user, config.password, md5->salt);
          Bytes message = wire::encode(wire::PasswordMessage{response});
          PGRELAY_CO_TRY(co_await link.stream.write(message));
        } else if (auto* sasl = std::get_if<wire::AuthenticationSASL>(&*auth)) {
          if (config.password.empty()) co_return no_password(config);
          wire::ScramClientOptions options;
          bool offers_plus = false, offers_plain = false;
          for (const auto& m : sasl->mechanisms) {
            offers_plus |= m == "SCRAM-SHA-256-PLUS";
            offers_plain |= m == "SCRAM-SHA-256";
          }
          auto binding = link.stream.transport().channel_binding(false);
          if (offers_plus && binding) {
            options.channel_binding = wire::ScramChannelBinding::kPlus;
            options.channel_binding_data = *binding;
          } else if (binding) {
            options.channel_binding = wire::ScramChannelBinding::kServerNotOffering;
          } else if (!offers_plain) {
            co_return Error::make(sqlstate::kFeatureNotSupported,
                                  "the upstream offers no SASL mechanism pgrelay supports");
          }
          scram.emplace(config.password, std::move(options));
          auto first = scram->client_first();
          if (!first.ok()) co_return first.error();
          wire::SASLInitialResponse initial;
          initial.mechanism = std::string(scram->mechanism());
          initial.data = Bytes(first->begin(), first->end());
          Bytes message = wire::encode(initial);
          PGRELAY_CO_TRY(co_await link.stream.write(message));
        } else if (auto* cont = std::get_if<wire::AuthenticationSASLContinue>(&*auth)) {
          if (!scram) co_return Error::protocol("unexpected SASLContinue from the upstream");
          auto final_message = scram->handle_server_first(std::string_view(
              reinterpret_cast<const char*>(cont->data.data()), cont->data.size()));
          if (!final_message.ok()) co_return final_message.error();
          Bytes message =
              wire::encode(wire::SASLResponse{Bytes(final_message->begin(), final_message->end())});
          PGRELAY_CO_TRY(co_await link.stream.write(message));
        } else if (auto* fin = std::get_if<wire::AuthenticationSASLFinal>(&*auth)) {
          if (!scram) co_return Error::protocol("unexpected SASLFinal from the upstream");
          PGRELAY_CO_TRY(scram->handle_server_final(
              std::string_view(reinterpret_cast<const char*>(fin->data.data()), fin->data.size())));
        }
        break;
      }
      case 'S': {
        auto status = wire::parse_parameter_status(frame->body);
        if (!status.ok()) co_return status.error();
        link.parameters.emplace_back(std::move(status->name), std::move(status->value));
        break;
      }
      case 'K': {
        auto key = wire::parse_backend_key_data(frame->body);
        if (!key.ok()) co_return key.error();
        link.key = *key;
        break;
      }
      case 'E': {
        auto error = wire::parse_error_response(frame->body);
        if (!error.ok()) co_return error.error();
        co_return error->to_error();
      }
      case 'Z':
        co_return std::move(link);
      case 'N':
      case 'v':
        break;  // notices and protocol negotiation need no answer
      default:
        co_return Error::protocol("unexpected message " + wire::describe_tag(frame->tag) +
                                  " from the upstream during startup");
    }
  }
}

awaitable<Status> cancel_upstream(const UpstreamConfig& config, wire::BackendKeyData key) {
  auto transport = co_await open_transport(config);
  if (!transport.ok()) co_return transport.error();
  Bytes request = wire::encode(wire::CancelRequest{key.pid, key.secret_key});
  PGRELAY_CO_TRY(co_await transport->write_all(request));
  // The server closes the connection when done; wait for that so the cancel is delivered.
  std::uint8_t byte = 0;
  (void)co_await transport->read_some(asio::buffer(&byte, 1));
  transport->close();
  co_return Status{};
}

}  // namespace pgrelay::upstream
