// Postgres's timestamps (microseconds since 2000-01-01 UTC) as ISO 8601 text, and back.
#include "base/pg_time.h"

#include <cstdio>
#include <ctime>

namespace pgrelay {

namespace {

constexpr std::int64_t kPgEpochUnixSeconds = 946684800;  // 2000-01-01 00:00:00 UTC

}  // namespace

std::string format_pg_time(std::int64_t pg_micros) {
  std::int64_t seconds = pg_micros / 1000000;
  std::int64_t micros = pg_micros % 1000000;
  if (micros < 0) {
    micros += 1000000;
    seconds -= 1;
  }
  std::time_t unix_seconds = static_cast<std::time_t>(seconds + kPgEpochUnixSeconds);
  std::tm tm{};
  ::gmtime_r(&unix_seconds, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%06lldZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<long long>(micros));
  return buf;
}

std::optional<std::int64_t> parse_pg_time(const std::string& text) {
  int year, month, day, hour, minute, second;
  int consumed = 0;
  if (std::sscanf(text.c_str(), "%4d-%2d-%2d%*1[ T]%2d:%2d:%2d%n", &year, &month, &day, &hour,
                  &minute, &second, &consumed) != 6) {
    return std::nullopt;
  }
  std::size_t pos = static_cast<std::size_t>(consumed);
  std::int64_t micros = 0;
  if (pos < text.size() && text[pos] == '.') {
    ++pos;
    int digits = 0;
    while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') {
      if (digits < 6) micros = micros * 10 + (text[pos] - '0');
      ++digits;
      ++pos;
    }
    if (digits == 0) return std::nullopt;
    for (; digits < 6; ++digits) micros *= 10;
  }
  std::int64_t offset_seconds = 0;
  if (pos < text.size()) {
    if (text[pos] == 'Z' && pos + 1 == text.size()) {
      pos = text.size();
    } else if (text[pos] == '+' || text[pos] == '-') {
      int oh = 0, om = 0, n = 0;
      std::string zone = text.substr(pos + 1);
      if (std::sscanf(zone.c_str(), "%2d:%2d%n", &oh, &om, &n) == 2 ||
          std::sscanf(zone.c_str(), "%2d%n", &oh, &n) == 1) {
        if (static_cast<std::size_t>(n) != zone.size()) return std::nullopt;
        offset_seconds = (oh * 3600 + om * 60) * (text[pos] == '+' ? 1 : -1);
        pos = text.size();
      } else {
        return std::nullopt;
      }
    } else {
      return std::nullopt;
    }
  }
  if (month < 1 || month > 12 || day < 1 || day > 31 || hour > 23 || minute > 59 || second > 60) {
    return std::nullopt;
  }
  std::tm tm{};
  tm.tm_year = year - 1900;
  tm.tm_mon = month - 1;
  tm.tm_mday = day;
  tm.tm_hour = hour;
  tm.tm_min = minute;
  tm.tm_sec = second;
  std::int64_t unix_seconds = static_cast<std::int64_t>(::timegm(&tm)) - offset_seconds;
  return (unix_seconds - kPgEpochUnixSeconds) * 1000000 + micros;
}

}  // namespace pgrelay
