// Installs and removes trigger capture upstream: change table, layouts, functions, triggers.
//
// What is installed (schema `_pgrelay` by default):
//  - `changes`: one row per captured row change, TRUNCATE or logical message, keyed by the
//    writer's top-level xid (pg_current_xact_id()) and a sequence value.
//  - `layouts`: each captured table's column layout (names, types, typmods, key and generated
//    flags, replica identity, table name), one version per distinct layout. Every change row
//    names the layout version it was written with, so the poller decodes it with the columns in
//    force when it was written, whatever DDL came after.
//  - per captured table a generated SECURITY DEFINER trigger function, run by statement-level
//    AFTER INSERT/UPDATE/DELETE triggers with transition tables: one call per statement (a
//    100k-row INSERT costs one INSERT ... SELECT into `changes`, not 100k function calls),
//    rows in the order the statement changed them. Each row is stored as its record text
//    (`r::text`: every column's own output function, as pgoutput prints it) under SET clauses
//    pinning DateStyle, IntervalStyle, extra_float_digits, bytea_output, lc_monetary and the
//    server's TimeZone. Plus TRUNCATE triggers, `emit_message()`, and `wakeup` (see
//    capture_service.h for when triggers NOTIFY). One ordering differs from pgoutput: an
//    INSERT ... ON CONFLICT DO UPDATE that both inserts and updates rows has two transition
//    tables, so its updates are sent before its inserts instead of interleaved (each row is
//    touched once per statement, so applying them gives the same state).
//  - `sync()`: the plpgsql that computes the captured tables (configured tables plus the tables
//    of the configured publications, for the actions each publishes), records new layouts and
//    regenerates triggers. install() and the event trigger both use it, so there is one
//    generator.
//
// Schema changes. Storing whole records (`r::text`) rather than a list of named columns means
// a trigger function never breaks a writer's statement after DROP or RENAME COLUMN; only the
// layout version it stamps can be stale. Two ways to keep it exact:
//  - Event trigger (needs superuser; chosen automatically when the installing role is one): on
//    ddl_command_end of CREATE/ALTER TABLE, CREATE/ALTER PUBLICATION and the like, sync() runs
//    inside the DDL's own transaction: it records the new layout and regenerates the table's
//    function before any row with the new layout can be written. Exact for every ALTER, and a
//    new table of a captured publication is captured from its first row.
//  - Without event triggers, the capture service calls sync() on a short interval and the
//    poller calls it when a row does not fit its stamped layout. Rows written between an ALTER
//    and that sync carry the previous version: the poller decodes them with the first later
//    layout whose column count matches, which is exact for ADD and DROP COLUMN; after RENAME or
//    a type change with the same column count those rows go out with the previous Relation
//    (names and type OIDs as before; the values are the text the new type printed). A row whose
//    layout existed only between two syncs (ADD then DROP before the sync) fits no recorded
//    layout: it is left out and reported (PollStats::undecodable_rows). Rows a new table gets
//    before the next sync are not captured, and unchanged TOAST values are sent in full
//    (detecting them needs per-column code that DDL would break).
//  The event trigger runs sync(), which looks at every captured table, on each CREATE/ALTER
//  TABLE of the database: DDL gets slower with thousands of captured tables.
//
// Unchanged TOAST. pgoutput sends 'u' for a value of an UPDATE's new tuple that is stored out
// of line and was not modified (the new tuple shares the old TOAST pointer). In event-trigger
// mode the generated function marks a varlena column unchanged when its stored size is at or
// above TOAST_TUPLE_THRESHOLD (no inline value can be that large, so it is out of line) and its
// binary image equals the old one. Not exact: an out-of-line value smaller than the threshold
// (a row with several medium values) is sent in full, and `SET c = c || ''` (same bytes, new
// TOAST pointer) is sent as 'u' where pgoutput sends it in full.
//
// Logical messages. `<schema>.emit_message(transactional, prefix, content)` (content text or
// bytea; STRICT, SECURITY DEFINER with a pinned search_path, callable by every role that has
// USAGE on the schema) has pg_logical_emit_message's signature and result type. It writes a
// change row (op 'M' or 'm'); the poller puts a transactional message into its transaction and a
// non-transactional one into an entry of its own, before the transaction it was written in.
// Limitation: a non-transactional message is visible only when the calling transaction commits
// and is lost if it rolls back (no autonomous transactions without extensions); in autocommit,
// how clients call it, that is at once. It returns pg_current_wal_insert_lsn() at the call: the
// message's LSN in the log is greater (its batch is placed at or after the WAL insert position
// read after it committed), so "the stream passed the returned LSN" never precedes the message.
//
// TRUNCATE. A BEFORE and two AFTER statement triggers number the TRUNCATE statements of a
// transaction (transaction-local settings), so the tables one statement truncated are sent as
// one Truncate message. CASCADE and RESTART IDENTITY are invisible to triggers: the poller reads
// them from the statement text (current_query()); a TRUNCATE run inside a function is sent
// without them.
#pragma once

