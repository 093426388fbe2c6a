// Fuzzes the catalog SQL rewriter: no crash, deterministic, output parses, fixed point, for every
// kind of session; and the DROP DATABASE finder beside it.
//
// The input is SQL text. A rewrite, when given, must differ from the input, parse with the real
// parser into the same number of statements, and be left alone by a second rewrite (everything
// it points at is already in pgrelay's schema). The prefilter must never reject a text that
// rewrite() would change. databases_used_alone() must not crash, must be deterministic, and finds
// nothing in a text that does not say DATABASE in any case.
#include <pg_query.h>

#include <cctype>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "server/sql_rewrite.h"

namespace {

void check(bool condition) {
  if (!condition) std::abort();
}

// Statements in the text, or -1 when it does not parse.
int statement_count(const std::string& sql) {
  PgQuerySplitResult split = pg_query_split_with_parser(sql.c_str());
  const int n = split.error == nullptr ? split.n_stmts : -1;
  pg_query_free_split_result(split);
  return n;
}

// One source's rewrite of `sql`, checked.
void check_rewrite(const pgrelay::server::SqlRewriter& rewriter, std::string_view sql,
                   const pgrelay::server::StatementSource& source) {
  auto first = rewriter.rewrite(sql, source);
  check(first.ok());
  auto second = rewriter.rewrite(sql, source);
  check(second.ok() && *second == *first);
  if (!first->has_value()) return;

  const std::string& out = **first;
  check(rewriter.may_need_rewrite(sql, source));
  check(out != sql);
  const std::string in(sql);
  const int before = statement_count(in);
  check(before >= 0);
  check(statement_count(out) == before);
  auto again = rewriter.rewrite(out, source);
  check(again.ok() && !again->has_value());
}

}  // namespace

// Every kind of session: the three slot accesses, with and without pg_dump's catalog reads.
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using pgrelay::server::SlotAccess;
  static const pgrelay::server::SqlRewriter rewriter(pgrelay::server::RewriteOptions{});
  const std::string_view sql(reinterpret_cast<const char*>(data), size);
  for (SlotAccess access : {SlotAccess::kChecked, SlotAccess::kGranted, SlotAccess::kDenied}) {
    for (bool pg_dump : {false, true}) check_rewrite(rewriter, sql, {access, pg_dump});
  }
  const auto used_alone = pgrelay::server::databases_used_alone(sql);
  check(pgrelay::server::databases_used_alone(sql) == used_alone);
  std::string lowered(sql);
  for (char& c : lowered) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  check(used_alone.empty() || lowered.find("database") != std::string::npos);
  for (const auto& database : used_alone) check(!database.name.empty());
  return 0;
}
