// The listener: accepts connections, negotiates TLS, authenticates, and starts each session.
#include "server/server.h"

#include "server/blocking.h"

#include <asio/steady_timer.hpp>

#include <chrono>
#include <exception>

#include "server/blocking.h"
#include "server/pass_through.h"
#include "server/replication_session.h"
#include "upstream/message_stream.h"
#include "upstream/upstream_login.h"
#include "wire/startup.h"

namespace pgrelay::server {
namespace {

upstream::awaitable<void> write_fatal(upstream::MessageStream& stream, const Error& error) {
  Bytes message = wire::encode(wire::make_error_response(error, wire::Severity::kFatal));
  (void)co_await stream.write(message);
}

// Sends a FATAL error that ends the session, counted and logged.
upstream::awaitable<void> send_fatal(ServerContext& context, upstream::MessageStream& stream,
                                     const Error& error, std::string_view host) {
  note_error_sent(context, error, /*ends_session=*/true, host);
  co_await write_fatal(stream, error);
}

// A network failure (not a protocol violation): the client went away.
bool client_vanished(const Error& error) {
  return error.sqlstate.starts_with("08") && error.sqlstate != sqlstate::kProtocolViolation;
}

// Completion of a detached coroutine: an exception there is a bug, reported rather than lost.
auto log_exception(Logger* logger, const char* where) {
  return [logger, where](std::exception_ptr failure) {
    if (!failure) return;
    try {
      std::rethrow_exception(failure);
    } catch (const std::exception& e) {
      log_to(logger, LogLevel::kError, "unexpected internal error",
             {{"in", where}, {"error", e.what()}});
    } catch (...) {
      log_to(logger, LogLevel::kError, "unexpected internal error", {{"in", where}});
    }
  };
}

// An authenticated session, from authorization to its end however it ends: counted as open,
// and its end logged with its duration. It keeps the logger and gauge themselves, not the
// context: a session's frame may be destroyed with the io_context, after the context.
class OpenSession {
 public:
  OpenSession(const ServerContext& context, std::string_view kind, std::string_view host,
              std::string_view user, std::string_view database)
      : logger_(context.logger), kind_(kind), host_(host), user_(user), database_(database) {
    if (context.metrics) {
      open_ = &context.metrics->gauge(server_metrics::kConnections, {{"kind", std::string(kind)}});
      open_->add(1);
    }
  }
  OpenSession(const OpenSession&) = delete;
  OpenSession& operator=(const OpenSession&) = delete;
  ~OpenSession() {
    if (open_) open_->add(-1);
    auto elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - start_);
    log_to(logger_, LogLevel::kInfo, "disconnection",
           {{"duration_ms", static_cast<std::int64_t>(elapsed.count())},
            {"user", user_},
            {"database", database_},
            {"host", host_},
            {"kind", kind_}});
  }

