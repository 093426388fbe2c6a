// A thread-safe registry of counters and gauges, rendered in Prometheus's text format 0.0.4.
//
// Counters and gauges the code updates live in the registry (an update is one relaxed atomic
// operation on an object looked up once). Values that live elsewhere (log size, slot lag) come
// from collectors, called at each render, so that series of dropped slots simply disappear.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pgrelay::server {

// Label names and values, e.g. {{"kind", "replication"}}. Order does not matter: a series is
// identified by its labels sorted by name.
using MetricLabels = std::vector<std::pair<std::string, std::string>>;

// A metric's name (pgrelay_..., counters ending in _total) and its HELP text.
struct MetricInfo {
  std::string_view name;
  std::string_view help;
};

class Counter {
 public:
  void inc(std::uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  std::uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<std::uint64_t> value_{0};
};

class Gauge {
 public:
  void set(double v) { value_.store(v, std::memory_order_relaxed); }
  void add(double delta) {
    double current = value_.load(std::memory_order_relaxed);
    while (!value_.compare_exchange_weak(current, current + delta, std::memory_order_relaxed)) {
    }
  }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// What a collector reports during one render. Samples of one name share its first HELP text.
class MetricWriter {
 public:
  void gauge(const MetricInfo& info, const MetricLabels& labels, double value);
  void counter(const MetricInfo& info, const MetricLabels& labels, double value);

 private:
  friend class Metrics;
  struct Family {
    std::string help;
    std::string type;
    std::map<MetricLabels, std::string> samples;  // canonical labels -> value text
  };
  void add(const MetricInfo& info, std::string_view type, const MetricLabels& labels,
           std::string value);
  std::map<std::string, Family> families_;
};

class Metrics {
 public:
  using Collector = std::function<void(MetricWriter&)>;

  Metrics() = default;
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // The series for `info` and `labels`, created at 0 on first use; the reference stays valid
  // as long as the registry. Look it up once and keep it where updates are frequent. A name
  // already registered with the other type yields an object that is never rendered. Invalid
  // characters in names become '_'.
  Counter& counter(const MetricInfo& info, MetricLabels labels = {});
  Gauge& gauge(const MetricInfo& info, MetricLabels labels = {});

  // Called at every render, in the order added, on the rendering thread, outside the
  // registry's lock (a collector may use counter() and gauge()).
  void add_collector(Collector collector);

  // Text format 0.0.4: families sorted by name, each with # HELP and # TYPE, then its series
  // sorted by labels. Registered and collected samples of the same name are merged.
  std::string render() const;

 private:
  struct Series {
    std::unique_ptr<Counter> counter;
    std::unique_ptr<Gauge> gauge;
  };
  struct Family {
    std::string help;
    bool is_counter = true;
    std::map<MetricLabels, Series> series;
  };
  template <typename T>
  T& find_or_create(const MetricInfo& info, MetricLabels labels, bool is_counter);

  mutable std::mutex mu_;
  std::map<std::string, Family> families_;
  std::vector<Collector> collectors_;
  std::vector<std::unique_ptr<Counter>> orphan_counters_;
  std::vector<std::unique_ptr<Gauge>> orphan_gauges_;
};

// The series the server layer keeps itself.
namespace server_metrics {
// kind: pass-through, replication, cancel.
inline constexpr MetricInfo kConnectionsAccepted{
    "pgrelay_connections_accepted_total",
    "Client connections whose startup packet was read, by kind (pass-through, replication, "
    "cancel)."};
// kind: pass-through, replication.
inline constexpr MetricInfo kConnections{"pgrelay_connections",
                                         "Authenticated client sessions now open, by kind."};
inline constexpr MetricInfo kAuthenticationFailures{
    "pgrelay_authentication_failures_total",
    "Client connections refused for a wrong password, an unknown user or a reject rule."};
inline constexpr MetricInfo kProtocolErrors{
    "pgrelay_protocol_errors_total",
    "Client sessions closed because the client broke the protocol."};
// sqlstate: the five-character code.
inline constexpr MetricInfo kErrorsSent{
    "pgrelay_errors_sent_total",
    "ErrorResponse messages pgrelay itself sent to clients, by SQLSTATE (errors the upstream "
    "sends through pass-through sessions are not counted)."};
// direction: to_upstream, to_client.
inline constexpr MetricInfo kRelayedBytes{"pgrelay_relayed_bytes_total",
                                          "Bytes relayed by pass-through sessions, by direction."};
}  // namespace server_metrics

// Registers the server's series above that have no per-event labels, so they read 0 from the
// start instead of appearing at their first event.
void register_server_metrics(Metrics& metrics);

// Null-safe shorthand for code holding an optional Metrics*.
inline void count(Metrics* metrics, const MetricInfo& info, MetricLabels labels = {},
                  std::uint64_t n = 1) {
  if (metrics != nullptr) metrics->counter(info, std::move(labels)).inc(n);
}

}  // namespace pgrelay::server
