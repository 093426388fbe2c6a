// What native capture needs upstream: checks, pgrelay's publications and their table mirror.
//
// Native capture streams one permanent upstream slot through pgoutput. pgoutput only decodes
// tables of the publications named at START_REPLICATION, and a publication named there must
// already exist at every position the slot decodes (Postgres 15 looks it up with the historic
// catalog), so naming the consumers' own publications would break as soon as one is created or
// dropped. Native capture therefore owns two publications and keeps their tables equal to the
// union of every other publication's (pg_publication_tables):
//   - `<schema>_capture` publishes every action, for tables with a usable replica identity;
//   - `<schema>_capture_keyless` publishes inserts and truncates only, for the others: a table
//     without one may not be in a publication that publishes updates or deletes (Postgres would
//     refuse them to writers), and no consumer's publication can publish those anyway.
// Row filters and column lists stay the consumers': the log keeps whole rows and each
// walsender applies its own publications, as with trigger capture.
#pragma once

#include <string>
#include <vector>

#include "base/result.h"
#include "capture/catalog_watch.h"
#include "capture/trigger/pg_session.h"

namespace pgrelay::capture {

struct NativeSetupOptions {
  std::string schema = "_pgrelay";
};

struct NativeSetupReport {
  int captured_tables = 0;
  bool event_trigger = false;  // DDL mirrored inside its own transaction (superuser installs)
};

// The publication names native capture streams (both, in START_REPLICATION's list).
std::string capture_publication(const std::string& schema);
std::string keyless_capture_publication(const std::string& schema);

// 55000 naming the fix when the upstream cannot stream logically to this role: wal_level is not
// logical, the role lacks REPLICATION, or trigger capture is installed in the schema.
Status check_native_capture_possible(PgSession& session, const std::string& schema);

// Creates (idempotently) the schema, the publications, the mirror function and, for a
// superuser, an event trigger that runs it in the DDL's own transaction; then mirrors once.
Result<NativeSetupReport> install_native_capture(PgSession& session,
                                                 const NativeSetupOptions& options);

// Brings the publications' tables up to date and marks a change of the other publications
// (publication_marker.h); returns how many tables it added or removed. With a `watch` (a
// periodic caller's) it does nothing and returns 0 unless the watch says the catalogs changed.
Result<int> mirror_publications(PgSession& session, const std::string& schema,
                                CatalogWatch* watch = nullptr);

// Whether install_native_capture ran on this schema (its publications exist).
Result<bool> native_capture_installed(PgSession& session, const std::string& schema);

// Removes what install_native_capture created, and the inactive upstream slots native capture
// streamed (pgrelay_<digits> of this database); returns the names of the slots dropped.
Result<std::vector<std::string>> uninstall_native_capture(PgSession& session,
                                                          const std::string& schema);

}  // namespace pgrelay::capture