 private:
  Logger* logger_;
  std::string_view kind_, host_, user_, database_;  // outlived by the session's coroutine frame
  Gauge* open_ = nullptr;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace

Server::Server(asio::io_context& io, ServerContext& context) : io_(io), context_(context) {
  if (context_.metrics) register_server_metrics(*context_.metrics);
}

Result<upstream::tcp::endpoint> Server::listen(const std::string& host, int port) {
  std::error_code ec;
  auto address = asio::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec);
  if (ec) {
    return Error::make(
        sqlstate::kInvalidParameterValue, "invalid listen address \"" + host + "\"",
        "Give an IP address, e.g. --listen 127.0.0.1:5433 or --listen 0.0.0.0:5433.");
  }
  upstream::tcp::endpoint endpoint(address, static_cast<unsigned short>(port));
  auto acceptor = std::make_unique<upstream::tcp::acceptor>(io_);
  acceptor->open(endpoint.protocol(), ec);
  if (!ec) acceptor->set_option(upstream::tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor->bind(endpoint, ec);
  if (!ec) acceptor->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return Error::make(
        "08006", "could not listen on " + host + ":" + std::to_string(port) + ": " + ec.message(),
        "Is another server (or pgrelay) using that port? Choose another with "
        "--listen HOST:PORT.");
  }
  auto bound = acceptor->local_endpoint(ec);
  acceptors_.push_back(std::move(acceptor));
  return bound;
}

void Server::start() {
  for (auto& acceptor : acceptors_) {
    asio::co_spawn(io_, accept_loop(*acceptor), log_exception(context_.logger, "accept"));
  }
}

void Server::stop_accepting() {
  stopping_ = true;
  for (auto& acceptor : acceptors_) {
    std::error_code ignored;
    acceptor->close(ignored);
  }
}

void Server::stop() {
  stop_accepting();
  for (auto* transport : *sessions_) transport->close();
}

upstream::awaitable<void> Server::accept_loop(upstream::tcp::acceptor& acceptor) {
  while (!stopping_) {
    auto [ec, socket] = co_await acceptor.async_accept(upstream::kAsTuple);
    if (ec) {
      if (ec == asio::error::operation_aborted || stopping_) co_return;
      // Out of file descriptors and the like: back off a little instead of spinning.
      asio::steady_timer pause(io_, std::chrono::milliseconds(50));
      co_await pause.async_wait(upstream::kAsTuple);
      continue;
    }
    std::error_code ignored;
    socket.set_option(upstream::tcp::no_delay(true), ignored);
    asio::co_spawn(io_, serve_connection(std::move(socket)),
                   log_exception(context_.logger, "session"));
  }
}

namespace {

// Closes a connection that has not logged in within the authentication timeout. The timer's
// handler can run after the session is gone, so it reaches the transport through a pointer
// the session clears when it logs in or ends.
class LoginDeadline {
 public:
  LoginDeadline(const asio::any_io_executor& executor, upstream::Transport& transport,
                std::chrono::milliseconds timeout, Logger* logger, const std::string& host)
      : timer_(executor), target_(std::make_shared<upstream::Transport*>(&transport)) {
    if (timeout.count() <= 0) return;
    timer_.expires_after(timeout);
    timer_.async_wait([target = target_, logger, host](const std::error_code& error) {
      if (error || *target == nullptr) return;
      log_to(logger, LogLevel::kWarning, "startup or authentication timed out", {{"host", host}});
      (*target)->close();
    });
  }
  LoginDeadline(const LoginDeadline&) = delete;
  LoginDeadline& operator=(const LoginDeadline&) = delete;
  ~LoginDeadline() { met(); }

  void met() {
    *target_ = nullptr;
    timer_.cancel();
  }

