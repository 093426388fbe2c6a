// Structured log lines (text in the spirit of Postgres's, or one JSON object per line) with levels.
#include "base/logger.h"

#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <ctime>

#include "base/json_string.h"

namespace pgrelay {
namespace {

std::string lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

constexpr char kHex[] = "0123456789abcdef";

void append_hex_escape(std::string& out, unsigned char c) {
  out += "\\x";
  out += kHex[c >> 4];
  out += kHex[c & 0xF];
}

// Control characters and malformed UTF-8 as C-style escapes; with `quoted`, also '"' and '\'.
void append_text_escaped(std::string& out, std::string_view s, bool quoted) {
  for (std::size_t i = 0; i < s.size();) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      std::size_t n = utf8_sequence_length(s, i);
      if (n == 0) {
        append_hex_escape(out, c);
        ++i;
      } else {
        out.append(s.substr(i, n));
        i += n;
      }
      continue;
    }
    ++i;
    switch (c) {
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      default:
        break;
    }
    if (c < 0x20 || c == 0x7F) {
      append_hex_escape(out, c);
    } else if (quoted && (c == '"' || c == '\\')) {
      out += '\\';
      out += static_cast<char>(c);
    } else {
      out += static_cast<char>(c);
    }
  }
}

// A bare value is non-empty printable text without spaces, quotes, '=' or '\'.
bool needs_quotes(std::string_view s) {
  if (s.empty()) return true;
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    if (c <= 0x20 || c == 0x7F || c == '"' || c == '=' || c == '\\') return true;
  }
  return false;
}

template <typename T>
void append_number(std::string& out, T value) {
  char buffer[64];
  auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, value);
  if (ec == std::errc()) out.append(buffer, end);
}

// Keys come from code, but a bad one must not break the line's syntax either.
void append_key(std::string& out, std::string_view key) {
  if (key.empty()) {
    out += '_';
    return;
  }
  for (char c : key) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.' || c == '-';
    out += ok ? c : '_';
  }
}

void append_text_value(std::string& out, const LogField::Value& value) {
  if (auto* s = std::get_if<std::string_view>(&value)) {
    if (needs_quotes(*s)) {
      out += '"';
      append_text_escaped(out, *s, /*quoted=*/true);
      out += '"';
    } else {
      append_text_escaped(out, *s, /*quoted=*/false);
    }
  } else if (auto* i = std::get_if<std::int64_t>(&value)) {
    append_number(out, *i);
  } else if (auto* u = std::get_if<std::uint64_t>(&value)) {
    append_number(out, *u);
  } else if (auto* d = std::get_if<double>(&value)) {
    if (std::isnan(*d)) {
      out += "NaN";
    } else if (std::isinf(*d)) {
      out += *d > 0 ? "+Inf" : "-Inf";
    } else {
      append_number(out, *d);
    }
  } else {
    out += std::get<bool>(value) ? "true" : "false";
  }
}

void append_json_value(std::string& out, const LogField::Value& value) {
  if (auto* s = std::get_if<std::string_view>(&value)) {
    append_json_string(out, *s);
  } else if (auto* i = std::get_if<std::int64_t>(&value)) {
    append_number(out, *i);
  } else if (auto* u = std::get_if<std::uint64_t>(&value)) {
    append_number(out, *u);
  } else if (auto* d = std::get_if<double>(&value)) {
    if (std::isfinite(*d)) {
      append_number(out, *d);
    } else {
      out += "null";  // JSON has no NaN or infinity
    }
  } else {
    out += std::get<bool>(value) ? "true" : "false";
  }
}

// "2026-11-30 04:40:12.345" (text) or "2026-11-30T04:40:12.345" (JSON), UTC.
void append_time(std::string& out, std::chrono::system_clock::time_point when, char separator) {
  auto millis = std::chrono::duration_cast<std::chrono::milliseconds>(when.time_since_epoch());
  auto seconds = std::chrono::floor<std::chrono::seconds>(millis);
  auto ms = static_cast<int>((millis - seconds).count());
  std::time_t t = static_cast<std::time_t>(seconds.count());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%04d-%02d-%02d%c%02d:%02d:%02d.%03d", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, separator, tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
  out += buffer;
}

std::string_view json_level(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarning:
      return "warning";
    case LogLevel::kError:
      return "error";
  }
  return "info";
}

bool is_reserved_json_key(std::string_view key) {
  return key == "time" || key == "level" || key == "pid" || key == "message";
}

void write_fully(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // nowhere left to report a failing log
    }
    data.remove_prefix(static_cast<std::size_t>(n));
  }
}

}  // namespace

Result<LogLevel> parse_log_level(std::string_view text) {
  std::string t = lower(text);
  if (t == "debug") return LogLevel::kDebug;
  if (t == "info") return LogLevel::kInfo;
  if (t == "warning" || t == "warn") return LogLevel::kWarning;
  if (t == "error") return LogLevel::kError;
  return Error::make(sqlstate::kInvalidParameterValue,
                     "invalid log level \"" + std::string(text) + "\"",
                     "Use debug, info, warning or error.");
}

Result<LogFormat> parse_log_format(std::string_view text) {
  std::string t = lower(text);
  if (t == "text") return LogFormat::kText;
  if (t == "json") return LogFormat::kJson;
  return Error::make(sqlstate::kInvalidParameterValue,
                     "invalid log format \"" + std::string(text) + "\"", "Use text or json.");
}

std::string_view log_level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "DEBUG";
    case LogLevel::kInfo:
      return "INFO";
    case LogLevel::kWarning:
      return "WARNING";
    case LogLevel::kError:
      return "ERROR";
  }
  return "INFO";
}

Logger::Logger(LoggerOptions options)
    : level_(static_cast<int>(options.level)), options_(std::move(options)) {
  if (options_.pid == 0) options_.pid = static_cast<int>(::getpid());
}

std::string Logger::format_line(LogLevel level, std::string_view message, LogFields fields) const {
  auto now = options_.clock ? options_.clock() : std::chrono::system_clock::now();
  std::string line;
  line.reserve(96 + message.size() + fields.size() * 24);
  if (options_.format == LogFormat::kJson) {
    line += "{\"time\":\"";
    append_time(line, now, 'T');
    line += "Z\",\"level\":\"";
    line += json_level(level);
    line += "\",\"pid\":";
    append_number(line, options_.pid);
    line += ",\"message\":";
    append_json_string(line, message);
    for (const auto& field : fields) {
      line += ",\"";
      if (is_reserved_json_key(field.key())) line += '_';
      append_key(line, field.key());
      line += "\":";
      append_json_value(line, field.value());
    }
    line += "}\n";
    return line;
  }
  append_time(line, now, ' ');
  line += " UTC [";
  append_number(line, options_.pid);
  line += "] ";
  line += log_level_name(level);
  line += ":  ";
  append_text_escaped(line, message, /*quoted=*/false);
  for (const auto& field : fields) {
    line += ' ';
    append_key(line, field.key());
    line += '=';
    append_text_value(line, field.value());
  }
  line += '\n';
  return line;
}

void Logger::log(LogLevel level, std::string_view message, LogFields fields) {
  if (!enabled(level)) return;
  std::string line = format_line(level, message, fields);
  std::lock_guard lock(mu_);
  if (options_.sink) {
    options_.sink(line);
  } else {
    write_fully(options_.fd, line);
  }
}

}  // namespace pgrelay
