// What `pgrelay doctor` reads from an upstream: plain facts, gathered by read-only queries.
#include "cli/doctor_facts.h"

#include <nlohmann/json.hpp>

#include <charconv>
#include <map>
#include <memory>
#include <string_view>

#include "server/publications.h"

namespace pgrelay::cli::doctor {
namespace {

using ResultPtr = std::unique_ptr<PGresult, decltype(&PQclear)>;

// One result set; value() is "" for NULL.
class Rows {
 public:
  explicit Rows(ResultPtr res) : res_(std::move(res)) {}
  int count() const { return PQntuples(res_.get()); }
  std::string value(int row, int col) const { return PQgetvalue(res_.get(), row, col); }
  bool flag(int row, int col) const { return value(row, col) == "t"; }
  int number(int row, int col) const {
    const std::string v = value(row, col);
    int n = 0;
    std::from_chars(v.data(), v.data() + v.size(), n);
    return n;
  }
  // A json array of strings (array_to_json(...)::text).
  std::vector<std::string> strings(int row, int col) const {
    std::vector<std::string> out;
    auto j = nlohmann::json::parse(value(row, col), nullptr, false);
    if (!j.is_array()) return out;
    for (const auto& e : j) {
      if (e.is_string()) out.push_back(e.get<std::string>());
    }
    return out;
  }

