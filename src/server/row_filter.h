// Evaluates PostgreSQL 15 publication row filters (WHERE) over pgoutput tuples' text values.
//
// The input is a filter as the catalog deparses it (pg_get_expr(prqual, prrelid)), parsed with
// the real Postgres parser (libpg_query) as `SELECT <expr>`. The supported subset, evaluated
// exactly as the PostgreSQL 15 executor does (three-valued logic; NULL makes a row not match):
//  - column references; constants: integers, decimals, strings, true/false, NULL, typed casts
//    of them ('5'::integer, (1.5)::double precision, NULL::boolean, 'x'::text);
//  - casts Postgres shows in deparsed filters: widening integer casts, integer to numeric, any
//    number to float4/float8 (numeric through its text, as numeric_float8 does), float4 to
//    float8, varchar/bpchar/name to text (bpchar loses trailing spaces);
//  - = <> (!=) < <= > >= between the types Postgres has operators for: integers (int2, int4,
//    int8 in any mix), oid, numeric (exact decimal comparison, NaN and infinities ordered as
//    Postgres orders them), float4/float8 (NaN equal to itself and above everything), boolean,
//    text/varchar/name (and name with text), bpchar (trailing spaces ignored). Equality of text
//    types needs a deterministic collation; < <= > >= need the "C" or "POSIX" collation
//    (explicit COLLATE, the column's, or the database's for the default collation);
//  - AND, OR, NOT; IS [NOT] NULL (on a column of any type); IS [NOT] TRUE/FALSE/UNKNOWN;
//    IS [NOT] DISTINCT FROM; x IN (...), x NOT IN (...), x op ANY/ALL (ARRAY[...]);
//    [NOT] BETWEEN; a bare boolean column.
// Anything else (function calls, LIKE, arithmetic, array literals, other types) is refused when
// the filter is compiled, with a 0A000 error naming the construct: pgrelay never guesses.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/result.h"
#include "log/change_view.h"

namespace pgrelay::server {

// What the catalog says about a column beyond its type OID (which comes from the Relation).
struct FilterColumn {
  std::string type_name;              // format_type(), for messages
  std::string collation = "default";  // pg_collation.collname; "" for a non-collatable type
  bool deterministic = true;          // pg_collation.collisdeterministic
};

struct FilterContext {
  std::map<std::string, FilterColumn> columns;  // by column name
  // The database's default collation is "C" or "POSIX" (libc provider).
  bool database_collation_is_c = false;
};

// Parses the filters (ORed together, in order, as pgoutput combines the publications' filters
// of one action) and keeps them for binding to each Relation layout. Errors: 0A000 for
// anything outside the supported subset, with a message naming it; 42601 for text that does
// not parse. Binding type-checks against the Relation's column types (errors as above) and
// fails (55000) for a column the filter names that the Relation lacks.
Result<std::shared_ptr<const log::RowFilter>> make_row_filter(
    const std::vector<std::string>& expressions, FilterContext context);

}  // namespace pgrelay::server
