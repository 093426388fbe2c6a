// `pgrelay dump` and `pgrelay restore`: Debian's pg_dump and pg_restore, custom format, run
// against a running pgrelay through its pass-through, with pgrelay's and zero's objects left out.
#include "cli/dump_commands.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "admin/admin_client.h"
#include "base/child_process.h"
#include "base/strings.h"
#include "cli/admin_commands.h"
#include "cli/dump_archive.h"
#include "upstream/upstream_config.h"

extern char** environ;

namespace pgrelay::cli {
namespace {

namespace fs = std::filesystem;

constexpr std::size_t kListingLimit = std::size_t{256} << 20;
constexpr auto kZeroReadyTimeout = std::chrono::seconds(180);

struct ArchiveOptions {
  admin::Target target;
  std::string database;  // empty: the URL's
  std::string pg_bin;    // empty: found
  std::string file;
  std::string admin_url;    // restore: empty for the one DATA_DIR/pgrelay.pid names
  std::string admin_token;  // restore
};

// The database to work on, through the running pgrelay.
struct Endpoint {
  upstream::UpstreamConfig config;
  std::string admin_url;  // the admin page the server published; empty without one
};

Result<Endpoint> find_endpoint(const ArchiveOptions& options) {
  std::string url = options.target.url;
  Endpoint endpoint;
  if (url.empty()) {
    auto server = admin::probe_server(options.target.data_dir);
    if (!server.ok()) return server.error();
    if (!server->running) {
      return Error::make(
          sqlstate::kConnectionFailure,
          "no pgrelay is running on data directory \"" + options.target.data_dir + "\"",
          "Start it (pgrelay zero, or pgrelay serve), give the --data-dir of the "
          "one running, or reach it with --url.");
    }
    if (server->url.empty()) {
      return Error::make(
          sqlstate::kObjectNotInPrerequisiteState,
          "pgrelay (pid " + std::to_string(server->pid) + ") has not written its URL yet",
          "It is starting: try again in a moment, or pass --url.");
    }
    url = server->url;
    endpoint.admin_url = server->admin_url;
  }
  auto config = upstream::UpstreamConfig::parse(url);
  if (!config.ok()) return config.error();
  endpoint.config = std::move(*config);
  if (!options.database.empty()) endpoint.config.dbname = options.database;
  if (!options.admin_url.empty()) endpoint.admin_url = options.admin_url;
  return endpoint;
}

// A libpq conninfo for the tools: no password (that goes in PGPASSWORD, off the command line
// other users can read).
std::string tool_conninfo(const upstream::UpstreamConfig& config, const char* application) {
  upstream::UpstreamConfig c = config;
  c.password.clear();
  return c.conninfo() + " application_name='" + application + "'";
}

// pgrelay's environment, with PGPASSWORD set to the endpoint's password (or left as it is).
std::vector<std::string> tool_environment(const upstream::UpstreamConfig& config) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view entry(*e);
    if (!config.password.empty() && entry.starts_with("PGPASSWORD=")) continue;
    env.emplace_back(entry);
  }
  if (!config.password.empty()) env.push_back("PGPASSWORD=" + config.password);
  return env;
}

Result<std::unique_ptr<capture::PgSession>> connect(const upstream::UpstreamConfig& config,
                                                    const char* application) {
  auto session = capture::PgSession::connect(config.conninfo() + " connect_timeout=10" +
                                             " application_name='" + application + "'");
  if (!session.ok()) {
    Error e = session.error();
    e.message = "could not connect to pgrelay at " + config.describe() + " (database \"" +
                config.dbname + "\"): " + admin::connect_failure(e);
    if (e.hint.empty()) {
      e.hint =
          "Is pgrelay running there, and does it accept this user? Pass --url with a "
          "user and password it accepts.";
    }
    return e;
  }
  return session;
}

