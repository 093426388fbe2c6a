// The HTTP endpoint Prometheus scrapes: GET /metrics answers with what a render callback returns.
//
// A deliberately tiny HTTP/1.1 server: one request per connection (Connection: close), headers
// bounded in size and time, no body read. Enough for a scraper and for curl, and nothing else.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "base/result.h"
#include "upstream/transport.h"

namespace pgrelay::server {

struct MetricsEndpointOptions {
  // Request line and headers together; a longer request gets 431.
  std::size_t max_request_bytes = 8 * 1024;
  // Time allowed for the whole request to arrive; then the connection is closed.
  std::chrono::milliseconds read_timeout{10000};
  // Connections served at once; more are closed at accept.
  std::size_t max_connections = 64;
};

// Parses the value of --metrics: "HOST:PORT" ("[::1]:9187" for IPv6) or a bare port (then on
// 127.0.0.1). Errors name the flag.
Result<std::pair<std::string, int>> parse_metrics_address(std::string_view text);

class MetricsEndpoint {
 public:
  // Builds the body of a 200 answer to GET /metrics; called on the io thread for each scrape.
  using Render = std::function<std::string()>;

  MetricsEndpoint(asio::io_context& io, Render render, MetricsEndpointOptions options = {});
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;
  ~MetricsEndpoint();

  // Binds and listens now, so a port in use comes back as a value (naming --metrics). Port 0
  // picks a free port: the result says which.
  Result<upstream::tcp::endpoint> listen(const std::string& host, int port);
  // Starts accepting on every bound address.
  void start();
  // Closes the listeners and every open connection. Call on the io thread, or while it is not
  // running; connections' coroutines then finish on their own, even after this object is gone.
  void stop();

  // Shared with the accept and connection coroutines, which may outlive this object.
  struct State;

 private:
  asio::io_context& io_;
  std::shared_ptr<State> state_;
};

}  // namespace pgrelay::server
