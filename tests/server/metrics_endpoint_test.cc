// The /metrics HTTP endpoint over real loopback sockets: answers, errors, limits, concurrency,
// stop.
#include "server/metrics_endpoint.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "server/metrics.h"

namespace pgrelay::server {
namespace {

int connect_to(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  timeval timeout{10, 0};  // a hung server fails the test instead of hanging it
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  return fd;
}

bool send_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n <= 0) return false;
    data.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

// Everything the server sends until it closes.
std::string read_all(int fd) {
  std::string out;
  char buffer[4096];
  ssize_t n;
  while ((n = ::recv(fd, buffer, sizeof buffer, 0)) > 0) out.append(buffer, n);
  return out;
}

std::string http_exchange(int port, std::string_view request) {
  int fd = connect_to(port);
  if (fd < 0) return "connect failed";
  send_all(fd, request);
  std::string response = read_all(fd);
  ::close(fd);
  return response;
}

struct Response {
  int status = 0;
  std::string headers;
  std::string body;
};

Response parse(const std::string& raw) {
  Response r;
  auto end = raw.find("\r\n\r\n");
  if (raw.rfind("HTTP/1.1 ", 0) != 0 || end == std::string::npos) return r;
  r.status = std::stoi(raw.substr(9, 3));
  r.headers = raw.substr(0, end + 2);
  r.body = raw.substr(end + 4);
  return r;
}

constexpr MetricInfo kScrapes{"pgrelay_test_scrapes_total", "Scrapes so far."};

class MetricsEndpointTest : public ::testing::Test {
 protected:
  void start(MetricsEndpointOptions options = {}) {
    endpoint_ = std::make_unique<MetricsEndpoint>(
        io_,
        [this] {
          render_thread_ = std::this_thread::get_id();
          metrics_.counter(kScrapes).inc();
          return metrics_.render();
        },
        options);
    auto bound = endpoint_->listen("127.0.0.1", 0);
    ASSERT_TRUE(bound.ok()) << bound.error().message;
    port_ = bound->port();
    endpoint_->start();
    thread_ = std::thread([this] { io_.run(); });
  }
  void TearDown() override {
    if (thread_.joinable()) {
      asio::post(io_, [this] {
        endpoint_->stop();
        work_.reset();
      });
      thread_.join();
    }
    endpoint_.reset();
  }