// PROGRAM from --pg-bin, else the newest /usr/lib/postgresql/N/bin (Debian keeps the clients of
// every installed major there; the newest reads every older server), else PATH.
Result<std::string> find_program(const std::string& pg_bin, const std::string& program) {
  auto runnable = [](const fs::path& p) { return ::access(p.c_str(), X_OK) == 0; };
  if (!pg_bin.empty()) {
    fs::path p = fs::path(pg_bin) / program;
    if (runnable(p)) return p.string();
    return Error::make(sqlstate::kUndefinedFile,
                       "no " + program + " in --pg-bin \"" + pg_bin + "\"",
                       "Point --pg-bin at a PostgreSQL bin directory, e.g. "
                       "/usr/lib/postgresql/15/bin.");
  }
  std::vector<std::pair<int, fs::path>> versioned;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/usr/lib/postgresql", ec)) {
    const int major = std::atoi(entry.path().filename().c_str());
    if (major > 0 && runnable(entry.path() / "bin" / program)) {
      versioned.emplace_back(major, entry.path() / "bin" / program);
    }
  }
  if (!versioned.empty())
    return std::max_element(versioned.begin(), versioned.end())->second.string();
  if (const char* path = std::getenv("PATH")) {
    std::string_view rest(path);
    while (!rest.empty()) {
      const std::string_view dir = rest.substr(0, rest.find(':'));
      rest.remove_prefix(std::min(rest.size(), dir.size() + 1));
      if (!dir.empty() && runnable(fs::path(dir) / program)) {
        return (fs::path(dir) / program).string();
      }
    }
  }
  return Error::make(sqlstate::kUndefinedFile, "could not find " + program,
                     "Install PostgreSQL's client programs (apt-get install postgresql-client-15) "
                     "or point --pg-bin at their directory.");
}