 private:
  asio::steady_timer timer_;
  std::shared_ptr<upstream::Transport*> target_;
};

}  // namespace

upstream::awaitable<void> Server::serve_connection(upstream::tcp::socket socket) {
  std::string host = "local";
  std::error_code peer_error;
  auto peer = socket.remote_endpoint(peer_error);
  if (!peer_error) host = peer.address().to_string();
  log_to(context_.logger, LogLevel::kInfo, "connection received",
         {{"host", host}, {"port", peer_error ? 0 : static_cast<int>(peer.port())}});
  upstream::MessageStream stream(upstream::Transport(std::move(socket)),
                                 wire::FrameReader::Phase::kStartup);
  sessions_->insert(&stream.transport());
  struct Untrack {
    std::shared_ptr<std::set<upstream::Transport*>> sessions;
    upstream::Transport* transport;
    ~Untrack() { sessions->erase(transport); }
  } untrack{sessions_, &stream.transport()};
  LoginDeadline deadline(co_await asio::this_coro::executor, stream.transport(),
                         context_.auth.timeout, context_.logger, host);

  std::optional<wire::StartupMessage> startup;
  while (!startup) {
    auto frame = co_await stream.read_frame();
    if (!frame.ok()) {
      // A client that vanished mid-startup deserves no answer; a malformed packet gets one.
      if (frame.error().sqlstate == sqlstate::kProtocolViolation) {
        co_await send_fatal(context_, stream, frame.error(), host);
      } else {
        log_to(context_.logger, LogLevel::kDebug, "connection closed before startup",
               {{"host", host}, {"error", frame.error().message}});
      }
      co_return;
    }
    auto packet = wire::parse_startup_packet(frame->body);
    if (!packet.ok()) {
      co_await send_fatal(context_, stream, packet.error(), host);
      co_return;
    }
    if (std::holds_alternative<wire::SSLRequest>(*packet)) {
      if (stream.reader().buffered() != 0) {
        // Bytes sent before our answer could be injected by a man in the middle.
        {
          const Error fatal = Error::protocol("received unencrypted data after SSL request");
          co_await send_fatal(context_, stream, fatal, host);
        }
        co_return;
      }
      bool tls = context_.server_tls != nullptr && !stream.transport().is_tls();
      std::uint8_t answer = tls ? 'S' : 'N';
      if (!(co_await stream.transport().write_all(ByteView(&answer, 1))).ok()) co_return;
      if (tls) {
        auto handshake = co_await stream.transport().start_tls(*context_.server_tls,
                                                               asio::ssl::stream_base::server);
        if (!handshake.ok()) {
          log_to(context_.logger, LogLevel::kInfo, "could not accept TLS connection",
                 {{"host", host}, {"error", handshake.error().message}});
          co_return;
        }
      }
      continue;
    }
    if (std::holds_alternative<wire::GSSENCRequest>(*packet)) {
      std::uint8_t answer = 'N';
      if (!(co_await stream.transport().write_all(ByteView(&answer, 1))).ok()) co_return;
      continue;
    }
    if (auto* cancel = std::get_if<wire::CancelRequest>(&*packet)) {
      count(context_.metrics, server_metrics::kConnectionsAccepted, {{"kind", "cancel"}});
      auto target = context_.cancels.lookup(cancel->pid, cancel->secret_key);
      if (target && context_.upstream) {
        (void)co_await upstream::cancel_upstream(*context_.upstream, *target);
      }
      co_return;  // Postgres answers a cancel request by closing, whatever happened
    }
    startup = std::get<wire::StartupMessage>(std::move(*packet));
  }

  if (startup->version.major != 3) {
    {
      const Error fatal = wire::unsupported_protocol_error(startup->version);
      co_await send_fatal(context_, stream, fatal, host);
    }
    co_return;
  }
  if (wire::needs_protocol_negotiation(*startup)) {
    Bytes negotiate = wire::encode(wire::make_negotiate_protocol_version(*startup));
    if (!(co_await stream.write(negotiate)).ok()) {
      co_return;
    }
  }
  auto mode = startup->replication_mode();
  if (!mode.ok()) {
    co_await send_fatal(context_, stream, mode.error(), host);
    co_return;
  }
  if (*mode == wire::ReplicationMode::kPhysical) {
    {
      const Error fatal =
          Error::make(sqlstate::kFeatureNotSupported, "pgrelay does not serve physical replication",
                      "Connect with replication=database for logical replication.");
      co_await send_fatal(context_, stream, fatal, host);
    }
    co_return;
  }
  const bool replication = *mode == wire::ReplicationMode::kLogical;
  const std::string_view kind = replication ? "replication" : "pass-through";
  count(context_.metrics, server_metrics::kConnectionsAccepted, {{"kind", std::string(kind)}});
  stream.reader().set_phase(wire::FrameReader::Phase::kRegular);
  auto user = co_await authenticate(stream, *startup, context_.auth);
  if (!user.ok()) {
    const Error& failure = user.error();
    if (client_vanished(failure)) {
      // As Postgres: a client that hangs up instead of answering (psql asking for the password
      // first) is no failure worth a line.
      log_to(context_.logger, LogLevel::kDebug, "connection closed during authentication",
             {{"host", host}, {"user", startup->user()}});
      co_await write_fatal(stream, failure);
      co_return;
    }
    if (failure.sqlstate.starts_with("28")) {
      // The user name, never what the client offered as a password.
      count(context_.metrics, server_metrics::kAuthenticationFailures);
      log_to(context_.logger, LogLevel::kWarning, "authentication failed",
             {{"user", startup->user()},
              {"database", startup->database()},
              {"host", host},
              {"error", failure.message}});
    }
    co_await send_fatal(context_, stream, failure, host);
    co_return;
  }
  deadline.met();
  log_to(context_.logger, LogLevel::kInfo, "connection authorized",
         {{"user", startup->user()},
          {"database", startup->database()},
          {"replication", replication},
          {"host", host},
          {"application_name", startup->find("application_name").value_or("")}});
  // The first session in a database readies it: pgrelay's catalog there, and its capture.
  if (context_.hubs && !context_.hubs->prepared(std::string(startup->database()))) {
    co_await run_blocking(context_.hubs->blocking(), [&] {
      context_.hubs->prepare(std::string(startup->database()));
      return true;
    });
  }
  if (replication) {
    if (!(*user)->replication) {
      {
        const Error fatal =
            Error::make(sqlstate::kInsufficientPrivilege,
                        "must be superuser or replication role to start walsender",
                        "Give the user the replication right in pgrelay's user list.");
        co_await send_fatal(context_, stream, fatal, host);
      }
      co_return;
    }
    if (!context_.hubs) {
      {
        const Error fatal = Error::make(sqlstate::kObjectNotInPrerequisiteState,
                                        "this pgrelay serves no replication");
        co_await send_fatal(context_, stream, fatal, host);
      }
      co_return;
    }
    OpenSession open(context_, kind, host, startup->user(), startup->database());
    co_await run_replication_session(stream, *startup, **user, context_);
  } else {
    OpenSession open(context_, kind, host, startup->user(), startup->database());
    co_await run_pass_through(stream, *startup, **user, context_);
  }
  stream.transport().close();
}

}  // namespace pgrelay::server
