// Reads what a publishing primary tells its followers of the upstream.
#include "cli/primary_facts_reader.h"

#include <libpq-fe.h>

#include "server/publications.h"
#include "upstream/libpq_pool.h"

namespace pgrelay::cli {

namespace {

// The settings PostgreSQL 15 reports to every session (GUC_REPORT), in its order.
constexpr const char* kReported[] = {"application_name",
                                     "client_encoding",
                                     "DateStyle",
                                     "default_transaction_read_only",
                                     "in_hot_standby",
                                     "integer_datetimes",
                                     "IntervalStyle",
                                     "is_superuser",
                                     "server_encoding",
                                     "server_version",
                                     "session_authorization",
                                     "standard_conforming_strings",
                                     "TimeZone"};

}  // namespace

Result<nats::ServerFacts> read_primary_facts(const std::string& conninfo) {
  upstream::LibpqPool pool(0);  // one connection, closed when read
  auto lease = pool.acquire(conninfo);
  if (!lease.ok()) return lease.error();
  PGconn* conn = lease->get();
  nats::ServerFacts facts;
  for (const char* name : kReported) {
    if (const char* value = PQparameterStatus(conn, name))
      facts.parameters.emplace_back(name, value);
  }
  if (PQserverVersion(conn) >= 150000) {
    auto catalog = server::read_publication_catalog_text(conn);
    if (!catalog.ok()) return catalog.error();
    facts.catalog = std::move(*catalog);
  }
  return facts;
}

}  // namespace pgrelay::cli
