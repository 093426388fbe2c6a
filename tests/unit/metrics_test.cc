// Metrics registry: exact Prometheus text for counters, gauges, labels and escaping; collectors;
// threads.
#include "server/metrics.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "server/metrics_endpoint.h"

namespace pgrelay::server {
namespace {

constexpr MetricInfo kRequests{"pgrelay_requests_total", "Requests served."};
constexpr MetricInfo kTemperature{"pgrelay_temperature", "Temperature with a \\ and a\nnewline."};
constexpr MetricInfo kLag{"pgrelay_slot_lag_bytes", "Bytes a slot is behind the log head."};

TEST(MetricsTest, RendersExactTextWithLabelsAndEscaping) {
  Metrics metrics;
  metrics.counter(kRequests, {{"kind", "replication"}}).inc(3);
  metrics.counter(kRequests, {{"kind", "pass-through"}}).inc();
  metrics.counter(kRequests, {{"kind", "pass-through"}}).inc(41);  // the same series
  metrics.gauge(kTemperature).set(-1.5);
  metrics.gauge(kTemperature, {{"where", "a \"quoted\" \\ value\nwith newline"}}).set(1e21);
  // Labels are identified regardless of order; names with bad characters are made valid.
  metrics.counter({"pgrelay_multi_total", "Two labels."}, {{"b", "2"}, {"a", "1"}}).inc();
  metrics.counter({"pgrelay_multi_total", "Two labels."}, {{"a", "1"}, {"b", "2"}}).inc();
  metrics.counter({"pgrelay-bad name", "Sanitized."}, {{"9x", "v"}}).inc(7);

  EXPECT_EQ(metrics.render(),
            "# HELP pgrelay_bad_name Sanitized.\n"
            "# TYPE pgrelay_bad_name counter\n"
            "pgrelay_bad_name{_x=\"v\"} 7\n"
            "# HELP pgrelay_multi_total Two labels.\n"
            "# TYPE pgrelay_multi_total counter\n"
            "pgrelay_multi_total{a=\"1\",b=\"2\"} 2\n"
            "# HELP pgrelay_requests_total Requests served.\n"
            "# TYPE pgrelay_requests_total counter\n"
            "pgrelay_requests_total{kind=\"pass-through\"} 42\n"
            "pgrelay_requests_total{kind=\"replication\"} 3\n"
            "# HELP pgrelay_temperature Temperature with a \\\\ and a\\nnewline.\n"
            "# TYPE pgrelay_temperature gauge\n"
            "pgrelay_temperature -1.5\n"
            "pgrelay_temperature{where=\"a \\\"quoted\\\" \\\\ value\\nwith newline\"} 1e+21\n");
}

TEST(MetricsTest, GaugesAddAndSpecialValues) {
  Metrics metrics;
  Gauge& g = metrics.gauge({"pgrelay_g", "g"});
  g.add(2);
  g.add(-0.5);
  EXPECT_DOUBLE_EQ(g.value(), 1.5);
  metrics.gauge({"pgrelay_inf", "i"}).set(std::numeric_limits<double>::infinity());
  metrics.gauge({"pgrelay_nan", "n"}).set(std::numeric_limits<double>::quiet_NaN());
  std::string text = metrics.render();
  EXPECT_NE(text.find("\npgrelay_g 1.5\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\npgrelay_inf +Inf\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\npgrelay_nan NaN\n"), std::string::npos) << text;
}

TEST(MetricsTest, TypeConflictNeverRendersTheIntruder) {
  Metrics metrics;
  metrics.counter(kRequests).inc(5);
  metrics.gauge(kRequests).set(99);  // wrong type: accepted, not rendered
  EXPECT_EQ(metrics.render(),
            "# HELP pgrelay_requests_total Requests served.\n"
            "# TYPE pgrelay_requests_total counter\n"
            "pgrelay_requests_total 5\n");
}

TEST(MetricsTest, CollectorsAddSeriesAtEachRenderAndDroppedOnesDisappear) {
  Metrics metrics;
  std::vector<std::pair<std::string, double>> slots = {{"zero", 10}, {"alpha", 0}};
  int calls = 0;
  metrics.add_collector([&](MetricWriter& out) {
    ++calls;
    for (const auto& [name, lag] : slots) out.gauge(kLag, {{"slot", name}}, lag);
    out.counter({"pgrelay_captured_transactions_total", "Captured."}, {}, 12345);
  });
  metrics.counter(kRequests).inc();
  EXPECT_EQ(metrics.render(),
            "# HELP pgrelay_captured_transactions_total Captured.\n"
            "# TYPE pgrelay_captured_transactions_total counter\n"
            "pgrelay_captured_transactions_total 12345\n"
            "# HELP pgrelay_requests_total Requests served.\n"
            "# TYPE pgrelay_requests_total counter\n"
            "pgrelay_requests_total 1\n"
            "# HELP pgrelay_slot_lag_bytes Bytes a slot is behind the log head.\n"
            "# TYPE pgrelay_slot_lag_bytes gauge\n"
            "pgrelay_slot_lag_bytes{slot=\"alpha\"} 0\n"
            "pgrelay_slot_lag_bytes{slot=\"zero\"} 10\n");
  slots.pop_back();
  std::string second = metrics.render();
  EXPECT_EQ(second.find("alpha"), std::string::npos) << second;
  EXPECT_NE(second.find("pgrelay_slot_lag_bytes{slot=\"zero\"} 10\n"), std::string::npos);
  EXPECT_EQ(calls, 2);
}

TEST(MetricsTest, ServerSeriesReadZeroFromTheStart) {
  Metrics metrics;
  register_server_metrics(metrics);
  std::string text = metrics.render();
  EXPECT_NE(text.find("\npgrelay_authentication_failures_total 0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\npgrelay_connections_accepted_total{kind=\"replication\"} 0\n"),
            std::string::npos);
  EXPECT_NE(text.find("\npgrelay_connections{kind=\"pass-through\"} 0\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE pgrelay_connections gauge\n"), std::string::npos);
  count(&metrics, server_metrics::kAuthenticationFailures);
  count(nullptr, server_metrics::kAuthenticationFailures);  // no registry: nothing happens
  EXPECT_EQ(metrics.counter(server_metrics::kAuthenticationFailures).value(), 1u);
}

TEST(MetricsTest, ConcurrentUpdatesAndRendersLoseNothing) {
  Metrics metrics;
  constexpr int kThreads = 4, kIncrements = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Counter& shared = metrics.counter(kRequests);
      for (int i = 0; i < kIncrements; ++i) {
        shared.inc();
        if (i % 1000 == 0) {
          metrics.counter(kRequests, {{"thread", std::to_string(t)}}).inc(1000);
          (void)metrics.render();
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(metrics.counter(kRequests).value(), std::uint64_t{kThreads} * kIncrements);
  std::string text = metrics.render();
  EXPECT_NE(text.find("pgrelay_requests_total{thread=\"3\"} 20000\n"), std::string::npos) << text;
}

TEST(MetricsAddressTest, ParsesHostPortAndNamesTheFlag) {
  auto v4 = parse_metrics_address("0.0.0.0:9187");
  ASSERT_TRUE(v4.ok());
  EXPECT_EQ(v4->first, "0.0.0.0");
  EXPECT_EQ(v4->second, 9187);
  auto v6 = parse_metrics_address("[::1]:9000");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->first, "::1");
  EXPECT_EQ(v6->second, 9000);
  auto bare = parse_metrics_address("9187");
  ASSERT_TRUE(bare.ok());
  EXPECT_EQ(bare->first, "127.0.0.1");
  for (const char* bad : {"", "host:", ":9187", "1.2.3.4:99999", "::1:9187", "[::1]9187", "a:b"}) {
    auto parsed = parse_metrics_address(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_NE(parsed.error().message.find("--metrics"), std::string::npos);
  }
}

}  // namespace
}  // namespace pgrelay::server
