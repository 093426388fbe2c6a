// Redirects the catalog names pgrelay answers for (slots, walsenders, settings, published
// tables) to its schema.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"

namespace pgrelay::server {

// Which of pgrelay's slot functions (create, drop, terminate a walsender) a statement reaches.
// Every session through pgrelay runs upstream as pgrelay's own role, so Postgres cannot tell
// its users apart: pgrelay decides by the user's REPLICATION right.
enum class SlotAccess {
  kChecked,  // pg_*: Postgres's own checks on the calling upstream role (direct sessions)
  kGranted,  // relay_*: a pgrelay user with the REPLICATION right
  kDenied,   // denied_*: one without it gets Postgres's refusal (42501)
};

// Who sends a statement: the slot functions it reaches, and whether it is pg_dump, whose catalog
// reads then leave out pgrelay's schema, triggers, event triggers and publications (so that a
// dump taken through pgrelay restores anywhere).
struct StatementSource {
  StatementSource(SlotAccess slot_access = SlotAccess::kChecked, bool from_pg_dump = false)
      : slots(slot_access), pg_dump(from_pg_dump) {}
  SlotAccess slots;
  bool pg_dump;
};

struct RewriteOptions {
  // The upstream schema holding pgrelay's virtual catalog (views and functions).
  std::string schema = "_pgrelay";
};

// Rewrites SQL text so that references to the virtualized catalog objects reach the objects
// pgrelay keeps upstream, and leaves every other byte as it was (comments, whitespace, $n).
//
// The statement is parsed with the real Postgres parser; only tokens the parse tree shows to be
// the catalog objects are touched: relations in FROM/JOIN (unqualified or pg_catalog-qualified,
// not shadowed by a CTE), function calls, SHOW of the virtualized settings, and the bodies of
// CREATE FUNCTION / DO in plpgsql or sql that mention them. Stateless: safe to share between
// threads (libpg_query keeps its memory per thread).
class SqlRewriter {
 public:
  explicit SqlRewriter(RewriteOptions options);

  // Cheap test: false means rewrite() would certainly return nullopt. Case-insensitive substring
  // search for the names involved; most statements answer false without parsing.
  bool may_need_rewrite(std::string_view sql, const StatementSource& source = {}) const;

  // The rewritten text, or nullopt when the text must pass unchanged (nothing to redirect, or the
  // text does not parse: the upstream reports the syntax error itself). An error only when the
  // parser's output is unusable.
  Result<std::optional<std::string>> rewrite(std::string_view sql,
                                             const StatementSource& source = {}) const;

  const RewriteOptions& options() const { return options_; }

 private:
  RewriteOptions options_;
  std::string quoted_schema_;
};

// A database a statement needs no other session connected to, and whether it drops it.
struct DatabaseUsedAlone {
  std::string name;
  bool dropped = false;
  bool operator==(const DatabaseUsedAlone&) const = default;
};
// The databases `sql` needs no other session connected to, in statement order: those it drops
// (DROP DATABASE), renames (ALTER DATABASE ... RENAME TO), moves (ALTER DATABASE ... SET
// TABLESPACE) or copies (CREATE DATABASE, from its TEMPLATE or template1). The upstream refuses
// these while another backend is connected there, so pgrelay closes the backends it keeps there
// first (BackendPool), and stops capturing a database dropped. Cheap for statements that do not
// say DATABASE (no parse); empty when the text does not parse.
std::vector<DatabaseUsedAlone> databases_used_alone(std::string_view sql);

}  // namespace pgrelay::server
