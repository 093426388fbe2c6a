// What `pgrelay dump` leaves out of an archive and `pgrelay restore` skips in one: pgrelay's
// and zero-cache's own objects, found in the database and in pg_restore's table of contents.
//
// pg_dump can leave schemas out (--exclude-schema) but not the objects elsewhere that belong to
// them: event triggers (pgrelay's and zero's call functions in their own schemas), trigger
// capture's triggers on the application's tables, and publications (zero's, and pgrelay's in
// native capture). Those stay in the archive, and restore skips them, as it finds them in
// `pg_restore -l`: a trigger or event trigger whose function the archive does not hold, and a
// publication named as pgrelay or zero-cache name theirs.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pgrelay::cli::dump {

// A query listing, one per row, the schemas that are not the application's and whose they are
// ('pgrelay' or 'zero'): pgrelay's capture schema (it holds note_publications()), zero-cache's
// shard schemas (they hold "shardConfig") and the app schema APP of each shard schema APP_N
// (holding "permissions" or "schemaVersions").
std::string_view internal_schemas_query();

// One line of `pg_restore -l`: "ID; TABLEOID OID DESC NAMESPACE TAG OWNER".
struct TocEntry {
  std::string line;
  std::string desc;    // "TABLE", "EVENT TRIGGER", "PUBLICATION TABLES IN SCHEMA", ...
  std::string schema;  // the namespace; "-" when the object has none
  std::string tag;     // the name; "PUB TABLE" for a publication's table, "PUB SCHEMA" for its
                       // schema, "TABLE TRIGGER" for a table's trigger
};

// The entry on `line`; nullopt for comments, blank lines and a desc this code does not know
// (such lines are kept as they are).
std::optional<TocEntry> parse_toc_line(std::string_view line);

// Whether a publication of this name is pgrelay's (SCHEMA_capture, SCHEMA_capture_keyless for
// one of `pgrelay_schemas`) or zero-cache's (_APP_metadata_N, _APP_public_N).
bool is_internal_publication(std::string_view name,
                             const std::vector<std::string>& pgrelay_schemas);

// The function a trigger or an event trigger runs, from the CREATE [CONSTRAINT | EVENT] TRIGGER
// statements pg_restore prints; names unquoted.
struct TriggerCall {
  std::string trigger;
  std::string table_schema;  // a table's trigger: its table; empty for an event trigger
  std::string table;
  std::string schema;  // the function's
  std::string function;
};
std::vector<TriggerCall> parse_trigger_calls(std::string_view sql);

// The listing for `pg_restore -L`, with skipped entries commented out, and what was skipped.
struct RestoreList {
  std::string listing;
  // "EVENT TRIGGER _pgrelay_ddl (...)", "PUBLICATION _zero_public_0"; a table's triggers
  // are counted, not listed.
  std::vector<std::string> skipped;
  std::size_t skipped_table_triggers = 0;
  // The tables the archive creates, as schema.table (quoted where needed, for messages).
  std::vector<std::pair<std::string, std::string>> tables;
};
RestoreList plan_restore(std::string_view listing, const std::vector<TriggerCall>& triggers,
                         const std::vector<std::string>& pgrelay_schemas);

// The listing holding only the TRIGGER and EVENT TRIGGER entries of `listing` (to print their
// statements).
std::string trigger_listing(std::string_view listing);

}  // namespace pgrelay::cli::dump