 private:
  ResultPtr res_;
};

Result<Rows> query(PGconn* conn, const std::string& sql,
                   const std::vector<std::string>& params = {}) {
  std::vector<const char*> values;
  values.reserve(params.size());
  for (const auto& p : params) values.push_back(p.c_str());
  ResultPtr res(PQexecParams(conn, sql.c_str(), static_cast<int>(values.size()), nullptr,
                             values.data(), nullptr, nullptr, 0),
                &PQclear);
  if (!res || PQresultStatus(res.get()) != PGRES_TUPLES_OK) {
    const char* state = res ? PQresultErrorField(res.get(), PG_DIAG_SQLSTATE) : nullptr;
    const char* message = res ? PQresultErrorField(res.get(), PG_DIAG_MESSAGE_PRIMARY) : nullptr;
    return Error::make(state != nullptr ? state : sqlstate::kConnectionException,
                       message != nullptr ? message : PQerrorMessage(conn));
  }
  return Rows(std::move(res));
}

ConnectionFacts connection_facts(PGconn* conn) {
  ConnectionFacts c;
  auto text = [](const char* s) { return std::string(s != nullptr ? s : ""); };
  c.host = text(PQhost(conn));
  c.port = text(PQport(conn));
  c.user = text(PQuser(conn));
  c.dbname = text(PQdb(conn));
  c.tls = PQsslInUse(conn) != 0;
  if (c.tls) {
    c.tls_protocol = text(PQsslAttribute(conn, "protocol"));
    c.tls_cipher = text(PQsslAttribute(conn, "cipher"));
  }
  c.gss_encrypted = PQgssEncInUse(conn) != 0;
  std::unique_ptr<PQconninfoOption, decltype(&PQconninfoFree)> options(PQconninfo(conn),
                                                                       &PQconninfoFree);
  for (PQconninfoOption* o = options.get(); o != nullptr && o->keyword != nullptr; ++o) {
    if (std::string_view(o->keyword) == "sslmode" && o->val != nullptr) c.sslmode = o->val;
  }
  return c;
}

constexpr const char* kServerSql = R"sql(
SELECT pg_catalog.current_setting('server_version_num')::int,
  pg_catalog.current_setting('server_version'),
  pg_catalog.pg_is_in_recovery(),
  pg_catalog.current_setting('transaction_read_only') = 'on',
  (SELECT s.source FROM pg_catalog.pg_settings s WHERE s.name = 'default_transaction_read_only'),
  pg_catalog.current_setting('wal_level'),
  pg_catalog.current_setting('max_prepared_transactions')::int,
  (SELECT count(*) FROM pg_catalog.pg_prepared_xacts),
  pg_catalog.current_setting('max_replication_slots')::int,
  (SELECT count(*) FROM pg_catalog.pg_replication_slots),
  pg_catalog.current_setting('max_wal_senders')::int,
  pg_catalog.current_setting('ssl') = 'on',
  coalesce(pg_catalog.host(pg_catalog.inet_client_addr()), ''),
  coalesce(pg_catalog.host(pg_catalog.inet_server_addr()), ''),
  coalesce((SELECT s.setting FROM pg_catalog.pg_settings s WHERE s.name = 'config_file'), ''),
  coalesce((SELECT s.setting FROM pg_catalog.pg_settings s WHERE s.name = 'hba_file'), ''),
  pg_catalog.current_setting('track_commit_timestamp') = 'on',
  r.rolname, pg_catalog.quote_ident(r.rolname), r.rolsuper, r.rolreplication,
  pg_catalog.current_database(), pg_catalog.quote_ident(pg_catalog.current_database()),
  pg_catalog.has_database_privilege(pg_catalog.current_database(), 'CREATE')
FROM pg_catalog.pg_roles r WHERE r.rolname = CURRENT_USER
)sql";

Status read_server_and_role(PGconn* conn, Facts& f) {
  auto r = query(conn, kServerSql);
  if (!r.ok()) return r.error();
  if (r->count() != 1) {
    return Error::make(sqlstate::kUndefinedObject, "the current role is not in pg_roles");
  }
  ServerFacts& s = f.server;
  s.version_num = r->number(0, 0);
  s.version = r->value(0, 1);
  s.in_recovery = r->flag(0, 2);
  s.read_only = r->flag(0, 3);
  s.read_only_source = r->value(0, 4);
  s.wal_level = r->value(0, 5);
  s.max_prepared_transactions = r->number(0, 6);
  s.prepared_transactions = r->number(0, 7);
  s.max_replication_slots = r->number(0, 8);
  s.replication_slots = r->number(0, 9);
  s.max_wal_senders = r->number(0, 10);
  s.ssl_offered = r->flag(0, 11);
  s.client_address = r->value(0, 12);
  s.server_address = r->value(0, 13);
  s.config_file = r->value(0, 14);
  s.hba_file = r->value(0, 15);
  s.track_commit_timestamp = r->flag(0, 16);
  RoleFacts& role = f.role;
  role.name = r->value(0, 17);
  role.quoted = r->value(0, 18);
  role.superuser = r->flag(0, 19);
  role.replication = r->flag(0, 20);
  role.database = r->value(0, 21);
  role.database_quoted = r->value(0, 22);
  role.create_on_database = r->flag(0, 23);
  f.connection.unix_socket = s.client_address.empty();
  return {};
}

constexpr const char* kSchemaSql = R"sql(
SELECT pg_catalog.quote_ident($1), n.oid IS NOT NULL,
  coalesce(pg_catalog.pg_has_role(n.nspowner, 'USAGE'), false),
  coalesce(pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(n.nspowner)), ''),
  CASE WHEN n.oid IS NULL OR NOT pg_catalog.has_schema_privilege(n.oid, 'USAGE') THEN false
       WHEN pg_catalog.to_regclass(pg_catalog.quote_ident($1) || '.meta') IS NULL THEN false
       ELSE pg_catalog.has_table_privilege(
              pg_catalog.to_regclass(pg_catalog.quote_ident($1) || '.meta'), 'SELECT') END,
  EXISTS (SELECT 1 FROM pg_catalog.pg_event_trigger e
          WHERE e.evtname = $1 || '_ddl' AND e.evtenabled = 'D')
FROM (SELECT 1) one LEFT JOIN pg_catalog.pg_namespace n ON n.nspname = $1
)sql";

constexpr const char* kGrantsSql = R"sql(
WITH objects AS (
  SELECT p.oid::pg_catalog.regprocedure::text AS object, p.proowner AS owner,
         coalesce(p.proacl, pg_catalog.acldefault('f', p.proowner)) AS acl
  FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
  WHERE n.nspname = $1
  UNION ALL
  SELECT c.oid::pg_catalog.regclass::text, c.relowner,
         coalesce(c.relacl, pg_catalog.acldefault('r', c.relowner))
  FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
  WHERE n.nspname = $1 AND c.relkind IN ('r', 'v', 'm', 'p', 'f', 'S')
)
SELECT o.object || ': ' || pg_catalog.string_agg(a.privilege_type, ', ' ORDER BY a.privilege_type)
       || ' to ' || CASE a.grantee WHEN 0 THEN 'PUBLIC'
                    ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee)) END
