// The HTTP endpoint Prometheus scrapes: GET /metrics answers with what a render callback returns.
#include "server/metrics_endpoint.h"

#include <asio/experimental/awaitable_operators.hpp>

#include <charconv>
#include <exception>
#include <set>
#include <vector>

namespace pgrelay::server {
namespace {

using namespace asio::experimental::awaitable_operators;
using upstream::awaitable;
using upstream::kAsTuple;
using upstream::tcp;

enum class ReadOutcome { kComplete, kTooLarge, kClosed };

// Reads until the blank line that ends the headers, at most `limit` bytes.
awaitable<ReadOutcome> read_request(tcp::socket& socket, std::string& request, std::size_t limit) {
  std::vector<char> buffer(2048);
  for (;;) {
    auto [ec, n] = co_await socket.async_read_some(asio::buffer(buffer), kAsTuple);
    if (ec) co_return ReadOutcome::kClosed;
    std::size_t scan_from = request.size() >= 3 ? request.size() - 3 : 0;
    request.append(buffer.data(), n);
    auto end = request.find("\r\n\r\n", scan_from);
    if (end == std::string::npos) end = request.find("\n\n", scan_from);
    if (end != std::string::npos) {
      co_return end + 4 <= limit ? ReadOutcome::kComplete : ReadOutcome::kTooLarge;
    }
    if (request.size() > limit) co_return ReadOutcome::kTooLarge;
  }
}

// After answering: reads (and drops) what the client still sends until it closes, so that
// closing with unread data does not reset the connection before the client reads the answer.
awaitable<void> drain(tcp::socket& socket) {
  std::vector<char> buffer(4096);
  std::size_t total = 0;
  while (total < 1024 * 1024) {
    auto [ec, n] = co_await socket.async_read_some(asio::buffer(buffer), kAsTuple);
    if (ec) co_return;
    total += n;
  }
}

std::string response(int status, std::string_view reason, std::string_view content_type,
                     const std::string& body, bool head, std::string_view extra_headers = {}) {
  std::string out = "HTTP/1.1 " + std::to_string(status) + " " + std::string(reason) + "\r\n";
  out += "Content-Type: ";
  out += content_type;
  out += "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  out += extra_headers;
  out += "Connection: close\r\n\r\n";
  if (!head) out += body;
  return out;
}

std::string plain(int status, std::string_view reason, const std::string& body, bool head = false,
                  std::string_view extra_headers = {}) {
  return response(status, reason, "text/plain; charset=utf-8", body, head, extra_headers);
}

}  // namespace

struct MetricsEndpoint::State {
  Render render;
  MetricsEndpointOptions options;
  std::vector<std::unique_ptr<tcp::acceptor>> acceptors;
  std::set<tcp::socket*> connections;
  bool stopping = false;

  // The answer to one complete request (request line and headers).
  std::string answer(std::string_view request) const {
    auto line_end = request.find('\n');
    std::string_view line = request.substr(0, line_end);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    auto sp1 = line.find(' ');
    auto sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
    if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos) {
      return plain(400, "Bad Request", "malformed request line\n");
    }
    std::string_view method = line.substr(0, sp1);
    std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
    std::string_view version = line.substr(sp2 + 1);
    if (version.substr(0, 7) != "HTTP/1." || method.empty() || target.empty()) {
      return plain(400, "Bad Request", "malformed request line\n");
    }
    // Absolute form (http://host/metrics), as a proxy would send it.
    if (auto scheme = target.find("://"); scheme != std::string_view::npos && target[0] != '/') {
      auto path = target.find('/', scheme + 3);
      target = path == std::string_view::npos ? std::string_view("/") : target.substr(path);
    }
    std::string_view path = target.substr(0, target.find('?'));
    if (path != "/metrics") return plain(404, "Not Found", "not found; try /metrics\n");
    bool head = method == "HEAD";
    if (method != "GET" && !head) {
      return plain(405, "Method Not Allowed", "use GET\n", false, "Allow: GET, HEAD\r\n");
    }
    std::string body;
    try {
      body = render();
    } catch (const std::exception& e) {
      return plain(500, "Internal Server Error",
                   std::string("could not render metrics: ") + e.what() + "\n");
    }
    return response(200, "OK", "text/plain; version=0.0.4; charset=utf-8", body, head);
  }
};

namespace {

awaitable<void> serve_connection(std::shared_ptr<MetricsEndpoint::State> state, tcp::socket socket);

}  // namespace

