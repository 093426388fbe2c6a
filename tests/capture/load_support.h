// Shared by the capture load tests: the pgbench workload, replaying the log, comparing states.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "log/change_log.h"
#include "log/transaction.h"
#include "pg_server.h"

namespace pgrelay::capture::load {

// Tables (and their seed rows) the workload writes; run on the upstream and on the replica.
extern const char* const kSchema;
extern const char* const kSeed;
extern const char* const kTables[5];  // every table of kSchema

// Writes the pgbench scripts into `dir` and runs pgbench against `db` for `seconds` with
// `clients` clients as `user`; returns pgbench's output (throws test::PgError on failure).
std::string run_pgbench(const test::PgServer& server, const std::string& db,
                        const std::string& user, const std::string& dir, int seconds, int clients);

struct Replayed {
  std::size_t transactions = 0;
  std::size_t changes = 0;
  std::size_t unchanged_values = 0;  // 'u' values kept from the replica's row
  std::vector<std::uint32_t> xids;   // of every transaction, in log order
  // Of the transactions holding only a publications-changed marker (not replayed, not in xids).
  std::vector<std::uint32_t> marker_xids;
};

// Applies every transaction of the log to `replica` (changes by replica identity key).
Replayed replay(log::ChangeLog& log, test::PgConnection& replica);

// A digest of a table's rows (order-independent).
std::string table_digest(test::PgConnection& conn, const std::string& table);

// The 32-bit xids of the transactions that committed a txlog row (every writing transaction of
// the workload inserts exactly one).
std::vector<std::uint32_t> committed_xids(test::PgConnection& upstream);

// Whether `txn` holds nothing but capture's publications-changed marker.
bool marker_only(const log::Transaction& txn);

// The publication markers a crash test's log holds (publication_marker.h), checked with gtest:
// none twice, at least `minimum`, the last one written upstream among them, and the upstream's
// fingerprint current. Returns how many there are.
std::size_t expect_publication_markers(const Replayed& replayed, test::PgConnection& upstream,
                                       std::size_t minimum);

}  // namespace pgrelay::capture::load