FROM objects o, pg_catalog.aclexplode(o.acl) a
WHERE a.grantee <> o.owner
GROUP BY o.object, a.grantee
ORDER BY 1
)sql";

Status read_schema(PGconn* conn, const std::string& name, SchemaFacts& s) {
  s.name = name;
  auto r = query(conn, kSchemaSql, {name});
  if (!r.ok()) return r.error();
  s.quoted = r->value(0, 0);
  s.exists = r->flag(0, 1);
  s.owned = r->flag(0, 2);
  s.owner_quoted = r->value(0, 3);
  s.event_trigger_disabled = r->flag(0, 5);
  if (r->flag(0, 4)) {
    auto v = query(conn, "SELECT value FROM " + s.quoted + ".meta WHERE key = 'version'");
    if (v.ok() && v->count() == 1) s.capture_version = v->number(0, 0);
  }
  if (s.exists) {
    auto g = query(conn, kGrantsSql, {name});
    if (!g.ok()) return g.error();
    for (int i = 0; i < g->count(); ++i) s.grants.push_back(g->value(i, 0));
  }
  return {};
}

Status read_publications(PGconn* conn, const std::string& schema, bool pg15, Facts& f) {
  const std::string schemas_column =
      pg15 ? "(SELECT pg_catalog.array_to_json(coalesce(array_agg(pg_catalog.quote_ident("
             "n.nspname) ORDER BY n.nspname), '{}'))::text "
             "FROM pg_catalog.pg_publication_namespace pn "
             "JOIN pg_catalog.pg_namespace n ON n.oid = pn.pnnspid WHERE pn.pnpubid = p.oid)"
           : "'[]'";
  auto r = query(conn,
                 "SELECT p.pubname, pg_catalog.quote_ident(p.pubname), p.puballtables, "
                 "p.pubviaroot, p.pubinsert, p.pubupdate, p.pubdelete, p.pubtruncate, "
                 "(SELECT pg_catalog.array_to_json(coalesce(array_agg("
                 "pg_catalog.quote_ident(t.schemaname) || '.' || pg_catalog.quote_ident("
                 "t.tablename) ORDER BY t.schemaname, t.tablename), '{}'))::text "
                 "FROM pg_catalog.pg_publication_tables t "
                 "WHERE t.pubname = p.pubname AND t.schemaname <> $1), " +
                     schemas_column + " FROM pg_catalog.pg_publication p ORDER BY p.pubname",
                 {schema});
  if (!r.ok()) return r.error();
  for (int i = 0; i < r->count(); ++i) {
    PublicationFacts p;
    p.name = r->value(i, 0);
    p.quoted = r->value(i, 1);
    p.all_tables = r->flag(i, 2);
    p.via_root = r->flag(i, 3);
    const char* actions[] = {"insert", "update", "delete", "truncate"};
    for (int a = 0; a < 4; ++a) {
      if (r->flag(i, 4 + a)) p.actions.emplace_back(actions[a]);
    }
    p.tables_quoted = r->strings(i, 8);
    p.schemas_quoted = r->strings(i, 9);
    f.publications.push_back(std::move(p));
  }
  if (!pg15) return {};
  auto n = query(conn,
                 "SELECT pg_catalog.quote_ident(p.pubname), pg_catalog.quote_ident(n.nspname) || "
                 "'.' || pg_catalog.quote_ident(c.relname), pr.prqual IS NOT NULL, "
                 "pr.prattrs IS NOT NULL, p.pubname FROM pg_catalog.pg_publication_rel pr "
                 "JOIN pg_catalog.pg_publication p ON p.oid = pr.prpubid "
                 "JOIN pg_catalog.pg_class c ON c.oid = pr.prrelid "
                 "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
                 "WHERE pr.prqual IS NOT NULL OR pr.prattrs IS NOT NULL "
                 "ORDER BY p.pubname, n.nspname, c.relname");
  if (!n.ok()) return n.error();
  // Each such publication is read as START_REPLICATION reads its rules: what it would refuse
  // of them is what pgrelay cannot evaluate (partitions are the publications check's).
  std::map<std::string, std::string> refusals;
  for (int i = 0; i < n->count(); ++i) {
    std::string name = n->value(i, 4);
    if (!refusals.count(name)) {
      auto view = server::load_publication_rules(conn, {name});
      refusals[name] = !view.ok() && view.error().sqlstate == sqlstate::kFeatureNotSupported
                           ? view.error().message
                           : "";
    }
    f.narrowed.push_back(
        {n->value(i, 0), n->value(i, 1), n->flag(i, 2), n->flag(i, 3), refusals[name]});
  }
  return {};
}

