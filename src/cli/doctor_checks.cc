// The checks of `pgrelay doctor`: facts about an upstream judged OK, WARN or FAIL, with fixes.
#include "cli/doctor_checks.h"

#include <arpa/inet.h>

#include <algorithm>
#include <array>
#include <optional>
#include <set>

#include "base/strings.h"
#include "capture/trigger/installer.h"

namespace pgrelay::cli::doctor {
namespace {

std::vector<std::string> first_n(const std::vector<std::string>& items, std::size_t n) {
  return {items.begin(), items.begin() + static_cast<std::ptrdiff_t>(std::min(n, items.size()))};
}

// "a, b, c" or "a, b, c and 7 more".
std::string listing(const std::vector<std::string>& items, std::size_t limit = 8) {
  std::string out = join(first_n(items, limit), ", ");
  if (items.size() > limit) out += " and " + std::to_string(items.size() - limit) + " more";
  return out;
}

std::string plural(std::size_t n, const std::string& one, const std::string& many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

// SQL identifier quoting without a server: always quoted (what PQescapeIdentifier does).
std::string sql_quote(const std::string& name) {
  std::string out = "\"";
  for (char c : name) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

bool is_loopback(const std::string& address) {
  return address == "::1" || address.rfind("127.", 0) == 0 || address == "::ffff:127.0.0.1";
}

std::string conf_file(const Facts& f) {
  return f.server.config_file.empty() ? "postgresql.conf" : f.server.config_file;
}

std::string hba_file(const Facts& f) {
  return f.server.hba_file.empty() ? "pg_hba.conf" : f.server.hba_file;
}

Check make(std::string name, Verdict v, std::string summary) {
  Check c;
  c.name = std::move(name);
  c.verdict = v;
  c.summary = std::move(summary);
  return c;
}

// ---- connection and server ----

Check check_connection(const Facts& f) {
  const ConnectionFacts& c = f.connection;
  std::string where =
      c.unix_socket ? "the socket in " + c.host + " (port " + c.port + ")" : c.host + ":" + c.port;
  return make("connection", Verdict::kOk,
              "connected to " + where + " as " + c.user + ", database " + c.dbname);
}

Check check_server_version(const Facts& f) {
  const int major = f.server.version_num / 10000;
  const std::string v = "PostgreSQL " + f.server.version;
  if (major == 15)
    return make("server_version", Verdict::kOk, v + ": the version pgrelay is tested with");
  if (major > 15) {
    Check c = make("server_version", Verdict::kWarn,
                   v + ": newer than 15, the only major version pgrelay is tested with");
    c.details.push_back(
        "Trigger capture uses nothing 16 or later removed, but a difference in a catalog or in "
        "pgoutput would show up only in use. Run pgrelay's end-to-end tests against it first.");
    return c;
  }
  Check c = make("server_version", Verdict::kFail,
                 v + " is too old: trigger capture needs PostgreSQL 15 or later");
  c.details.push_back(
      "Capture's tables use UNIQUE NULLS NOT DISTINCT, and pgrelay reads publication "
      "catalogs that came with 15 (pg_publication_namespace, row filters, column lists).");
  c.fixes.push_back(
      {"upgrade the server to PostgreSQL 15 (pg_upgrade, or pg_dump and restore)", {}});
  return c;
}

Check check_writable(const Facts& f) {
  if (f.server.in_recovery) {
    Check c = make("writable", Verdict::kFail,
                   "this server is a standby (in recovery): capture must create triggers and "
                   "write rows, so it needs the primary");
    c.fixes.push_back({"connect to the primary instead, with its host and port in the URL", {}});
    return c;
  }
  if (f.server.read_only) {
    Check c = make("writable", Verdict::kFail,
                   "sessions of " + f.role.quoted +
                       " are read-only (default_transaction_read_only = on): capture could not "
                       "install its triggers");
    const std::string& src = f.server.read_only_source;
    if (src == "user") {
      c.fixes.push_back(
          {"run as a superuser or as the role itself",
           {"ALTER ROLE " + f.role.quoted + " RESET default_transaction_read_only;"}});
    } else if (src == "database" || src == "database user") {
      c.fixes.push_back({"run as a superuser",
                         {src == "database" ? "ALTER DATABASE " + f.role.database_quoted +
                                                  " RESET default_transaction_read_only;"
                                            : "ALTER ROLE " + f.role.quoted + " IN DATABASE " +
                                                  f.role.database_quoted +
                                                  " RESET default_transaction_read_only;"}});
    } else {
      c.fixes.push_back({"set in " + conf_file(f) + ", then run SELECT pg_reload_conf()",
                         {"default_transaction_read_only = off"}});
    }
    return c;
  }
  return make("writable", Verdict::kOk, "a primary that accepts writes");
}

Check check_tls(const Facts& f) {
  const ConnectionFacts& c = f.connection;
  if (c.unix_socket) return make("tls", Verdict::kOk, "Unix socket: TLS does not apply");
  const bool loopback = is_loopback(f.server.server_address);
  const std::string sslmode = c.sslmode.empty() ? "prefer" : c.sslmode;
  if (c.tls) {
    std::string what = "TLS in use (" + c.tls_protocol + ", " + c.tls_cipher + ")";
    if (sslmode == "verify-full" || sslmode == "verify-ca") {
      return make("tls", Verdict::kOk,
                  what + "; the server's certificate is verified (sslmode=" + sslmode + ")");
    }
    if (loopback) {
      return make("tls", Verdict::kOk,
                  what + "; the certificate is not verified (sslmode=" + sslmode +
                      "), which is fine on loopback");
    }
    Check k = make("tls", Verdict::kWarn,
                   what + ", but sslmode=" + sslmode +
                       " does not verify the server's certificate: a host in between could "
                       "pose as the server");
    k.fixes.push_back(
        {"add to the connection URL, naming the CA that signed the server's certificate",
         {"sslmode=verify-full&sslrootcert=/path/to/root.crt"}});
    return k;
  }
  if (c.gss_encrypted) return make("tls", Verdict::kOk, "GSSAPI encryption in use (no TLS needed)");
  const std::string offer =
      f.server.ssl_offered ? "the server offers TLS" : "the server has ssl = off";
  if (loopback) {
    return make(
        "tls", Verdict::kOk,
        "not encrypted (sslmode=" + sslmode + "; " + offer + "), which is fine on loopback");
  }
  if (f.server.ssl_offered) {
    Check k =
        make("tls", Verdict::kWarn,
             "the server offers TLS, but this connection is not encrypted (sslmode=" + sslmode +
                 "): queries and data cross the network in clear");
    k.fixes.push_back(
        {"add to the connection URL, naming the CA that signed the server's certificate",
         {"sslmode=verify-full&sslrootcert=/path/to/root.crt"}});
    return k;
  }
  Check k = make("tls", Verdict::kWarn,
                 "the server does not offer TLS (ssl = off): queries, data and, with md5 or "
                 "password authentication, the password cross the network in clear");
  k.fixes.push_back({"set in " + conf_file(f) +
                         " with the server's certificate and key, then run SELECT pg_reload_conf()",
                     {"ssl = on", "ssl_cert_file = 'server.crt'", "ssl_key_file = 'server.key'"}});
  k.fixes.push_back(
      {"then add to the connection URL", {"sslmode=verify-full&sslrootcert=/path/to/root.crt"}});
  return k;
}

Check check_wal_level(const Facts& f) {
  const std::string& w = f.server.wal_level;
  if (w == "logical") {
    return make("wal_level", Verdict::kOk,
                "wal_level = logical: native capture (--capture native or auto) is possible "
                "with the REPLICATION right; pgrelay serve --upstream captures with triggers "
                "unless told, which work at any wal_level");
  }
  Check c = make("wal_level", Verdict::kOk,
                 "wal_level = " + w +
                     ": no logical decoding, so pgrelay captures with triggers; nothing to change");
  c.details.push_back("Only native capture (--capture native) would need wal_level = logical (" +
                      conf_file(f) + ", then a restart).");
  return c;
}

// ---- the role and what it may create ----

Check check_role(const Facts& f) {
  const RoleFacts& r = f.role;
  if (r.superuser) {
    return make("role", Verdict::kOk,
                "role " + r.quoted + " is a superuser: it may do all pgrelay needs");
  }
  if (r.replication) {
    return make("role", Verdict::kOk,
                "role " + r.quoted +
                    " is not a superuser and has the REPLICATION right (native capture, "
                    "--capture native, would use it)");
  }
  if (f.server.wal_level == "logical") {
    Check c = make("role", Verdict::kWarn,
                   "role " + r.quoted +
                       " has no REPLICATION right: trigger capture does not need it, but native "
                       "capture (--capture native), which wal_level = logical here allows, does");
    c.fixes.push_back({"run as a superuser", {"ALTER ROLE " + r.quoted + " REPLICATION;"}});
    return c;
  }
  return make(
      "role", Verdict::kOk,
      "role " + r.quoted + " has neither SUPERUSER nor REPLICATION: trigger capture needs neither");
}

Check check_schema(const Facts& f) {
  const SchemaFacts& s = f.schema;
  const RoleFacts& r = f.role;
  if (!s.exists) {
    if (r.create_on_database) {
      return make("schema", Verdict::kOk,
                  "schema " + s.quoted + " does not exist yet; " + r.quoted +
                      " may create it (CREATE on database " + r.database_quoted + ")");
    }
    Check c = make("schema", Verdict::kFail,
                   "role " + r.quoted + " may not create schema " + s.quoted +
                       ": it lacks CREATE on database " + r.database_quoted);
    c.details.push_back(
        "pgrelay keeps its change table, capture functions and catalog views in that schema.");
    c.fixes.push_back({"run as the database owner or a superuser",
                       {"GRANT CREATE ON DATABASE " + r.database_quoted + " TO " + r.quoted + ";",
                        "-- or create the schema for it:",
                        "CREATE SCHEMA " + s.quoted + " AUTHORIZATION " + r.quoted + ";"}});
    return c;
  }
  if (!s.owned) {
    Check c = make("schema", Verdict::kFail,
                   "schema " + s.quoted + " belongs to " + s.owner_quoted + ", not to " + r.quoted +
                       ": pgrelay creates its objects there and grants USAGE on it");
    c.fixes.push_back({"run as " + s.owner_quoted + " or a superuser",
                       {"ALTER SCHEMA " + s.quoted + " OWNER TO " + r.quoted + ";",
                        "-- or give pgrelay another schema: pgrelay serve --schema NAME"}});
    return c;
  }
  if (s.capture_version && *s.capture_version > capture::kInstallVersion) {
    Check c = make("schema", Verdict::kFail,
                   "schema " + s.quoted + " holds trigger capture version " +
                       std::to_string(*s.capture_version) + ", newer than this pgrelay's " +
                       std::to_string(capture::kInstallVersion));
    c.fixes.push_back({"use the newer pgrelay, or give this one another schema with --schema", {}});
    return c;
  }
  std::string summary = "schema " + s.quoted + " exists and belongs to " + r.quoted;
  if (s.capture_version) {
    summary += "; trigger capture version " + std::to_string(*s.capture_version) + " is installed";
  }
  return make("schema", Verdict::kOk, summary);
}

// What other roles may do with pgrelay's objects: the audit the Security section of the README
// describes. Informational: pgrelay itself grants only what Postgres gives every role.
Check check_grants(const Facts& f) {
  const SchemaFacts& s = f.schema;
  if (!s.exists) {
    return make("grants", Verdict::kSkip, "schema " + s.quoted + " does not exist yet");
  }
  Check c = make("grants", Verdict::kOk,
                 std::to_string(s.grants.size()) + " grants on objects in schema " + s.quoted +
                     " to roles other than their owner (each listed below)");
  c.details = s.grants;
  return c;
}

Check check_ddl_tracking(const Facts& f) {
  const std::string evt =
      f.schema.quoted == f.schema.name ? f.schema.name + "_ddl" : sql_quote(f.schema.name + "_ddl");
  if (f.role.superuser) {
    if (f.schema.event_trigger_disabled) {
      Check c = make("ddl_tracking", Verdict::kWarn,
                     "event trigger " + evt +
                         " is disabled: schema changes of captured tables are followed only by "
                         "periodic sync, with the gaps that brings");
      c.fixes.push_back({"run as a superuser", {"ALTER EVENT TRIGGER " + evt + " ENABLE;"}});
      return c;
    }
    return make("ddl_tracking", Verdict::kOk,
                "superuser: an event trigger follows schema changes exactly (ALTER TABLE, new "
                "tables of a publication) inside the DDL's own transaction");
  }
  Check c = make("ddl_tracking", Verdict::kWarn,
                 "not a superuser, so no event trigger: pgrelay follows schema changes by syncing "
                 "once a second, which leaves gaps");
  c.details.push_back(
      "Rows written between an ALTER TABLE and the next sync: after RENAME COLUMN or a type "
      "change they go out with the previous column names and types.");
  c.details.push_back(
      "A new table of a publication is captured from the next sync, not from its first row.");
  c.details.push_back(
      "Unchanged TOASTed values of an UPDATE are sent in full rather than as 'unchanged'.");
  c.fixes.push_back({"if your policy allows it, run as a superuser (event triggers need one)",
                     {"ALTER ROLE " + f.role.quoted + " SUPERUSER;"}});
  return c;
}

// ---- publications and tables ----

Check check_publications(const Facts& f) {
  if (f.publications.empty()) {
    Check c = make("publications", Verdict::kWarn,
                   "no publications: nothing is captured, and consumers have nothing to "
                   "subscribe to");
    if (f.role.superuser) {
      c.fixes.push_back({"run as a superuser", {"CREATE PUBLICATION pgrelay FOR ALL TABLES;"}});
    } else {
      std::vector<std::string> tables = first_n(f.owned_tables_quoted, 10);
      c.fixes.push_back(
          {"run as the tables' owner, naming the tables to publish (FOR ALL TABLES needs a "
           "superuser)",
           {"CREATE PUBLICATION pgrelay FOR TABLE " +
            (tables.empty() ? std::string("schema.table, ...") : join(tables, ", ")) + ";"}});
    }
    return c;
  }
  Check c;
  c.name = "publications";
  std::vector<std::string> names;
  for (const PublicationFacts& p : f.publications) {
    names.push_back(p.quoted);
    std::string scope = p.all_tables ? "FOR ALL TABLES" : "";
    if (!p.schemas_quoted.empty()) {
      scope += "FOR TABLES IN SCHEMA " + join(p.schemas_quoted, ", ");
    }
    std::string line = p.quoted + ": " + (scope.empty() ? "" : scope + ", ") +
                       plural(p.tables_quoted.size(), "table", "tables");
    if (!p.tables_quoted.empty()) line += " (" + listing(p.tables_quoted) + ")";
    line += "; publishes " + (p.actions.empty() ? std::string("nothing") : join(p.actions, ", "));
    if (p.via_root) line += "; publish_via_partition_root";
    c.details.push_back(line);
  }
  // Partitioned tables stream in both capture modes (their leaf partitions are captured); via
  // the root only from PostgreSQL 15 on: before, pgrelay refuses such streams
  // (server/publications.h) rather than leave changes out.
  std::vector<std::string> via_root_tables;
  std::vector<std::string> refused_pubs;
  if (f.server.version_num < 150000) {
    for (const TableFacts& t : f.tables) {
      if (t.relkind != 'p' || t.via_root_publications_quoted.empty()) continue;
      via_root_tables.push_back(t.quoted);
      for (const auto& p : t.via_root_publications_quoted) {
        if (std::find(refused_pubs.begin(), refused_pubs.end(), p) == refused_pubs.end()) {
          refused_pubs.push_back(p);
        }
      }
    }
  }
  if (!via_root_tables.empty()) {
    std::sort(refused_pubs.begin(), refused_pubs.end());
    c.verdict = Verdict::kFail;
    c.summary = "publication " + listing(refused_pubs) + " publishes partitioned table " +
                listing(via_root_tables) +
                " with publish_via_partition_root, which pgrelay streams from PostgreSQL 15 "
                "on: START_REPLICATION of it through pgrelay is refused (0A000); the other "
                "publications stream";
    c.fixes.push_back(
        Fix{"publish the partitions as themselves, as the upstream's own slot then sends them",
            {"ALTER PUBLICATION " + refused_pubs.front() +
             " SET (publish_via_partition_root = false);"}});
    return c;
  }
  std::size_t tables = f.tables.size();
  c.verdict = Verdict::kOk;
  c.summary = plural(f.publications.size(), "publication", "publications") + " (" + listing(names) +
              ") with " + plural(tables, "table", "tables") +
              " in all; pgrelay captures every one of them";
  return c;
}

Check check_publication_filters(const Facts& f) {
  if (f.server.version_num < 150000) {
    return make("publication_filters", Verdict::kSkip, "row filters and column lists came with 15");
  }
  if (f.narrowed.empty()) {
    return make("publication_filters", Verdict::kOk,
                "no publication has a row filter or a column list");
  }
  auto what = [](const NarrowedTable& n) {
    return std::string(n.row_filter && n.column_list ? "a row filter and a column list"
                       : n.row_filter                ? "a row filter (WHERE)"
                                                     : "a column list");
  };
  std::vector<std::string> pubs, refused;
  for (const NarrowedTable& n : f.narrowed) {
    auto& list = n.refusal.empty() ? pubs : refused;
    if (std::find(list.begin(), list.end(), n.publication_quoted) == list.end()) {
      list.push_back(n.publication_quoted);
    }
  }
  if (refused.empty()) {
    Check c = make("publication_filters", Verdict::kOk,
                   "pgrelay applies the row filters and column lists of publication " +
                       listing(pubs) + " as PostgreSQL 15 does");
    for (const NarrowedTable& n : f.narrowed) {
      c.details.push_back(n.publication_quoted + ": " + what(n) + " on " + n.table_quoted);
    }
    return c;
  }
  Check c = make("publication_filters", Verdict::kFail,
                 "publication " + listing(refused) +
                     " has a row filter pgrelay cannot evaluate: it refuses to stream " +
                     (refused.size() == 1 ? "it" : "them"));
  Fix fix{
      "run as the publication's owner, or rewrite the WHERE clause as comparisons of columns "
      "with constants (ALTER PUBLICATION ... SET TABLE ... WHERE (...)): this publishes "
      "whole tables, so filter in the consumer",
      {}};
  for (const NarrowedTable& n : f.narrowed) {
    if (n.refusal.empty()) continue;
    c.details.push_back(n.publication_quoted + ": " + what(n) + " on " + n.table_quoted);
    if (std::find(c.details.begin(), c.details.end(), n.refusal) == c.details.end()) {
      c.details.push_back(n.refusal);
    }
    if (!n.row_filter) continue;
    fix.lines.push_back("ALTER PUBLICATION " + n.publication_quoted + " DROP TABLE " +
                        n.table_quoted + ";");
    fix.lines.push_back("ALTER PUBLICATION " + n.publication_quoted + " ADD TABLE " +
                        n.table_quoted + ";");
  }
  c.fixes.push_back(std::move(fix));
  return c;
}

Check check_table_privileges(const Facts& f) {
  std::vector<std::string> no_trigger, trigger_only, no_select;
  for (const TableFacts& t : f.tables) {
    if (!t.can_trigger) {
      no_trigger.push_back(t.quoted);
    } else if (!t.owned) {
      trigger_only.push_back(t.quoted);
    }
    if (!t.can_select) no_select.push_back(t.quoted);
  }
  if (f.tables.empty()) {
    return make("table_privileges", Verdict::kSkip, "no published tables yet");
  }
  const std::string& role = f.role.quoted;
  const std::size_t n = f.tables.size();
  Check c;
  c.name = "table_privileges";
  if (!no_trigger.empty() || !trigger_only.empty()) {
    c.details.push_back(
        "Capture creates statement triggers on each published table: that needs the TRIGGER "
        "privilege; removing them again (a table leaves its publications, capture uninstall) "
        "needs the table's owner.");
  }
  if (!no_trigger.empty()) {
    c.verdict = Verdict::kFail;
    c.summary = "role " + role + " may not create triggers on " +
                std::to_string(no_trigger.size()) + " of " +
                plural(n, "published table", "published tables") + " (" + listing(no_trigger) +
                "): pgrelay serve would fail to install capture";
    Fix fix{"run as each table's owner or a superuser", {}};
    for (const auto& t : no_trigger) {
      fix.lines.push_back("ALTER TABLE " + t + " OWNER TO " + role + ";");
    }
    fix.lines.push_back("-- or, if " + role +
                        " must not own them (its triggers then need the owner to drop):");
    fix.lines.push_back("GRANT TRIGGER, SELECT ON " + join(no_trigger, ", ") + " TO " + role + ";");
    c.fixes.push_back(std::move(fix));
  } else if (!trigger_only.empty()) {
    c.verdict = Verdict::kWarn;
    c.summary = "role " + role + " may create triggers on all " + std::to_string(n) +
                " published tables but does not own " + std::to_string(trigger_only.size()) + " (" +
                listing(trigger_only) +
                "): capture installs, but dropping its triggers later needs the owner";
    Fix fix{"run as each table's owner or a superuser", {}};
    for (const auto& t : trigger_only) {
      fix.lines.push_back("ALTER TABLE " + t + " OWNER TO " + role + ";");
    }
    c.fixes.push_back(std::move(fix));
  } else {
    c.verdict = Verdict::kOk;
    c.summary = "role " + role + " owns all " + plural(n, "published table", "published tables");
  }
  if (!no_select.empty() && no_trigger.empty()) {
    if (c.verdict == Verdict::kOk) c.verdict = Verdict::kWarn;
    c.summary += "; it may not read " + listing(no_select) +
                 ", which consumers' initial copy through pgrelay does as " + role;
    c.fixes.push_back({"run as each table's owner or a superuser",
                       {"GRANT SELECT ON " + join(no_select, ", ") + " TO " + role + ";"}});
  }
  return c;
}

Check check_replica_identity(const Facts& f) {
  std::vector<const TableFacts*> keyless;
  for (const TableFacts& t : f.tables) {
    if (t.relkind != 'r' || !t.publishes_update_or_delete) continue;
    const bool has_identity = t.replica_identity == 'f' ||
                              (t.replica_identity == 'd' && t.has_primary_key) ||
                              (t.replica_identity == 'i' && t.has_identity_index);
    if (!has_identity) keyless.push_back(&t);
  }
  if (f.tables.empty()) return make("replica_identity", Verdict::kSkip, "no published tables yet");
  if (keyless.empty()) {
    return make("replica_identity", Verdict::kOk,
                "every published table has a primary key or a replica identity");
  }
  std::vector<std::string> names;
  for (const TableFacts* t : keyless) names.push_back(t->quoted);
  Check c = make("replica_identity", Verdict::kWarn,
                 plural(keyless.size(), "published table has", "published tables have") +
                     " no primary key or replica identity (" + listing(names) +
                     "): pgrelay does not capture their DELETEs and sends their UPDATEs without "
                     "the old key; a native publisher would refuse UPDATE and DELETE on them");
  Fix fix{
      "run as each table's owner; where the data has a key, ALTER TABLE ... ADD PRIMARY KEY "
      "(...) is better",
      {}};
  for (const TableFacts* t : keyless) {
    fix.lines.push_back("ALTER TABLE " + t->quoted + " REPLICA IDENTITY " +
                        (t->candidate_index_quoted.empty()
                             ? std::string("FULL")
                             : "USING INDEX " + t->candidate_index_quoted) +
                        ";");
  }
  c.fixes.push_back(std::move(fix));
  return c;
}

// ---- pg_hba.conf ----

// Whether `client` falls in the rule's address range; nullopt when that cannot be told here
// (samehost, samenet, host names).
std::optional<bool> address_matches(const HbaRule& rule, const std::string& client) {
  if (rule.address == "all") return true;
  std::array<unsigned char, 16> addr{}, mask{}, from{};
  int family = AF_INET;
  std::size_t len = 4;
  if (inet_pton(AF_INET, rule.address.c_str(), addr.data()) != 1) {
    if (inet_pton(AF_INET6, rule.address.c_str(), addr.data()) != 1) return std::nullopt;
    family = AF_INET6;
    len = 16;
  }
  if (inet_pton(family, rule.netmask.c_str(), mask.data()) != 1) return std::nullopt;
  if (inet_pton(family, client.c_str(), from.data()) != 1) return false;
  for (std::size_t i = 0; i < len; ++i) {
    if ((addr[i] & mask[i]) != (from[i] & mask[i])) return false;
  }
  return true;
}

int prefix_length(const std::string& netmask) {
  std::array<unsigned char, 16> m{};
  std::size_t len = 4;
  if (inet_pton(AF_INET, netmask.c_str(), m.data()) != 1) {
    if (inet_pton(AF_INET6, netmask.c_str(), m.data()) != 1) return -1;
    len = 16;
  }
  int bits = 0;
  for (std::size_t i = 0; i < len; ++i) bits += __builtin_popcount(m[i]);
  return bits;
}

std::string describe_rule(const HbaRule& r) {
  std::string line = r.type + " " + r.databases + " " + r.users;
  if (r.type != "local") {
    line += " " + r.address;
    const int bits = prefix_length(r.netmask);
    if (bits >= 0) line += "/" + std::to_string(bits);
  }
  return line + " " + r.method;
}

bool type_matches(const HbaRule& r, const ConnectionFacts& c) {
  if (r.type == "local") return c.unix_socket;
  if (c.unix_socket) return false;
  if (r.type == "host") return true;
  if (r.type == "hostssl") return c.tls;
  if (r.type == "hostnossl") return !c.tls;
  if (r.type == "hostgssenc") return c.gss_encrypted;
  if (r.type == "hostnogssenc") return !c.gss_encrypted;
  return false;
}

Check check_pg_hba(const Facts& f) {
  const ConnectionFacts& conn = f.connection;
  const RoleFacts& role = f.role;
  if (!f.hba.readable) {
    Check c = make("pg_hba", Verdict::kSkip,
                   "pg_hba.conf could not be checked: " + f.hba.unreadable_reason +
                       " (pg_hba_file_rules is for superusers unless granted)");
    c.fixes.push_back({"run as a superuser so that doctor may read it",
                       {"GRANT SELECT ON pg_hba_file_rules TO " + role.quoted + ";",
                        "GRANT EXECUTE ON FUNCTION pg_hba_file_rules() TO " + role.quoted + ";"}});
    return c;
  }
  const std::string who =
      role.quoted + (conn.unix_socket ? " on the Unix socket" : " from " + f.server.client_address);
  const bool loopback = conn.unix_socket || is_loopback(f.server.client_address);
  std::vector<const HbaRule*> broken;
  const HbaRule* match = nullptr;
  const HbaRule* maybe = nullptr;  // a rule before the match that may match (samenet, host name)
  for (const HbaRule& r : f.hba.rules) {
    if (!r.error.empty()) {
      broken.push_back(&r);
      continue;
    }
    if (match != nullptr || !type_matches(r, conn) || !r.database_matches || !r.user_matches) {
      continue;
    }
    if (conn.unix_socket) {
      match = &r;
      continue;
    }
    auto m = address_matches(r, f.server.client_address);
    if (!m.has_value()) {
      if (maybe == nullptr) maybe = &r;
    } else if (*m) {
      match = &r;
    }
  }
  Check c;
  c.name = "pg_hba";
  const std::string file = hba_file(f);
  const std::string reload = "then run SELECT pg_reload_conf()";
  if (!broken.empty()) {
    c.verdict = Verdict::kWarn;
    c.summary = file + " has " + plural(broken.size(), "error", "errors") +
                ": the server keeps its previous rules until they are fixed, and would not "
                "start with this file";
    Fix fix{"correct these lines of " + file + ", " + reload, {}};
    for (const HbaRule* r : broken) {
      fix.lines.push_back("line " + std::to_string(r->line) + ": " + r->error);
    }
    c.fixes.push_back(std::move(fix));
  }
  const std::string wanted =
      conn.unix_socket
          ? "local " + hba_quote(role.database) + " " + hba_quote(role.name) + " scram-sha-256"
          : std::string(conn.tls ? "hostssl " : "host ") + hba_quote(role.database) + " " +
                hba_quote(role.name) + " " + f.server.client_address +
                (f.server.client_address.find(':') != std::string::npos ? "/128" : "/32") +
                " scram-sha-256";
  if (match == nullptr || match->method == "reject") {
    if (c.verdict == Verdict::kOk) {
      c.verdict = Verdict::kWarn;
      c.summary = match == nullptr
                      ? "as " + file + " reads now, no line admits " + who + " to database " +
                            role.database_quoted + ": the next reload would lock pgrelay out"
                      : "as " + file + " reads now, line " + std::to_string(match->line) +
                            " rejects " + who + ": the next reload would lock pgrelay out";
    }
    c.fixes.push_back({"add to " + file +
                           (match != nullptr ? " before line " + std::to_string(match->line) : "") +
                           ", " + reload,
                       {wanted}});
    return c;
  }
  const std::string matched =
      "line " + std::to_string(match->line) + " (" + describe_rule(*match) + ")";
  if (maybe != nullptr && maybe->line < match->line) {
    c.details.push_back("line " + std::to_string(maybe->line) + " (" + describe_rule(*maybe) +
                        ") comes first and may match too; doctor cannot tell " + maybe->address +
                        " here.");
  }
  if (f.server.wal_level == "logical") {
    c.details.push_back(
        "Native logical replication connections (replication=database) match these same lines; "
        "the keyword replication concerns physical replication only.");
  }
  if (c.verdict != Verdict::kOk) return c;
  HbaRule scram = *match;
  scram.method = "scram-sha-256";
  const std::string rewrite = "replace line " + std::to_string(match->line) + " of " + file +
                              " by this one (the role needs a SCRAM password), " + reload;
  if (match->method == "trust" && !loopback) {
    c.verdict = Verdict::kWarn;
    c.summary = matched + " lets anyone reach database " + role.database_quoted + " as " +
                role.quoted + " from " + f.server.client_address + " without a password";
    c.fixes.push_back({rewrite, {describe_rule(scram)}});
    return c;
  }
  if (match->method == "password" && !conn.tls && !loopback) {
    c.verdict = Verdict::kWarn;
    c.summary =
        matched + " sends " + role.quoted + "'s password in clear over an unencrypted connection";
    c.fixes.push_back({rewrite, {describe_rule(scram)}});
    return c;
  }
  c.verdict = Verdict::kOk;
  c.summary = matched + " admits " + who + " to database " + role.database_quoted;
  return c;
}

// ---- settings ----

Check check_prepared_transactions(const Facts& f) {
  const int n = f.server.max_prepared_transactions;
  if (n == 0) {
    return make("prepared_transactions", Verdict::kOk,
                "max_prepared_transactions = 0: idle capture waits for a NOTIFY from the triggers");
  }
  Check c = make("prepared_transactions", Verdict::kWarn,
                 "max_prepared_transactions = " + std::to_string(n) +
                     ": a transaction that ran NOTIFY cannot be prepared, so the triggers never "
                     "notify and idle capture polls every 100 ms (up to 100 ms more latency)");
  if (f.server.prepared_transactions > 0) {
    c.details.push_back(plural(static_cast<std::size_t>(f.server.prepared_transactions),
                               "transaction is", "transactions are") +
                        " prepared right now: something uses two-phase commit, so keep the "
                        "setting and accept the polling.");
  } else {
    c.fixes.push_back({"if no application uses PREPARE TRANSACTION, set in " + conf_file(f) +
                           ", then restart the server",
                       {"max_prepared_transactions = 0"}});
  }
  return c;
}

// pgoutput's Commit carries the commit's time. Trigger capture reads it with
// pg_xact_commit_timestamp, which only this setting makes available; without it each
// transaction is stamped with the time of the poll that found it.
Check check_commit_timestamps(const Facts& f) {
  if (f.server.track_commit_timestamp) {
    return make("commit_timestamps", Verdict::kOk,
                "track_commit_timestamp = on: each Commit carries the transaction's own commit "
                "time");
  }
  Check c = make("commit_timestamps", Verdict::kWarn,
                 "track_commit_timestamp = off: under trigger capture each Commit carries the "
                 "time of the poll that found the transaction (milliseconds after its commit), "
                 "not its commit time");
  c.details.push_back(
      "Consumers that read commit times (an event's timestamp, replication lag) then see the "
      "poll's, and pgrelay_capture_delay_seconds is not reported. Native capture sends the "
      "upstream's own commit time either way.");
  c.details.push_back(
      "The setting costs the upstream a few bytes per transaction in pg_commit_ts.");
  c.fixes.push_back(
      {"set in " + conf_file(f) + ", then restart the server", {"track_commit_timestamp = on"}});
  return c;
}

Check check_replication_slots(const Facts& f) {
  const ServerFacts& s = f.server;
  if (s.wal_level != "logical") {
    return make("replication_slots", Verdict::kSkip,
                "trigger capture holds no replication slot and no walsender on the upstream");
  }
  const std::string counts = "max_replication_slots = " + std::to_string(s.max_replication_slots) +
                             " (" + std::to_string(s.replication_slots) +
                             " in use), max_wal_senders = " + std::to_string(s.max_wal_senders);
  if (s.replication_slots >= s.max_replication_slots || s.max_wal_senders == 0) {
    Check c = make("replication_slots", Verdict::kWarn,
                   counts + ": native capture needs a free slot and a walsender");
    c.fixes.push_back(
        {"set in " + conf_file(f) + ", then restart the server",
         {"max_replication_slots = " + std::to_string(std::max(10, s.replication_slots + 4)),
          "max_wal_senders = " + std::to_string(std::max(10, s.max_wal_senders))}});
    return c;
  }
  return make("replication_slots", Verdict::kOk,
              counts + ": room for native capture's slot (trigger capture uses none)");
}

// FOR ALL TABLES holds pgrelay's own tables too. Through pgrelay they never show, but a consumer
// of the upstream's own slots (another tool beside pgrelay) decodes pgrelay's bookkeeping writes.
Check check_all_tables_publications(const Facts& f) {
  std::vector<std::string> all;
  for (const PublicationFacts& p : f.publications) {
    if (p.all_tables) all.push_back(p.quoted);
  }
  if (all.empty()) {
    return make("all_tables_publications", Verdict::kOk, "no FOR ALL TABLES publication");
  }
  const std::string schema = f.schema.quoted.empty() ? "\"_pgrelay\"" : f.schema.quoted;
  if (f.server.wal_level != "logical") {
    Check c = make("all_tables_publications", Verdict::kOk,
                   "publication " + listing(all) +
                       " is FOR ALL TABLES: through pgrelay it leaves out pgrelay's schema " +
                       schema + " (wal_level is not logical, so no other consumer reads it)");
    return c;
  }
  Check c =
      make("all_tables_publications", Verdict::kWarn,
           "publication " + listing(all) +
               " is FOR ALL TABLES: consumers of the upstream's "
               "own replication slots (not through pgrelay) also receive pgrelay's bookkeeping "
               "rows from schema " +
               schema);
  c.details.push_back(
      "Through pgrelay, pg_publication_tables and the streams leave pgrelay's schema out; "
      "pgrelay's own tables all have a replica identity, so their writes never fail.");
  Fix through{
      "point those consumers at pgrelay instead of the upstream (nothing to change "
      "upstream)",
      {}};
  c.fixes.push_back(std::move(through));
  Fix narrow{
      "or, as a superuser, publish the application's schemas instead (then point the "
      "consumers' publication_names at the new publication)",
      {}};
  narrow.lines.push_back("CREATE PUBLICATION app FOR TABLES IN SCHEMA public;");
  c.fixes.push_back(std::move(narrow));
  return c;
}

// Which databases pgrelay captures (each from its first session through pgrelay), which it
// leaves out, and those it would capture but cannot reach or set up with this role.
Check check_databases(const Facts& f) {
  const std::string& first = f.role.database;
  bool all = false;
  std::set<std::string> named;
  for (const auto& name : f.capture_databases) {
    if (name == "*") all = true;
    named.insert(name);
  }
  std::vector<std::string> captured, left_out, unreachable;
  std::vector<const DatabaseFacts*> needs_grant;
  for (const DatabaseFacts& d : f.databases) {
    if (!(all || d.name == first || named.count(d.name))) {
      left_out.push_back(d.quoted);
      continue;
    }
    captured.push_back(d.quoted);
    if (!d.allows_connections || !d.can_connect) {
      unreachable.push_back(d.quoted);
    } else if (!d.can_create && d.name != first) {
      needs_grant.push_back(&d);
    }
  }
  std::string summary = "pgrelay captures " + listing(captured);
  summary += all ? " (every database: --capture-database '*', from its first session through "
                   "pgrelay)"
                 : " (from each one's first session through pgrelay)";
  if (!left_out.empty()) summary += "; not " + listing(left_out);
  if (unreachable.empty() && needs_grant.empty()) {
    Check c = make("databases", Verdict::kOk, summary);
    if (!left_out.empty()) {
      c.details.push_back("Slot creation in " + listing(left_out) +
                          " is refused with SQLSTATE 55000 and a hint naming "
                          "--capture-database.");
    }
    return c;
  }
  Check c = make("databases", Verdict::kWarn, summary);
  if (!unreachable.empty()) {
    c.details.push_back("The role cannot connect to " + listing(unreachable) +
                        ": replication there fails until it can.");
  }
  if (!needs_grant.empty()) {
    Fix grant{
        "SQL, as a superuser or the database owner (or leave these databases out with "
        "--capture-database)",
        {}};
    std::vector<std::string> names;
    for (const DatabaseFacts* d : needs_grant) {
      names.push_back(d->quoted);
      grant.lines.push_back("GRANT CREATE ON DATABASE " + d->quoted + " TO " + f.role.quoted + ";");
    }
    c.details.push_back("The role may not create pgrelay's schema in " + listing(names) +
                        ": capture cannot start there.");
    c.fixes.push_back(std::move(grant));
  }
  return c;
}

// Finds `key "value"` in a libpq message; empty when absent.
std::string quoted_after(const std::string& message, const std::string& key) {
  const std::size_t at = message.find(key + " \"");
  if (at == std::string::npos) return "";
  const std::size_t start = at + key.size() + 2;
  const std::size_t end = message.find('"', start);
  return end == std::string::npos ? "" : message.substr(start, end - start);
}

}  // namespace

const char* to_string(Verdict v) {
  switch (v) {
    case Verdict::kOk:
      return "OK";
    case Verdict::kWarn:
      return "WARN";
    case Verdict::kFail:
      return "FAIL";
    case Verdict::kSkip:
      return "SKIP";
  }
  return "?";
}

int Report::exit_status() const {
  if (!connected) return 2;
  for (const Check& c : checks) {
    if (c.verdict == Verdict::kFail) return 1;
  }
  return 0;
}

std::string hba_quote(const std::string& name) {
  static const char* const kKeywords[] = {"all", "sameuser", "samerole", "samegroup",
                                          "replication"};
  bool plain = !name.empty();
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) plain = false;
  }
  for (const char* k : kKeywords) {
    if (name == k) plain = false;
  }
  if (plain) return name;
  std::string out = "\"";
  for (char c : name) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

Report evaluate(const Facts& facts) {
  Report r;
  r.connected = true;
  r.target = facts.connection.user + "@" + facts.connection.host + ":" + facts.connection.port +
             "/" + facts.connection.dbname;
  r.server_version = facts.server.version;
  r.checks = {check_connection(facts),
              check_server_version(facts),
              check_writable(facts),
              check_tls(facts),
              check_wal_level(facts),
              check_role(facts),
              check_schema(facts),
              check_grants(facts),
              check_ddl_tracking(facts),
              check_publications(facts),
              check_publication_filters(facts),
              check_table_privileges(facts),
              check_replica_identity(facts),
              check_pg_hba(facts),
              check_prepared_transactions(facts),
              check_commit_timestamps(facts),
              check_replication_slots(facts),
              check_all_tables_publications(facts),
              check_databases(facts)};
  return r;
}

Report connection_failed(const std::string& target, const std::string& message) {
  Report r;
  r.connected = false;
  r.target = target;
  Check c = make("connection", Verdict::kFail, "could not connect to " + target);
  for (std::size_t start = 0; start < message.size();) {
    std::size_t end = message.find('\n', start);
    if (end == std::string::npos) end = message.size();
    std::string line = message.substr(start, end - start);
    while (!line.empty() && (line.front() == '\t' || line.front() == ' ')) line.erase(0, 1);
    if (!line.empty()) c.details.push_back(line);
    start = end + 1;
  }
  const std::string user = quoted_after(message, "user");
  const std::string database = quoted_after(message, "database");
  if (message.find("no pg_hba.conf entry") != std::string::npos) {
    const std::string host = quoted_after(message, "host");
    const bool ssl = message.find("SSL encryption") != std::string::npos;
    std::string line =
        host.empty() || host == "[local]"
            ? "local " + hba_quote(database) + " " + hba_quote(user) + " scram-sha-256"
            : std::string(ssl ? "hostssl " : "host ") + hba_quote(database) + " " +
                  hba_quote(user) + " " + host +
                  (host.find(':') != std::string::npos ? "/128" : "/32") + " scram-sha-256";
    c.fixes.push_back(
        {"add to the server's pg_hba.conf, then run SELECT pg_reload_conf()", {line}});
  } else if (message.find("password authentication failed") != std::string::npos) {
    c.fixes.push_back(
        {"check the password in the URL, PGPASSWORD or ~/.pgpass; to set a new one, run "
         "as a superuser (or use psql's \\password, which does not echo it)",
         {"ALTER ROLE " + sql_quote(user) + " PASSWORD '...';"}});
  } else if (message.find("no password supplied") != std::string::npos) {
    c.fixes.push_back({"give the password in the URL, PGPASSWORD or ~/.pgpass",
                       {"postgres://USER:PASSWORD@HOST:PORT/DBNAME"}});
  } else if (message.find("does not exist") != std::string::npos && !database.empty() &&
             message.find("database \"") != std::string::npos) {
    c.fixes.push_back({"run as a superuser or a role with CREATEDB",
                       {"CREATE DATABASE " + sql_quote(database) + ";"}});
  } else if (message.find("role \"") != std::string::npos &&
             message.find("does not exist") != std::string::npos) {
    c.fixes.push_back(
        {"run as a superuser",
         {"CREATE ROLE " + sql_quote(quoted_after(message, "role")) + " LOGIN PASSWORD '...';"}});
  } else if (message.find("is not permitted to log in") != std::string::npos) {
    c.fixes.push_back({"run as a superuser",
                       {"ALTER ROLE " + sql_quote(quoted_after(message, "role")) + " LOGIN;"}});
  } else if (message.find("server does not support SSL") != std::string::npos) {
    c.fixes.push_back(
        {"set in postgresql.conf with the server's certificate and key, then run SELECT "
         "pg_reload_conf()",
         {"ssl = on", "ssl_cert_file = 'server.crt'", "ssl_key_file = 'server.key'"}});
  } else if (message.find("Connection refused") != std::string::npos ||
             message.find("No such file or directory") != std::string::npos) {
    c.fixes.push_back(
        {"start the server, or check host and port; to accept connections from other "
         "hosts, set in postgresql.conf, then restart the server",
         {"listen_addresses = '*'"}});
  } else if (message.find("too many connections") != std::string::npos ||
             message.find("remaining connection slots") != std::string::npos) {
    c.fixes.push_back({"close idle sessions, or set in postgresql.conf, then restart the server",
                       {"max_connections = 200"}});
  }
  r.checks.push_back(std::move(c));
  return r;
}

}  // namespace pgrelay::cli::doctor
