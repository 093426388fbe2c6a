// Installs and removes trigger capture upstream: change table, meta table, per-table triggers.
#include "capture/trigger/installer.h"

#include <charconv>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "capture/trigger/relation_info.h"

namespace pgrelay::capture {
namespace {

// Operations a table is captured for (pg_publication's pubinsert ... pubtruncate).
struct Ops {
  bool insert = false;
  bool update = false;
  bool del = false;
  bool truncate = false;
};

// Names of the objects install() creates, quoted once.
struct Names {
  std::string schema;         // quoted schema
  std::string changes;        // schema.changes
  std::string meta;           // schema.meta
  std::string captured;       // schema.captured
  std::string row_trigger;    // quoted trigger name on captured tables
  std::string trunc_trigger;  // quoted truncate trigger name
  std::string trunc_function;
};

Result<Names> make_names(PgSession& s, const std::string& schema) {
  Names n;
  auto q = s.ident(schema);
  if (!q.ok()) return q.error();
  n.schema = *q;
  n.changes = n.schema + ".changes";
  n.meta = n.schema + ".meta";
  n.captured = n.schema + ".captured";
  auto row = s.ident(schema + "_capture");
  if (!row.ok()) return row.error();
  n.row_trigger = *row;
  auto trunc = s.ident(schema + "_capture_truncate");
  if (!trunc.ok()) return trunc.error();
  n.trunc_trigger = *trunc;
  n.trunc_function = n.schema + ".capture_truncate()";
  return n;
}

std::string row_function(const Names& n, std::uint32_t oid) {
  return n.schema + ".\"capture_" + std::to_string(oid) + "\"()";
}

// Rolls back unless committed, so every error path leaves the upstream as it was.
class Transaction {
 public:
  explicit Transaction(PgSession& s) : s_(s) {}
  ~Transaction() {
    if (open_) (void)s_.run("ROLLBACK");
  }
  Status begin() {
    PGRELAY_TRY(s_.run("BEGIN"));
    open_ = true;
    return {};
  }
  Status commit() {
    open_ = false;
    return s_.run("COMMIT");
  }

