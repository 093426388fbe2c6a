// Turns the text values of pgoutput changes into their types' binary send format, through the
// upstream's own input and send functions (pgoutput's binary mode).
//
// The log keeps every value as its type's text output. PostgreSQL 15's pgoutput with
// binary 'true' sends a column as 'b' (the send function's bytes) when the column's type has a
// send function, and as 't' otherwise (aclitem, or a user type made without one); NULL ('n') and
// unchanged TOAST ('u') columns stay as they are. The bytes come from the upstream: each text
// value is a parameter of its column's type, read back in binary, so they are what the upstream's
// send function makes of what its input function reads. The connection pins the output
// settings text values were made under (DateStyle ISO, IntervalStyle postgres,
// extra_float_digits 3, bytea_output hex, the role's TimeZone and lc_monetary, as capture's
// triggers and Postgres's subscribers do), so text parses back to the value it came from.
#pragma once

#include <cstddef>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/result.h"
#include "pgoutput/messages.h"
#include "upstream/libpq_pool.h"

namespace pgrelay::server {

// Column type OIDs of each relation, as its last Relation message declared them.
using RelationTypes = std::unordered_map<pgoutput::Oid, std::vector<pgoutput::Oid>>;

// A text value of a change and its column's type.
struct TextValueRef {
  pgoutput::Oid type = 0;
  pgoutput::TupleValue* value = nullptr;
};

// The text values of `messages`' Inserts, Updates and Deletes with their column types, in
// order; Relation messages update `types` on the way (a later change sees its own Relation).
// A change whose relation has not been declared, or whose tuple has more columns than its
// Relation, is an error (XX000): the log always carries the Relation before the change.
Result<std::vector<TextValueRef>> collect_text_values(std::vector<pgoutput::Message*>& messages,
                                                      RelationTypes& types);

// The parameter list of one conversion query: "SELECT $1, $2, ..., $n".
std::string conversion_query(std::size_t values);

// Converts values through the upstream. Thread-safe; blocking (run it on the blocking pool).
class BinaryConverter {
 public:
  // At most this many values per query (Postgres allows 1664 result columns).
  static constexpr std::size_t kMaxValuesPerQuery = 1000;

  BinaryConverter() = default;
  BinaryConverter(const BinaryConverter&) = delete;
  BinaryConverter& operator=(const BinaryConverter&) = delete;

  // Makes each value of a type with a send function kBinary, with the upstream's bytes, on
  // database `conninfo` names; values of types without one stay kText. An upstream error
  // (a type dropped since the value was logged, a value its input function now refuses) is
  // returned with its SQLSTATE. A call that fails part way leaves the values it converted
  // binary; calling it again converts the rest.
  Status convert(const std::string& conninfo, const std::vector<TextValueRef>& values);

  // Conversion queries sent so far (type lookups not counted), for tests and metrics.
  std::size_t conversions() const;

 private:
  // Whether each type has a send function, asked of the upstream once per database and type.
  Status learn_types(PGconn* conn, const std::string& conninfo,
                     const std::vector<TextValueRef>& values);
  bool has_send(const std::string& conninfo, pgoutput::Oid type) const;
  Status convert_chunk(PGconn* conn, const std::vector<const TextValueRef*>& chunk);

  upstream::LibpqPool connections_;
  mutable std::mutex mu_;
  std::map<std::pair<std::string, pgoutput::Oid>, bool> has_send_;
  std::size_t conversions_ = 0;
};

// `conninfo` with the settings conversion pins (see above), for libpq.
std::string conversion_conninfo(const std::string& conninfo);

}  // namespace pgrelay::server