// Every table some publication publishes, with what capture needs from it.
constexpr const char* kTablesSql = R"sql(
WITH pt AS (
  SELECT c.oid, p.pubname, p.pubupdate OR p.pubdelete AS upd_del, p.pubviaroot
  FROM pg_catalog.pg_publication_tables t
  JOIN pg_catalog.pg_publication p ON p.pubname = t.pubname
  JOIN pg_catalog.pg_namespace n ON n.nspname = t.schemaname
  JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = t.tablename
  WHERE t.schemaname <> $1),
t AS (
  SELECT pt.oid, bool_or(pt.upd_del) AS upd_del,
    coalesce(array_agg(DISTINCT pg_catalog.quote_ident(pt.pubname)) FILTER (WHERE pt.pubviaroot),
             '{}') AS via_root,
    array_agg(DISTINCT pg_catalog.quote_ident(pt.pubname)) AS pubs
  FROM pt GROUP BY pt.oid)
SELECT pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(c.relname),
  c.relkind::text,
  pg_catalog.pg_has_role(c.relowner, 'USAGE'),
  pg_catalog.has_table_privilege(c.oid, 'TRIGGER'),
  pg_catalog.has_table_privilege(c.oid, 'SELECT'),
  c.relreplident::text,
  EXISTS (SELECT 1 FROM pg_catalog.pg_index i WHERE i.indrelid = c.oid AND i.indisprimary),
  EXISTS (SELECT 1 FROM pg_catalog.pg_index i WHERE i.indrelid = c.oid AND i.indisreplident),
  coalesce((
    SELECT pg_catalog.quote_ident(ic.relname) FROM pg_catalog.pg_index i
    JOIN pg_catalog.pg_class ic ON ic.oid = i.indexrelid
    WHERE i.indrelid = c.oid AND i.indisunique AND i.indimmediate AND i.indisvalid
      AND i.indpred IS NULL AND i.indexprs IS NULL
      AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a
                      WHERE a.attrelid = c.oid AND a.attnum = ANY (i.indkey) AND NOT a.attnotnull)
    ORDER BY ic.relname LIMIT 1), ''),
  t.upd_del,
  pg_catalog.array_to_json(t.via_root)::text,
  c.relispartition,
  pg_catalog.array_to_json(t.pubs)::text
FROM t JOIN pg_catalog.pg_class c ON c.oid = t.oid
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
ORDER BY n.nspname, c.relname
)sql";

Status read_tables(PGconn* conn, const std::string& schema, Facts& f) {
  auto r = query(conn, kTablesSql, {schema});
  if (!r.ok()) return r.error();
  for (int i = 0; i < r->count(); ++i) {
    TableFacts t;
    t.quoted = r->value(i, 0);
    t.relkind = r->value(i, 1).empty() ? 'r' : r->value(i, 1)[0];
    t.owned = r->flag(i, 2);
    t.can_trigger = r->flag(i, 3);
    t.can_select = r->flag(i, 4);
    t.replica_identity = r->value(i, 5).empty() ? 'd' : r->value(i, 5)[0];
    t.has_primary_key = r->flag(i, 6);
    t.has_identity_index = r->flag(i, 7);
    t.candidate_index_quoted = r->value(i, 8);
    t.publishes_update_or_delete = r->flag(i, 9);
    t.via_root_publications_quoted = r->strings(i, 10);
    t.is_partition = r->flag(i, 11);
    t.publications_quoted = r->strings(i, 12);
    f.tables.push_back(std::move(t));
  }
  auto owned = query(conn,
                     "SELECT pg_catalog.quote_ident(n.nspname) || '.' || "
                     "pg_catalog.quote_ident(c.relname) FROM pg_catalog.pg_class c "
                     "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
                     "WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition "
                     "AND pg_catalog.pg_has_role(c.relowner, 'USAGE') "
                     "AND n.nspname <> ALL ('{pg_catalog,information_schema}') "
                     "AND n.nspname NOT LIKE 'pg\\_%' AND n.nspname <> $1 "
                     "ORDER BY n.nspname, c.relname LIMIT 11",
                     {schema});
  if (!owned.ok()) return owned.error();
  for (int i = 0; i < owned->count(); ++i) f.owned_tables_quoted.push_back(owned->value(i, 0));
  return {};
}