 private:
  PgSession& s_;
  bool open_ = false;
};

// An OID or version the server printed; 0 when it is not a number (never thrown).
std::uint32_t to_u32(std::string_view text) {
  std::uint32_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  return ec == std::errc() && p == text.data() + text.size() ? v : 0;
}

Result<std::optional<int>> installed_version(PgSession& s, const std::string& schema) {
  auto r = s.exec(
      "SELECT pg_catalog.to_regclass(pg_catalog.quote_ident($1) || '.meta') IS NOT NULL", {schema});
  if (!r.ok()) return r.error();
  if (r->value(0, 0) != "t") return std::optional<int>();
  auto ident = s.ident(schema);
  if (!ident.ok()) return ident.error();
  auto v = s.exec("SELECT value FROM " + *ident + ".meta WHERE key = 'version'");
  if (!v.ok()) return v.error();
  if (v->rows() == 0) return std::optional<int>();
  const std::uint32_t version = to_u32(v->value(0, 0));
  if (version == 0) {
    return Error::make(sqlstate::kObjectNotInPrerequisiteState,
                       "trigger capture in schema \"" + schema + "\" has an unreadable version",
                       "Run uninstall and install again.");
  }
  return std::optional<int>(static_cast<int>(version));
}

Result<std::string> server_default(PgSession& s, const char* name) {
  auto r = s.exec("SELECT reset_val FROM pg_catalog.pg_settings WHERE name = $1", {name});
  if (!r.ok()) return r.error();
  if (r->rows() == 0)
    return Error::make(sqlstate::kUndefinedObject, std::string("no setting ") + name);
  return std::string(r->value(0, 0));
}

Status add_table(PgSession& s, std::map<std::uint32_t, Ops>& out, const TableName& t,
                 const std::string& own_schema) {
  if (t.schema == own_schema) {
    // Capturing the change table would make every captured row write another one.
    return Error::make(sqlstate::kInvalidParameterValue,
                       "cannot capture \"" + t.schema + "." + t.name +
                           "\": it is in trigger capture's own schema");
  }
  auto r = s.exec(
      "SELECT c.oid::pg_catalog.int8, c.relkind::text FROM pg_catalog.pg_class c "
      "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
      "WHERE n.nspname = $1 AND c.relname = $2",
      {t.schema, t.name});
  if (!r.ok()) return r.error();
  if (r->rows() == 0) {
    return Error::make("42P01", "relation \"" + t.schema + "." + t.name + "\" does not exist");
  }
  if (r->value(0, 1) != "r") {
    return Error::make(
        sqlstate::kFeatureNotSupported, "\"" + t.schema + "." + t.name + "\" is not a plain table",
        "Trigger capture supports ordinary tables only (no partitioned tables yet).");
  }
  out[to_u32(r->value(0, 0))] = Ops{true, true, true, true};
  return {};
}

Status add_publication(PgSession& s, std::map<std::uint32_t, Ops>& out, const std::string& pub,
                       const std::string& own_schema) {
  auto p = s.exec(
      "SELECT pubinsert, pubupdate, pubdelete, pubtruncate FROM pg_catalog.pg_publication "
      "WHERE pubname = $1",
      {pub});
  if (!p.ok()) return p.error();
  if (p->rows() == 0) {
    return Error::make(sqlstate::kUndefinedObject, "publication \"" + pub + "\" does not exist");
  }
  Ops ops{p->value(0, 0) == "t", p->value(0, 1) == "t", p->value(0, 2) == "t",
          p->value(0, 3) == "t"};
  auto t = s.exec(
      "SELECT c.oid::pg_catalog.int8, c.relkind::text, pt.schemaname, pt.tablename "
      "FROM pg_catalog.pg_publication_tables pt "
      "JOIN pg_catalog.pg_namespace n ON n.nspname = pt.schemaname "
      "JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename "
      "WHERE pt.pubname = $1 AND pt.schemaname <> $2",
      {pub, own_schema});
  if (!t.ok()) return t.error();
  for (int i = 0; i < t->rows(); ++i) {
    if (t->value(i, 1) != "r") {
      return Error::make(
          sqlstate::kFeatureNotSupported,
          "\"" + std::string(t->value(i, 2)) + "." + std::string(t->value(i, 3)) +
              "\" of publication \"" + pub + "\" is not a plain table",
          "Trigger capture supports ordinary tables only (no partitioned tables yet).");
    }
    Ops& o = out[to_u32(t->value(i, 0))];
    o.insert |= ops.insert;
    o.update |= ops.update;
    o.del |= ops.del;
    o.truncate |= ops.truncate;
  }
  return {};
}

// ARRAY[...] of the row's columns as their output functions print them; `mask` selects the
// columns kept (others are NULL, as in pgoutput's key tuples). format('%s') calls the type's
// output function (a ::text cast would not: bool and inet have their own casts); num_nulls tests
// the datum itself, where IS NULL would look inside composite values.
Result<std::string> row_array(PgSession& s, const pgoutput::Relation& rel, const char* row,
                              bool keys_only) {
  if (rel.columns.empty()) return std::string("'{}'::text[]");
  std::string out = "ARRAY[";
  for (std::size_t i = 0; i < rel.columns.size(); ++i) {
    if (i > 0) out += ", ";
    if (keys_only && !rel.columns[i].is_key()) {
      out += "NULL::text";
      continue;
    }
    auto col = s.ident(rel.columns[i].name);
    if (!col.ok()) return col.error();
    const std::string ref = std::string(row) + "." + *col;
    out += "CASE WHEN pg_catalog.num_nulls(" + ref + ") = 1 THEN NULL::text ELSE " +
           "pg_catalog.format('%s', " + ref + ") END";
  }
  return out + "]::text[]";
}

Result<std::string> function_body(PgSession& s, const Names& n, const pgoutput::Relation& rel) {
  auto new_row = row_array(s, rel, "NEW", false);
  if (!new_row.ok()) return new_row.error();
  auto old_full = row_array(s, rel, "OLD", false);
  if (!old_full.ok()) return old_full.error();
  auto old_key = row_array(s, rel, "OLD", true);
  if (!old_key.ok()) return old_key.error();
  std::vector<std::size_t> keys;
  for (std::size_t i = 0; i < rel.columns.size(); ++i) {
    if (rel.columns[i].is_key()) keys.push_back(i + 1);
  }
  const bool full = rel.replica_identity == pgoutput::kReplicaIdentityFull;
  const std::string ins = "INSERT INTO " + n.changes +
                          " (rel, op, old_kind, old_values, new_values) VALUES (TG_RELID, ";

  std::string b = "DECLARE\n  n text[];\n  o text[];\nBEGIN\n";
  b += "  IF TG_OP = 'INSERT' THEN\n    " + ins + "'I', NULL, NULL, " + *new_row + ");\n";
  b += "  ELSIF TG_OP = 'UPDATE' THEN\n    n := " + *new_row + ";\n";
  if (full) {
    b += "    " + ins + "'U', 'O', " + *old_full + ", n);\n";
  } else if (!keys.empty()) {
    // pgoutput sends the old key only when the key changed; the printed values tell.
    b += "    o := " + *old_key + ";\n    IF ";
    for (std::size_t k = 0; k < keys.size(); ++k) {
      if (k > 0) b += " OR ";
      b += "o[" + std::to_string(keys[k]) + "] IS DISTINCT FROM n[" + std::to_string(keys[k]) + "]";
    }
    b += " THEN\n      " + ins + "'U', 'K', o, n);\n    ELSE\n      " + ins +
         "'U', NULL, NULL, n);\n    END IF;\n";
  } else {
    b += "    " + ins + "'U', NULL, NULL, n);\n";
  }
  b += "  ELSIF TG_OP = 'DELETE' THEN\n";
  if (full) {
    b += "    " + ins + "'D', 'O', " + *old_full + ", NULL);\n";
  } else if (!keys.empty()) {
    b += "    " + ins + "'D', 'K', " + *old_key + ", NULL);\n";
  } else {
    // pgoutput sends no Delete without an old tuple.
    b += "    NULL;\n";
  }
  b += "  END IF;\n  RETURN NULL;\nEND";
  return b;
}

// The SET clauses that make values independent of the writer's session: what a walsender
// serving a default subscriber prints.
Result<std::string> output_settings(PgSession& s, const std::string& timezone,
                                    const std::string& lc_monetary) {
  auto tz = s.literal(timezone);
  if (!tz.ok()) return tz.error();
  auto mon = s.literal(lc_monetary);
  if (!mon.ok()) return mon.error();
  return " SET search_path = pg_catalog, pg_temp SET DateStyle = 'ISO, MDY'"
         " SET IntervalStyle = 'postgres' SET extra_float_digits = 3 SET bytea_output = 'hex'"
         " SET TimeZone = " +
         *tz + " SET lc_monetary = " + *mon;
}

Result<std::string> qualified_table(PgSession& s, std::uint32_t oid) {
  auto r = s.exec(
      "SELECT pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(c.relname) "
      "FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
      "WHERE c.oid = $1::pg_catalog.oid",
      {std::to_string(oid)});
  if (!r.ok()) return r.error();
  if (r->rows() == 0) return std::string();
  return std::string(r->value(0, 0));
}

Status install_table(PgSession& s, const Names& n, std::uint32_t oid, const Ops& ops,
                     const std::string& settings) {
  auto rel = load_relation(s, oid);
  if (!rel.ok()) return rel.error();
  if (!rel->has_value())
    return Error::make("42P01", "relation with OID " + std::to_string(oid) + " does not exist");
  auto table = qualified_table(s, oid);
  if (!table.ok()) return table.error();
  auto body = function_body(s, n, **rel);
  if (!body.ok()) return body.error();
  auto body_literal = s.literal(*body);
  if (!body_literal.ok()) return body_literal.error();
  const std::string fn = row_function(n, oid);
  PGRELAY_TRY(s.run("CREATE OR REPLACE FUNCTION " + fn +
                    " RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER" + settings + " AS " +
                    *body_literal));
  std::vector<std::string> events;
  if (ops.insert) events.push_back("INSERT");
  if (ops.update) events.push_back("UPDATE");
  if (ops.del) events.push_back("DELETE");
  if (events.empty()) {
    PGRELAY_TRY(s.run("DROP TRIGGER IF EXISTS " + n.row_trigger + " ON " + *table));
  } else {
    std::string list;
    for (const auto& e : events) list += (list.empty() ? "" : " OR ") + e;
    PGRELAY_TRY(s.run("CREATE OR REPLACE TRIGGER " + n.row_trigger + " AFTER " + list + " ON " +
                      *table + " FOR EACH ROW EXECUTE FUNCTION " + fn));
  }
  if (ops.truncate) {
    PGRELAY_TRY(s.run("CREATE OR REPLACE TRIGGER " + n.trunc_trigger + " AFTER TRUNCATE ON " +
                      *table + " FOR EACH STATEMENT EXECUTE FUNCTION " + n.trunc_function));
  } else {
    PGRELAY_TRY(s.run("DROP TRIGGER IF EXISTS " + n.trunc_trigger + " ON " + *table));
  }
  return s.run("INSERT INTO " + n.captured +
                   " (relid) VALUES ($1::pg_catalog.oid) ON CONFLICT (relid) DO NOTHING",
               {std::to_string(oid)});
}

Status remove_table(PgSession& s, const Names& n, std::uint32_t oid) {
  auto table = qualified_table(s, oid);
  if (!table.ok()) return table.error();
  if (!table->empty()) {
    PGRELAY_TRY(s.run("DROP TRIGGER IF EXISTS " + n.row_trigger + " ON " + *table));
    PGRELAY_TRY(s.run("DROP TRIGGER IF EXISTS " + n.trunc_trigger + " ON " + *table));
  }
  PGRELAY_TRY(s.run("DROP FUNCTION IF EXISTS " + row_function(n, oid)));
  return s.run("DELETE FROM " + n.captured + " WHERE relid = $1::pg_catalog.oid",
               {std::to_string(oid)});
}

Result<std::vector<std::uint32_t>> captured_tables(PgSession& s, const Names& n) {
  auto r = s.exec("SELECT relid::pg_catalog.int8 FROM " + n.captured + " ORDER BY relid");
  if (!r.ok()) return r.error();
  std::vector<std::uint32_t> out;
  for (int i = 0; i < r->rows(); ++i) {
    out.push_back(to_u32(r->value(i, 0)));
  }
  return out;
}

Status check_version(PgSession& s, const std::string& schema) {
  auto v = installed_version(s, schema);
  if (!v.ok()) return v.error();
  if (v->has_value() && **v > kInstallVersion) {
    return Error::make(sqlstate::kObjectNotInPrerequisiteState,
                       "trigger capture in schema \"" + schema + "\" has version " +
                           std::to_string(**v) + ", newer than this pgrelay's " +
                           std::to_string(kInstallVersion),
                       "Upgrade pgrelay.");
  }
  return {};
}

}  // namespace

Result<InstallReport> install(PgSession& session, const InstallOptions& options) {
  PgSession& s = session;
  auto names = make_names(s, options.schema);
  if (!names.ok()) return names.error();
  const Names& n = *names;
  Transaction txn(s);
  PGRELAY_TRY(txn.begin());
  PGRELAY_TRY(check_version(s, options.schema));

  auto exists =
      s.exec("SELECT count(*) FROM pg_catalog.pg_namespace WHERE nspname = $1", {options.schema});
  if (!exists.ok()) return exists.error();
  InstallReport report;
  report.created_schema = exists->value(0, 0) == "0";
  // CREATE SCHEMA checks CREATE on the database even when the schema exists: skip it then.
  if (report.created_schema) PGRELAY_TRY(s.run("CREATE SCHEMA " + n.schema));
  PGRELAY_TRY(s.run("CREATE TABLE IF NOT EXISTS " + n.meta +
                    " (key text PRIMARY KEY, value text NOT NULL)"));
  // Serializes concurrent installs of the same schema.
  PGRELAY_TRY(s.run("LOCK TABLE " + n.meta + " IN EXCLUSIVE MODE"));
  PGRELAY_TRY(s.run("INSERT INTO " + n.meta +
                        " (key, value) VALUES ('created_schema', $1) ON CONFLICT (key) DO NOTHING",
                    {report.created_schema ? "true" : "false"}));
  auto created = s.exec("SELECT value FROM " + n.meta + " WHERE key = 'created_schema'");
  if (!created.ok()) return created.error();
  report.created_schema = created->value(0, 0) == "true";
  PGRELAY_TRY(s.run("INSERT INTO " + n.meta +
                        " (key, value) VALUES ('version', $1) ON CONFLICT (key) DO UPDATE SET "
                        "value = EXCLUDED.value",
                    {std::to_string(kInstallVersion)}));
  // Rows are keyed by the writer's top-level xid; the poller reads by snapshot visibility.
  PGRELAY_TRY(s.run("CREATE TABLE IF NOT EXISTS " + n.changes +
                    " (xid pg_catalog.xid8 NOT NULL DEFAULT pg_catalog.pg_current_xact_id(),"
                    " seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
                    " rel pg_catalog.oid NOT NULL,"
                    " op \"char\" NOT NULL,"
                    " old_kind \"char\","
                    " old_values text[],"
                    " new_values text[])"));
  PGRELAY_TRY(s.run("CREATE INDEX IF NOT EXISTS changes_xid ON " + n.changes + " (xid)"));
  PGRELAY_TRY(
      s.run("CREATE TABLE IF NOT EXISTS " + n.captured + " (relid pg_catalog.oid PRIMARY KEY)"));

  auto tz = server_default(s, "TimeZone");
  if (!tz.ok()) return tz.error();
  auto mon = server_default(s, "lc_monetary");
  if (!mon.ok()) return mon.error();
  report.timezone = *tz;
  auto settings = output_settings(s, *tz, *mon);
  if (!settings.ok()) return settings.error();

  std::map<std::uint32_t, Ops> wanted;
  for (const auto& t : options.tables) PGRELAY_TRY(add_table(s, wanted, t, options.schema));
  for (const auto& p : options.publications) {
    PGRELAY_TRY(add_publication(s, wanted, p, options.schema));
  }

  // TRUNCATE CASCADE and RESTART IDENTITY are invisible to triggers: recorded without them.
  auto trunc_body = s.literal("BEGIN INSERT INTO " + n.changes +
                              " (rel, op) VALUES (TG_RELID, 'T'); RETURN NULL; END");
  if (!trunc_body.ok()) return trunc_body.error();
  PGRELAY_TRY(s.run("CREATE OR REPLACE FUNCTION " + n.trunc_function +
                    " RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER" + *settings + " AS " +
                    *trunc_body));
  for (const auto& [oid, ops] : wanted) PGRELAY_TRY(install_table(s, n, oid, ops, *settings));
  auto before = captured_tables(s, n);
  if (!before.ok()) return before.error();
  for (std::uint32_t oid : *before) {
    if (wanted.count(oid) == 0) PGRELAY_TRY(remove_table(s, n, oid));
  }
  report.captured_tables = static_cast<int>(wanted.size());
  PGRELAY_TRY(txn.commit());
  return report;
}

Status uninstall(PgSession& session, const std::string& schema) {
  PgSession& s = session;
  auto names = make_names(s, schema);
  if (!names.ok()) return names.error();
  const Names& n = *names;
  Transaction txn(s);
  PGRELAY_TRY(txn.begin());
  auto version = installed_version(s, schema);
  if (!version.ok()) return version.error();
  if (!version->has_value()) return txn.commit();
  PGRELAY_TRY(s.run("LOCK TABLE " + n.meta + " IN EXCLUSIVE MODE"));
  auto tables = captured_tables(s, n);
  if (!tables.ok()) return tables.error();
  for (std::uint32_t oid : *tables) PGRELAY_TRY(remove_table(s, n, oid));
  auto created = s.exec("SELECT value FROM " + n.meta + " WHERE key = 'created_schema'");
  if (!created.ok()) return created.error();
  if (created->rows() > 0 && created->value(0, 0) == "true") {
    PGRELAY_TRY(s.run("DROP SCHEMA " + n.schema + " CASCADE"));
  } else {
    PGRELAY_TRY(s.run("DROP FUNCTION IF EXISTS " + n.trunc_function));
    PGRELAY_TRY(s.run("DROP TABLE IF EXISTS " + n.changes + ", " + n.captured + ", " + n.meta));
  }
  return txn.commit();
}

}  // namespace pgrelay::capture
