// Renders change-log entries and changes as JSON objects for `pgrelay log dump`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "base/pg_time.h"
#include "log/format.h"
#include "log/transaction.h"

namespace pgrelay::cli {

nlohmann::json entry_begin_json(const log::EntryMeta& meta);
nlohmann::json entry_commit_json(const log::EntryMeta& meta);
// The Relations seen so far in an entry, to name tables and columns.
using RelationMap = std::unordered_map<pgoutput::Oid, pgoutput::Relation>;

// One change; Relation changes are also recorded in `relations`.
nlohmann::json change_json(const log::Change& change, RelationMap& relations);

}  // namespace pgrelay::cli