#include <string>
#include <vector>

#include "base/result.h"
#include "capture/catalog_watch.h"
#include "capture/trigger/pg_session.h"

namespace pgrelay::capture {

// The schema layout this code creates and reads. An installation of a newer version is refused;
// version 1 (phase 1) is upgraded when its change table is empty; version 2 numbered layouts
// per table (3 takes them from a sequence, never reusing one) and is upgraded by installing;
// 3 wrote one change row per row (4 writes chunks of a statement's rows) and is upgraded by
// installing, its rows still read; 4 captured no partitioned table (5 captures the leaf
// partitions of those published, with row triggers) and is upgraded by installing; 5 captured
// tables of inheritance trees with statement triggers, which saw a child's rows updated or
// deleted through its parent as the parent's (6 uses row triggers there too).
inline constexpr int kInstallVersion = 6;

struct TableName {
  std::string schema;
  std::string name;
};

enum class DdlTracking {
  kAuto,          // an event trigger when the installing role is superuser, polling otherwise
  kEventTrigger,  // fail unless an event trigger can be created
  kPolling,       // never create an event trigger
};

struct InstallOptions {
  // Also the NOTIFY channel the triggers wake the poller on. Must not contain $, ' or %.
  std::string schema = "_pgrelay";
  // Tables captured for every operation.
  std::vector<TableName> tables;
  // Tables of these publications (pg_publication_tables), for the operations they publish.
  std::vector<std::string> publications;
  // Tables of every publication of the database, including publications created later (what a
  // server needs: consumers name their publications only when they start streaming).
  bool all_publications = false;
  DdlTracking ddl = DdlTracking::kAuto;
};

// What install() set up, for logs and tests.
struct InstallReport {
  int captured_tables = 0;
  bool created_schema = false;
  bool event_trigger = false;
  std::string timezone;  // the server default the trigger functions format timestamptz in
};

// Creates or brings up to date everything in one transaction; running it again with the same
// options changes nothing, with other options it adds and removes triggers to match. Needs no
// superuser: owning the tables (and CREATE on the database or on the schema) suffices. In a
// schema it creates, USAGE is granted to PUBLIC so that any writer can call emit_message();
// in an existing schema the owner grants that.
Result<InstallReport> install(PgSession& session, const InstallOptions& options);

// Re-reads publication membership and table layouts and regenerates what changed (what the event
// trigger does on DDL), and marks a change of the publications; returns the number of captured
// tables. It reads every captured table's layout: 85 ms with 200 of them. With a `watch` (a
// periodic caller's) it does nothing and returns 0 unless the watch says the catalogs changed.
Result<int> sync_tables(PgSession& session, const std::string& schema = "_pgrelay",
                        CatalogWatch* watch = nullptr);

// Removes every object install() created (a schema it did not create is left in place). A
// schema without an installation is not an error.
Status uninstall(PgSession& session, const std::string& schema = "_pgrelay");

}  // namespace pgrelay::capture