  asio::io_context io_;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_{
      asio::make_work_guard(io_)};
  Metrics metrics_;
  std::unique_ptr<MetricsEndpoint> endpoint_;
  std::thread thread_;
  std::thread::id render_thread_;
  int port_ = 0;
};

TEST_F(MetricsEndpointTest, GetMetricsAnswersWithTheRenderedBody) {
  start();
  auto r = parse(http_exchange(port_, "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n"));
  ASSERT_EQ(r.status, 200) << r.headers;
  EXPECT_NE(r.headers.find("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"),
            std::string::npos)
      << r.headers;
  EXPECT_NE(r.headers.find("Connection: close\r\n"), std::string::npos);
  EXPECT_EQ(r.body,
            "# HELP pgrelay_test_scrapes_total Scrapes so far.\n"
            "# TYPE pgrelay_test_scrapes_total counter\n"
            "pgrelay_test_scrapes_total 1\n");
  EXPECT_NE(r.headers.find("Content-Length: " + std::to_string(r.body.size()) + "\r\n"),
            std::string::npos);
  EXPECT_EQ(render_thread_, thread_.get_id());  // rendered on the io thread

  // A query string and HTTP/1.0 are fine; HEAD has the headers only.
  auto again = parse(http_exchange(port_, "GET /metrics?x=1 HTTP/1.0\r\n\r\n"));
  EXPECT_EQ(again.status, 200);
  EXPECT_NE(again.body.find("pgrelay_test_scrapes_total 2\n"), std::string::npos) << again.body;
  auto head = parse(http_exchange(port_, "HEAD /metrics HTTP/1.1\r\n\r\n"));
  EXPECT_EQ(head.status, 200);
  EXPECT_EQ(head.body, "");
}

TEST_F(MetricsEndpointTest, OtherPathsMethodsAndGarbageAreRefused) {
  start();
  EXPECT_EQ(parse(http_exchange(port_, "GET / HTTP/1.1\r\n\r\n")).status, 404);
  EXPECT_EQ(parse(http_exchange(port_, "GET /metricsx HTTP/1.1\r\n\r\n")).status, 404);
  auto post = parse(http_exchange(port_, "POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc"));
  EXPECT_EQ(post.status, 405);
  EXPECT_NE(post.headers.find("Allow: GET, HEAD\r\n"), std::string::npos);
  EXPECT_EQ(parse(http_exchange(port_, "DELETE /metrics HTTP/1.1\r\n\r\n")).status, 405);
  EXPECT_EQ(parse(http_exchange(port_, "GARBAGE\r\n\r\n")).status, 400);
  EXPECT_EQ(parse(http_exchange(port_, "GET /metrics SMTP/1.0\r\n\r\n")).status, 400);
  EXPECT_EQ(parse(http_exchange(port_, "GET  /metrics HTTP/1.1\r\n\r\n")).status, 400);
  // None of these rendered anything.
  EXPECT_EQ(metrics_.counter(kScrapes).value(), 0u);
}

TEST_F(MetricsEndpointTest, OversizedRequestGets431AndTheAnswerArrives) {
  start();
  // Headers larger than 8 KiB, sent in full before reading: the answer must not be lost to a
  // connection reset.
  std::string request = "GET /metrics HTTP/1.1\r\n";
  for (int i = 0; i < 400; ++i)
    request += "X-Filler-" + std::to_string(i) + ": " + std::string(40, 'f') + "\r\n";
  request += "\r\n";
  ASSERT_GT(request.size(), 16u * 1024);
  auto r = parse(http_exchange(port_, request));
  EXPECT_EQ(r.status, 431) << r.headers;
  // A request line with no end at all.
  auto endless = parse(http_exchange(port_, "GET /" + std::string(9000, 'a')));
  EXPECT_EQ(endless.status, 431);
  // Just under the limit is fine.
  std::string fits = "GET /metrics HTTP/1.1\r\nX: " + std::string(8000, 'y') + "\r\n\r\n";
  ASSERT_LT(fits.size(), 8192u);
  EXPECT_EQ(parse(http_exchange(port_, fits)).status, 200);
  EXPECT_EQ(metrics_.counter(kScrapes).value(), 1u);
}

TEST_F(MetricsEndpointTest, SlowClientIsDisconnectedAfterTheReadTimeout) {
  MetricsEndpointOptions options;
  options.read_timeout = std::chrono::milliseconds(300);
  start(options);
  int fd = connect_to(port_);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(send_all(fd, "GET /metrics HTTP/1.1\r\n"));  // never finishes the headers
  auto begin = std::chrono::steady_clock::now();
  std::string got = read_all(fd);
  auto waited = std::chrono::steady_clock::now() - begin;
  ::close(fd);
  EXPECT_EQ(got, "");
  EXPECT_GE(waited, std::chrono::milliseconds(200));
  EXPECT_LT(waited, std::chrono::seconds(5));
  // The endpoint still serves others.
  EXPECT_EQ(parse(http_exchange(port_, "GET /metrics HTTP/1.1\r\n\r\n")).status, 200);
}

TEST_F(MetricsEndpointTest, ConcurrentClientsAllGetTheirAnswer) {
  start();
  constexpr int kClients = 16, kRequests = 25;
  std::atomic<int> ok{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&] {
      for (int i = 0; i < kRequests; ++i) {
        auto r = parse(http_exchange(port_, "GET /metrics HTTP/1.1\r\n\r\n"));
        if (r.status == 200 && r.body.find("pgrelay_test_scrapes_total ") != std::string::npos)
          ++ok;
      }
    });
  }
  // Meanwhile a few idle connections hold slots open without harming anyone.
  std::vector<int> idle;
  for (int i = 0; i < 4; ++i) idle.push_back(connect_to(port_));
  for (auto& t : clients) t.join();
  for (int fd : idle) ::close(fd);
  EXPECT_EQ(ok.load(), kClients * kRequests);
  EXPECT_EQ(metrics_.counter(kScrapes).value(), std::uint64_t{kClients * kRequests});
}

TEST_F(MetricsEndpointTest, PortInUseNamesTheFlag) {
  start();
  MetricsEndpoint second(io_, [] { return std::string(); });
  auto taken = second.listen("127.0.0.1", port_);
  ASSERT_FALSE(taken.ok());
  EXPECT_NE(taken.error().message.find("--metrics"), std::string::npos) << taken.error().message;
  EXPECT_NE(taken.error().message.find(std::to_string(port_)), std::string::npos);
  auto bad_host = second.listen("not-an-ip", 0);
  ASSERT_FALSE(bad_host.ok());
  EXPECT_NE(bad_host.error().message.find("--metrics"), std::string::npos);
}

TEST_F(MetricsEndpointTest, StopClosesListenerAndOpenConnections) {
  start();
  int idle = connect_to(port_);
  ASSERT_GE(idle, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // accepted by now
  std::promise<void> stopped;
  asio::post(io_, [&] {
    endpoint_->stop();
    stopped.set_value();
  });
  stopped.get_future().wait();
  auto begin = std::chrono::steady_clock::now();
  EXPECT_EQ(read_all(idle), "");
  // Closed by the server, not by the 10 s request timeout or the client's receive timeout.
  EXPECT_LT(std::chrono::steady_clock::now() - begin, std::chrono::seconds(5));
  ::close(idle);
  EXPECT_EQ(connect_to(port_), -1);
}

}  // namespace
}  // namespace pgrelay::server
