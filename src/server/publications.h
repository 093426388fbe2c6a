// Reads publications from the upstream and turns them into the log view a walsender sends.
#pragma once

#include <libpq-fe.h>

#include <string>
#include <vector>

#include "base/result.h"
#include "log/change_view.h"

namespace pgrelay::server {

// The tables and operations `names` publish, as pgoutput decides what to send:
// FOR ALL TABLES publishes every table, FOR TABLES IN SCHEMA every table of the schema now or
// later, FOR TABLE the listed tables; the operation set is the union of the publications'
// publish actions. 42704 'publication "x" does not exist' for a missing one, as pgoutput.
// Logical messages pass when `messages` is set. Blocking (libpq).
Result<log::ViewOptions> load_publication_view(PGconn* conn, const std::vector<std::string>& names,
                                               bool messages);

}  // namespace pgrelay::server