// The rules of pg_hba.conf as the file reads now, with the database and user fields matched in
// SQL (role membership is easier there); the address is matched by the caller.
constexpr const char* kHbaSql = R"sql(
SELECT r.line_number, r.type, pg_catalog.array_to_string(r.database, ','),
  pg_catalog.array_to_string(r.user_name, ','), coalesce(r.address, ''),
  coalesce(r.netmask, ''), coalesce(r.auth_method, ''), coalesce(r.error, ''),
  EXISTS (SELECT 1 FROM pg_catalog.unnest(r.database) d
          WHERE d IN ('all', pg_catalog.current_database())
             OR (d = 'sameuser' AND pg_catalog.current_database() = CURRENT_USER)
             OR (d IN ('samerole', 'samegroup') AND EXISTS (
                   SELECT 1 FROM pg_catalog.pg_roles g
                   WHERE g.rolname = pg_catalog.current_database()
                     AND pg_catalog.pg_has_role(g.oid, 'MEMBER')))),
  EXISTS (SELECT 1 FROM pg_catalog.unnest(r.user_name) u
          WHERE u IN ('all', CURRENT_USER)
             OR (u LIKE '+%' AND EXISTS (
                   SELECT 1 FROM pg_catalog.pg_roles g
                   WHERE g.rolname = pg_catalog.substr(u, 2)
                     AND pg_catalog.pg_has_role(g.oid, 'MEMBER'))))
FROM pg_catalog.pg_hba_file_rules r ORDER BY r.line_number
)sql";

Status read_hba(PGconn* conn, HbaFacts& h) {
  auto r = query(conn, kHbaSql);
  if (!r.ok()) {
    if (r.error().sqlstate != sqlstate::kInsufficientPrivilege) return r.error();
    h.readable = false;
    h.unreadable_reason = r.error().message;
    return {};
  }
  h.readable = true;
  for (int i = 0; i < r->count(); ++i) {
    HbaRule rule;
    rule.line = r->number(i, 0);
    rule.type = r->value(i, 1);
    rule.databases = r->value(i, 2);
    rule.users = r->value(i, 3);
    rule.address = r->value(i, 4);
    rule.netmask = r->value(i, 5);
    rule.method = r->value(i, 6);
    rule.error = r->value(i, 7);
    rule.database_matches = r->flag(i, 8);
    rule.user_matches = r->flag(i, 9);
    h.rules.push_back(std::move(rule));
  }
  return {};
}

}  // namespace

Status read_databases(PGconn* conn, std::vector<DatabaseFacts>& out) {
  auto r = query(conn,
                 "SELECT d.datname, pg_catalog.quote_ident(d.datname), d.datallowconn, "
                 "pg_catalog.has_database_privilege(d.oid, 'CONNECT'), "
                 "pg_catalog.has_database_privilege(d.oid, 'CREATE') "
                 "FROM pg_catalog.pg_database d WHERE NOT d.datistemplate ORDER BY 1");
  if (!r.ok()) return r.error();
  for (int i = 0; i < r->count(); ++i) {
    out.push_back({r->value(i, 0), r->value(i, 1), r->flag(i, 2), r->flag(i, 3), r->flag(i, 4)});
  }
  return {};
}

Result<Facts> probe(PGconn* conn, const std::string& schema) {
  Facts f;
  f.connection = connection_facts(conn);
  PGRELAY_TRY(read_server_and_role(conn, f));
  PGRELAY_TRY(read_schema(conn, schema, f.schema));
  PGRELAY_TRY(read_publications(conn, schema, f.server.version_num >= 150000, f));
  PGRELAY_TRY(read_tables(conn, schema, f));
  PGRELAY_TRY(read_hba(conn, f.hba));
  PGRELAY_TRY(read_databases(conn, f.databases));
  return f;
}

}  // namespace pgrelay::cli::doctor
