// Reads a table's pgoutput Relation (columns, types, replica identity key flags) from the catalog.
#pragma once

#include <optional>
#include <vector>

#include "base/result.h"
#include "capture/trigger/pg_session.h"
#include "pgoutput/messages.h"

namespace pgrelay::capture {

// The Relation pgoutput would send for the table now: columns that are neither dropped nor
// generated, in attnum order; every column flagged as key for REPLICA IDENTITY FULL, the primary
// key's (DEFAULT) or the identity index's (USING INDEX) columns otherwise, none for NOTHING.
// nullopt when no such table exists.
Result<std::optional<pgoutput::Relation>> load_relation(PgSession& session, pgoutput::Oid oid);

// The Type records pgoutput sends before a Relation: its columns' types with OIDs at or above
// FirstGenbkiObjectId (10000), i.e. not built in. A domain's record names its base type (as
// logicalrep_write_typ does) under the domain's OID.
Result<std::vector<pgoutput::Type>> load_types(PgSession& session,
                                               const pgoutput::Relation& relation);

}  // namespace pgrelay::capture
