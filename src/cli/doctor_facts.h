// What `pgrelay doctor` reads from an upstream: plain facts, gathered by read-only queries.
#pragma once

#include <libpq-fe.h>

#include <optional>
#include <string>
#include <vector>

#include "base/result.h"

namespace pgrelay::cli::doctor {

// Identifiers named `quoted` are already quoted for SQL (quote_ident), ready to paste into fixes.

struct ConnectionFacts {
  std::string host;  // PQhost: a host name, an address, or a Unix socket directory
  std::string port;
  std::string user;
  std::string dbname;
  std::string sslmode;  // the sslmode libpq used (URL, PGSSLMODE or its default)
  bool unix_socket = false;
  bool tls = false;
  std::string tls_protocol;
  std::string tls_cipher;
  bool gss_encrypted = false;
};

struct ServerFacts {
  int version_num = 0;
  std::string version;
  bool in_recovery = false;
  bool read_only = false;        // transaction_read_only of this session
  std::string read_only_source;  // pg_settings.source of default_transaction_read_only
  std::string wal_level;
  int max_prepared_transactions = 0;
  bool track_commit_timestamp = false;  // pg_xact_commit_timestamp() answers
  int prepared_transactions = 0;        // rows of pg_prepared_xacts now
  int max_replication_slots = 0;
  int replication_slots = 0;  // slots that exist now
  int max_wal_senders = 0;
  bool ssl_offered = false;    // the server's `ssl` setting
  std::string client_address;  // inet_client_addr(); empty on a Unix socket
  std::string server_address;  // inet_server_addr()
  std::string config_file;     // empty when this role may not read it
  std::string hba_file;
};

struct RoleFacts {
  std::string name;
  std::string quoted;
  bool superuser = false;
  bool replication = false;
  std::string database;  // current database
  std::string database_quoted;
  bool create_on_database = false;
};

struct SchemaFacts {
  std::string name;
  std::string quoted;
  bool exists = false;
  bool owned = false;  // the role has its owner's privileges
  std::string owner_quoted;
  std::optional<int> capture_version;   // trigger capture installed in it (meta.version)
  bool event_trigger_disabled = false;  // its DDL event trigger exists with evtenabled = 'D'
  // "object: privileges to grantee" for every privilege on an object in it held by a role other
  // than the object's owner (PUBLIC included; a function without an ACL is PUBLIC's to execute).
  std::vector<std::string> grants;
};

struct PublicationFacts {
  std::string name;
  std::string quoted;
  bool all_tables = false;
  bool via_root = false;
  std::vector<std::string> actions;         // insert, update, delete, truncate
  std::vector<std::string> schemas_quoted;  // FOR TABLES IN SCHEMA
  std::vector<std::string> tables_quoted;   // pg_publication_tables, schema-qualified
};

// A table of a publication with a row filter or a column list.
struct NarrowedTable {
  std::string publication_quoted;
  std::string table_quoted;
  bool row_filter = false;
  bool column_list = false;
  // Why START_REPLICATION would refuse the publication (a row filter outside what pgrelay
  // evaluates); empty when pgrelay applies its filters and lists as Postgres does.
  std::string refusal;
};

// A table some publication publishes (outside pgrelay's own schema).
struct TableFacts {
  std::string quoted;  // schema.table
  char relkind = 'r';
  bool owned = false;
  bool can_trigger = false;
  bool can_select = false;
  char replica_identity = 'd';  // pg_class.relreplident
  bool has_primary_key = false;
  bool has_identity_index = false;     // an index marked indisreplident
  std::string candidate_index_quoted;  // a unique index on NOT NULL columns, if any
  bool publishes_update_or_delete = false;
  std::vector<std::string> via_root_publications_quoted;  // for relkind 'p'
  bool is_partition = false;                              // pg_class.relispartition
  std::vector<std::string> publications_quoted;           // that publish it
};

struct HbaRule {
  int line = 0;
  std::string type;
  std::string databases;  // comma-separated, as in the file
  std::string users;
  std::string address;
  std::string netmask;
  std::string method;
  std::string error;
  bool database_matches = false;  // for this connection's database
  bool user_matches = false;      // for this connection's role
};

struct HbaFacts {
  bool readable = false;
  std::string unreadable_reason;  // the server's error when not readable
  std::vector<HbaRule> rules;
};

// One database of the upstream (templates left out), and what the role may do in it.
struct DatabaseFacts {
  std::string name;
  std::string quoted;
  bool allows_connections = true;  // datallowconn
  bool can_connect = false;
  bool can_create = false;  // CREATE: pgrelay's schema there (capture, virtual catalog)
};

struct Facts {
  ConnectionFacts connection;
  ServerFacts server;
  RoleFacts role;
  SchemaFacts schema;
  std::vector<PublicationFacts> publications;
  std::vector<NarrowedTable> narrowed;
  std::vector<TableFacts> tables;
  std::vector<std::string> owned_tables_quoted;  // a few tables the role owns, for fixes
  HbaFacts hba;
  std::vector<DatabaseFacts> databases;  // by name
  // serve's --capture-database: the databases besides this one that pgrelay captures; "*"
  // is every database.
  std::vector<std::string> capture_databases{"*"};
};

// Reads everything with catalog queries on `conn` (nothing is changed); `schema` is the schema
// `pgrelay serve --schema` would use.
Result<Facts> probe(PGconn* conn, const std::string& schema);

}  // namespace pgrelay::cli::doctor
