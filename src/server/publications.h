// Reads publications from the upstream and turns them into the log view a walsender sends.
#pragma once

#include <libpq-fe.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "log/change_view.h"

namespace pgrelay::server {

// The tables and operations `names` publish, as pgoutput decides what to send:
// FOR ALL TABLES publishes every table, FOR TABLES IN SCHEMA every table of the schema now or
// later, FOR TABLE the listed tables; the operation set is the union of the publications'
// publish actions. 42704 'publication "x" does not exist' for a missing one, as pgoutput.
// Logical messages pass when `messages` is set. Blocking (libpq). A publication whose changes
// pgrelay cannot give exactly is refused (0A000), never streamed with changes left out. Both
// captures log a partitioned table's changes as its leaf partitions'; a publication that
// publishes them via the root (publish_via_partition_root) has them sent as the ancestor's
// (log::PublishedAs) on PostgreSQL 15 and later, and is refused before.
//
// On PostgreSQL 15 and later the view carries PublicationTables: per table the publish actions
// of the publications that publish it, its column list and its row filters per action,
// combined as pgoutput's get_rel_sync_entry does. A row filter outside what row_filter.h
// evaluates is refused here (0A000 naming the publication, table and construct, with a hint);
// publications giving a table different column lists leave the error Postgres raises
// ("cannot use different column lists for table ...", 0A000) to the table's first change.
// Read at START_REPLICATION, and again where capture marks a change of the publications in
// the log (walsender.h, reload_view): the upstream's publications as they are when read.
// From PostgreSQL 15 on, through pgoutput::publication_catalog_query.
Result<log::ViewOptions> load_publication_view(PGconn* conn, const std::vector<std::string>& names,
                                               bool messages);

// The same view, PostgreSQL 15 and later, of the publications as `catalog` (the answer of
// pgoutput::publication_catalog_query, as capture's marker logged it) describes them.
Result<log::ViewOptions> publication_view_at(std::string_view catalog,
                                             const std::vector<std::string>& names, bool messages);

// The publications' catalog as pgoutput::publication_catalog_query answers it (JSON text),
// PostgreSQL 15 and later: what a primary publishes for its followers (nats/server_facts.h).
// Blocking (libpq).
Result<std::string> read_publication_catalog_text(PGconn* conn);

// Waits until the upstream transaction `xid` (a full transaction id) is visible to new
// snapshots. Logical decoding hands a commit out before the committing backend leaves the proc
// array (right after its commit record is flushed, or once a synchronous standby has confirmed
// it), so publications read as soon as capture logged a change of them can be the ones it
// replaced. An xid the upstream never assigned (a log that outlived its upstream: restored, or
// replaced) is not waited for. 55000 after `limit`, naming what may hold it back. Blocking.
Status wait_until_visible(PGconn* conn, std::uint64_t xid, std::chrono::milliseconds limit);

// The same view without the partition refusal: what START_REPLICATION would refuse of the
// publications' row filters and column lists alone (doctor's publication_filters check).
Result<log::ViewOptions> load_publication_rules(PGconn* conn,
                                                const std::vector<std::string>& names);

}  // namespace pgrelay::server
