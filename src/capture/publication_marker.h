// Marks changes of the upstream's publications in the captured stream, where walsenders re-read
// them.
//
// A consumer's publications decide what it is sent, and Postgres's walsender applies an ALTER
// PUBLICATION from the position where it committed, judging each change by the publications as
// they stood when it was made. pgrelay's walsenders cannot read the upstream's past catalog, so
// capture logs it: a fingerprint of every publication is kept upstream, and when it changes a
// transactional logical message (log::kPublicationsChangedPrefix) is written through the
// capture's emit_message, in the DDL's own transaction when an event trigger calls
// note_publications(true), else at the capture's next periodic check. It carries the catalog
// the views are made from (pgoutput/publication_catalog.h) before and after the change, and
// the transaction's full xid (see note_function).
#pragma once

#include <string>
#include <vector>

#include "base/result.h"
#include "capture/trigger/pg_session.h"

namespace pgrelay::capture {

// Creates or replaces, in `schema` (which already holds emit_message(boolean, text, bytea)),
// the table publication_state and the functions publications_fingerprint(),
// publications_catalog() and note_publications(wait boolean). The publications named in `own`
// (pgrelay's, which follow the others) are left out of the fingerprint and the catalog. Run it inside the installer's transaction.
Status install_publication_marker(PgSession& s, const std::string& schema,
                                  const std::vector<std::string>& own);

// The SQL call that checks the fingerprint and writes the marker when it changed. `wait`: wait
// for a concurrent transaction that is changing it (inside DDL); else skip, as a periodic check
// may, leaving that change to the transaction making it.
std::string note_publications_call(const std::string& quoted_schema, bool wait);

// A periodic check's note_publications(false), in the caller's open transaction and after the
// check's own work (the order in which the event triggers take their locks: the other order
// could deadlock with a DDL). Returns whether it compared the fingerprint: false when another
// transaction held the publications' row and the note was skipped, so the check is not done.
Result<bool> note_publications_periodic(PgSession& s, const std::string& quoted_schema);

// Drops what install_publication_marker created.
Status uninstall_publication_marker(PgSession& s, const std::string& schema);

}  // namespace pgrelay::capture