Result<std::pair<std::string, int>> parse_metrics_address(std::string_view text) {
  auto invalid = [&] {
    return Error::make(sqlstate::kInvalidParameterValue,
                       "invalid --metrics value \"" + std::string(text) + "\"",
                       "Use HOST:PORT, e.g. --metrics 127.0.0.1:9187, or a port alone.");
  };
  std::string host = "127.0.0.1";
  std::string_view port_text = text;
  if (!text.empty() && text.front() == '[') {
    auto close = text.find("]:");
    if (close == std::string_view::npos) return invalid();
    host = std::string(text.substr(1, close - 1));
    port_text = text.substr(close + 2);
  } else if (auto colon = text.rfind(':'); colon != std::string_view::npos) {
    host = std::string(text.substr(0, colon));
    port_text = text.substr(colon + 1);
    if (host.find(':') != std::string::npos) return invalid();  // IPv6 needs brackets
  }
  int port = -1;
  auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (host.empty() || port_text.empty() || ec != std::errc() ||
      end != port_text.data() + port_text.size() || port < 0 || port > 65535) {
    return invalid();
  }
  return std::pair<std::string, int>(host, port);
}

MetricsEndpoint::MetricsEndpoint(asio::io_context& io, Render render,
                                 MetricsEndpointOptions options)
    : io_(io), state_(std::make_shared<State>()) {
  state_->render = std::move(render);
  state_->options = options;
}

MetricsEndpoint::~MetricsEndpoint() {
  stop();
}

Result<tcp::endpoint> MetricsEndpoint::listen(const std::string& host, int port) {
  std::error_code ec;
  auto address = asio::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec);
  if (ec) {
    return Error::make(sqlstate::kInvalidParameterValue,
                       "invalid --metrics address \"" + host + "\"",
                       "Give an IP address, e.g. --metrics 127.0.0.1:9187.");
  }
  tcp::endpoint endpoint(address, static_cast<unsigned short>(port));
  auto acceptor = std::make_unique<tcp::acceptor>(io_);
  acceptor->open(endpoint.protocol(), ec);
  if (!ec) acceptor->set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor->bind(endpoint, ec);
  if (!ec) acceptor->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return Error::make("08006",
                       "could not listen for --metrics on " + host + ":" + std::to_string(port) +
                           ": " + ec.message(),
                       "Is another exporter using that port? Choose another with "
                       "--metrics HOST:PORT.");
  }
  auto bound = acceptor->local_endpoint(ec);
  state_->acceptors.push_back(std::move(acceptor));
  return bound;
}

namespace {

awaitable<void> accept_loop(std::shared_ptr<MetricsEndpoint::State> state,
                            tcp::acceptor& acceptor) {
  while (!state->stopping) {
    auto [ec, socket] = co_await acceptor.async_accept(kAsTuple);
    if (ec) {
      if (ec == asio::error::operation_aborted || state->stopping) co_return;
      asio::steady_timer pause(acceptor.get_executor(), std::chrono::milliseconds(50));
      co_await pause.async_wait(kAsTuple);
      continue;
    }
    if (state->connections.size() >= state->options.max_connections) {
      std::error_code ignored;
      socket.close(ignored);
      continue;
    }
    auto executor = acceptor.get_executor();
    asio::co_spawn(executor, serve_connection(state, std::move(socket)), asio::detached);
  }
}

awaitable<void> serve_connection(std::shared_ptr<MetricsEndpoint::State> state,
                                 tcp::socket socket) {
  state->connections.insert(&socket);
  struct Untrack {
    MetricsEndpoint::State& state;
    tcp::socket* socket;
    ~Untrack() { state.connections.erase(socket); }
  } untrack{*state, &socket};

  std::string request;
  asio::steady_timer deadline(socket.get_executor(), state->options.read_timeout);
  auto read = co_await (read_request(socket, request, state->options.max_request_bytes) ||
                        deadline.async_wait(kAsTuple));
  if (read.index() != 0) co_return;  // too slow: close without an answer
  ReadOutcome outcome = std::get<0>(read);
  if (outcome == ReadOutcome::kClosed) co_return;
  std::string answer =
      outcome == ReadOutcome::kTooLarge
          ? plain(431, "Request Header Fields Too Large",
                  "request headers exceed " + std::to_string(state->options.max_request_bytes) +
                      " bytes\n")
          : state->answer(request);
  auto [write_ec, written] = co_await asio::async_write(socket, asio::buffer(answer), kAsTuple);
  (void)written;
  if (write_ec) co_return;
  std::error_code ignored;
  socket.shutdown(tcp::socket::shutdown_send, ignored);
  asio::steady_timer linger(socket.get_executor(), std::chrono::seconds(1));
  co_await (drain(socket) || linger.async_wait(kAsTuple));
  socket.close(ignored);
}

}  // namespace

void MetricsEndpoint::start() {
  for (auto& acceptor : state_->acceptors) {
    asio::co_spawn(io_, accept_loop(state_, *acceptor), asio::detached);
  }
}

void MetricsEndpoint::stop() {
  state_->stopping = true;
  std::error_code ignored;
  for (auto& acceptor : state_->acceptors) acceptor->close(ignored);
  for (auto* socket : state_->connections) socket->close(ignored);
}

}  // namespace pgrelay::server
