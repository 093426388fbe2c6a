// Installs and removes trigger capture upstream: change table, meta table, per-table triggers.
#pragma once

#include <string>
#include <vector>

#include "base/result.h"
#include "capture/trigger/pg_session.h"

namespace pgrelay::capture {

// The schema layout this code creates and reads. An installation of a newer version is refused.
inline constexpr int kInstallVersion = 1;

struct TableName {
  std::string schema;
  std::string name;
};

struct InstallOptions {
  std::string schema = "_pgrelay";
  // Tables captured for every operation.
  std::vector<TableName> tables;
  // Tables of these publications (pg_publication_tables), for the operations they publish.
  std::vector<std::string> publications;
};

// What install() set up, for logs and tests.
struct InstallReport {
  int captured_tables = 0;
  bool created_schema = false;
  std::string timezone;  // the server default the trigger functions format timestamptz in
};

// Creates or brings up to date everything in one transaction; running it again with the same
// options changes nothing, with other options it adds and removes triggers to match. Needs no
// superuser: owning the tables (and CREATE on the database or on the schema) suffices.
// Trigger functions are generated from the tables' current columns and replica identity, so
// install() must run again after such DDL (event triggers are not handled yet).
Result<InstallReport> install(PgSession& session, const InstallOptions& options);

// Removes every object install() created (a schema it did not create is left in place). A
// schema without an installation is not an error.
Status uninstall(PgSession& session, const std::string& schema = "_pgrelay");

}  // namespace pgrelay::capture
