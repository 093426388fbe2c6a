// Reads a table's pgoutput Relation (columns, types, replica identity key flags) from the catalog.
#pragma once

#include <map>
#include <optional>
#include <set>
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

// The Type records pgoutput sends before a Relation, for those of `oids` at or above
// FirstGenbkiObjectId (10000), i.e. not built in, by OID; one query for all of them. A domain's
// record names its base type (as logicalrep_write_typ does) under the domain's OID. A type that
// no longer exists has no record.
Result<std::map<pgoutput::Oid, pgoutput::Type>> load_types(PgSession& session,
                                                           const std::set<pgoutput::Oid>& oids);

}  // namespace pgrelay::capture
