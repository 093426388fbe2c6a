// Reads TRUNCATE's CASCADE and RESTART IDENTITY options from the statement text a trigger saw.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace pgrelay::capture {

struct TruncateOptions {
  bool cascade = false;
  bool restart_identity = false;
};

// The options of the TRUNCATE statement in `query` (current_query(): the client's whole query
// string, possibly several statements) that truncated `tables` (unqualified names as stored in
// the catalog): the TRUNCATE naming most of them and fewest other words, or the only TRUNCATE.
// Comments, string literals and quoted identifiers are skipped as the Postgres lexer does. Defaults
// (false, false) when no statement matches, e.g. a TRUNCATE run inside a function.
TruncateOptions truncate_options(std::string_view query, const std::vector<std::string>& tables);

}  // namespace pgrelay::capture
