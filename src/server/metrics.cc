// A thread-safe registry of counters and gauges, rendered in Prometheus's text format 0.0.4.
#include "server/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <type_traits>

namespace pgrelay::server {
namespace {

bool is_alpha(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

// Metric names: [a-zA-Z_:][a-zA-Z0-9_:]*; label names: [a-zA-Z_][a-zA-Z0-9_]*.
std::string sanitize_name(std::string_view name, bool allow_colon) {
  std::string out(name);
  if (out.empty()) return "_";
  for (std::size_t i = 0; i < out.size(); ++i) {
    char c = out[i];
    bool ok = is_alpha(c) || (allow_colon && c == ':') || (i > 0 && is_digit(c));
    if (!ok) out[i] = '_';
  }
  return out;
}

MetricLabels canonical(MetricLabels labels) {
  for (auto& [name, value] : labels) name = sanitize_name(name, /*allow_colon=*/false);
  std::sort(labels.begin(), labels.end());
  return labels;
}

// HELP text escapes '\' and newline; label values also '"'.
void append_escaped(std::string& out, std::string_view text, bool quote) {
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (quote && c == '"') {
      out += "\\\"";
    } else {
      out += c;
    }
  }
}

std::string format_double(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buffer[64];
  auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, value);
  if (ec != std::errc()) return "NaN";
  return std::string(buffer, end);
}

std::string format_uint(std::uint64_t value) {
  char buffer[32];
  auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, value);
  (void)ec;  // 32 bytes always hold a uint64
  return std::string(buffer, end);
}

}  // namespace

void MetricWriter::add(const MetricInfo& info, std::string_view type, const MetricLabels& labels,
                       std::string value) {
  auto& family = families_[sanitize_name(info.name, /*allow_colon=*/true)];
  if (family.type.empty()) {
    family.type = std::string(type);
    family.help = std::string(info.help);
  }
  family.samples[canonical(labels)] = std::move(value);
}

void MetricWriter::gauge(const MetricInfo& info, const MetricLabels& labels, double value) {
  add(info, "gauge", labels, format_double(value));
}

void MetricWriter::counter(const MetricInfo& info, const MetricLabels& labels, double value) {
  add(info, "counter", labels, format_double(value));
}

template <typename T>
T& Metrics::find_or_create(const MetricInfo& info, MetricLabels labels, bool is_counter) {
  std::string name = sanitize_name(info.name, /*allow_colon=*/true);
  MetricLabels key = canonical(std::move(labels));
  std::lock_guard lock(mu_);
  auto [it, created] = families_.try_emplace(std::move(name));
  Family& family = it->second;
  if (created) {
    family.help = std::string(info.help);
    family.is_counter = is_counter;
  } else if (family.is_counter != is_counter) {
    // A programming error that must not crash a server: hand out an object nobody renders.
    if constexpr (std::is_same_v<T, Counter>) {
      return *orphan_counters_.emplace_back(std::make_unique<Counter>());
    } else {
      return *orphan_gauges_.emplace_back(std::make_unique<Gauge>());
    }
  }
  Series& series = family.series[std::move(key)];
  if constexpr (std::is_same_v<T, Counter>) {
    if (!series.counter) series.counter = std::make_unique<Counter>();
    return *series.counter;
  } else {
    if (!series.gauge) series.gauge = std::make_unique<Gauge>();
    return *series.gauge;
  }
}

Counter& Metrics::counter(const MetricInfo& info, MetricLabels labels) {
  return find_or_create<Counter>(info, std::move(labels), true);
}

Gauge& Metrics::gauge(const MetricInfo& info, MetricLabels labels) {
  return find_or_create<Gauge>(info, std::move(labels), false);
}

void Metrics::add_collector(Collector collector) {
  std::lock_guard lock(mu_);
  collectors_.push_back(std::move(collector));
}

std::string Metrics::render() const {
  std::vector<Collector> collectors;
  {
    std::lock_guard lock(mu_);
    collectors = collectors_;
  }
  MetricWriter collected;
  for (const auto& collector : collectors) collector(collected);
  {
    std::lock_guard lock(mu_);
    for (const auto& [name, family] : families_) {
      auto& out = collected.families_[name];
      if (out.type.empty()) {
        out.type = family.is_counter ? "counter" : "gauge";
        out.help = family.help;
      }
      for (const auto& [labels, series] : family.series) {
        out.samples[labels] = family.is_counter ? format_uint(series.counter->value())
                                                : format_double(series.gauge->value());
      }
    }
  }
  std::string text;
  for (const auto& [name, family] : collected.families_) {
    if (family.samples.empty()) continue;
    text += "# HELP ";
    text += name;
    text += ' ';
    append_escaped(text, family.help, /*quote=*/false);
    text += "\n# TYPE ";
    text += name;
    text += ' ';
    text += family.type;
    text += '\n';
    for (const auto& [labels, value] : family.samples) {
      text += name;
      if (!labels.empty()) {
        text += '{';
        for (std::size_t i = 0; i < labels.size(); ++i) {
          if (i > 0) text += ',';
          text += labels[i].first;
          text += "=\"";
          append_escaped(text, labels[i].second, /*quote=*/true);
          text += '"';
        }
        text += '}';
      }
      text += ' ';
      text += value;
      text += '\n';
    }
  }
  return text;
}

void register_server_metrics(Metrics& metrics) {
  using namespace server_metrics;
  for (const char* kind : {"pass-through", "replication", "cancel"}) {
    metrics.counter(kConnectionsAccepted, {{"kind", kind}});
  }
  for (const char* kind : {"pass-through", "replication"}) {
    metrics.gauge(kConnections, {{"kind", kind}});
  }
  metrics.counter(kAuthenticationFailures);
  metrics.counter(kProtocolErrors);
  for (const char* direction : {"to_upstream", "to_client"}) {
    metrics.counter(kRelayedBytes, {{"direction", direction}});
  }
}

}  // namespace pgrelay::server