// A file in TMPDIR that goes when this does.
class TempFile {
 public:
  static Result<TempFile> create(const std::string& contents) {
    const char* dir = std::getenv("TMPDIR");
    std::string path =
        std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") + "/pgrelay-restore-XXXXXX";
    const int fd = ::mkstemp(path.data());
    if (fd < 0) {
      return Error::make(sqlstate::kIoError, "could not create a temporary file in " +
                                                 fs::path(path).parent_path().string());
    }
    TempFile file(path);
    const bool written =
        ::write(fd, contents.data(), contents.size()) == static_cast<ssize_t>(contents.size());
    ::close(fd);
    if (!written) return Error::make(sqlstate::kIoError, "could not write " + path);
    return file;
  }
  TempFile(TempFile&& other) noexcept : path_(std::exchange(other.path_, {})) {}
  TempFile& operator=(TempFile&&) = delete;
  ~TempFile() {
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  const std::string& path() const { return path_; }

 private:
  explicit TempFile(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

ChildSpec tool_spec(std::vector<std::string> argv, const upstream::UpstreamConfig& config) {
  ChildSpec spec;
  spec.argv = std::move(argv);
  spec.environment = tool_environment(config);
  spec.output_fd = STDERR_FILENO;  // the tool's messages are the user's to read
  spec.new_session = false;        // Ctrl-C stops it with us
  spec.parent_death_signal = SIGTERM;
  return spec;
}

// The schemas that are not the application's.
struct InternalSchemas {
  std::vector<std::string> all;
  std::vector<std::string> pgrelay;
  bool zero = false;  // zero-cache has run on this database
};

Result<InternalSchemas> internal_schemas(capture::PgSession& session) {
  auto rows = session.exec(std::string(dump::internal_schemas_query()));
  if (!rows.ok()) return rows.error();
  InternalSchemas out;
  for (int i = 0; i < rows->rows(); ++i) {
    out.all.emplace_back(rows->value(i, 0));
    if (rows->value(i, 1) == "pgrelay") {
      out.pgrelay.emplace_back(rows->value(i, 0));
    } else {
      out.zero = true;
    }
  }
  return out;
}

// NAME as a pg_dump pattern that matches only NAME (double quotes make every character literal).
std::string exact_pattern(const std::string& name) {
  std::string out = "\"";
  for (char c : name) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string human_size(std::uintmax_t bytes) {
  char text[32];
  if (bytes < 10 * 1024) {
    std::snprintf(text, sizeof text, "%ju bytes", bytes);
  } else if (bytes < 10 * 1024 * 1024) {
    std::snprintf(text, sizeof text, "%ju kB", bytes / 1024);
  } else {
    std::snprintf(text, sizeof text, "%ju MB", bytes / (1024 * 1024));
  }
  return text;
}

int run_dump(const ArchiveOptions& options) {
  auto endpoint = find_endpoint(options);
  if (!endpoint.ok()) return admin::fail(endpoint.error());
  const auto& config = endpoint->config;
  auto pg_dump = find_program(options.pg_bin, "pg_dump");
  if (!pg_dump.ok()) return admin::fail(pg_dump.error());
  auto session = connect(config, "pgrelay dump");
  if (!session.ok()) return admin::fail(session.error());
  auto left_out = internal_schemas(**session);
  if (!left_out.ok()) return admin::fail(left_out.error());
  session.value().reset();  // not held while the tool runs

  // Written beside FILE and renamed over it only when whole: a failed dump leaves an older
  // FILE as it was.
  const std::string partial = options.file + ".partial";
  std::vector<std::string> argv = {*pg_dump, "--format=custom", "--blobs", "--file=" + partial,
                                   "--dbname=" + tool_conninfo(config, "pgrelay dump")};
  for (const auto& schema : left_out->all) {
    argv.push_back("--exclude-schema=" + exact_pattern(schema));
  }
  Status dumped = run_child(tool_spec(std::move(argv), config));
  std::error_code ec;
  if (!dumped.ok()) {
    fs::remove(partial, ec);
    Error e = dumped.error();
    e.message = "pgrelay dump failed: " + e.message;
    e.hint = "pg_dump's own message is above.";
    return admin::fail(e);
  }
  fs::rename(partial, options.file, ec);
  if (ec) {
    fs::remove(partial, ec);
    return admin::fail(Error::make(
        sqlstate::kIoError,
        "could not rename \"" + partial + "\" to \"" + options.file + "\": " + ec.message()));
  }
  const auto size = fs::file_size(options.file, ec);
  std::printf("pgrelay dump: wrote %s (%s) from database \"%s\" at %s\n", options.file.c_str(),
              human_size(ec ? 0 : size).c_str(), config.dbname.c_str(), config.describe().c_str());
  if (!left_out->all.empty()) {
    std::printf("left out (pgrelay's and zero-cache's own): schemas %s\n",
                join(left_out->all, ", ").c_str());
  }
  return 0;
}

// The tables of `tables` the database already has (the restore drops and creates them again).
Result<std::vector<std::string>> existing_tables(
    capture::PgSession& session, const std::vector<std::pair<std::string, std::string>>& tables) {
  std::vector<std::string> out;
  for (const auto& [schema, name] : tables) {
    auto rows = session.exec(
        "SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = "
        "c.relnamespace WHERE n.nspname = $1 AND c.relname = $2",
        {schema, name});
    if (!rows.ok()) return rows.error();
    if (rows->rows() > 0) out.push_back(schema + "." + name);
  }
  return out;
}

// After a restore that replaced tables zero-cache had synced: its replica cannot follow a table
// dropped and created again, so zero is reset (slots and replica gone, a fresh initial sync).
int reset_zero_if_running(const Endpoint& endpoint, const ArchiveOptions& options,
                          bool zero_schemas, const std::vector<std::string>& replaced) {
  if (endpoint.admin_url.empty()) {
    if (zero_schemas && !replaced.empty()) {
      admin::print_warning(
          "the restore replaced " + std::to_string(replaced.size()) +
              " existing table(s) of a database zero-cache syncs, and pgrelay's admin page is "
              "unknown: zero-cache was not reset",
          "If zero-cache runs, reset it: the admin page's Reset zero, or pgrelay restore "
          "--admin-url http://HOST:PORT/ next time.");
    }
    return 0;
  }
  auto client = ::pgrelay::admin::AdminClient::connect_to(endpoint.admin_url, options.admin_token);
  if (!client.ok()) return admin::fail(client.error());
  auto status = client->status();
  if (!status.ok()) return admin::fail(status.error());
  const nlohmann::json zero = status->value("zero", nlohmann::json());
  if (!zero.is_object()) return 0;  // no zero-cache
  if (replaced.empty()) {
    std::printf("zero-cache follows the restore through capture (it created tables only)\n");
    return 0;
  }
  std::printf("resetting zero-cache: the restore replaced %zu table(s) it syncs (%s)\n",
              replaced.size(), join(replaced, ", ").c_str());
  std::fflush(stdout);
  auto reset = client->reset_zero();
  if (!reset.ok()) return admin::fail(reset.error());
  const auto deadline = std::chrono::steady_clock::now() + kZeroReadyTimeout;
  for (;;) {
    auto now = client->status();
    if (now.ok() && now->value("zero", nlohmann::json()).is_object() &&
        (*now)["zero"].value("state", "") == "ready") {
      break;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return admin::fail(
          Error::make(sqlstate::kObjectNotInPrerequisiteState,
                      "zero-cache was reset but is not ready after " +
                          std::to_string(kZeroReadyTimeout.count()) + " s",
                      "Its log says why: the admin page, or DATA_DIR/zero/zero-cache.log."));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  std::printf("zero-cache is ready again, synced from the restored data\n");
  return 0;
}

int run_restore(const ArchiveOptions& options) {
  auto endpoint = find_endpoint(options);
  if (!endpoint.ok()) return admin::fail(endpoint.error());
  const auto& config = endpoint->config;
  auto pg_restore = find_program(options.pg_bin, "pg_restore");
  if (!pg_restore.ok()) return admin::fail(pg_restore.error());
  if (::access(options.file.c_str(), R_OK) != 0) {
    return admin::fail(
        Error::make(sqlstate::kUndefinedFile,
                    "could not read \"" + options.file + "\": " + std::strerror(errno),
                    "Give the file `pgrelay dump` wrote."));
  }
  auto session = connect(config, "pgrelay restore");
  if (!session.ok()) return admin::fail(session.error());

  ChildSpec list_spec;
  list_spec.argv = {*pg_restore, "--list", options.file};
  auto listing = read_child_output(list_spec, kListingLimit);
  if (!listing.ok()) {
    Error e = listing.error();
    e.message = "\"" + options.file + "\" is not an archive pg_restore can read";
    e.hint =
        "pgrelay restore reads custom-format archives, as `pgrelay dump` (or pg_dump "
        "--format=custom) writes them.";
    return admin::fail(e);
  }
  std::vector<dump::TriggerCall> triggers;
  if (std::string only = dump::trigger_listing(*listing); !only.empty()) {
    auto list = TempFile::create(only);
    if (!list.ok()) return admin::fail(list.error());
    ChildSpec sql_spec;
    sql_spec.argv = {*pg_restore, "--file=-", "--use-list=" + list->path(), options.file};
    auto sql = read_child_output(sql_spec, kListingLimit);
    if (!sql.ok()) return admin::fail(sql.error());
    triggers = dump::parse_trigger_calls(*sql);
  }
  auto internal = internal_schemas(**session);
  if (!internal.ok()) return admin::fail(internal.error());
  std::vector<std::string> pgrelay_schemas = internal->pgrelay;
  pgrelay_schemas.emplace_back("_pgrelay");
  const dump::RestoreList plan = dump::plan_restore(*listing, triggers, pgrelay_schemas);
  auto replaced = existing_tables(**session, plan.tables);
  if (!replaced.ok()) return admin::fail(replaced.error());
  session.value().reset();  // not held while the tool runs

  auto list = TempFile::create(plan.listing);
  if (!list.ok()) return admin::fail(list.error());
  // One transaction: capture carries the restore as one, and a failure leaves nothing behind.
  // --clean --if-exists: what the archive holds replaces what the database has of it.
  Status restored =
      run_child(tool_spec({*pg_restore, "--dbname=" + tool_conninfo(config, "pgrelay restore"),
                           "--clean", "--if-exists", "--no-owner", "--single-transaction",
                           "--exit-on-error", "--use-list=" + list->path(), options.file},
                          config));
  if (!restored.ok()) {
    Error e = restored.error();
    e.message =
        "pgrelay restore failed, and restored nothing (it runs in one transaction): " + e.message;
    e.hint = "pg_restore's own message is above.";
    return admin::fail(e);
  }
  std::printf(
      "pgrelay restore: restored %s into database \"%s\" at %s (%zu table(s), %zu of "
      "them replaced)\n",
      options.file.c_str(), config.dbname.c_str(), config.describe().c_str(), plan.tables.size(),
      replaced->size());
  for (const auto& s : plan.skipped)
    std::printf("skipped (not the application's): %s\n", s.c_str());
  if (plan.skipped_table_triggers > 0) {
    std::printf(
        "skipped (not the application's): %zu trigger(s) on tables, calling functions the "
        "archive does not hold (pgrelay's trigger capture installs its own)\n",
        plan.skipped_table_triggers);
  }
  std::fflush(stdout);
  return reset_zero_if_running(*endpoint, options, internal->zero, *replaced);
}

void add_archive_options(CLI::App* cmd, ArchiveOptions& options, const char* file_help) {
  admin::add_target_options(*cmd, options.target);
  cmd->add_option("-d,--database", options.database,
                  "The database (default: the one in the URL pgrelay wrote, or in --url)");
  cmd->add_option("--pg-bin", options.pg_bin,
                  "Directory of pg_dump and pg_restore. Default: the newest\n"
                  "/usr/lib/postgresql/*/bin, then PATH");
  cmd->add_option("FILE", options.file, file_help)->required();
}

}  // namespace

Subcommand add_dump_command(CLI::App& parent) {
  auto options = std::make_shared<ArchiveOptions>();
  CLI::App* cmd = parent.add_subcommand(
      "dump",
      "Dump a database served by a running pgrelay to FILE (pg_dump's custom format),\n"
      "through pgrelay, leaving out pgrelay's and zero-cache's own schemas");
  cmd->footer(
      "\nThe schemas left out are pgrelay's capture schema and zero-cache's app and shard\n"
      "schemas; their event triggers and publications stay in FILE and pgrelay restore\n"
      "skips them. FILE is written whole or not at all (FILE.partial meanwhile).\n"
      "Example: pgrelay dump --data-dir ./pgrelay-data app.dump");
  add_archive_options(cmd, *options, "The archive to write (replaced if it exists)");
  return {cmd, [options] { return run_dump(*options); }};
}

Subcommand add_restore_command(CLI::App& parent) {
  auto options = std::make_shared<ArchiveOptions>();
  CLI::App* cmd = parent.add_subcommand(
      "restore",
      "Restore FILE (from pgrelay dump, or pg_dump --format=custom) into a database served\n"
      "by a running pgrelay, through pgrelay, in one transaction");
  cmd->footer(
      "\nWhat FILE holds replaces what the database has of it (pg_restore --clean --if-exists\n"
      "--single-transaction --no-owner); pgrelay's and zero-cache's own objects are skipped.\n"
      "The restore is captured like any other write. With zero-cache running (pgrelay zero):\n"
      "tables the restore creates reach it through capture; if it replaced tables that\n"
      "existed, zero-cache is reset through the admin page and syncs the restored data.\n"
      "Example: pgrelay restore --data-dir ./pgrelay-data app.dump");
  add_archive_options(cmd, *options, "The archive to restore");
  cmd->add_option("--admin-url", options->admin_url,
                  "pgrelay's admin page, to reset zero-cache after the restore. Default: the\n"
                  "one pgrelay wrote to DATA_DIR/pgrelay.pid");
  cmd->add_option("--admin-token", options->admin_token,
                  "The admin page's token, if pgrelay runs with one")
      ->envname("PGRELAY_ADMIN_TOKEN");
  return {cmd, [options] { return run_restore(*options); }};
}

}  // namespace pgrelay::cli
