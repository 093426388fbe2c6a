// Postgres's timestamps (microseconds since 2000-01-01 UTC) as ISO 8601 text, and back.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace pgrelay {

// "2026-11-29T23:31:28.123456Z" from microseconds since 2000-01-01.
std::string format_pg_time(std::int64_t pg_micros);
// Parses "YYYY-MM-DD[ T]HH:MM:SS[.ffffff][Z|+HH[:MM]|-HH[:MM]]" (UTC when no zone is given)
// into microseconds since 2000-01-01.
std::optional<std::int64_t> parse_pg_time(const std::string& text);

}  // namespace pgrelay
