// Renders change-log entries and changes as JSON objects for `pgrelay log dump`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "log/format.h"
#include "log/transaction.h"

namespace pgrelay::cli {

// "2026-11-29T23:31:28.123456Z" from microseconds since 2000-01-01.
std::string format_pg_time(std::int64_t pg_micros);
// Parses "YYYY-MM-DD[ T]HH:MM:SS[.ffffff][Z|+HH[:MM]|-HH[:MM]]" (UTC when no zone is given)
// into microseconds since 2000-01-01.
std::optional<std::int64_t> parse_pg_time(const std::string& text);

nlohmann::json entry_begin_json(const log::EntryMeta& meta);
nlohmann::json entry_commit_json(const log::EntryMeta& meta);
// The Relations seen so far in an entry, to name tables and columns.
using RelationMap = std::unordered_map<pgoutput::Oid, pgoutput::Relation>;

// One change; Relation changes are also recorded in `relations`.
nlohmann::json change_json(const log::Change& change, RelationMap& relations);

}  // namespace pgrelay::cli
