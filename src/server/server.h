// The listener: accepts connections, negotiates TLS, authenticates, and starts each session.
#pragma once

#include <memory>
#include <set>
#include <string>

#include "server/server_context.h"
#include "upstream/transport.h"

namespace pgrelay::server {

class Server {
 public:
  // Registers the server's metrics (when context.metrics is set) so they read 0 from the start.
  Server(asio::io_context& io, ServerContext& context);

  // Binds and listens now, so errors (address in use, bad host) come back as values. May be
  // called more than once (several addresses).
  Result<upstream::tcp::endpoint> listen(const std::string& host, int port);
  // Starts accepting on every bound address.
  void start();
  // Stops accepting new connections.
  void stop_accepting();
  // Stops accepting and closes every session (their coroutines then finish).
  void stop();
  std::size_t session_count() const { return sessions_->size(); }

 private:
  upstream::awaitable<void> accept_loop(upstream::tcp::acceptor& acceptor);
  upstream::awaitable<void> serve_connection(upstream::tcp::socket socket);

  asio::io_context& io_;
  ServerContext& context_;
  std::vector<std::unique_ptr<upstream::tcp::acceptor>> acceptors_;
  // Shared with the session coroutines, which may be destroyed after the Server (with the
  // io_context that owns their frames).
  std::shared_ptr<std::set<upstream::Transport*>> sessions_ =
      std::make_shared<std::set<upstream::Transport*>>();
  bool stopping_ = false;
};

}  // namespace pgrelay::server
