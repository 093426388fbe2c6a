// Structured log lines (text in the spirit of Postgres's, or one JSON object per line) with levels.
//
// There is no global logger: whoever logs is handed a Logger* (null means silent), so tests
// capture output and two servers in one process can log differently.
//
// Passwords: nothing here takes a connection string, URL or credential, on purpose. Log a
// user, a host, a database as separate fields; never pass a conninfo or a URL (which may carry
// a password) as a message or a field value.
#pragma once

#include <atomic>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <mutex>
#include <string>
#include <string_view>
#include <variant>

#include "base/result.h"

namespace pgrelay {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };
enum class LogFormat { kText, kJson };

// "debug", "info", "warning" (or "warn"), "error"; case-insensitive.
Result<LogLevel> parse_log_level(std::string_view text);
// "text" or "json"; case-insensitive.
Result<LogFormat> parse_log_format(std::string_view text);
// "DEBUG", "INFO", "WARNING", "ERROR".
std::string_view log_level_name(LogLevel level);

// One key=value of a log line. Holds views: build fields in the logging call itself, so the
// viewed strings outlive the call.
class LogField {
 public:
  using Value = std::variant<std::string_view, std::int64_t, std::uint64_t, double, bool>;

  LogField(std::string_view key, std::string_view value) : key_(key), value_(value) {}
  LogField(std::string_view key, const std::string& value)
      : key_(key), value_(std::string_view(value)) {}
  LogField(std::string_view key, const char* value)
      : key_(key), value_(std::string_view(value ? value : "")) {}
  LogField(std::string_view key, bool value) : key_(key), value_(value) {}
  LogField(std::string_view key, double value) : key_(key), value_(value) {}
  template <std::signed_integral T>
  LogField(std::string_view key, T value) : key_(key), value_(static_cast<std::int64_t>(value)) {}
  template <std::unsigned_integral T>
  requires(!std::same_as<T, bool>) LogField(std::string_view key, T value)
      : key_(key), value_(static_cast<std::uint64_t>(value)) {}

  std::string_view key() const { return key_; }
  const Value& value() const { return value_; }

 private:
  std::string_view key_;
  Value value_;
};

using LogFields = std::initializer_list<LogField>;

struct LoggerOptions {
  LogLevel level = LogLevel::kInfo;
  LogFormat format = LogFormat::kText;
  // Where lines go: each line (with its '\n') in a single write(2) to `fd`, unless `sink` is
  // set, which then receives each line instead (called under the logger's lock).
  int fd = 2;
  std::function<void(std::string_view line)> sink;
  // For tests: a fixed clock and pid make lines reproducible. Defaults: system clock, getpid().
  std::function<std::chrono::system_clock::time_point()> clock;
  int pid = 0;
};

// Thread-safe: lines from concurrent threads never interleave.
class Logger {
 public:
  explicit Logger(LoggerOptions options = {});

  bool enabled(LogLevel level) const {
    return static_cast<int>(level) >= level_.load(std::memory_order_relaxed);
  }
  void set_level(LogLevel level) { level_.store(static_cast<int>(level)); }

  // Text: `2026-11-30 04:40:12.345 UTC [pid] LEVEL:  message key=value ...` on one line
  // (control characters in the message are escaped, values with spaces or quotes are quoted),
  // so that no value, such as a client-chosen user name, can forge a line.
  // JSON: {"time":"2026-11-30T04:40:12.345Z","level":"info","pid":N,"message":"...",fields...};
  // a field named like one of those four gets a leading underscore.
  void log(LogLevel level, std::string_view message, LogFields fields = {});
  void debug(std::string_view message, LogFields fields = {}) {
    log(LogLevel::kDebug, message, fields);
  }
  void info(std::string_view message, LogFields fields = {}) {
    log(LogLevel::kInfo, message, fields);
  }
  void warning(std::string_view message, LogFields fields = {}) {
    log(LogLevel::kWarning, message, fields);
  }
  void error(std::string_view message, LogFields fields = {}) {
    log(LogLevel::kError, message, fields);
  }
  // An Error as one line: its message, with its SQLSTATE, detail and hint as fields.
  void error(const Error& error) {
    log(LogLevel::kError, error.message,
        {{"sqlstate", error.sqlstate}, {"detail", error.detail}, {"hint", error.hint}});
  }

  // The line log() would write (with its trailing newline), whatever the level filter.
  std::string format_line(LogLevel level, std::string_view message, LogFields fields) const;

 private:
  std::atomic<int> level_;
  LoggerOptions options_;
  std::mutex mu_;
};

// For code that holds an optional Logger*: does nothing when `logger` is null.
inline void log_to(Logger* logger, LogLevel level, std::string_view message,
                   LogFields fields = {}) {
  if (logger != nullptr && logger->enabled(level)) logger->log(level, message, fields);
}

}  // namespace pgrelay
